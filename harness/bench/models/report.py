"""Reports of the model tier over everything stored for one profile (every chunk of a run folder).

The four numbers of PyTorch's compiler dashboard, per compiler: pass rate (accuracy checks passed / cases
run), geomean speedup over eager (passing cases), compile time (mean cold and warm seconds) and memory
compression ratio (geomean of eager peak / compiler peak, GPU only); plus the geomean of Inductor step time /
kiln step time over cases both pass (> 1: kiln is faster), and the same for their CUDA-graph modes.

Which results: runs of profile `models-<profile>` on the device of the newest such run; per case, every
compiler's result from the newest run that measured the case, and compilers that run lacks from older runs
with the same source hash. Results of interrupted runs count (each result is committed whole); their runs
are listed with their status. Compile times (`compile_s`, `meta.compile_warm_s`) come from the newest run
that measured them for the case's source hash: a step run with probes, or a `--compile-only` run (results of
phase "compile", which carry no step samples and only ever fill in those two numbers).

Memory (`model_memory.py`): a ratio is taken only between results measured with the same definition (results
stored before the current one are `window-v1`: recording left out); the report says what is counted. GPU runs
also carry kernel ms per step (profiled) and, for kiln arms, the ATen fallback ops and the graphs that ran
unrecorded under CUDA graphs with the reason (`meta.kiln_graphs`).
"""

from __future__ import annotations

import collections
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import arms, conventions
from harness.bench.core.host_load import busy_note
from harness.bench.core.records import COMPILE_PHASE, Result, RunInfo, Verdict, by_case, passed
from harness.bench.core.stats import geomean
from harness.bench.judge.compare import Comparison
from harness.bench.models import autotune_gain
from harness.bench.models import catalog as mdl
from harness.bench.models import memory as model_memory
from harness.bench.models.compile_times import cold_pairs
from harness.bench.models.step_facts import unrecorded_lines
from harness.bench.reports.report import (
    INTERPRETER_NOTE,
    PlotUnavailable,
    Table,
    comparison_table,
    counts_line,
    interpreted,
    latency_cell,
    markdown,
    pyplot,
    save_figure,
    terminal,
    text_bars,
)
from harness.bench.stores.store import Store
from harness.exc import UsageError
from harness.results import append_job_summary, atomic_write_text

BASELINE = arms.EAGER
ORDER = tuple(arms.default("model", eager_first=True).split(","))
# (numerator, denominator) of the step ratio: each kiln arm's peer and the kiln arm; with the autotuned arm
# (asked for by name), kiln over it: the autotuning gain, measured side by side in one run
PAIRS = tuple((arms.peer(c), c) for c in ORDER if arms.is_kiln(c)) + ((arms.KILN, arms.KILN_AUTOTUNE),)


# ------------------------------------------------------------------ selection
def collect(store: Store, profile: str) -> tuple[list[RunInfo], list[Result], list[str], list[Result]]:
    """(runs used, newest first; results in registry order; notes; compile-only results: the newest compile
    measurement of each (case, compiler) that has no step result at all, in registry order) — see module
    docstring."""
    runs = [r for r in store.runs() if r.profile == f"models-{profile}"]
    if not runs:
        raise UsageError(
            f"no {profile} model runs in {store.path} (run `python -m harness bench models` first)"
        )
    device = runs[0].device_name
    notes = []
    others = [r for r in runs if r.device_name != device]
    if others:
        notes.append(f"runs {', '.join(str(r.id) for r in others)} ran on another device and are left out")
    runs = [r for r in runs if r.device_name == device]
    chosen: dict[str, dict[str, Result]] = {}
    used: dict[int, RunInfo] = {}
    for run in runs:  # newest first
        per_case: dict[str, list[Result]] = {}
        for r in store.results(run.rid):
            per_case.setdefault(r.workload, []).append(r)
        for w, group in per_case.items():
            have = chosen.setdefault(w, {})
            want = next(iter(have.values())).source_hash if have else group[0].source_hash
            for r in group:
                if r.compiler not in have and r.source_hash == want:
                    r.meta.run_id = run.id
                    have[r.compiler] = r
                    used[run.rid] = run
    merge_notes, alone = _merge_compile_times(store, runs, chosen, used)
    notes += merge_notes
    order: dict[str, int] = {}
    for device in ("cuda", "cpu"):
        for i, c in enumerate(mdl.all_cases(profile, device)):
            order.setdefault(c.name, i)
    names = sorted(chosen, key=lambda w: (order.get(w, 10**6), w))
    results = [r for w in names for r in sorted(chosen[w].values(), key=lambda r: _rank(r.compiler))]
    alone.sort(key=lambda r: (order.get(r.workload, 10**6), r.workload, _rank(r.compiler)))
    for run in runs:
        for case, why in (run.config.get("skipped") or {}).items():
            line = f"{case}: skipped ({why})"
            if case not in chosen and line not in notes:
                notes.append(line)
        for n in run.config.get("notes") or []:
            if n not in notes:
                notes.append(n)
    skipped = {case for run in runs for case in (run.config.get("skipped") or {})}
    compiled = {r.workload for r in alone}
    missing = [
        c.name
        for c in mdl.all_cases(profile, runs[0].device)
        if c.name not in chosen and c.name not in skipped and c.name not in compiled
    ]
    if missing:
        notes.append(f"not measured here yet: {', '.join(missing)} (`--only` them, or `--resume`)")
    for r in results:
        busy = busy_note(r.workload.removeprefix(mdl.PREFIX), r.compiler, r.meta.host_load)
        if busy:
            notes.append(busy)
    return [r for r in runs if r.id in used], results, notes, alone


