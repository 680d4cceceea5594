"""Walk of a backend name through the harness (issue 22's yardstick): which harness functions the name
passes through, from `python -m harness run --backend cpu --native` to the end of the run.

Terms:
  stop      a call of a function defined in `harness/` that is handed the backend: an argument (not the
            receiver `self`/`cls` of a method) equal to the name, or an object whose `name` or `backend`
            attribute is it (a Backend, a record, a state).
  entry     a stop in a module other than the previous stop's module.
  climb     an entry into a module the walk had already left once (a walk that reads as a pipeline visits each
            module in one stretch: climbs = entries - modules).
Usage: python ci/walk_backend.py TREE [--json OUT]   (TREE: a checkout whose harness/ is walked; its own
ci/matrix.json is used, with one planted suite of two tests, run natively without health checks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r'''
import json, os, sys
tree = sys.argv[1]; out = sys.argv[2]
sys.path.insert(0, tree)
NAME = "cpu"
stops = []
def carries(v):
    try:
        if isinstance(v, str):
            return v == NAME
        return getattr(v, "name", None) == NAME or getattr(v, "backend", None) == NAME
    except Exception:
        return False
hdir = os.path.join(tree, "harness") + os.sep
def prof(frame, event, arg):
    if event != "call":
        return
    code = frame.f_code
    if not code.co_filename.startswith(hdir):
        return
    loc = frame.f_locals
    if any(carries(loc[n]) for n in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount] if n in loc and n not in ('self', 'cls')):
        mod = os.path.relpath(code.co_filename, tree)
        stops.append([mod, code.co_qualname if hasattr(code, "co_qualname") else code.co_name])
from harness.__main__ import main
sys.setprofile(prof)
try:
    rc = main(["run", "--backend", NAME, "--native", "--no-health", "--quiet"])
finally:
    sys.setprofile(None)
json.dump({"rc": rc, "stops": stops}, open(out, "w"))
'''

PLANTED = "def test_one():\n    assert 1 + 1 == 2\n\n\ndef test_two():\n    assert [1] * 2 == [1, 1]\n"


def walk(tree: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="kiln-walk-") as tmp:
        root = Path(tmp) / "proj"
        (root / "ci").mkdir(parents=True)
        data = json.loads((tree / "ci" / "matrix.json").read_text())
        data["suites"] = ["alpha"]
        (root / "ci" / "matrix.json").write_text(json.dumps(data))
        (root / "tests" / "alpha").mkdir(parents=True)
        (root / "tests" / "alpha" / "test_alpha.py").write_text(PLANTED)
        env = {**os.environ, "KILN_ROOT": str(root), "KILN_RESULTS": str(root / "results"),
               "PYTHONPATH": str(tree), "XDG_DATA_HOME": str(Path(tmp) / "xdg"), "HOME": str(Path(tmp) / "home")}
        for k in ("KILN_NATIVE", "KILN_HISTORY_DB"):
            env.pop(k, None)
        out = Path(tmp) / "walk.json"
        proc = subprocess.run([sys.executable, "-c", CHILD, str(tree), str(out)], cwd=root, env=env,
                              capture_output=True, text=True, timeout=600)
        if not out.exists():
            raise SystemExit(f"walk failed in {tree}: {proc.stderr[-2000:]}")
        got = json.loads(out.read_text())
    stops = got["stops"]
    entries: list[str] = []
    for mod, _ in stops:
        if not entries or entries[-1] != mod:
            entries.append(mod)
    modules = sorted(set(entries))
    per_module = {m: entries.count(m) for m in modules}
    return {"tree": str(tree), "rc": got["rc"], "stops": len(stops), "modules": len(modules),
            "entries": len(entries), "climbs": len(entries) - len(modules),
            "entries_per_module": dict(sorted(per_module.items(), key=lambda kv: (-kv[1], kv[0]))),
            "path": entries, "calls": stops}


def main() -> int:
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    result = walk(Path(args[0]).resolve())
    if "--json" in args:
        Path(args[args.index("--json") + 1]).write_text(json.dumps(result, indent=1))
    top = ", ".join(f"{m} x{n}" for m, n in list(result["entries_per_module"].items())[:5])
    print(f"{result['tree']}: rc {result['rc']}, {result['stops']} stops in {result['modules']} modules, "
          f"{result['entries']} entries, {result['climbs']} climbs back up; most entered: {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
