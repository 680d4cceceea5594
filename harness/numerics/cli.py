"""Command line: `python -m harness numerics run|compare|gpu|trace-diff ...` (also `nox -s numerics -- ...`).

Exit codes: 0 fine; 1 a compiler failed during `run`, `compare --check` found a side further from fp64
than the bound, or `trace-diff` found a launch whose outputs diverge; 2 bad input, incomplete/corrupt run
folders or traces, or runs or traces that cannot be compared (one line).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import string
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import arms

from .comparison import Check
from .exc import NoDevice, NotComparable, NumericsError, RunFolderError

if TYPE_CHECKING:
    from .compare import Side
    from .comparison import Comparison
    from .store import RunFolder


class _Later:
    """A module of this package imported on first use: capture, compare, report, program and store import
    torch, and `numerics --help` must not need it."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        import importlib

        return getattr(importlib.import_module(self._name, __package__), attr)


cap, cmp, rep, td, _program, _store = (
    _Later(f".{m}") for m in ("capture", "compare", "report", "trace_diff", "program", "store")
)
TIER = "numerics"  # capture.TIER, the arms tier this triage runs
DEFAULT_COMPILERS = arms.default(TIER)


def _add_run_options(p: argparse.ArgumentParser, compilers: str) -> None:
    p.add_argument(
        "--compilers", default=compilers, help=f"comma-separated, of {', '.join(arms.names(TIER))}"
    )
    p.add_argument("--repeat", type=int, default=1, help="executions per compiler (2: run-to-run check)")
    p.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    p.add_argument("--device", default="auto", help="auto (GPU when present), cpu, cuda, cuda:N")
    p.add_argument(
        "--full-max",
        type=int,
        default=None,
        help="outputs up to this many elements are saved whole (default: store.FULL_MAX)",
    )
    p.add_argument(
        "--sample", type=int, default=None, help="elements saved of a larger output (default: store.SAMPLE)"
    )


def _add_compare_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--baseline", help="side label (A, B...) or compiler paired with every other side (default: A)"
    )
    p.add_argument("--rtol", type=float, help="relative tolerance (default per dtype; bf16 1.6e-2)")
    p.add_argument("--atol", type=float, help="absolute tolerance (default per dtype; bf16 1.6e-2)")
    p.add_argument("--top", type=int, default=8, help="worst elements listed per pair")
    p.add_argument(
        "--check", action="store_true", help="exit 1 when a side is further from fp64 than the bound"
    )
    p.add_argument(
        "--ratio",
        type=float,
        default=2.0,
        help="--check bound: max error <= RATIO x the closest side's max error + 1 ULP (default 2)",
    )
    p.add_argument("--max-ulp", type=float, help="--check bound: max ULP error of every side")
    p.add_argument(
        "--reference",
        choices=["compute", "stored"],
        default="compute",
        help="fp64 reference: compute it from the program (default) or use one stored with the run",
    )
    p.add_argument("--md", type=Path, help="write the Markdown report here (default: print it)")
    p.add_argument("--json", type=Path, help="write the JSON report here")
    p.add_argument("--plot", type=Path, help="write a PNG of the error histograms here (needs matplotlib)")


def cli_add_arguments(ap: argparse.ArgumentParser) -> None:
    sub = ap.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = sub.add_parser("run", help="run a program under several compilers and save its outputs")
    p.add_argument("program", help="module.path:function, a built-in name, numerics:NAME[DTYPE] or FILE.pt2")
    p.add_argument(
        "--out", type=Path, help="run folder to create (default results/numerics/<program>-<time>)"
    )
    p.add_argument("--inputs", action="append", help="input spec 'x:bf16[8,64] randn ...' (repeat, in order)")
    p.add_argument("--no-backward", action="store_true", help="forward outputs only")
    _add_run_options(p, DEFAULT_COMPILERS)
    p = sub.add_parser("compare", help="compare saved runs with each other and with fp64")
    p.add_argument(
        "sides",
        nargs="+",
        metavar="RUN[:COMPILER,...]",
        help="run folders (every side in it), FOLDER:COMPILER, suite save folders, harness results",
    )
    p.add_argument("--out", type=Path, help="write report.md, report.json and report.png into this folder")
    _add_compare_options(p)
    p = sub.add_parser(
        "gpu", help="the bf16 attention block and LayerNorm+GELU MLP under every compiler, report"
    )
    p.add_argument("--out", type=Path, required=True, help="folder for the runs and report.md/json/png")
    p.add_argument("--programs", default="attention,mlp", help="comma-separated built-in programs")
    _add_run_options(p, arms.default(TIER, eager_first=True))
    p.set_defaults(repeat=2)
    p = sub.add_parser(
        "trace-diff",
        help="two value traces (KILN_TRACE_VALUES=1): the first kernel launch whose "
        "outputs diverge, with its source (exit 1 when one does)",
    )
    p.add_argument("traces", nargs=2, type=Path, metavar="TRACE", help="trace files (.jsonl), A then B")
    p.add_argument(
        "--rtol",
        type=float,
        help="relative tolerance for every dtype (default per dtype: fp32 1e-4, "
        "fp16 4e-3, bf16 3.2e-2, fp64 1e-9, integers exact), scaled per statistic (see trace_diff.py)",
    )
    p.add_argument("--atol", type=float, default=0.0, help="absolute tolerance added (default 0)")
    p.add_argument(
        "--allow-source-diff",
        action="store_true",
        help="compare launches whose kernel sources or output dtypes differ (a setting that changes "
        "codegen, an fp64-upcast run); shapes must still match",
    )
    p.add_argument("--dump-dir", type=Path, help="a KILN_DUMP_DIR folder: kernel sources a trace lacks")
    p.add_argument("--json", type=Path, help="write the result as JSON here")