def _merge_compile_times(
    store: Store, runs: list[RunInfo], chosen: dict[str, dict[str, Result]], used: dict[int, RunInfo]
) -> tuple[list[str], list[Result]]:
    """Put the newest compile-only measurement (see module docstring) of each chosen (case, compiler) into
    its step result when that measurement is newer than the step run. Returns notes for measurements beside
    step results of another definition (left out), and the measurements of (case, compiler) pairs with no step
    result at all: reported on their own (`compile_only_table`)."""
    notes: list[str] = []
    alone: list[Result] = []
    seen: set[tuple[str, str]] = set()
    for run in runs:  # newest first
        for r in store.results(run.rid, phase=COMPILE_PHASE):
            key = (r.workload, r.compiler)
            if key in seen:
                continue
            seen.add(key)
            step = chosen.get(r.workload, {}).get(r.compiler)
            if step is None:
                r.meta.compile_run_id = run.id
                alone.append(r)
                used[run.rid] = run
                continue
            if step.source_hash != r.source_hash:
                notes.append(
                    f"{r.workload}: compile times of {r.compiler} (run {run.id}) have no step result "
                    "of the same definition beside them; left out"
                )
                continue
            if (
                step.meta.run_id is not None and step.meta.run_id > run.rid
            ):  # the step run measured its own, later
                continue
            step.compile_s = r.compile_s
            step.meta.compile_warm_s = r.meta.compile_warm_s
            step.meta.compile_probe_error = r.meta.compile_probe_error or None
            step.meta.compile_cpus = r.meta.compile_cpus
            step.meta.compile_breakdown = r.meta.compile_breakdown
            step.meta.compile_counts = r.meta.compile_counts
            step.meta.compile_run_id = run.id
            if r.meta.autotune is not None:  # --autotune-times
                step.meta.autotune = r.meta.autotune
            used[run.rid] = run
    return notes, alone


def _interp(runs: list[RunInfo], compilers: Sequence[str]) -> frozenset:
    """Those of `compilers` with interpreter times in any of `runs` (kiln on a CPU)."""
    return frozenset().union(*(interpreted(r.device, compilers) for r in runs))


def _rank(compiler: str) -> tuple[int, str]:
    return (ORDER.index(compiler) if compiler in ORDER else len(ORDER), compiler)


def compilers_of(results: list[Result]) -> list[str]:
    return sorted({r.compiler for r in results}, key=_rank)


