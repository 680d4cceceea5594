"""Cold, warm and autotuned compile times of model cases, each in fresh processes.

    python -m harness.bench.models.warmcache --only PATTERNS [--compilers kiln,inductor] [--profile gpu]
                                      [--device cuda] [--no-autotune] [--budget-s S] [--json P] [--md P]

Terms, per case and compiler (every number from a fresh subprocess: the model tier's compile probe,
`model_run.probe_command`, which times 3 first steps against 3 steady ones):
- *cold*: empty caches (new folders for every lasting compiler cache: Triton's, Inductor's, kiln's kernels,
  graph and front caches, autotune choices, and XDG_CACHE_HOME; `model_run.probe_env`);
- *warm*: a second process on the same cache folders (kiln: the graph cache and Triton's kernels on disk;
  Inductor: its FX graph and AOTAutograd caches);
- *autotuned*: new empty caches with autotuning on (kiln: `KILN_AUTOTUNE=1`; Inductor:
  `TORCHINDUCTOR_MAX_AUTOTUNE=1`), then *autotuned warm*: a second process on those caches (no timing is
  expected: choices are cached on disk);
- *step*: the median of the probe's 3 steady steps, of the warm process (heuristic configs) and of the
  autotuned warm one: a rough side-by-side, not the model tier's measured step time (the two processes run
  minutes apart, so whatever else loads the host then moves host-bound steps; the model tier's arm
  ``kiln-autotune`` measures the gain side by side, interleaved, in one process).

The model tier calls `measure` for its `--compile-times` compilers (with autotuning for `--autotune-times`;
`autotune_times` turns that into its results' `meta.autotune`) and `report_lines` for its
report; `harness/bench/models/warmcache.py` is the command line (`ci/device_check.sh warmcache`: 2-3 rows, kiln and
Inductor side by side).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import arms
from harness.bench.core.records import AutotuneTimes, Result
from harness.bench.core.stats import geomean

#: environment that turns autotuning on, per compiler backend
AUTOTUNE_ENV: dict[str, dict[str, str]] = {
    arms.KILN: {"KILN_AUTOTUNE": "1"},
    arms.INDUCTOR: {"TORCHINDUCTOR_MAX_AUTOTUNE": "1"},
}


@dataclass
class CompileTimes:
    """One case under one compiler; seconds, None where not measured (``error`` says why)."""

    case: str
    compiler: str
    cold_s: float | None = None
    warm_s: float | None = None
    autotune_s: float | None = None
    autotune_warm_s: float | None = None
    step_s: float | None = None
    autotune_step_s: float | None = None
    error: str = ""  # the cold and warm probes' ("cold: ...; warm: ...")
    autotune_error: str = ""  # the autotuned probes'
    breakdown: dict[str, float] = field(default_factory=dict)  # the cold probe's ``phase_breakdown``
    counts: dict[str, float] = field(default_factory=dict)  # the cold probe's ``compile_counts`` (kiln)

    @property
    def problems(self) -> str:
        """Every probe's error, one line ('' when none)."""
        return "; ".join(e for e in (self.error, self.autotune_error) if e)


def autotune_env(compiler: str) -> dict[str, str] | None:
    """The variables that autotune ``compiler``'s backend, or None (eager, unknown backends)."""
    arm = arms.ARMS.get(compiler)
    backend = arm.backend if arm is not None else compiler
    return AUTOTUNE_ENV.get(backend) if backend is not None else None


@dataclass
class Probe:
    """How to run one compile probe of one case and compiler (the model tier's, ``model_run.compile_probe``):
    its command, the environment for a cache folder, the tag of its JSON line, where to run it, its limit."""

    command: list[str]
    environ: Callable[[Path], dict[str, str]]
    tag: str
    cwd: str
    timeout_s: float
    cpus: tuple[int, ...] | None = None  # the CPUs the probe and its children may run on (None: all)


#: a Python entry that pins itself to the CPUs in argv[1] (comma-separated) and becomes the command after them:
#: every thread and child process it starts (Triton's and Inductor's compile workers) inherits the set, and
#: both compilers size their worker pools from it (``os.sched_getaffinity``)
_PIN = (
    "import os, sys; os.sched_setaffinity(0, [int(c) for c in sys.argv[1].split(',')]); "
    "os.execv(sys.argv[2], sys.argv[2:])"
)


def pinned(command: list[str], cpus: tuple[int, ...] | None) -> list[str]:
    """``command`` run on ``cpus`` only (unchanged when None)."""
    if cpus is None:
        return list(command)
    return [sys.executable, "-c", _PIN, ",".join(map(str, cpus)), *command]