def _say(line: str) -> None:
    print(line, flush=True)


def _env() -> dict[str, Any] | None:
    from harness import envinfo

    try:
        return envinfo.capture()
    except Exception as e:  # noqa: BLE001 - the record is best effort; the run's data is not
        return {"error": f"{type(e).__name__}: {e}"}


def run_program(
    ref: str,
    out: Path,
    compilers: list[str],
    repeat: int = 1,
    seed: int = 0,
    device: str = "auto",
    inputs: list[str] | None = None,
    backward: bool = True,
    full_max: int | None = None,
    sample: int | None = None,
) -> tuple[Path, list[str]]:
    """Capture and save one program; returns (run folder, failed compilers)."""
    if repeat < 1:
        raise NumericsError("--repeat must be at least 1")
    comps = [cap.standard(c.strip()) for c in compilers if c.strip()]
    if any(c.kiln for c in comps):
        import compiler

        compiler.register()  # first: it picks the Triton interpreter before anything imports triton
    prog = _program.resolve(ref, inputs)
    prog.backward = prog.backward and backward
    device = cap.resolve_device(device)
    cpu_inputs, cots, sides = cap.capture(prog, comps, seed, device, repeat, progress=_say)
    _store.save_run(
        out,
        prog,
        seed,
        device,
        cpu_inputs,
        cots,
        sides,
        _env(),
        _store.FULL_MAX if full_max is None else full_max,
        _store.SAMPLE if sample is None else sample,
    )
    return out, [s.compiler for s in sides if s.error]


def _split(arg: str) -> tuple[Path, list[str] | None]:
    p = Path(arg)
    if p.exists() or ":" not in arg:
        return p, None
    path, _, comps = arg.rpartition(":")
    return Path(path), [c for c in comps.split(",") if c]


def _sides_of(run: RunFolder, comps: list[str] | None, left_out: list[str]) -> list[tuple[RunFolder, str]]:
    if comps:
        for c in comps:
            run.side(c)
        return [(run, c) for c in comps]
    out = []
    for s in run.sides:
        if s.error:
            left_out.append(f"{run.path}:{s.compiler} failed: {s.error}")
        else:
            out.append((run, s.compiler))
    return out


def build_cases(args: list[str]) -> tuple[list[tuple[str, list[Side], list[str]]], list[str]]:
    """(case name, labelled sides, left-out notes) per program compared, and notes on unmatched cases."""
    specs = [(_split(a), _store.find_runs(_split(a)[0])) for a in args]
    collections = [len(runs) > 1 or (runs[0] != path) for (path, _), runs in specs]
    notes: list[str] = []
    if any(collections) and not all(collections):
        raise NotComparable("compare either run folders or suite save folders, not one with the other")
    if not any(collections):
        groups = [("", [(_store.RunFolder(path), comps) for (path, comps), _ in specs])]
    else:
        names = [{r.name: r for r in runs} for _, runs in specs]
        common = sorted(set.intersection(*(set(n) for n in names)))
        for (path, _), n in zip(specs, names):
            only = sorted(set(n) - set(common))
            if only:
                notes.append(f"{len(only)} case(s) only in {path}: {', '.join(only[:10])}")
        if not common:
            raise NotComparable("the suite folders share no case")
        groups = [
            (c, [(_store.RunFolder(n[c]), comps) for ((_, comps), _), n in zip(specs, names)]) for c in common
        ]
    cases = []
    for case, runs in groups:
        left_out: list[str] = []
        try:
            pairs = [s for run, comps in runs for s in _sides_of(run, comps, left_out)]
        except RunFolderError as e:
            if not case:
                raise
            notes.append(f"case {case} left out: {e}")  # e.g. a case run under kiln-emulate only
            continue
        labels = _labels(len(pairs))
        cases.append((case, [cmp.Side(lab, run, c) for lab, (run, c) in zip(labels, pairs)], left_out))
    return cases, notes


def _labels(n: int) -> list[str]:
    letters = string.ascii_uppercase
    return [letters[i] if n <= 26 else f"S{i + 1}" for i in range(n)]


def _baseline(sides: list[Side], name: str | None) -> int:
    if not name:
        return 0
    for i, s in enumerate(sides):
        if name in (s.label, s.compiler):
            return i
    raise NumericsError(
        f"--baseline {name!r} names no side ({', '.join(f'{s.label}={s.compiler}' for s in sides)})"
    )