def _ms(ns: float | None) -> str:
    if ns is None:
        return "-"
    ms = ns / 1e6
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def _f(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def mem_ratio(eager: Result | None, r: Result | None, key: str = "peak_allocated_bytes") -> float | None:
    """eager peak / `r`'s peak (`key` of `meta.memory`; results before it: `peak_mem_bytes`), None unless
    both were measured with the same definition."""
    if eager is None or r is None or not model_memory.comparable(eager.meta, r.meta):
        return None
    a, b = (
        (x.meta.memory or {}).get(key, x.meta.peak_mem_bytes if key == "peak_allocated_bytes" else None)
        for x in (eager, r)
    )
    return a / b if a and b else None


def kernel_ms(r: Result | None) -> float | None:
    k = r.meta.kernel if r is not None and r.status == "ok" else None
    return k.get("kernel_ms") if k else None


def fallback_cell(r: Result | None) -> str:
    """A kiln arm's ATen fallback ops with counts (`index_put x2`), `none`, or `-` when not recorded."""
    g = r.meta.kiln_graphs if r is not None else None
    if not g:
        return "-"
    fb = g.get("fallbacks") or {}
    return (
        ", ".join(f"{op.removeprefix('aten.').removesuffix('.default')} x{n}" for op, n in fb.items())
        or "none"
    )


def unrecorded_cell(r: Result | None) -> str:
    """For a CUDA-graph kiln arm: `0/4` graphs with unrecorded calls after warm-up, else `k/n: graph (role)`."""
    g = r.meta.kiln_graphs if r is not None else None
    if not g or not g.get("cudagraphs"):
        return "-"
    bad = [c for c in g["cudagraphs"] if c.get("unrecorded") or c.get("reasons")]
    head = f"{len(bad)}/{len(g['cudagraphs'])}"
    return head + (": " + ", ".join(f"{c['graph']} ({c.get('role', '?')})" for c in bad) if bad else "")


# ------------------------------------------------------------------ numbers
def summary(results: list[Result], compilers: Sequence[str] | None = None) -> dict[str, Any]:
    """Per compiler: cases, passed, pass rate, geomean speedup, mean cold/warm compile s, geomean memory
    ratio; and the step-time ratios of `PAIRS` (module docstring)."""
    by = by_case(results)
    compilers = [c for c in (compilers or compilers_of(results)) if c != BASELINE]
    out: dict[str, Any] = {"cases": len(by), "compilers": {}, "step_ratio": {}}
    for c in compilers:
        rows = [per for per in by.values() if c in per]
        ok = [per for per in rows if passed(per[c])]
        sp = [per[BASELINE].median / per[c].median for per in ok if passed(per.get(BASELINE))]
        cold = [s for per in rows if (s := per[c].compile_s) is not None]
        warm = [s for per in rows if (s := per[c].meta.compile_warm_s) is not None]
        mem = [mem_ratio(per.get(BASELINE), per[c]) for per in ok]
        out["compilers"][c] = {
            "cases": len(rows),
            "passed": len(ok),
            "pass_rate": len(ok) / len(rows) if rows else None,
            "geomean_speedup": geomean(sp),
            "speedup_cases": len(sp),
            "compile_cold_s_mean": sum(cold) / len(cold) if cold else None,
            "compile_warm_s_mean": sum(warm) / len(warm) if warm else None,
            "memory_ratio_geomean": geomean([m for m in mem if m]),
        }
    for num, den in PAIRS:
        both = [per for per in by.values() if passed(per.get(num)) and passed(per.get(den))]
        if both:
            out["step_ratio"][f"{num}/{den}"] = {
                "geomean": geomean([per[num].median / per[den].median for per in both]),
                "cases": len(both),
            }
    return out


# ------------------------------------------------------------------ tables
def model_table(
    results: list[Result], compilers: Sequence[str] | None = None, interp: frozenset = frozenset()
) -> Table:
    """One row per case: pass, median step ms per compiler, speedups, compile cold/warm s, memory ratios.
    Compilers in ``interp`` (interpreter times) get no speedup column."""
    compilers = list(compilers or compilers_of(results))
    comp = [c for c in compilers if c != BASELINE]
    fast = [c for c in comp if c not in interp]
    by = by_case(results)
    has_compile = [c for c in comp if any(per.get(c) and per[c].compile_s is not None for per in by.values())]
    has_mem = any(r.meta.peak_mem_bytes for r in results)
    has_kernel = [c for c in compilers if any(kernel_ms(per.get(c)) is not None for per in by.values())]
    has_graphs = [c for c in comp if any(per.get(c) and per[c].meta.kiln_graphs for per in by.values())]
    cg_graphs = [c for c in has_graphs if c in arms.ARMS and arms.ARMS[c].cuda_graphs]
    head = ["model", "pass"] + [f"{c} ms" + (" (interpreter)" if c in interp else "") for c in compilers]
    head += [f"{c} x" for c in fast]
    head += [f"{c} kernel ms" for c in has_kernel]
    head += [f"{c} compile s cold/warm" for c in has_compile]
    head += [f"{c} mem ratio" for c in comp] if has_mem else ["mem ratio"]
    head += [f"{c} fallbacks" for c in has_graphs[:1]] + [f"{c} unrecorded graphs" for c in cg_graphs]
    rows = [head]
    for w, per in by.items():
        eager = per.get(BASELINE)
        bad = [c for c in comp if c in per and not passed(per[c])]
        row = [
            w.removeprefix(mdl.PREFIX),
            "fail: " + ", ".join(bad) if bad else "all",
        ]
        for c in compilers:
            r = per.get(c)
            row.append("-" if r is None else "error" if r.status != "ok" else _ms(r.median_ns))
        for c in fast:
            r = per.get(c)
            if r is None or r.status != "ok" or not r.median_ns or not (eager and eager.median_ns):
                row.append("-" if r is None or r.status == "ok" else "error")
                continue
            row.append(f"{eager.median_ns / r.median_ns:.2f}x" + ("" if passed(r) else " FAIL"))
        row += [_f(kernel_ms(per.get(c)), "{:.3g}") for c in has_kernel]
        for c in has_compile:
            r = per.get(c)
            cold = r.compile_s if r else None
            warm = r.meta.compile_warm_s if r else None
            row.append("-" if cold is None else f"{cold:.1f}/{_f(warm, '{:.1f}')}")
        if has_mem:
            row += [_f(mem_ratio(eager, per.get(c))) for c in comp]
        else:
            row.append("n/a")
        row += [fallback_cell(per.get(c)) for c in has_graphs[:1]] + [
            unrecorded_cell(per.get(c)) for c in cg_graphs
        ]
        rows.append(row)
    return rows


def compile_cpus_lines(results: list[Result]) -> list[str]:
    """One line saying how many CPUs the compile probes ran on (the model tier's ``--compile-jobs`` splits the
    host's CPUs between concurrent probes; compile time shrinks with Triton's and Inductor's worker pools),
    or none when no result says."""
    counts = sorted({n for r in results if (n := r.meta.compile_cpus) is not None})
    if not counts:
        return []
    cpus = " or ".join(map(str, counts))
    return ["", f"Compile probes ran on {cpus} CPUs each (the same for every compiler of a case)."]


def _mib(x: int | None) -> str:
    return "-" if x is None else f"{x / 2**20:.0f}"


def memory_table(results: list[Result], compilers: Sequence[str] | None = None) -> Table:
    """Per case and compiler: peak allocated / peak reserved MiB (current definition; `old def` otherwise)."""
    compilers = list(compilers or compilers_of(results))
    rows = [["model"] + [f"{c} alloc/reserved MiB" for c in compilers]]
    for w, per in by_case(results).items():
        row = [w.removeprefix(mdl.PREFIX)]
        for c in compilers:
            r = per.get(c)
            m = r.meta.memory if r is not None else None
            if m and m.get("definition") == model_memory.DEFINITION:
                row.append(f"{_mib(m.get('peak_allocated_bytes'))}/{_mib(m.get('peak_reserved_bytes'))}")
            else:
                row.append("old def" if r is not None and r.meta.peak_mem_bytes else "-")
        rows.append(row)
    return rows


def host_table(results: list[Result], compilers: Sequence[str] | None = None) -> Table:
    """Per case and compiler: host ms per step (`step_facts.HostSamples`: the time a step takes to return on an
    idle device, and in parentheses in a back-to-back loop where measured), launches per step and host us per
    launch; `-` where not measured."""
    compilers = list(compilers or compilers_of(results))
    rows: Table = [["model"] + [f"{c} {k}" for c in compilers for k in ("host ms", "launches", "us/launch")]]
    for w, per in by_case(results).items():
        row = [w[len(mdl.PREFIX) :]]
        for c in compilers:
            r = per.get(c)
            h = r.meta.host if r is not None and r.status == "ok" else None
            k = r.meta.kernel if r is not None and r.status == "ok" else None
            row += [
                _host_cell(h) if h else "-",
                f"{k['launches']:g}" if k else "-",
                f"{h['host_us_per_launch']:.1f}" if h and h.get("host_us_per_launch") else "-",
            ]
        rows.append(row)
    return rows


def _host_cell(h: dict[str, Any]) -> str:
    extra = [f"{h['host_ms_loop']:.3f}"] if h.get("host_ms_loop") is not None else []
    if h.get("host_cpu_ms") is not None:
        extra.append(f"cpu {h['host_cpu_ms']:.3f}")
    return f"{h['host_ms']:.3f}" + (f" ({'; '.join(extra)})" if extra else "")


def combo_table(results: list[Result]) -> Table:
    """Per case and kiln arm with combo kernels: the combo guard's decisions of its compile and first steps
    (`meta.combo_guard`): combos decided; by timing, kept combined / split into their parts; read from the
    cache; by rule (no timing: a CUDA-graph capture or the CPU interpreter); decided earlier in the process (the
    same combo and sizes in another arm's compile); and the microseconds per step that the combos kept by timing
    save against their parts."""
    rows: Table = [
        ["model", "compiler", "combos", "combined", "split", "cached", "rule", "earlier", "us saved"]
    ]
    for r in results:
        g = r.meta.combo_guard if r.status == "ok" else None
        if not g or not g.get("decisions"):
            continue
        n = g.get("counts", {})
        timed = [d for d in g["decisions"] if d.get("how") == "timed" and not d.get("split")]
        saved = sum(d["parts_us"] - d["combo_us"] for d in timed if "combo_us" in d)
        rows.append(
            [r.workload.removeprefix(mdl.PREFIX), r.compiler, str(len(g["decisions"]))]
            + [str(n.get(k, 0)) for k in ("combined", "split", "cached", "rule", "earlier")]
            + [f"{saved:.1f}" if timed else "-"]
        )
    return rows


def addmm_table(results: list[Result]) -> Table:
    """Per case and kiln arm: the forms its linear layers' addmms took by the compile-time timing
    (`meta.addmm_forms`): distinct products timed, how many kept each form, and the microseconds per call the
    chosen forms save against the traced one (cuBLASLt's bias epilogue), summed over the distinct products."""
    rows: Table = [["model", "compiler", "timed", "lt", "expand", "mm", "us saved"]]
    for r in results:
        log = r.meta.addmm_forms if r.status == "ok" else None
        if not log:
            continue
        distinct = {(d["m"], d["n"], d["k"], d["dtype"]): d for d in log}.values()
        counts = collections.Counter(d["form"] for d in distinct)
        saved = sum(d["us"]["lt"] - d["us"][d["form"]] for d in distinct)
        rows.append(
            [r.workload.removeprefix(mdl.PREFIX), r.compiler, str(len(distinct))]
            + [str(counts.get(f, 0)) for f in ("lt", "expand", "mm")]
            + [f"{saved:.1f}"]
        )
    return rows


def compile_only_table(alone: list[Result]) -> Table:
    """Compile measurements with no step result beside them (a `--compile-only` run of cases whose steps were
    not timed): per case and compiler, cold and warm s, the cold s over the peer arm's (`arms.peer`: kiln's
    over Inductor's, below 1 kiln compiles faster) where both were measured, the CPUs each probe had, and the
    run."""
    pairs = cold_pairs(alone)
    rows: Table = [["model", "compiler", "cold s", "warm s", "cold / peer's", "cpus", "run"]]
    for r in alone:
        pair = pairs.get((r.workload, r.compiler))
        ratio = pair[0] / pair[1] if pair else None
        rows.append(
            [
                r.workload[len(mdl.PREFIX) :],
                r.compiler,
                _f(r.compile_s) if r.status == "ok" else f"error: {(r.error or '?')[:60]}",
                _f(r.meta.compile_warm_s),
                _f(ratio, f"{{:.3f}} ({arms.peer(r.compiler)})"),
                str(r.meta.compile_cpus or "-"),
                str(r.meta.compile_run_id or "-"),
            ]
        )
    return rows


def cold_ratio_lines(results: Sequence[Result]) -> list[str]:
    """For each kiln arm whose peer (`arms.peer`) has cold compile s of the same cases: the geomean, least and
    greatest of kiln's cold s over the peer's, per case (below 1: kiln compiles faster)."""
    pairs = cold_pairs(results)
    out = []
    for c in sorted({c for _, c in pairs}):
        peer = arms.peer(c)
        ratios = {w: s / p for (w, k), (s, p) in pairs.items() if k == c and s}
        if not ratios:
            continue
        lo, hi = min(ratios, key=ratios.__getitem__), max(ratios, key=ratios.__getitem__)
        out.append(
            f"geomean {c} cold compile s / {peer} cold compile s = {geomean(list(ratios.values())) or 0:.3f} "
            f"over {len(ratios)} case(s) (least {ratios[lo]:.3f} {lo.removeprefix(mdl.PREFIX)}, greatest "
            f"{ratios[hi]:.3f} {hi.removeprefix(mdl.PREFIX)})"
        )
    return out


def unrecorded_report(results: list[Result]) -> list[str]:
    """`case compiler: graph (role): k of n calls unrecorded: why` for every kiln graph that ran unrecorded."""
    out = []
    for r in results:
        g = r.meta.kiln_graphs
        for line in unrecorded_lines(g) if g else []:
            out.append(f"{r.workload.removeprefix(mdl.PREFIX)} {r.compiler}: {line}")
    return out


def short_table(
    results: list[Result], compilers: Sequence[str] | None = None, interp: frozenset = frozenset()
) -> Table:
    """The terminal table: per case, step ms per compiler with its speedup, FAIL/error marks, kiln cold s."""
    compilers = list(compilers or compilers_of(results))
    by = by_case(results)
    rows = [
        ["model"]
        + [f"{c} ms" for c in compilers]
        + [
            "cold s ("
            + "/".join(
                c
                for c in compilers
                if c != BASELINE and any(per.get(c) and per[c].compile_s is not None for per in by.values())
            )
            + ")"
        ]
    ]
    cold_of = [
        c
        for c in compilers
        if c != BASELINE and any(per.get(c) and per[c].compile_s is not None for per in by.values())
    ]
    for w, per in by.items():
        eager = per.get(BASELINE)
        row = [w[len(mdl.PREFIX) :]]
        for c in compilers:
            r = per.get(c)
            cell = latency_cell(r, None if c == BASELINE or c in interp else eager, _ms)
            row.append(cell + ("" if r is None or r.status != "ok" or passed(r) else " FAIL"))
        row.append("/".join(_f(per[c].compile_s if per.get(c) else None, "{:.1f}") for c in cold_of) or "-")
        rows.append(row)
    return rows


def summary_table(s: dict[str, Any], device_is_gpu: bool, interp: frozenset = frozenset()) -> Table:
    rows = [["compiler", "pass rate", "geomean speedup", "compile s cold (mean)", "warm (mean)", "mem ratio"]]
    for c, d in s["compilers"].items():
        speedup = (
            "n/a (interpreter)"
            if c in interp
            else (
                _f(d["geomean_speedup"], "{:.3f}x")
                + (f" (n={d['speedup_cases']})" if d["speedup_cases"] else "")
            )
        )
        rows.append(
            [
                c,
                f"{d['passed']}/{d['cases']}"
                + (f" ({d['pass_rate'] * 100:.0f}%)" if d["pass_rate"] is not None else ""),
                speedup,
                _f(d["compile_cold_s_mean"], "{:.1f}"),
                _f(d["compile_warm_s_mean"], "{:.1f}"),
                _f(d["memory_ratio_geomean"], "{:.3f}") if device_is_gpu else "n/a",
            ]
        )
    return rows


def ratio_lines(s: dict[str, Any], interp: frozenset = frozenset()) -> list[str]:
    """Step-time geomeans between compilers; none that involve interpreter times."""
    out = []
    for key, d in s["step_ratio"].items():
        num, den = key.split("/")
        if num in interp or den in interp:
            continue
        verdict = "kiln faster" if d["geomean"] > 1 else "kiln slower" if d["geomean"] < 1 else "even"
        out.append(
            f"geomean {num} step ms / {den} step ms = {d['geomean']:.3f} over {d['cases']} case(s) "
            f"passed by both ({verdict})"
        )
    return out


def problems(results: list[Result]) -> Table:
    rows = [["case", "compiler", "problem"]]
    for r in results:
        if r.status != "ok":
            rows.append([r.workload, r.compiler, r.error or "error"])
        elif not passed(r) and r.median_ns:
            rows.append([r.workload, r.compiler, "accuracy: " + str(r.meta.accuracy_note or "?")])
        if r.meta.compile_probe_error:
            rows.append([r.workload, r.compiler, "compile time: " + r.meta.compile_probe_error])
    return rows


# ------------------------------------------------------------------ whole reports
def markdown_report(
    profile: str,
    runs: list[RunInfo],
    results: list[Result],
    notes: list[str],
    comparisons: list[Comparison] | None = None,
    compile_only: Sequence[Result] = (),
) -> str:
    """The Markdown report: summary, per-model table, host time, memory, combo kernels, addmm forms, compile
    times (`compile_only`: those with no step result beside them, `collect`'s fourth value), problems, notes."""
    compilers = compilers_of(results)
    gpu = any(r.device.startswith("cuda") for r in runs)
    interp = _interp(runs, compilers)
    s = summary(results, compilers)
    parts = [f"## kiln bench: model tier ({profile})", ""]
    if interp:
        parts += [f"> {INTERPRETER_NOTE}", ""]
    if runs:
        dev = runs[0].device_name or runs[0].device
        parts += [
            f"Device: {dev}; runs: "
            + ", ".join(
                f"{r.id} ({r.status}, {r.created_at}, commit {(r.git_commit or '-')[:10]})" for r in runs
            ),
            "",
        ]
    parts += ["### Summary (the dashboard numbers)", "", markdown(summary_table(s, gpu, interp)), ""]
    parts += [f"- {line}" for line in ratio_lines(s, interp)] + [""]
    parts += [
        "### Per model",
        "",
        (
            "Step ms: median host wall-clock time per step, device synchronized (x: speedup over eager; "
            "FAIL: accuracy check failed). Kernel ms: device kernel + copy time per step (profiled, CUDA-graph "
            "replays included). Compile s: fresh-process cold / warm-cache. Memory ratio: eager peak / compiler "
            "peak (same definition only). Fallbacks: kiln's ATen fallback ops; unrecorded graphs: kiln graphs "
            "that ran without CUDA graphs after warm-up (listed below with the reason)."
        ),
        *compile_cpus_lines(results),
        "",
        markdown(model_table(results, compilers, interp)),
        "",
        "```",
        text_bars(results, [c for c in compilers if c not in interp]),
        "```",
        "",
    ]
    if any(r.meta.host for r in results):
        parts += [
            "### Host time",
            "",
            "Host ms: median time a step takes to return when started on an idle device "
            "(its kernels queued, not waited for): Python, guards, argument binding and launches; in "
            "parentheses, the same in a back-to-back loop (the two differ where the host's work depends on "
            "the device being idle, or a step waits for its previous one) and the process's CPU ms per step "
            "in that loop (every thread; not stretched by a thread woken late). Sampled in every round, the "
            "compilers taking turns. Launches: kernel and copy launches per step (profiled).",
            "",
            markdown(host_table(results, compilers)),
            "",
        ]
    if gpu and any(r.meta.peak_mem_bytes for r in results):
        parts += [
            "### Memory",
            "",
            f"Counted: {model_memory.DESCRIPTION}.",
            "",
            markdown(memory_table(results, compilers)),
            "",
        ]
    combos = combo_table(results)
    if len(combos) > 1:
        parts += [
            "### Combo kernels",
            "",
            "The combo-kernel guard's decisions of each kiln arm's compile and first steps: a combo (independent "
            "small kernels launched as one) is timed at its first launch against its parts and the faster kept "
            "(cached with the autotune choices); under CUDA-graph capture or the CPU interpreter it is combined "
            "by rule. us saved: parts' time minus the combo's, summed over the combos kept by timing.",
            "",
            markdown(combos),
            "",
        ]
    forms = addmm_table(results)
    if len(forms) > 1:
        parts += [
            "### Linear layers' addmm forms",
            "",
            "Each kiln arm's bias addmms of at least 2^24 multiply-adds, timed at compile time in each form "
            "(lt: cuBLASLt with the bias in its epilogue, as traced; expand: cuBLAS with the bias expanded and "
            "beta 1; mm: the product alone, the add fused into kiln's consumer kernel) and the fastest kept when "
            "3% faster than lt (`compiler/fx_addmm.py`). us saved: per call, summed over the distinct products.",
            "",
            markdown(forms),
            "",
        ]
    unrec = unrecorded_report(results)
    if any((r.meta.kiln_graphs or {}).get("cudagraphs") for r in results):
        parts += ["### kiln graphs run unrecorded under CUDA graphs", ""]
        parts += [f"- {line}" for line in unrec] if unrec else ["none: every graph replayed after warm-up"]
        parts += [""]
    from harness.bench.models.compile_times import breakdown_lines, report_lines

    if compile_only:
        parts += [
            "### Compile times without step results",
            "",
            "Cold: a fresh process with empty caches; warm: a fresh process over the caches the cold one left "
            "(`--compile-only`, or steps not timed yet).",
            "",
            markdown(compile_only_table(list(compile_only))),
            "",
        ]
    cold_lines = cold_ratio_lines([*results, *compile_only])
    if cold_lines:
        parts += [f"- {line}" for line in cold_lines] + [""]
    parts += breakdown_lines([*results, *compile_only])  # cold compile per phase (Dynamo, AOTAutograd, kiln's
    # passes, Triton)
    parts += report_lines(results)  # cold/warm/autotuned compile s, when measured (--autotune-times)
    parts += autotune_gain.report_lines(results)  # kiln against kiln-autotune, when both arms ran
    probs = problems(results)
    if len(probs) > 1:
        parts += ["### Errors and failed checks", "", markdown(probs), ""]
    if notes:
        parts += ["### Notes", ""] + [f"- {n}" for n in notes] + [""]
    if comparisons is not None:
        flagged = [c for c in comparisons if c.verdict != Verdict.UNCHANGED]
        parts += ["### Against earlier runs", "", counts_line(comparisons), ""]
        if flagged:
            parts += [markdown(comparison_table(flagged)), ""]
    return "\n".join(parts)


def json_report(
    profile: str,
    runs: list[RunInfo],
    results: list[Result],
    notes: list[str],
    comparisons: list[Comparison] | None = None,
    compile_only: Sequence[Result] = (),
) -> dict[str, Any]:
    """The JSON report: per case and compiler the step figures, and `compile_only` (`collect`'s fourth value)."""
    by = by_case(results)
    rows = []
    for w, per in by.items():
        eager = per.get(BASELINE)
        cells = {}
        for c, r in per.items():
            cells[c] = {
                "status": r.status,
                "error": r.error,
                "median_ns": r.median_ns,
                "n": len(r.samples),
                "spread": r.stats.spread if r.stats else None,
                "speedup": eager.median_ns / r.median_ns
                if eager and eager.median_ns and r.median_ns
                else None,
                "pass": passed(r),
                "accuracy": r.meta.accuracy,
                "compile_cold_s": r.compile_s,
                "compile_warm_s": r.meta.compile_warm_s,
                "compile_cpus": r.meta.compile_cpus,
                "first_call_s": r.meta.first_call_s,
                "peak_mem_bytes": r.meta.peak_mem_bytes,
                "memory": r.meta.memory,
                "memory_ratio": mem_ratio(eager, r),
                "reserved_ratio": mem_ratio(eager, r, "peak_reserved_bytes"),
                "kernel": r.meta.kernel,
                "kiln_graphs": r.meta.kiln_graphs,
                "source_hash": r.source_hash,
                "run_id": r.meta.run_id,
            }
        meta = next(iter(per.values())).meta
        rows.append(
            {
                "case": w,
                **{
                    k: getattr(meta, k)
                    for k in ("family", "package", "package_version", "mode", "dtype", "optimizer", "shape")
                },
                "compilers": cells,
            }
        )
    return {
        "profile": profile,
        "runs": [{k: v for k, v in r.as_dict().items() if k != "env"} for r in runs],
        "summary": summary(results),
        "autotune_gain": [g.as_dict() for g in autotune_gain.gains(results)],
        "memory_definition": {"name": model_memory.DEFINITION, "counted": model_memory.DESCRIPTION},
        "cases": rows,
        "compile_only": [
            {
                "case": r.workload,
                "compiler": r.compiler,
                "status": r.status,
                "error": r.error,
                "compile_cold_s": r.compile_s,
                "compile_warm_s": r.meta.compile_warm_s,
                "compile_cpus": r.meta.compile_cpus,
                "compile_breakdown": r.meta.compile_breakdown,
                "compile_counts": r.meta.compile_counts,
                "source_hash": r.source_hash,
                "run_id": r.meta.compile_run_id,
            }
            for r in compile_only
        ],
        "notes": notes,
        "comparisons": [c.as_dict() for c in comparisons] if comparisons is not None else None,
    }


def plot_models(results: list[Result], path: Path, runs: Sequence[RunInfo] = ()) -> Path | None:
    """Three panels: speedup over eager per case and compiler, cold compile s, memory ratio (where measured: no
    memory panel for a CPU run); titled with the
    backend and runs, one colour per compiler (arms.colour), log axes where values span decades. Compilers with
    interpreter times (kiln on a CPU) are labelled so. Nothing to draw (no compiler besides eager): no figure,
    None."""
    from harness.bench.reports.report import plot_title, series_label, spans_decades

    comp = [c for c in compilers_of(results) if c != BASELINE]
    if not comp or not results:
        return None
    plt = pyplot()
    by = by_case(results)
    names = [w[len(mdl.PREFIX) :] for w in by]
    device = runs[0].device if runs else "cuda"
    interp = _interp(list(runs), comp) if runs else frozenset()
    # the memory panel only where some compiler has a memory ratio (a CPU run has none: no empty third of the figure)
    has_mem = any(mem_ratio(per.get(BASELINE), per.get(c)) for c in comp for per in by.values())
    fig, axes = plt.subplots(
        1,
        3 if has_mem else 2,
        figsize=(16 if has_mem else 11, 0.45 * len(names) * max(1, len(comp)) ** 0.5 + 2.6),
        sharey=True,
    )
    h = 0.8 / max(1, len(comp))
    for j, c in enumerate(comp):
        ys = [i + j * h for i in range(len(names))]
        sp, cold, mem = [], [], []
        for per in by.values():
            r, e = per.get(c), per.get(BASELINE)
            ok = r is not None and r.status == "ok" and r.median_ns and e is not None and e.median_ns
            sp.append(e.median / r.median if ok and e is not None and r is not None else 0)
            cold.append((r.compile_s or 0) if r else 0)
            mem.append(mem_ratio(e, r) or 0)
        label = f"{c} (Triton CPU interpreter)" if c in interp else series_label(c, device)
        colour = arms.colour(c)
        bars = axes[0].barh(ys, sp, height=h, label=label, color=colour)
        for b, per in zip(bars, by.values()):
            if per.get(c) is not None and not passed(per[c]):
                b.set_hatch("//")
        if any(cold):  # the compile panel names its compilers (on a CPU only kiln's compile s is measured)
            axes[1].barh(ys, cold, height=h, label=label, color=colour)
        if has_mem:
            axes[2].barh(ys, mem, height=h, label=label, color=colour)
    axes[0].axvline(1.0, color="k", lw=0.8)
    widths = [[b.get_width() for b in ax.patches] for ax in axes]
    if any(w > 0 for w in widths[0]):
        axes[0].set_xscale("log")
    if spans_decades(widths[1]):
        axes[1].set_xscale("log")
    if axes[1].patches:
        axes[1].legend(fontsize=7)
    else:
        axes[1].text(0.5, 0.5, "no compile times measured", transform=axes[1].transAxes, ha="center")
    if has_mem:
        axes[2].axvline(1.0, color="k", lw=0.8)
        axes[2].set_xlabel("memory ratio eager peak / compiler peak (x; GPU)")
    axes[0].set_yticks([i + 0.4 - h / 2 for i in range(len(names))], names, fontsize=8)
    axes[0].invert_yaxis()
    axes[0].set_xlabel("speedup over eager (x, log scale; > 1: faster; hatched: accuracy failed)")
    axes[1].set_xlabel(
        "cold compile time (s, fresh process" + (", log scale)" if spans_decades(widths[1]) else ")")
    )
    axes[0].legend(fontsize=7)
    caveat = (
        (
            f"{', '.join(sorted(interp))}: Triton CPU interpreter times, a pipeline check, not kernel speed "
            "(their speedup is far below 1 by design)"
        )
        if interp
        else ""
    )
    ids = ", ".join(str(r.id) for r in runs)
    what = (
        "step time, compile time and memory against eager"
        if has_mem
        else "step time and compile time against eager (memory: GPU runs only)"
    )
    fig.suptitle(
        plot_title(
            f"Model tier: {what}",
            None,
            device=device,
            device_name=runs[0].device_name if runs else None,
            extra="; ".join(x for x in (f"run(s) {ids}" if ids else "", caveat) if x),
        ),
        fontsize=9,
    )
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path


def write_reports(
    store: Store,
    profile: str,
    out: Path,
    args: Any = None,
    *,
    print_table: bool = True,
    comparisons: list[Comparison] | None = None,
) -> int:
    """Collect, write report.md / report.json / export.json / models.png (or --md/--json/--plots), print the
    short table and the summary; returns 0."""
    runs, results, notes, alone = collect(store, profile)
    md_path = getattr(args, "md", None) or out / "report.md"
    json_path = getattr(args, "json", None) or out / "report.json"
    plots = getattr(args, "plots", None) or out
    md = markdown_report(profile, runs, results, notes, comparisons, alone)
    json_stdout = conventions.to_stdout(json_path)  # `--json -`: the JSON on stdout (the caller sent the rest
    for p in (md_path, out, *([] if json_stdout else [json_path])):  # to stderr: conventions.human_to_stderr)
        Path(p).parent.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(md_path, md)
    conventions.write_json(json_path, json_report(profile, runs, results, notes, comparisons, alone))
    atomic_write_text(out / "export.json", json.dumps(store.export([r.rid for r in runs]), default=str))
    append_job_summary(md)
    written = [str(md_path), *([] if json_stdout else [str(json_path)]), str(out / "export.json")]
    try:
        plots.mkdir(parents=True, exist_ok=True)
        drawn = plot_models(results, plots / "models.png", runs)
        if drawn is not None:
            written.append(str(drawn))
        elif not alone:
            print("note: no models.png: no compiler besides eager has results", file=sys.stderr)
    except PlotUnavailable as e:
        print(f"note: {e}", file=sys.stderr)
    if print_table:
        s = summary(results)
        gpu = any(r.device.startswith("cuda") for r in runs)
        interp = _interp(runs, compilers_of(results))
        print(
            f"model tier ({profile}), {s['cases']} case(s) from run(s) {', '.join(str(r.id) for r in runs)}:"
        )
        if interp:
            print(f"note: {INTERPRETER_NOTE}")
        if results:
            print(terminal(short_table(results, interp=interp)))
            print()
            print(terminal(summary_table(s, gpu, interp)))
            for line in ratio_lines(s, interp):
                print(line)
        if alone:
            print("compile times without step results:")
            print(terminal(compile_only_table(alone)))
        for line in cold_ratio_lines([*results, *alone]):
            print(line)
        for line in autotune_gain.summary_lines(autotune_gain.gains(results)):
            print(line)
        for n in notes:
            print(f"note: {n}")
        print(f"wrote {', '.join(written)}")
    return 0
