"""Compile check: compile every kernel the suites generate for every CUDA and ROCm target in the matrix.

Terms:
  dump folder    what the compiler writes under KILN_DUMP_DIR (docs/TEAM.md): `kernels/<name>.py`, a module
                 holding the `@triton.jit` function `<name>`, and one `kernels/<name>.<hash>.json` per
                 launch specialization {kernel, source, signature, constexprs, num_warps, num_stages}.
  target         a GPU that Triton compiles for ahead of time, from each backend's `compile_targets` in
                 ci/matrix.json: {"backend": "cuda", "arch": 90, "warp_size": 32} is sm_90,
                 {"backend": "hip", "arch": "gfx942", "warp_size": 64} is gfx942.
  interpreter-only kernel
                 a kernel that ran under TRITON_INTERPRET=1 (the interpreter runs plain Python) but that
                 `triton.compile` rejects for a target; the check fails on each one, naming its source
                 file and line and the target.

Steps: `dump_kernels` (the suites on CPU in interpreter mode with KILN_DUMP_DIR set) -> `load_specs` ->
`compile_specs` (worker processes WITHOUT TRITON_INTERPRET, since Triton picks the interpreter at import
time) -> report (compile_check.json, compile_check.md). CLI: `python -m harness compile-check`.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.exc import CompileCheckError, MissingTool, RunInterrupted
from harness.process import (
    Heartbeat,
    Spawned,
    execute,
    heartbeat_interval,
    interrupts_after,
    kill_group,
    sigterm_interrupts,
    spawn,
)
from harness.results import append_job_summary, atomic_write_text, markdown_table
from harness.settings import selection_args, settings

SCHEMA = 1
SLOW_COMPILE_S = 60.0  # a compile this slow is printed as a note: on a GPU the kernel likely spills
_SPEC_KEYS = {
    "kernel": str,
    "source": str,
    "signature": dict,
    "constexprs": dict,
    "num_warps": int,
    "num_stages": int,
}


@dataclass(frozen=True)
class Target:
    """One ahead-of-time compile target (Triton's GPUTarget fields)."""

    backend: str  # "cuda" | "hip"
    arch: int | str  # 90 for sm_90; "gfx942"
    warp_size: int

    @property
    def label(self) -> str:
        return f"sm_{self.arch}" if self.backend == "cuda" else str(self.arch)

    @property
    def name(self) -> str:
        return f"{self.backend} {self.label}"

    @classmethod
    def from_json(cls, obj: Any, where: str) -> Target:
        if not isinstance(obj, dict) or set(obj) != {"backend", "arch", "warp_size"}:
            raise CompileCheckError(
                f'{where}: a compile target is {{"backend", "arch", "warp_size"}}, got {obj!r}'
            )
        backend, arch, warp = obj["backend"], obj["arch"], obj["warp_size"]
        ok = (backend == "cuda" and isinstance(arch, int) and not isinstance(arch, bool)) or (
            backend == "hip" and isinstance(arch, str) and arch.startswith("gfx")
        )
        if not ok or warp not in (32, 64):
            raise CompileCheckError(
                f"{where}: bad compile target {obj!r} (want cuda with an int arch such as "
                '90, or hip with an arch such as "gfx942"; warp_size 32 or 64)'
            )
        return cls(backend, arch, warp)


@dataclass(frozen=True)
class KernelSpec:
    """One launch specialization of one dumped kernel."""

    kernel: str
    source: str  # path of the kernel module, relative to the dump folder
    spec_file: str  # path of the spec JSON, relative to the dump folder
    signature: dict[str, str]
    constexprs: dict[str, Any]
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class Outcome:
    """The result of compiling one spec for one target."""

    kernel: str
    source: str
    spec_file: str
    target: str
    ok: bool
    error: str = ""  # one line
    location: str = ""  # "kernels/<name>.py:LINE:COL" when Triton pointed at a line
    seconds: float = 0.0  # wall time of this compile

    def message(self, dump_dir: Path | None = None) -> str:
        where = self.location or self.source
        if dump_dir is not None:
            where = f"{dump_dir / where}"
        what = f"kernel {self.kernel} ({self.spec_file})"
        return f"{where}: {what} does not compile for {self.target}: {self.error}"


def targets_from_matrix(matrix: Any) -> list[Target]:
    """Every backend's compile_targets, in matrix order, without repeats."""
    seen: list[Target] = []
    for name, backend in matrix.backends.items():
        for i, obj in enumerate(backend.compile_targets):
            target = Target.from_json(obj, f"{matrix.path}: backends.{name}.compile_targets[{i}]")
            if target not in seen:
                seen.append(target)
    return seen


def select_targets(targets: Sequence[Target], wanted: Sequence[str]) -> list[Target]:
    """The targets whose label (sm_90, gfx942, ...) is in `wanted`; all when `wanted` is empty."""
    if not wanted:
        return list(targets)
    labels = {t.label: t for t in targets}
    unknown = [w for w in wanted if w not in labels]
    if unknown:
        raise CompileCheckError(f"unknown target(s) {unknown}; the matrix has {list(labels)}")
    return [labels[w] for w in wanted]


# ---- reading the dump ---------------------------------------------------------------------------------


def load_specs(dump_dir: Path) -> list[KernelSpec]:
    """Every `kernels/*.json` spec of the dump folder, validated, sorted by file name."""
    kernels = dump_dir / "kernels"
    if not dump_dir.is_dir():
        raise CompileCheckError(f"no dump folder at {dump_dir}")
    specs = []
    for path in sorted(kernels.glob("*.json")) if kernels.is_dir() else []:
        rel = str(path.relative_to(dump_dir))
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CompileCheckError(f"{path}: unreadable kernel spec: {e}") from None
        if not isinstance(data, dict):
            raise CompileCheckError(f"{path}: a kernel spec must be a JSON object")
        for key, kind in _SPEC_KEYS.items():
            if not isinstance(data.get(key), kind) or isinstance(data.get(key), bool):
                raise CompileCheckError(f"{path}: '{key}' must be a {kind.__name__}, got {data.get(key)!r}")
        source = Path(data["source"])
        if source.is_absolute() or ".." in source.parts or not (kernels / source).is_file():
            raise CompileCheckError(f"{path}: source {data['source']!r} is not a file in {kernels}")
        bad = [k for k, v in data["signature"].items() if not isinstance(v, str)]
        if bad:
            raise CompileCheckError(f"{path}: signature types must be strings such as '*fp32', see {bad}")
        missing = [
            k for k, v in data["signature"].items() if v == "constexpr" and k not in data["constexprs"]
        ]
        if missing:
            raise CompileCheckError(f"{path}: constexpr argument(s) {missing} have no value in 'constexprs'")
        specs.append(
            KernelSpec(
                data["kernel"],
                str(Path("kernels") / source),
                rel,
                dict(data["signature"]),
                dict(data["constexprs"]),
                data["num_warps"],
                data["num_stages"],
            )
        )
    return specs


# ---- compiling (worker side: runs in a process without TRITON_INTERPRET) ------------------------------


def _def_line(path: Path, name: str) -> int | None:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node.lineno
    return None


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _load_kernel(path: Path, name: str) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"kiln_dump_{name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if fn is None or not hasattr(fn, "arg_names"):
        raise TypeError(f"{path.name} defines no @triton.jit function named {name!r}")
    return fn


def _compile_one(fn: Any, spec: KernelSpec, target: Target, source_path: Path) -> Outcome:
    start = time.monotonic()
    outcome = _compile_one_untimed(fn, spec, target, source_path)
    return dataclasses.replace(outcome, seconds=round(time.monotonic() - start, 3))


def _compile_one_untimed(fn: Any, spec: KernelSpec, target: Target, source_path: Path) -> Outcome:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.errors import CompilationError

    base: dict[str, Any] = dict(
        kernel=spec.kernel, source=spec.source, spec_file=spec.spec_file, target=target.name
    )
    if set(spec.signature) != set(fn.arg_names):
        return Outcome(
            **base,
            ok=False,
            error=f"spec signature {sorted(spec.signature)} does not match the "
            f"kernel's arguments {list(fn.arg_names)}",
        )
    # a JSON object's key order means nothing (the compiler may write sorted keys): use the kernel's order
    signature = {name: spec.signature[name] for name in fn.arg_names}
    try:
        src = ASTSource(fn, signature=signature, constexprs=spec.constexprs)
        triton.compile(
            src,
            target=GPUTarget(target.backend, target.arch, target.warp_size),
            options={"num_warps": spec.num_warps, "num_stages": spec.num_stages},
        )
    except CompilationError as e:
        node = getattr(e, "node", None)
        location = ""
        line0 = _def_line(source_path, spec.kernel)
        if node is not None and getattr(node, "lineno", None) and line0:
            location = f"{spec.source}:{line0 + node.lineno - 1}:{getattr(node, 'col_offset', 0)}"
        message = getattr(e, "error_message", None) or _one_line(str(e))
        return Outcome(**base, ok=False, error=f"{type(e).__name__}: {_one_line(message)}", location=location)
    except Exception as e:  # noqa: BLE001 - any compiler failure is a finding, reported per kernel and target
        return Outcome(**base, ok=False, error=f"{type(e).__name__}: {_one_line(str(e))}")
    return Outcome(**base, ok=True)


def worker(request: Path, results: Path) -> int:
    """Compile the request's specs for its targets; one JSON line per outcome, flushed as it comes."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise CompileCheckError(
            "the compile worker must run without TRITON_INTERPRET (the interpreter compiles nothing)"
        )
    try:
        from triton.compiler import ASTSource
    except ImportError as e:
        raise MissingTool(f"triton is not importable: {e}") from None
    import inspect

    if "constexprs" not in inspect.signature(ASTSource.__init__).parameters:
        raise MissingTool("the compile check needs triton >= 3.3 (ASTSource with constexprs)")
    req = json.loads(request.read_text())
    dump = Path(req["dump_dir"])
    targets = [Target(**t) for t in req["targets"]]
    loaded: dict[str, Any] = {}
    with results.open("a", encoding="utf-8") as out:
        for raw in req["specs"]:
            spec = KernelSpec(**raw)
            path = dump / spec.source
            if spec.source not in loaded:
                try:
                    loaded[spec.source] = _load_kernel(path, spec.kernel)
                except Exception as e:  # noqa: BLE001 - a dumped module that does not import is a finding
                    loaded[spec.source] = e
            fn = loaded[spec.source]
            for target in targets:
                if isinstance(fn, Exception):
                    outcome = Outcome(
                        spec.kernel,
                        spec.source,
                        spec.spec_file,
                        target.name,
                        False,
                        f"module does not import: {type(fn).__name__}: {_one_line(str(fn))}",
                    )
                else:
                    outcome = _compile_one(fn, spec, target, path)
                out.write(json.dumps(asdict(outcome)) + "\n")
                out.flush()
    return 0


# ---- compiling (parent side) --------------------------------------------------------------------------


def compiler_env() -> dict[str, str]:
    """This process's environment without TRITON_INTERPRET, with the harness importable and the compiler caches
    of this job's trust scope (harness.commands.native_cache_env: never another scope's folders)."""
    from harness.commands import native_cache_env, native_command

    _, full = native_command(
        [], native_cache_env(), src=settings().root
    )  # the source tree first on PYTHONPATH
    env = {k: v for k, v in full.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # triton 3.9 warns when unset; 1 is its default
    return env


def compile_specs(
    specs: Sequence[KernelSpec],
    targets: Sequence[Target],
    dump_dir: Path,
    work_dir: Path,
    jobs: int = 1,
    timeout_s: float | None = None,
) -> list[Outcome]:
    """Compile every spec for every target in `jobs` worker processes; outcomes sorted by spec then target.

    A worker still running after `timeout_s` is killed: the compile it was in is reported as not finishing
    in time (a finding: ptxas can take minutes on a kernel that spills), the rest of its share as not
    compiled.
    """
    if not specs or not targets:
        return []
    work_dir.mkdir(parents=True, exist_ok=True)
    # round-robin over specs keeps the workers equally busy; each worker imports a kernel module once
    chunks: list[list[KernelSpec]] = [[] for _ in range(max(1, min(jobs, len(specs))))]
    for i, spec in enumerate(sorted(specs, key=lambda sp: sp.spec_file)):
        chunks[i % len(chunks)].append(spec)
    procs: list[tuple[Spawned, Path, Path, list[KernelSpec]]] = []
    try:
        for i, chunk in enumerate(chunks):
            request, result = work_dir / f"request-{i}.json", work_dir / f"outcomes-{i}.jsonl"
            request.write_text(
                json.dumps(
                    {
                        "dump_dir": str(dump_dir.resolve()),
                        "targets": [asdict(t) for t in targets],
                        "specs": [asdict(s) for s in chunk],
                    }
                )
            )
            result.write_text("")
            cmd = [
                sys.executable,
                "-m",
                "harness.checks.compile_check",
                "--worker",
                str(request),
                str(result),
            ]
            log = work_dir / f"worker-{i}.log"
            with interrupts_after():  # a stop arriving while a worker starts finds it in procs
                procs.append((spawn(cmd, log, env=compiler_env(), echo=False), log, result, chunk))
    except BaseException:  # stopped while starting them: the workers started so far go too
        for worker, *_ in procs:
            kill_group(worker.proc)
        raise
    outcomes: dict[tuple[str, str], Outcome] = {}
    failures = []
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    total = len(specs) * len(targets)

    def progress() -> str:  # the outcomes the workers have written so far
        done = sum(len(r.read_text().splitlines()) for _, _, r, _ in procs if r.exists())
        return f"{done} of {total} compiles done"

    try:
        with Heartbeat(
            f"compile-check: {len(procs)} compile worker(s)", heartbeat_interval(None), last_line=progress
        ):
            for worker, *_ in procs:
                try:
                    worker.proc.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    kill_group(worker.proc)
    except BaseException:
        for worker, *_ in procs:
            kill_group(worker.proc)
        raise
    for worker, log, result, chunk in procs:
        code = worker.proc.returncode
        worker.reader.join(timeout=10)
        for line in result.read_text().splitlines():
            o = Outcome(**json.loads(line))
            outcomes[(o.spec_file, o.target)] = o
        pending = [(sp, t) for sp in chunk for t in targets if (sp.spec_file, t.name) not in outcomes]
        if not pending:
            continue
        killed = timeout_s is not None and code in (-signal.SIGTERM, -signal.SIGKILL)
        if killed:
            sp, t = pending.pop(0)  # workers go in order: the first pair without an outcome was compiling
            outcomes[(sp.spec_file, t.name)] = Outcome(
                sp.kernel,
                sp.source,
                sp.spec_file,
                t.name,
                False,
                f"compile did not finish within the {timeout_s:.0f} s limit of the compile check",
            )
            why = f"not compiled: the compile worker was stopped after {timeout_s:.0f} s"
        else:
            failures.append(f"compile worker exited {code}: {_one_line(log.read_text())}")
            why = f"not compiled: the compile worker exited {code} first"
        for sp, t in pending:
            outcomes[(sp.spec_file, t.name)] = Outcome(sp.kernel, sp.source, sp.spec_file, t.name, False, why)
    if failures and all(o.error.startswith("not compiled:") for o in outcomes.values()):
        # no worker compiled anything (bad environment): an error of the check, not a finding about kernels
        raise CompileCheckError(failures[0])
    order = {t.name: i for i, t in enumerate(targets)}
    return sorted(outcomes.values(), key=lambda o: (o.spec_file, order[o.target]))


# ---- running the suites with KILN_DUMP_DIR ------------------------------------------------------------


def dump_kernels(
    dump_dir: Path, paths: Sequence[str], root: Path, log: Path, extra: Sequence[str] = ()
) -> int:
    """Run `paths` on CPU in interpreter mode with KILN_DUMP_DIR=dump_dir; returns pytest's exit code."""
    from harness import matrix
    from harness.commands import native_cache_env, native_command, pytest_argv, suite_env

    m = matrix.load()
    cpu = m.backend("cpu")
    env = {
        **native_cache_env(),
        **suite_env(m, cpu),
        "TRITON_INTERPRET": "1",
        "KILN_DUMP_DIR": str(dump_dir.resolve()),
    }
    dump_dir.mkdir(parents=True, exist_ok=True)
    inner = pytest_argv(paths, test_timeout_s=cpu.timeouts.test_s, extra=["-q", "--tb=line", *extra])
    cmd, full_env = native_command(inner, env, src=root)
    code, _ = execute(
        cmd,
        log=log,
        timeout_s=None,
        env=full_env,
        cwd=root,
        echo=False,
        step="compile-check: the suites in interpreter mode (kernel dump)",
    )
    if code in (2, 3, 4):
        raise CompileCheckError(f"the suites did not run (pytest exit {code}); see {log}")
    return code


