"""The harness's and the compiler's modules import each other without circles, counting imports inside
functions and under ``TYPE_CHECKING`` too (they hide a circle from Python but not from a reader).

``from package import module`` is an edge to that module, not to the package's ``__init__``: Python runs
every parent package's ``__init__`` before any of its modules, which is no dependency a reader follows
(``compiler/__init__.py`` imports the backend, which every ``from . import config`` would otherwise close
into a circle)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, mods: set[str]) -> set[str]:
    """The modules of `mods` that `path` imports anywhere in its body."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            subs = [f"{base}.{a.name}" for a in node.names]
            names = [n for n in subs if n in mods]
            if len(names) < len(subs):  # a name defined by the module (or package) `base` itself
                names.append(base)
        else:
            continue
        found |= {n for n in names if n in mods and n != me}
    return found


def graph(package: str = "harness") -> dict[str, set[str]]:
    files = sorted((ROOT / package).rglob("*.py"))
    mods = {module_name(f) for f in files}
    return {module_name(f): imports_of(f, mods) for f in files}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary circle found by depth-first search, each named once by its smallest rotation."""
    found: set[tuple[str, ...]] = set()

    def visit(start: str, node: str, path: list[str]) -> None:
        for nxt in sorted(g.get(node, ())):
            if nxt == start:
                i = path.index(min(path))
                found.add(tuple(path[i:] + path[:i]))
            elif nxt not in path and nxt > start:
                visit(start, nxt, path + [nxt])

    for start in sorted(g):
        visit(start, start, [start])
    return [list(c) for c in sorted(found)]


def test_cycle_finder_finds_a_planted_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circles_in_the_harness():
    g = graph()
    assert "harness.suites.runner" in g and "harness.commands" in g["harness.suites.runner"]
    found = cycles(g)
    assert found == [], "\n".join(" -> ".join(c + [c[0]]) for c in found)


def test_no_import_circles_in_the_compiler():
    g = graph("compiler")
    assert "compiler.backend" in g and "compiler.scheduler" in g["compiler.backend"]
    found = cycles(g)
    assert found == [], "\n".join(" -> ".join(c + [c[0]]) for c in found)


def test_a_module_imported_from_its_package_is_an_edge_to_the_module(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("from . import b\nfrom .b import thing\n")
    (pkg / "b.py").write_text("def f():\n    from pkg import VERSION\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert graph("pkg") == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": {"pkg"}}
    assert cycles(graph("pkg")) == [["pkg", "pkg.a", "pkg.b"]]


# A module's underscore names are its own: no module of the products imports another's (`from x import _y`).
# Tests may, to test a private helper directly. Each exception names why it stays.
PRIVATE_IMPORTS_ALLOWED: dict[tuple[str, str, str], str] = {}


def private_imports(path: Path, mods: set[str]) -> list[tuple[str, str, str]]:
    """(importer, module, name) for every `from module import _name` in `path` where `module` is another module
    of `mods` (dunder names such as `__version__` are public)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        if base == me or base not in mods:
            continue
        found += [
            (me, base, a.name) for a in node.names if a.name.startswith("_") and not a.name.startswith("__")
        ]
    return found