def compare_cli(args: argparse.Namespace, groups: list[list[str]]) -> int:
    """compare: every case of every group of side arguments, then one report; exit code 1 when --check failed."""
    cases, notes = [], []
    for group in groups:
        c, n = build_cases(group)
        cases += c
        notes += n
    compared: list[Comparison] = []
    for case, sides, left_out in cases:
        for note in left_out:
            _say(f"note: left out {note}")
        r = cmp.compare(
            sides, _baseline(sides, args.baseline), args.rtol, args.atol, args.top, args.reference
        )
        compared.append(dataclasses.replace(r, case=case, left_out=left_out))
    per_report = [cmp.check(r, args.ratio, args.max_ulp) for r in compared]
    failures = [f"{r.program.ref} {f}" for r, fs in zip(compared, per_report) for f in fs]
    check = Check(args.ratio, args.max_ulp, failures) if args.check else None
    reports = [
        dataclasses.replace(r, check=None if check is None else dataclasses.replace(check, failures=fs))
        for r, fs in zip(compared, per_report)
    ]
    text = rep.markdown_many(reports, f"Numerics: {len(reports)} programs compared")
    if notes:
        text += "\n" + "\n".join(f"- note: {n}" for n in notes) + "\n"
    md, js, png = args.md, args.json, args.plot
    if getattr(args, "out", None):
        md, js = md or args.out / "report.md", js or args.out / "report.json"
        png = png or args.out / "report.png"
    if md:
        rep.write_text(md, text)
    if js:
        rep.write_json(js, reports, check)
    if png:
        try:
            rep.plot(png, reports)
        except NumericsError as e:
            if args.plot:
                raise
            _say(f"note: {e}")
            png = None
    if not md:
        sys.stdout.write(text)
    for line in rep.verdict_lines(reports):
        _say(line)
    _say("wrote " + ", ".join(str(p) for p in (md, js, png) if p) if (md or js or png) else "")
    if args.check and failures:
        for f in failures:
            _say(f"check failed: {f}")
        return 1
    return 0


def cli_main(args: argparse.Namespace) -> int:
    """Numerics triage: run a program under several compilers, compare runs against fp64."""
    if args.action == "run":
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        out = args.out or Path("results") / "numerics" / f"{_store.safe_name(args.program)}-{stamp}"
        path, failed = run_program(
            args.program,
            out,
            args.compilers.split(","),
            args.repeat,
            args.seed,
            args.device,
            args.inputs,
            not args.no_backward,
            args.full_max,
            args.sample,
        )
        _say(f"wrote {path}" + (f"; failed: {', '.join(failed)}" if failed else ""))
        return 1 if failed else 0
    if args.action == "compare":
        return compare_cli(args, [args.sides])
    if args.action == "trace-diff":
        return trace_diff_cli(args)
    return gpu(args)


def trace_diff_cli(args: argparse.Namespace) -> int:
    """trace-diff: exit 0 when every aligned launch agrees within tolerance, 1 at the first that does not."""
    a, b = (td.load(p) for p in args.traces)
    res = td.diff(a, b, args.rtol, args.atol, args.allow_source_diff)
    sys.stdout.write(td.render(res, args.dump_dir))
    if args.json:
        rep.write_text(args.json, json.dumps(res.to_json(), indent=1, sort_keys=True) + "\n")
    return 0 if res.first is None else 1


def gpu(args: argparse.Namespace) -> int:
    """The GPU command: each program under every compiler (repeat 2), then one report over all of them."""
    device = cap.resolve_device(args.device)
    if (
        device == "cpu" and args.device == "auto"
    ):  # the GPU-size programs under the interpreter: minutes, not asked for
        raise NoDevice(
            "no GPU found: `numerics gpu` runs GPU-size programs (on a CPU, through the Triton interpreter, "
            "about 7 min on 2 cores); `--device cpu` runs them here anyway, `numerics run PROGRAM` one at a "
            "time"
        )
    if device == "cpu":
        _say("note: running the GPU-size programs on the CPU (kiln through the Triton interpreter: slow)")
    runs = []
    for name in [p.strip() for p in args.programs.split(",") if p.strip()]:
        path = args.out / "runs" / _store.safe_name(name)
        if (path / "manifest.json").exists():
            raise RunFolderError(f"{path} exists: give gpu a new --out folder")
        run_program(
            name,
            path,
            args.compilers.split(","),
            args.repeat,
            args.seed,
            device,
            None,
            True,
            args.full_max,
            args.sample,
        )
        runs.append(str(path))
    ns = argparse.Namespace(
        baseline="eager",
        rtol=None,
        atol=None,
        top=8,
        check=False,
        ratio=2.0,
        max_ulp=None,
        reference="compute",
        md=None,
        json=None,
        plot=None,
        out=args.out,
    )
    return compare_cli(ns, [[r] for r in runs])