# ---- report -------------------------------------------------------------------------------------------


def build_report(
    specs: Sequence[KernelSpec],
    targets: Sequence[Target],
    outcomes: Sequence[Outcome],
    suites_exit: int | None,
) -> dict:
    failed = [o for o in outcomes if not o.ok]
    return {
        "schema": SCHEMA,
        "kind": "compile-check",
        "targets": [t.name for t in targets],
        "kernels": len({s.source for s in specs}),
        "specializations": len(specs),
        "compiled": sum(o.ok for o in outcomes),
        "failed": len(failed),
        "suites_exit": suites_exit,
        "ok": not failed,
        "failures": [asdict(o) for o in failed],
        "compile_seconds": round(sum(o.seconds for o in outcomes), 1),
        "slowest": [
            asdict(o) for o in sorted(outcomes, key=lambda o: (-o.seconds, o.spec_file, o.target))[:5]
        ],
    }


def summary_line(report: dict) -> str:
    return (
        f"compile-check: {report['kernels']} kernels, {report['specializations']} specializations x "
        f"{len(report['targets'])} targets ({', '.join(report['targets'])}): {report['compiled']} compiled, "
        f"{report['failed']} failed"
    )


def render_markdown(report: dict) -> str:
    lines = ["## Compile check", "", summary_line(report), ""]
    if report["failures"]:
        lines += markdown_table(
            ["kernel source", "spec", "target", "error"],
            [
                [f"`{f['location'] or f['source']}`", f"`{f['spec_file']}`", f["target"], f["error"]]
                for f in report["failures"]
            ],
        )
        lines.append("")
    if report.get("slowest") and report["slowest"][0]["seconds"] > 0:
        lines += [f"Compile time {report['compile_seconds']} s in all; slowest:", ""]
        lines += [f"- {o['seconds']} s `{o['spec_file']}` for {o['target']}" for o in report["slowest"]]
        lines.append("")
    if report["specializations"] == 0:
        lines += [
            "No kernel was dumped: the suites generated no kernels (or the compiler wrote no dump).",
            "",
        ]
    return "\n".join(lines)