def test_private_import_finder_finds_a_planted_one(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("_secret = 1\n__version__ = '1'\n")
    (pkg / "b.py").write_text("from .a import _secret, __version__\nfrom os import _exit\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    mods = {module_name(f) for f in pkg.rglob("*.py")}
    assert private_imports(pkg / "b.py", mods) == [("pkg.b", "pkg.a", "_secret")]
    assert private_imports(pkg / "a.py", mods) == []


def test_no_module_imports_another_modules_private_names():
    files = sorted(f for package in ("compiler", "harness") for f in (ROOT / package).rglob("*.py"))
    mods = {module_name(f) for f in files}
    found = [hit for f in files for hit in private_imports(f, mods)]
    assert {"compiler.codegen.printer", "harness.site.build"} <= mods
    bad = [
        f"{m}: from {base} import {name}"
        for m, base, name in found
        if (m, base, name) not in PRIVATE_IMPORTS_ALLOWED
    ]
    assert bad == [], "\n".join(bad)


def test_the_harness_runs_on_a_host_python_without_pytest():
    """The host side of the harness (detect, run's parent, report) never imports pytest: `nox -s ci` asks
    `harness detect` with a fresh venv's Python before anything is installed there. Only the plugins, which run
    inside the suites' pytest, import it."""
    import subprocess
    import sys

    code = (
        "import sys, runpy; sys.modules['pytest'] = None; sys.argv = ['harness', 'detect']; "
        "runpy.run_module('harness', run_name='__main__', alter_sys=True)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0 and proc.stdout.strip() in ("cpu", "cuda", "rocm"), proc.stderr[-2000:]
    for module in (
        "harness.suites.steps",
        "harness.suites.runner",
        "harness.suites.report",
        "harness.suites.isolation",
    ):
        check = f"import sys; sys.modules['pytest'] = None; import {module}"
        proc = subprocess.run(
            [sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
        )
        assert proc.returncode == 0, (module, proc.stderr[-2000:])


# The harness's floors, bottom to top (README's layout table): a module imports only from its own floor or
# below. envinfo records the image and lock a run came from, so it sits on the images' floor.
FLOORS = {
    "ground": 0,
    "images": 1,
    "checks": 2,
    "suites": 3,
    "numerics": 4,
    "bench": 4,
    "site": 4,
    "__main__": 5,
}
ON_IMAGES_FLOOR = {"harness.envinfo"}


def floor_of(module: str) -> int:
    parts = module.split(".")
    if module in ON_IMAGES_FLOOR:
        return FLOORS["images"]
    if len(parts) > 1 and parts[1] in FLOORS:
        return FLOORS[parts[1]]
    return FLOORS["ground"]


def upward_imports(g: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{m} -> {n}"
        for m, deps in g.items()
        for n in deps
        if floor_of(n) > floor_of(m) and n.count(".") > 0 and n.split(".")[-1] != "__init__"
    )


def test_floor_finder_finds_a_planted_upward_import():
    g = {"harness.process": {"harness.suites.runner"}, "harness.suites.runner": {"harness.process"}}
    assert upward_imports(g) == ["harness.process -> harness.suites.runner"]


def test_the_harness_imports_only_downward():
    g = graph()
    assert {"harness.suites", "harness.images", "harness.checks"} <= set(g)
    bad = [
        b
        for b in upward_imports(g)
        if b.split(" -> ")[1]
        not in ("harness.suites", "harness.images", "harness.checks", "harness.bench", "harness.site")
    ]
    assert bad == [], "\n".join(bad)


# The bench's sub-packages, bottom to top: each imports only from itself, from the ones before it and from
# outside the bench. The bench's own top modules (cli, job, __main__) sit above them all.
BENCH_LAYERS = ("core", "stores", "judge", "reports", "kernels", "models")


def bench_layer(module: str) -> int | None:
    """The index of `module`'s bench sub-package in BENCH_LAYERS; len(BENCH_LAYERS) for the bench's top
    modules; None outside the bench."""
    parts = module.split(".")
    if parts[:2] != ["harness", "bench"]:
        return None
    if len(parts) > 2 and parts[2] in BENCH_LAYERS:
        return BENCH_LAYERS.index(parts[2])
    return len(BENCH_LAYERS)


def upward_bench_imports(g: dict[str, set[str]]) -> list[str]:
    """One line for each import from a bench sub-package into a later one (or into the bench's top)."""
    order = " < ".join(BENCH_LAYERS) + " < harness.bench's top modules"
    bad = []
    for m, deps in sorted(g.items()):
        lm = bench_layer(m)
        for n in sorted(deps):
            ln = bench_layer(n)
            if lm is not None and ln is not None and ln > lm and n != "harness.bench":
                bad.append(f"{m} imports {n}, which sits above it ({order})")
    return bad


def test_bench_layer_finder_finds_a_planted_upward_import():
    g = {
        "harness.bench.core.records": {"harness.bench.judge.compare", "harness.exc"},
        "harness.bench.judge.compare": {"harness.bench.core.records", "harness.bench.judge.paired"},
        "harness.bench.models.run": {"harness.bench.kernels.execute", "harness.bench.cli"},
    }
    assert upward_bench_imports(g) == [
        "harness.bench.core.records imports harness.bench.judge.compare, which sits above it "
        "(core < stores < judge < reports < kernels < models < harness.bench's top modules)",
        "harness.bench.models.run imports harness.bench.cli, which sits above it "
        "(core < stores < judge < reports < kernels < models < harness.bench's top modules)",
    ]


def test_the_bench_is_sub_packages_that_import_only_downward():
    g = graph()
    bench = [m for m in g if m.startswith("harness.bench.")]
    flat = [m for m in bench if bench_layer(m) == len(BENCH_LAYERS)]
    assert set(flat) <= {"harness.bench.cli", "harness.bench.job", "harness.bench.__main__"}, flat
    assert {f"harness.bench.{p}" for p in BENCH_LAYERS} <= set(g)
    bad = upward_bench_imports(g)
    assert bad == [], "\n".join(bad)