def cpu_slices(jobs: int, cpus: tuple[int, ...] | None = None) -> list[tuple[int, ...]]:
    """This process's CPUs (or ``cpus``) split into ``jobs`` disjoint, contiguous, nearly equal sets, one per
    concurrent probe (ValueError unless 1 <= ``jobs`` <= the number of CPUs)."""
    have = tuple(sorted(cpus if cpus is not None else os.sched_getaffinity(0)))
    if not 1 <= jobs <= len(have):
        raise ValueError(f"{jobs} compile jobs need 1 to {len(have)} CPUs each holding one")
    size, extra = divmod(len(have), jobs)
    out, start = [], 0
    for j in range(jobs):
        n = size + (1 if j < extra else 0)
        out.append(have[start : start + n])
        start += n
    return out


def probe(p: Probe, environ: dict[str, str]) -> dict[str, Any]:
    """The JSON line of one compile probe (``compile_s``, ``steady_s``...), or ``{"error": one line}``."""
    try:
        done = subprocess.run(
            pinned(p.command, p.cpus),
            env=environ,
            cwd=p.cwd,
            capture_output=True,
            text=True,
            timeout=p.timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"probe took longer than {p.timeout_s:.0f}s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(p.tag):
            return json.loads(line[len(p.tag) :])
    tail = [ln.strip() for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
    return {"error": f"probe exit {done.returncode}: {tail[-1][:200] if tail else 'no output'}"}


def _pair(p: Probe, extra: dict[str, str], second: bool = True) -> tuple[dict, dict]:
    """(first, second) probe in two fresh processes sharing new, initially empty cache folders (without
    ``second``: the first alone, and ``{}``)."""
    folder = Path(tempfile.mkdtemp(prefix="kiln-compile-times-"))
    try:
        environ = {**p.environ(folder), **extra}
        first = probe(p, environ)
        if "error" in first or not second:
            return first, {}
        return first, probe(p, environ)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def measure(case: str, compiler: str, p: Probe, autotune: bool = True, warm: bool = True) -> CompileTimes:
    """Cold and (with ``warm``) warm, then (when ``autotune`` and the compiler can) autotuned cold and warm
    compile s. Without ``warm`` the step s is the cold probe's steady step."""
    out = CompileTimes(case, compiler)
    first, second = _pair(p, {}, second=warm)
    out.cold_s, out.warm_s, out.step_s = (
        first.get("compile_s"),
        second.get("compile_s"),
        (second if warm else first).get("steady_s"),
    )
    out.error = _errors((("cold", first), ("warm", second)) if warm else (("cold", first),))
    out.breakdown = dict(first.get("breakdown") or {})
    out.counts = dict(first.get("counts") or {})
    if out.breakdown and out.cold_s is not None:
        out.breakdown["other"] = round(max(0.0, out.cold_s - sum(out.breakdown.values())), 3)
    if not out.error and not_cold(compiler, out.breakdown):
        out.error = f"cold: {NOT_COLD}"
    extra = autotune_env(compiler)
    if autotune and extra is not None and not out.error:
        first, second = _pair(p, extra)
        out.autotune_s, out.autotune_warm_s = first.get("compile_s"), second.get("compile_s")
        out.autotune_step_s = second.get("steady_s")
        out.autotune_error = _errors((("autotuned", first), ("autotuned warm", second)))
    return out


#: the cold probe's problem when kiln compiled nothing (its seconds are kept, flagged)
NOT_COLD = "kiln's graphs came from a cache (AOTAutograd never ran): not a cold compile"


def not_cold(compiler: str, breakdown: dict[str, float]) -> bool:
    """True when a kiln arm's cold probe has a phase breakdown without ``aot_autograd``: every graph kiln
    compiles passes through AOTAutograd, so its absence means the graph and front caches answered (a cache
    folder the probe did not own)."""
    return bool(breakdown) and arms.is_kiln(compiler) and "aot_autograd" not in breakdown


def _errors(pair: tuple[tuple[str, dict], ...]) -> str:
    """The first failed probe of a pair as ``what: error`` ('' when both gave compile seconds; the second of a
    pair does not run after a failed first)."""
    for what, d in pair:
        if "error" in d or "compile_s" not in d:
            return f"{what}: {d.get('error', 'no result')}"
    return ""


def autotune_times(t: CompileTimes) -> AutotuneTimes:
    """The model tier's autotuned compile times (``Result.meta.autotune``) from one case and compiler's
    ``measure``: autotuned compile s (cold, warm) and the probes' steady step s with heuristic and autotuned
    configs."""
    return AutotuneTimes(t.autotune_s, t.autotune_warm_s, t.step_s, t.autotune_step_s, t.autotune_error)


def _f(x: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if x is None else fmt.format(x)


def table(rows: list[CompileTimes]) -> list[str]:
    """A Markdown table of ``rows``, with the autotuned step gain (heuristic step / autotuned step)."""
    head = (
        "| case | compiler | cold s | warm s | warm/cold | autotuned s | autotuned warm s | step ms | "
        "autotuned step ms | gain |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = r.warm_s / r.cold_s if r.cold_s and r.warm_s is not None else None
        gain = r.step_s / r.autotune_step_s if r.step_s and r.autotune_step_s else None
        lines.append(
            f"| {r.case} | {r.compiler} | {_f(r.cold_s)} | {_f(r.warm_s)} | {_f(ratio, '{:.0%}')} | "
            f"{_f(r.autotune_s)} | {_f(r.autotune_warm_s)} | {_f(r.step_s and r.step_s * 1e3, '{:.2f}')} | "
            f"{_f(r.autotune_step_s and r.autotune_step_s * 1e3, '{:.2f}')} | {_f(gain, '{:.3f}')} |"
        )
    gains = [r.step_s / r.autotune_step_s for r in rows if r.step_s and r.autotune_step_s]
    by: dict[str, list[float]] = {}
    for r in rows:
        if r.step_s and r.autotune_step_s:
            by.setdefault(r.compiler, []).append(r.step_s / r.autotune_step_s)
    if gains:
        lines += [""] + [
            f"- autotuned step gain, geomean over {len(g)} rows: {c} {geomean(g) or 0:.3f}"
            for c, g in by.items()
        ]
    errors = [f"- {r.case} {r.compiler}: {r.problems}" for r in rows if r.problems]
    goal_lines = goals(rows)
    return lines + ([""] + goal_lines if goal_lines else []) + ([""] + errors if errors else [])


#: the compile goals: kiln's warm compile at most Inductor's warm compile and at most this share of its cold
WARM_SHARE = 0.25


def goals(rows: list[CompileTimes], compiler: str = arms.KILN, peer: str = arms.INDUCTOR) -> list[str]:
    """Which of the compile goals hold, row by row and counted (rows where a number is missing are left out of
    that goal): ``compiler``'s warm compile <= ``peer``'s warm compile of the same case, <= ``WARM_SHARE`` of its
    own cold compile; its autotuned step no slower than its heuristic step (gain >= 1; *probes*: one step
    median from each of two processes minutes apart, a rough reading: ``autotune_gain`` judges this goal on the
    model tier's side-by-side arms); its second autotuned compile no dearer than its warm compile."""
    mine = {r.case: r for r in rows if r.compiler == compiler}
    theirs = {r.case: r for r in rows if r.compiler == peer}
    checks: dict[str, list[tuple[str, bool]]] = {
        "warm <= peer warm": [],
        f"warm <= {WARM_SHARE:.0%} of cold": [],
        "autotuned step >= heuristic (probes)": [],
        "autotuned warm <= warm": [],
    }
    for case, r in mine.items():
        p = theirs.get(case)
        if r.warm_s is not None and p is not None and p.warm_s is not None:
            checks["warm <= peer warm"].append((case, r.warm_s <= p.warm_s))
        if r.warm_s is not None and r.cold_s:
            checks[f"warm <= {WARM_SHARE:.0%} of cold"].append((case, r.warm_s <= WARM_SHARE * r.cold_s))
        if r.step_s and r.autotune_step_s:
            checks["autotuned step >= heuristic (probes)"].append((case, r.autotune_step_s <= r.step_s))
        if r.autotune_warm_s is not None and r.warm_s is not None:
            checks["autotuned warm <= warm"].append((case, r.autotune_warm_s <= r.warm_s))
    out = []
    for name, got in checks.items():
        if got:
            missed = [c for c, ok in got if not ok]
            out.append(
                f"- goal {name.replace('peer', peer)} ({compiler}): {len(got) - len(missed)}/{len(got)} rows"
                + (f"; not on {', '.join(missed)}" if missed else "")
            )
    return out


def report_lines(results: list[Result]) -> list[str]:
    """The model tier report's section for results carrying ``meta.autotune`` (none: no lines)."""
    rows = [
        CompileTimes(
            r.workload,
            r.compiler,
            r.compile_s,
            r.meta.compile_warm_s,
            a.cold_s,
            a.warm_s,
            a.step_s,
            a.autotune_step_s,
            autotune_error=a.error,
        )
        for r in results
        if (a := r.meta.autotune) is not None
    ]
    if not rows:
        return []
    return ["### Compile times: cold, warm, autotuned (fresh processes)", "", *table(rows), ""]


# ------------------------------------------------------------------ cold compile per phase
#: Dynamo's timers (``torch._dynamo.utils.compilation_time_metrics``) the breakdown reads
DYNAMO_TOTAL = "_compile.compile_inner"
BACKEND_TOTAL = "OutputGraph.call_user_compiler"

#: kiln's phases (``compiler.phase_times``) reported as their own columns; ``pass.*`` are summed as ``passes``
KILN_COLUMNS = ("aot_autograd", "front_cache", "graph", "kernel_load", "triton_compile", "autotune")


#: kiln's compile counters (``compiler.runtime.compile_stats()``) a cold probe reports beside its phases
COMPILE_COUNTS = (
    "compiled",  # kernel specializations compiled from scratch (in workers or at a first launch)
    "worker_compiles",  # of those, in compile workers
    "submitted",  # ahead-of-time requests sent to the workers
    "worker_misses",  # a worker's result the launch did not find (a wasted compile)
    "jit_compiles",  # first launches left to Triton's JIT
    "worker_seconds",  # CPU time of the workers' compiles, summed
    "wait_seconds",  # the main thread's wait for workers at first launches
    "graph_hits",  # graphs from kiln's graph cache (0 in a cold probe)
)


def reset_phase_timers() -> None:
    """Forget Dynamo's compile timers, kiln's phase times and its compile counters (a probe's compiled steps
    start from zero)."""
    from torch._dynamo.utils import compilation_time_metrics

    compilation_time_metrics.clear()
    import compiler.phase_times as phase_times
    from compiler.runtime import reset_compile_stats

    phase_times.reset()
    reset_compile_stats()


def compile_counts() -> dict[str, float]:
    """kiln's compile counters since ``reset_phase_timers()`` (``COMPILE_COUNTS``), in this process."""
    from compiler.runtime import compile_stats

    stats = compile_stats()
    return {k: round(float(getattr(stats, k)), 4) for k in COMPILE_COUNTS}


def phase_breakdown(kiln: bool) -> dict[str, float]:
    """Seconds per compile phase since ``reset_phase_timers()``, in this process. ``dynamo``: Dynamo's own time
    (its compile minus the backend call); kiln: ``aot_autograd`` (exclusive of kiln's graph compiles), its
    ``compiler.phase_times`` phases as ``kiln.<phase>`` (``kiln.pass.<name>`` per pass, ``kiln.triton_compile``,
    ``kiln.autotune``...) and ``backend_other`` (the backend call outside AOTAutograd and the front cache);
    other compilers: ``backend`` (the backend call: AOTAutograd and the compiler). Every phase is measured
    inside the probe's first steps, exclusive of the others: they sum to at most those steps' time."""
    from torch._dynamo.utils import compilation_time_metrics as metrics

    def total(key: str) -> float:
        return float(sum(metrics.get(key, [])))

    backend = total(BACKEND_TOTAL)
    out = {"dynamo": max(0.0, total(DYNAMO_TOTAL) - backend)}
    if not kiln:
        out["backend"] = backend
        return {k: round(v, 4) for k, v in out.items()}
    import compiler.phase_times as phase_times

    inclusive = phase_times.inclusive()
    out["backend_other"] = max(
        0.0, backend - inclusive.get("aot_autograd", 0.0) - inclusive.get("front_cache", 0.0)
    )
    for name, seconds in phase_times.totals().items():
        out["aot_autograd" if name == "aot_autograd" else f"kiln.{name}"] = seconds
    return {k: round(v, 4) for k, v in out.items()}


def _passes(b: dict[str, float]) -> list[tuple[str, float]]:
    """kiln's passes of a breakdown, slowest first."""
    return sorted(
        ((k[len("kiln.pass.") :], v) for k, v in b.items() if k.startswith("kiln.pass.")), key=lambda x: -x[1]
    )


#: the phases of a breakdown that are PyTorch's front end, which every compiler's cold compile runs
FRONT_END = ("dynamo", "aot_autograd")


def front_end_split(cold: float | None, b: dict[str, float], peer_cold: float | None) -> tuple[str, str]:
    """(front end / peer's cold, the rest / peer's cold) as table cells: a kiln cold compile over its peer's,
    split into PyTorch's front end (``FRONT_END``: Dynamo and AOTAutograd, which the peer runs inside its own
    time too) and kiln's own part (its passes, kernel compiles and everything else). The two add up to the
    cold ratio; ``-`` without a peer's cold s or without AOTAutograd in the breakdown."""
    if cold is None or not peer_cold or "aot_autograd" not in b:
        return "-", "-"
    front = sum(b.get(k, 0.0) for k in FRONT_END)
    return f"{front / peer_cold:.3f}", f"{(cold - front) / peer_cold:.3f}"


def breakdown_table(
    rows: list[tuple[str, str, float | None, dict[str, float], dict[str, float] | None]],
    peer_cold: dict[tuple[str, str], float] | None = None,
) -> list[str]:
    """A Markdown table of (case, compiler, cold s, breakdown, compile counts) rows: seconds per phase, kiln's
    passes summed with the three slowest named, kiln's kernel compiles (in workers) with the workers' summed
    seconds, and (``peer_cold``: (case, compiler) -> the cold s of that compiler's peer) the cold ratio split
    into the front end's share and kiln's own (``front_end_split``)."""
    cols = (
        "dynamo",
        "aot_autograd",
        "passes",
        *(f"kiln.{c}" for c in KILN_COLUMNS[1:]),
        "backend_other",
        "backend",
        "other",
    )
    head = (
        "| case | compiler | cold s | "
        + " | ".join(c.removeprefix("kiln.") for c in cols)
        + " | slowest passes | compiles (in workers) | worker s | front end / peer's cold | own / peer's cold |"
    )
    lines = [head, "|" + "---|" * (len(cols) + 8)]
    for case, compiler, cold, b, counts in rows:
        passes = _passes(b)
        values = {**b, "passes": sum(v for _, v in passes)} if passes else b
        cells = [_f(values.get(c), "{:.2f}") for c in cols]
        top = ", ".join(f"{n} {v:.2f}" for n, v in passes[:3]) or "-"
        made = f"{counts.get('compiled', 0):.0f} ({counts.get('worker_compiles', 0):.0f})" if counts else "-"
        worker = _f(counts.get("worker_seconds"), "{:.2f}") if counts else "-"
        front, own = front_end_split(cold, b, (peer_cold or {}).get((case, compiler)))
        lines.append(
            f"| {case} | {compiler} | {_f(cold, '{:.2f}')} | "
            + " | ".join(cells)
            + f" | {top} | {made} | {worker} | {front} | {own} |"
        )
    return lines


def cold_pairs(results: Sequence[Result]) -> dict[tuple[str, str], tuple[float, float]]:
    """(case, kiln arm) -> (that arm's cold compile s, its peer's cold compile s of the same case) for every
    kiln arm with cold seconds whose peer (`arms.peer`) has cold seconds too: the pairs of the cold ratio."""
    cold = {(r.workload, r.compiler): r.compile_s for r in results if r.compile_s is not None}
    return {
        (case, c): (s, p)
        for (case, c), s in cold.items()
        if arms.is_kiln(c) and (p := cold.get((case, arms.peer(c))))
    }


def breakdown_lines(results: list[Result]) -> list[str]:
    """The model tier report's cold-compile-per-phase section (no lines when no result carries a breakdown)."""
    rows = [
        (r.workload, r.compiler, r.compile_s, r.meta.compile_breakdown, r.meta.compile_counts)
        for r in results
        if r.meta.compile_breakdown
    ]
    if not rows:
        return []
    peers = {key: p for key, (_, p) in cold_pairs(results).items()}
    return [
        "### Cold compile per phase (s, the cold probe)",
        "",
        "Dynamo: its tracing and guards; aot_autograd: AOTAutograd without the graph compiles inside it; passes: "
        "kiln's passes (`compiler.phase_times`); graph: kiln's per-graph work outside them (graph cache); "
        "kernel_load: kernel modules imported; triton_compile: first launches' compiles, loads and waits "
        "(compiles: kernel specializations compiled, in workers; worker s: the workers' compile seconds, summed); "
        "backend_other: kiln's backend call outside AOTAutograd and the front cache; backend: another "
        "compiler's whole backend call; other: the cold compile s outside every phase "
        "(first-launch work, CUDA-graph recording, the steady-step estimate's error). Front end / peer's cold: "
        "Dynamo's and AOTAutograd's seconds over the peer compiler's cold s of the case (PyTorch's front end, which "
        "the peer runs too); own / peer's cold: the rest of kiln's cold s over the same (the two add up to the cold "
        "ratio).",
        "",
        *breakdown_table(rows, peers),
        "",
    ]