def write_report(out_dir: Path, report: dict) -> None:
    """Write compile_check.json and compile_check.md atomically (a reader never sees half a report)."""
    atomic_write_text(out_dir / "compile_check.json", json.dumps(report, indent=2) + "\n")
    atomic_write_text(out_dir / "compile_check.md", render_markdown(report))


def check(
    dump_dir: Path,
    targets: Sequence[Target],
    out_dir: Path,
    jobs: int = 1,
    suites_exit: int | None = None,
    timeout_s: float | None = None,
) -> dict:
    """Compile the dump folder's specs for `targets`, write the report into `out_dir`, return it."""
    specs = load_specs(dump_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    outcomes = compile_specs(specs, targets, dump_dir, out_dir / "work", jobs, timeout_s)
    report = build_report(specs, targets, outcomes, suites_exit)
    write_report(out_dir, report)
    return report


# ---- CLI ----------------------------------------------------------------------------------------------


def cli_add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dump", help="use this existing dump folder instead of running the suites")
    p.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="LABEL",
        help="only this target (sm_90, gfx942, ...; repeatable; default: all in ci/matrix.json)",
    )
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="compile worker processes")
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds for all compiles (default: the cpu backend's suite timeout in ci/matrix.json)",
    )
    p.add_argument(
        "--min-kernels",
        type=int,
        default=0,
        help="fail when fewer kernel specializations than this were dumped",
    )
    p.add_argument(
        "--github-summary",
        action="store_true",
        help="also append the Markdown report to $GITHUB_STEP_SUMMARY when it is set",
    )
    p.add_argument("--out", help="output folder (default: <results>/compile-check-<time>)")
    p.add_argument("--pytest-arg", action="append", default=[], metavar="ARG", help="extra pytest argument")
    p.add_argument("paths", nargs="*", help="test paths to run for the dump (default: the matrix's suites)")


def cli_main(args: argparse.Namespace) -> int:
    """Dump the suites' kernels (or read --dump), compile them for every target; exit 1 on any failure."""
    from harness import matrix

    s = settings()
    m = matrix.load()
    targets = select_targets(targets_from_matrix(m), args.target)
    if not targets:
        raise CompileCheckError(f"{m.path} lists no compile_targets")
    if args.jobs < 1:
        raise CompileCheckError(f"--jobs must be >= 1, got {args.jobs}")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    out = Path(args.out) if args.out else s.results_root / f"compile-check-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    suites_exit = None
    if args.dump:
        dump = Path(args.dump)
    else:
        dump = out / "dump"
        from harness.matrix import resolve_test_paths

        paths, missing = resolve_test_paths(s.root, args.paths)
        if missing and args.paths:
            raise CompileCheckError(f"no such test path: {missing[0]}")
        for p in missing:
            print(f"compile-check: suite folder {p} does not exist: skipped")
        dump.mkdir(parents=True, exist_ok=True)
        if paths:
            print(f"compile-check: running {' '.join(paths)} in interpreter mode with KILN_DUMP_DIR={dump}")
            suites_exit = dump_kernels(
                dump, paths, s.root, out / "suites.log", [*args.pytest_arg, *selection_args("compile-check")]
            )
    timeout_s = args.timeout or m.backend("cpu").timeouts.suite_s
    try:
        with sigterm_interrupts():  # SIGTERM stops the workers like Ctrl-C does
            report = check(dump, targets, out, args.jobs, suites_exit, timeout_s)
    except KeyboardInterrupt:
        raise RunInterrupted(f"compile check interrupted; outcomes so far are in {out / 'work'}") from None
    for failure in report["failures"]:
        print(f"compile-check: FAIL {Outcome(**failure).message(dump)}", file=sys.stderr)
    for o in report["slowest"]:
        if o["seconds"] >= SLOW_COMPILE_S:
            print(
                f"compile-check: slow: {o['seconds']:.0f} s to compile {o['spec_file']} for {o['target']} "
                "(often a tile too large for its warps: the kernel spills registers)"
            )
    print(summary_line(report))
    if suites_exit not in (None, 0, 5):
        print(f"compile-check: note: the suites exited {suites_exit} (their failures are the suites' report)")
    print(f"report: {out / 'compile_check.md'}")
    if args.github_summary:
        append_job_summary((out / "compile_check.md").read_text(encoding="utf-8"), force=True)
    if report["specializations"] < args.min_kernels:
        raise CompileCheckError(
            f"only {report['specializations']} kernel specializations were dumped to {dump}, "
            f"--min-kernels wants {args.min_kernels}"
        )
    return 0 if report["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    """`python -m harness.checks.compile_check --worker REQUEST RESULT`: one compile worker (started by
    `compile_all`). The verb itself is `python -m harness compile-check`."""
    from harness.exc import UsageError, guarded

    argv = list(sys.argv[1:] if argv is None else argv)

    def run() -> int:
        if argv[:1] != ["--worker"] or len(argv) != 3:
            raise UsageError(
                "this module runs one compile worker (--worker REQUEST RESULT); "
                "the verb is `python -m harness compile-check`"
            )
        return worker(Path(argv[1]), Path(argv[2]))

    return guarded("compile-check", run)


if __name__ == "__main__":
    sys.exit(main())
