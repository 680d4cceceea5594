"""Run the model tier: each model case under each compiler, checked against eager, timed, stored.

    python -m harness bench models [--profile tiny|gpu] [--only PATTERNS] [--compilers ...] [--out DIR]
    python -m harness bench models --report --out DIR        (report over everything stored there)
    python -m harness bench models --compile-only --compile-times kiln,inductor [--resume]
                                                             (cold/warm compile s alone, beside stored steps)

Compilers: the model tier's arms of `harness/arms.py`: `eager` (the baseline), `kiln`
(`torch.compile(m, backend="kiln")` after `import compiler`), `inductor`, and on CUDA only `kiln-cg`
(`backend="kiln", options={"cudagraphs": True}`) and `inductor-cg` (`mode="reduce-overhead"`);
`torch.compiler.cudagraph_mark_step_begin()` is called before every step of both -cg modes, as users must.
On CPU the -cg modes are skipped with a note. Any other registered torch.compile backend name works too.
The shape of a case (open, arms in turns, close) is `executor.CaseExecutor`'s.

Per case: build the model once on CPU in fp32 from the seed -> a higher-precision reference step (fp64 for
fp32 cases, fp32 for bf16/amp ones; TF32 off) -> per compiler, eager first: deep-copy the model to the
device, compile, first step (its outputs, and in train mode the loss and a few parameter gradients, are
copied to the host), warm-up, peak memory, step estimate -> rounds of samples, compilers taking turns ->
fresh subprocesses for the cold and warm compile times -> one `Result` per compiler, committed at once.
A compiler failing a case (compile error, crash, timeout, OOM) gives an `error` result; the run goes on.

The numbers (those of PyTorch's compiler dashboard):
- *pass*: every compared tensor (outputs; in train mode also the loss and the gradients of the first and
  last two parameters, after the first step) has a normwise relative error against the reference of at most
  max(3 x eager's own error, a dtype floor: 1e-4 fp32, 2e-2 bf16/amp). In infer mode the check is repeated
  after warm-up (CUDA graphs replay from the third call on). In train mode only the first step is checked
  (weights move afterwards). When the reference step fails, eager's outputs are the reference.
- *step latency*: host wall clock (`time.perf_counter_ns`) around `steps` consecutive steps with the device
  synchronized before and after; one sample = that time / steps (several steps per sample when steps are
  short, so the synchronization costs little). Host overhead is included. Stored samples are ns per step.
- *speedup*: eager median / compiler median.
- *compile s, cold and warm*: measured in a fresh subprocess with empty caches (every lasting compiler cache
  in new folders: `probe_env`), then in a second fresh subprocess reusing
  those folders. In each, one eager step runs first (CUDA context, cuBLAS/cuDNN handles), then the compiled
  model takes 6 steps: compile s = time of the first 3 steps - 3 x the median of the last 3. That is the
  time until the model runs at speed: compilation on the first call, and for the -cg modes the CUDA-graph
  warm-up and recording on the next calls. Stored in `compile_s` (cold) and `meta.compile_warm_s`;
  `meta.first_call_s` is the in-process first step, which shares the process's warm state.
- *peak memory* (GPU, `model_memory.py`, the same for every arm): peak allocated bytes from the end of the
  first step (compilation left out) through warm-up, CUDA-graph recording and two steady steps, above what
  was allocated before the compiler's copy of the model (weights, gradients, optimizer state and the step's
  live tensors, graph-pool tensors while they live); the same window's peak reserved bytes (private graph
  pools included) beside it. The report's memory ratio is eager peak / compiler peak. n/a on CPU.
- *kernel ms* (GPU): device kernel and copy time per step over `kernel_steps` profiled steps (CUDA-graph
  replays included), after the memory window; `launches` per step beside it.
- *host ms* (GPU): the time a step takes to return, started on an idle device and back to back, and the
  process's CPU time per step (`step_facts.HostSamples`), sampled in every round beside the step samples (the
  compilers taking turns), at least 5 of each kind; per launch with `launches`.
- *kiln graphs* (kiln arms): graphs, kernels, ATen fallback ops, and for CUDA-graph runs each graph's
  recordings, replays and unrecorded calls with their reasons (`meta.kiln_graphs`, refreshed after sampling).

`--baseline` compares with compare.py's statistics (ratio of medians + Mann-Whitney on the per-step
samples, source hashes equal) but without the kernel tier's confirmation re-measure: re-run a flagged case.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from harness import arms
from harness.bench.core.executor import CaseExecutor, one_line
from harness.bench.core.executor import deadline as _deadline
from harness.bench.core.records import COMPILE_PHASE, Result, RunInfo, Verdict
from harness.bench.core.stats import Stats
from harness.bench.models import catalog as mdl
from harness.bench.models.memory import MemoryWindow, cuda_source
from harness.bench.models.step_facts import (
    HostSamples,
    addmm_forms,
    combo_guard,
    graph_report,
    kernel_time,
    reset_addmm_forms,
    reset_combo_guard,
)
from harness.bench.stores import env
from harness.bench.stores.store import Store
from harness.exc import BaselineError, UsageError
from harness.process import raise_if_terminated

BASELINE_COMPILER = arms.EAGER
TIER = "model"
DEFAULT_COMPILERS = arms.default(TIER)
TIMER = "step"  # Result.timer of model rows: host wall clock per step, device synchronized
PROBE_TAG = "KILN_MODEL_PROBE "
REPO = Path(__file__).resolve().parents[3]
MULT = 3.0  # a compiled output may be this many times further from the reference than eager's
FLOOR = {"fp32": 1e-4, "bf16": 2e-2, "amp": 2e-2}
REF_DTYPE = {"fp32": torch.float64, "bf16": torch.float32, "amp": torch.float32}
PROBE_READY_STEPS, PROBE_STEADY_STEPS = 3, 3


@dataclass
class ModelBenchConfig:
    """What to run and how long to measure it (`defaults_for` gives the per-device budgets)."""

    profile: str = "tiny"
    device: str = "cpu"
    compilers: list[str] = field(default_factory=lambda: DEFAULT_COMPILERS.split(","))
    only: str | None = None
    compile_times: list[str] = field(default_factory=lambda: [arms.KILN])  # cold/warm subprocesses for these
    target_s: float = 0.5  # measuring seconds per case and compiler, split into `rounds`
    rounds: int = 3
    min_samples: int = 3
    max_samples: int = 20
    sample_s: float = 0.0  # a sample spans at least this long (several steps when a step is shorter)
    warmup_steps: int = 2
    warmup_s: float = 0.0
    seed: int = 0
    compile_timeout_s: float = 900.0  # compile + first step, in process and in each subprocess
    budget_s: float | None = None  # stop starting cases past this (see run_models)
    compile_only: bool = False  # only the cold/warm subprocesses of `compile_times` (phase "compile")
    kernel_steps: int = 0  # profiled steps for the kernel-ms column (0: none; GPU default 3)
    autotune_times: bool = False  # also autotuned compile s of `compile_times` (compile_times.autotune_times)
    compile_warm: bool = True  # the warm probe after each cold one (False: cold compile s alone)
    compile_jobs: int = 1  # compile-only: cases probed at once, each on its own share of the CPUs
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def defaults_for(device: str) -> dict[str, Any]:
    """Budgets per device kind: a GPU gets ~1.5 s of samples per compiler; CPU (Triton's interpreter: up to a
    second a step) a few samples, and cold/warm compile times for kiln only (Inductor's cold C++ compile of
    each graph takes ~40 s on a 2-core machine and proves nothing about kiln)."""
    if device.startswith("cuda"):
        return {
            "profile": "gpu",
            "target_s": 1.5,
            "rounds": 5,
            "min_samples": 10,
            "max_samples": 100,
            "sample_s": 0.02,
            "warmup_steps": 5,
            "warmup_s": 0.5,
            "compile_times": [arms.KILN, arms.INDUCTOR],
            "kernel_steps": 3,
        }
    return {"profile": "tiny"}


def check_compilers(names: list[str], device: str) -> tuple[list[str], list[str]]:
    """(compilers to run, eager first; notes) — unknown names raise UsageError, -cg modes need CUDA."""
    out = [a.name for a in arms.check(names, TIER, any_backend=True)]
    out = [BASELINE_COMPILER] + [n for n in out if n != BASELINE_COMPILER]
    notes = []
    if not device.startswith("cuda"):
        cg = arms.cuda_graph_arms(out)
        if cg:
            notes.append(f"{', '.join(cg)}: CUDA graphs need a CUDA device; skipped on {device}")
            out = [n for n in out if n not in cg]
    return out, notes


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def no_tf32() -> Iterator[None]:
    """TF32 off for matmuls and convolutions (the reference step)."""
    m, c = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = m, c


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True)


class Stepper:
    """One compiler's copy of a case's model, its optimizer and inputs, and its step (see module docstring)."""

    def __init__(
        self,
        case: mdl.ModelCase,
        base: torch.nn.Module,
        compiler: str,
        device: torch.device,
        seed: int = 0,
        dtype: torch.dtype | None = None,
        autocast: bool | None = None,
    ):
        self.case, self.device = case, device
        self.model = copy.deepcopy(base).to(device=device, dtype=dtype or case.model_dtype)
        self.grad_names = mdl.grad_names(self.model) if case.mode != "infer" else []
        arm = arms.get(compiler, TIER, any_backend=True)
        if case.mode == "opt":  # the optimizer step alone, compiled; the gradients are drawn once and stay
            gen = torch.Generator().manual_seed(seed + 2)
            for p in self.model.parameters():
                p.grad = (torch.randn(p.shape, generator=gen) * 1e-2).to(device=device, dtype=p.dtype)
            self.opt = mdl.make_optimizer(case.optimizer, self.model.parameters(), foreach=True)
            assert self.opt is not None
            mdl.prime_optimizer(self.opt)
            self.fn = arm.compile(self.opt.step)
        else:
            self.opt = mdl.make_optimizer(case.optimizer, self.model.parameters()) if dtype is None else None
            self.fn = arm.compile(self.model)
        self.inputs = case.inputs(device, seed, float_dtype=dtype)
        self.cg = arm.cuda_graphs
        use_amp = case.autocast if autocast is None else autocast
        self.amp = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if use_amp else nullcontext

    def step(self, capture: bool = False) -> dict[str, torch.Tensor] | None:
        """One step; with `capture`, its outputs (and loss and selected gradients) copied to the host."""
        if self.cg:
            torch.compiler.cudagraph_mark_step_begin()
        style = self.case.spec.style
        if self.case.mode == "opt":
            self.fn()
            if not capture:
                return None
            params = dict(self.model.named_parameters())
            return {f"param:{n}": _host(params[n].detach()) for n in self.grad_names}
        if self.case.mode == "infer":
            with torch.no_grad(), self.amp():
                out = mdl.forward(style, self.fn, self.inputs)
            return {"output": _host(mdl.primary(out))} if capture else None
        if self.opt is not None:
            self.opt.zero_grad(set_to_none=True)
        else:
            self.model.zero_grad(set_to_none=True)
        with self.amp():
            out = mdl.forward(style, self.fn, self.inputs)
            loss = mdl.loss_of(out, self.inputs)
        loss.backward()
        got = None
        if capture:
            params = dict(self.model.named_parameters())
            got = {"loss": _host(loss), "output": _host(mdl.primary(out))}
            for n in self.grad_names:
                g = params[n].grad
                got[f"grad:{n}"] = _host(g) if g is not None else torch.full((), math.nan)
        if self.opt is not None:
            self.opt.step()
        return got

    def timed(self, steps: int) -> float:
        """ns per step over `steps` consecutive steps, device synchronized before and after."""
        sync(self.device)
        t0 = time.perf_counter_ns()
        for _ in range(steps):
            self.step()
        sync(self.device)
        return (time.perf_counter_ns() - t0) / steps


# ------------------------------------------------------------------ accuracy
@dataclass
class Accuracy:
    """Verdict of one comparison (see module docstring): `err` and `eager_err` are of the worst tensor."""

    ok: bool
    err: float
    eager_err: float
    limit: float
    worst: str
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def rel_err(
    x: torch.Tensor, ref: torch.Tensor, chunk: int = 1 << 24, device: torch.device | None = None
) -> float:
    """||x - ref|| / ||ref|| in float64 over the positions where ref is finite (inf when x is not finite
    where ref is). Computed in chunks (large logits need no whole float64 copy), on `device` when given (the
    captured tensors live on the host; a GPU does the arithmetic ~50x faster than the host)."""
    if x.shape != ref.shape:
        return math.inf
    a, b = x.reshape(-1), ref.reshape(-1)
    dev = device or a.device
    num = den = 0.0
    for i in range(0, max(1, a.numel()), chunk):
        xa = a[i : i + chunk].to(dev, torch.float64)
        xb = b[i : i + chunk].to(dev, torch.float64)
        d = xa - xb
        n, r = float(torch.dot(d, d)), float(torch.dot(xb, xb))
        if not (math.isfinite(n) and math.isfinite(r)):  # rare: mask the reference's non-finite positions
            fin = torch.isfinite(xb)
            if bool((~torch.isfinite(xa) & fin).any()):
                return math.inf
            d, xb = torch.where(fin, d, 0.0), torch.where(fin, xb, 0.0)
            n, r = float(torch.dot(d, d)), float(torch.dot(xb, xb))
        num, den = num + n, den + r
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return math.sqrt(num / den)


def check_accuracy(
    got: dict[str, torch.Tensor],
    eager: dict[str, torch.Tensor],
    ref: dict[str, torch.Tensor] | None,
    dtype_name: str,
    device: torch.device | None = None,
    eager_errs: dict[str, float] | None = None,
) -> Accuracy:
    """Compare a compiler's captured tensors with eager's, both measured against `ref` (eager when None).
    `eager_errs` caches eager's own errors between calls of one case."""
    ref = ref if ref is not None else eager
    eager_errs = {} if eager_errs is None else eager_errs
    floor = FLOOR[dtype_name]
    worst = Accuracy(True, 0.0, 0.0, floor, "")
    score = -1.0
    for name, e in eager.items():
        if name not in got:
            return Accuracy(False, math.inf, 0.0, floor, name, f"{name}: missing from the compiled step")
        g, r = got[name], ref.get(name, e)
        if g.shape != e.shape:
            return Accuracy(
                False, math.inf, 0.0, floor, name, f"{name}: shape {tuple(g.shape)} != eager {tuple(e.shape)}"
            )
        if name not in eager_errs:
            eager_errs[name] = rel_err(e, r, device=device) if r is not e else 0.0
        ee = eager_errs[name]
        if not math.isfinite(ee):  # eager itself broke against the reference: judge against eager
            r, ee = e, 0.0
        err = ee if g is e else rel_err(g, r, device=device)
        limit = max(MULT * ee, floor)
        s = err / limit
        if s > score:
            score, worst = s, Accuracy(s <= 1.0, err, ee, limit, name)
    if not worst.ok:
        worst.note = (
            f"{worst.worst}: error {worst.err:.3g} > limit {worst.limit:.3g} (eager {worst.eager_err:.3g})"
        )
    return worst


# ------------------------------------------------------------------ one case
@dataclass
class Prepared:
    stepper: Stepper
    result: Result
    steps: int  # steps per sample
    samples: int  # samples in all
    graphs: list | None = None  # kiln's compiled graphs (compiler.capture records) for kiln arms
    host_steps: int = 0  # host time samples of each kind per sampling round (0: not measured)
    launches: float | None = None  # launches per step (kernel_time), for host us per launch
    host: HostSamples = field(default_factory=HostSamples)

    @property
    def planned(self) -> int:
        return self.samples


@dataclass
class Setup:
    """What every compiler of a model case shares: the model built on the CPU, the reference step's captured
    tensors (None: eager is the reference, `ref_note` says why), eager's captured first step once eager ran,
    and eager's own error per captured tensor."""

    base: torch.nn.Module
    ref: dict | None
    ref_note: str
    eager: dict | None = None
    eager_errs: dict[str, float] = field(default_factory=dict)


class ModelExecutor(CaseExecutor[Prepared]):
    """Measures model cases under compilers on one device (module docstring)."""

    setup_failure = "model build failed"

    def _reference(self, case: mdl.ModelCase, base: torch.nn.Module) -> tuple[dict | None, str]:
        """Captured step of a higher-precision copy (module docstring), or (None, why) when it fails."""
        try:
            with no_tf32():
                st = Stepper(
                    case,
                    base,
                    BASELINE_COMPILER,
                    self.device,
                    self.cfg.seed,
                    dtype=REF_DTYPE[case.dtype_name],
                    autocast=False,
                )
                got = st.step(capture=True)
            del st
            return got, ""
        except Exception as e:  # noqa: BLE001 - then eager is the reference
            return None, f"reference step failed ({one_line(e)}); eager is the reference"
        finally:
            self._free()

    def _free(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # ------------------------------------------------------------ CaseExecutor's hooks
    def setup(self, case: mdl.ModelCase) -> Setup:
        base = case.build(self.cfg.seed)  # a model that cannot be built fails for every compiler
        ref, ref_note = self._reference(case, base)
        return Setup(base, ref, ref_note)

    def failed(self, case: mdl.ModelCase, compiler: str, phase: str, error: str) -> Result:
        return Result(
            case.name,
            compiler,
            case.source_hash,
            status="error",
            phase=phase,
            error=error,
            timer=TIMER,
            meta=case.describe(),
        )

    def prepare(self, case: mdl.ModelCase, setup: Setup, compiler: str, phase: str) -> Prepared | Result:
        """Eager first (its captured first step is what the others are checked against): a compiler after a
        failed eager is not run."""
        if compiler != BASELINE_COMPILER and setup.eager is None:
            return self.failed(case, compiler, phase, "not run: the eager baseline failed")
        p, got = self._prepare(case, setup, compiler, phase)
        if compiler == BASELINE_COMPILER:
            setup.eager = got
        if setup.ref_note and isinstance(p, Prepared) and p.result.meta.accuracy is not None:
            p.result.meta.accuracy["reference"] = setup.ref_note
        return p

    def take(self, p: Prepared, n: int) -> list[float]:
        out = [p.stepper.timed(p.steps) for _ in range(n)]
        if p.host_steps:  # host time in the same turns as the step samples: every compiler under one host
            p.host.take(p.stepper.step, self.device, p.host_steps)
            p.result.meta.host = p.host.summary(p.launches)
        if p.graphs is not None:  # CUDA-graph counters move while sampling
            p.result.meta.kiln_graphs = graph_report(p.graphs)
        return out

    def release(self) -> None:
        torch._dynamo.reset()  # compiled graphs (and CUDA-graph pools) go before the compile-time subprocesses
        self._free()

    def _prepare(
        self, case: mdl.ModelCase, setup: Setup, compiler: str, phase: str
    ) -> tuple[Prepared | Result, dict | None]:
        """Copy, compile, first step, accuracy, warm-up, memory, estimate; (Prepared or error Result, the
        captured first step)."""
        cfg, cuda = self.cfg, self.device.type == "cuda"
        base, eager, ref = setup.base, setup.eager, setup.ref
        res = Result(case.name, compiler, case.source_hash, phase=phase, timer=TIMER, meta=case.describe())
        self._free()
        mem = MemoryWindow(cuda_source(self.device)) if cuda else None
        if mem is not None:
            mem.baseline()
        st: Stepper | None = None
        graphs: list | None = None
        try:
            with kiln_capture(compiler) as graphs:
                if graphs is not None:  # a kiln arm: the combo guard's decisions of this compile, from zero
                    reset_combo_guard()
                    reset_addmm_forms()
                st = Stepper(case, base, compiler, self.device, cfg.seed)
                t0 = time.perf_counter()
                with _deadline(cfg.compile_timeout_s, f"{compiler} compile + first step"):
                    got = st.step(capture=True)
                    sync(self.device)
            res.meta.first_call_s = round(time.perf_counter() - t0, 3)
            if mem is not None:
                mem.open()
            assert got is not None
            base_out = eager if eager is not None else got
            acc = check_accuracy(got, base_out, ref, case.dtype_name, self.device, setup.eager_errs)
            checks = {"first": acc.as_dict()}
            ts: list[float] = []
            deadline = time.perf_counter() + cfg.warmup_s
            while len(ts) < cfg.warmup_steps or (time.perf_counter() < deadline and len(ts) < 200):
                ts.append(st.timed(1))
            if case.mode == "infer" and compiler != BASELINE_COMPILER:  # the same weights: check a replay
                replay = st.step(capture=True)
                assert replay is not None  # a captured step has outputs
                again = check_accuracy(replay, base_out, ref, case.dtype_name, self.device, setup.eager_errs)
                checks["replay"] = again.as_dict()
                if not again.ok and acc.ok:
                    acc = again
            res.max_rel_err = acc.err
            accuracy: dict[str, Any] = {"pass": all(c["ok"] for c in checks.values()), **checks}
            if not accuracy["pass"]:
                accuracy["note"] = acc.note or "replay check failed"
            res.meta.accuracy = accuracy
            if mem is not None:
                st.timed(2)
                memory = mem.close()
                res.meta.memory, res.meta.peak_mem_bytes = memory, memory["peak_allocated_bytes"]
            launches: float | None = None
            if cuda and cfg.kernel_steps > 0:
                kernel = kernel_time(st.step, self.device, cfg.kernel_steps)
                res.meta.kernel = kernel
                launches = kernel.get("launches")
            if graphs is not None:
                res.meta.kiln_graphs = graph_report(graphs)
                res.meta.combo_guard = combo_guard()
                res.meta.addmm_forms = addmm_forms()
            est = Stats.of(ts[len(ts) // 2 :]).median
            steps = max(1, min(50, math.ceil(cfg.sample_s * 1e9 / max(est, 1.0))))
            n = round(cfg.target_s * 1e9 / max(est * steps, 1.0))
            n = max(cfg.min_samples, min(cfg.max_samples, n))
            res.meta.steps_per_sample = steps
            # host time: at least 5 samples of each kind over the rounds (none on CPU: the step is host work)
            host_steps = (
                math.ceil(max(5, cfg.kernel_steps) / max(1, self.rounds)) if launches is not None else 0
            )
            return Prepared(st, res, steps, n, graphs, host_steps, launches), got
        except Exception as e:  # noqa: BLE001 - a compiler failing a case is a result, not a crash
            res.status, res.error = "error", one_line(e)
            del st
            self._free()
            return res, None

    def measure_case(
        self, case: mdl.ModelCase, compilers: list[str], phase: str = "main", reps_scale: float = 1.0
    ) -> list[Result]:
        """Results of `case` under each compiler (eager first), then cold/warm compile times of those in
        `compile_times` that ran (their subprocesses start once this process has freed the device)."""
        out = super().measure_case(case, compilers, phase, reps_scale)
        for r in out:
            if r.status == "ok" and r.compiler in self.cfg.compile_times and r.compiler != BASELINE_COMPILER:
                self._compile_times(case, r)
        return out

    def _compile_times(self, case: mdl.ModelCase, res: Result, cpus: tuple[int, ...] | None = None) -> str:
        """Cold/warm compile s of `res`'s compiler into `res` (and with `autotune_times` the autotuned pair into
        its `meta.autotune`, `compile_times.autotune_times`), the probes pinned to `cpus` when given (their count
        in `meta.compile_cpus`); the cold/warm probes' error ('' when none)."""
        from harness.bench.models.compile_times import autotune_times, measure

        probe = compile_probe(case, res.compiler, self.cfg)
        probe.cpus = cpus
        t = measure(
            case.name, res.compiler, probe, autotune=self.cfg.autotune_times, warm=self.cfg.compile_warm
        )
        res.compile_s, res.meta.compile_warm_s = t.cold_s, t.warm_s
        res.meta.compile_cpus = len(cpus) if cpus is not None else usable_cpus()
        res.meta.compile_breakdown = t.breakdown or None
        res.meta.compile_counts = t.counts or None
        if t.error:
            res.meta.compile_probe_error = t.error
        elif self.cfg.autotune_times:
            res.meta.autotune = autotune_times(t)
        return t.error

    def compile_case(
        self, case: mdl.ModelCase, compilers: list[str], cpus: tuple[int, ...] | None = None
    ) -> list[Result]:
        """Cold/warm compile s of `case` under each of `compilers` in turn (probes pinned to `cpus` when
        given), with no step measurement in this process: one `phase="compile"` Result per compiler (no
        samples; `error` when a probe failed). The report merges them into the newest step results of the
        same source hash (model_report.collect)."""
        out = []
        for c in compilers:
            res = Result(
                case.name, c, case.source_hash, phase=COMPILE_PHASE, timer=TIMER, meta=case.describe()
            )
            err = self._compile_times(case, res, cpus)
            if res.compile_s is None:
                res.status, res.error = "error", err
            out.append(res)
        return out


def usable_cpus() -> int:
    """How many CPUs this process may run on (its affinity set where the platform has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


@contextmanager
def kiln_capture(compiler: str) -> Iterator[list | None]:
    """kiln's graphs compiled inside the block (`compiler.capture()`) for kiln arms, else None."""
    if not arms.is_kiln(compiler):
        yield None
        return
    import compiler as kiln

    with kiln.capture() as graphs:
        yield graphs


# ------------------------------------------------------------------ compile-time subprocesses
def probe_env(cache: Path) -> dict[str, str]:
    """This process's environment with every lasting compiler cache in folders under `cache`
    (`commands.cache_env`: Triton's, kiln's kernels, graph and front caches and autotune choices, Inductor's)
    and XDG_CACHE_HOME there too. The harness points its own process at the trust scope's compile cache
    (`commands.scope_this_process`); a probe that kept any of those variables would find the graphs the tier
    compiled in-process, and its cold compile would not be cold."""
    from harness.commands import cache_env, with_pythonpath

    folders = {**cache_env(str(cache)), "XDG_CACHE_HOME": str(cache / "xdg")}
    for folder in folders.values():
        Path(folder).mkdir(parents=True, exist_ok=True)
    return with_pythonpath({**os.environ, **folders}, REPO)


def probe_command(case: mdl.ModelCase, compiler: str, cfg: ModelBenchConfig) -> list[str]:
    return [
        sys.executable,
        "-m",
        "harness.bench.models.run",
        "probe",
        case.name,
        "--profile",
        case.profile,
        "--device",
        cfg.device,
        "--compiler",
        compiler,
        "--seed",
        str(cfg.seed),
        "--threads",
        str(torch.get_num_threads()),
    ]


def compile_probe(case: mdl.ModelCase, compiler: str, cfg: ModelBenchConfig) -> Any:
    """The probe of `case` under `compiler` for `compile_times` (its command, environment, tag and limit)."""
    from harness.bench.models.compile_times import Probe

    return Probe(
        probe_command(case, compiler, cfg), probe_env, PROBE_TAG, str(REPO), cfg.compile_timeout_s + 120
    )


def probe_main(argv: list[str]) -> int:
    """`python -m harness.bench.models.run probe CASE ...`: one compile-time measurement (module docstring);
    prints one line `KILN_MODEL_PROBE {json}`."""
    ap = argparse.ArgumentParser(prog="python -m harness.bench.models.run probe")
    ap.add_argument("case")
    ap.add_argument("--profile", required=True)
    ap.add_argument("--device", required=True)
    ap.add_argument("--compiler", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args(argv)
    if args.compiler.startswith("kiln"):
        from harness.bench.kernels.session import prepare_kiln

        prepare_kiln()
    if args.threads and args.device == "cpu":
        torch.set_num_threads(args.threads)
    try:
        case = mdl.find(args.case, args.profile, args.device)
        problem = mdl.package_problem(case.spec.package)
        if problem:
            raise RuntimeError(f"{case.spec.package}: {problem}")
        device = torch.device(args.device)
        base = case.build(args.seed)
        Stepper(case, base, BASELINE_COMPILER, device, args.seed).step()  # CUDA context, library handles
        st = Stepper(case, base, args.compiler, device, args.seed)
        from harness.bench.models.compile_times import compile_counts, phase_breakdown, reset_phase_timers

        reset_phase_timers()
        ts = []
        for _ in range(PROBE_READY_STEPS + PROBE_STEADY_STEPS):
            t0 = time.perf_counter()
            st.step()
            sync(device)
            ts.append(time.perf_counter() - t0)
        steady = Stats.of(ts[PROBE_READY_STEPS:]).median
        data: dict[str, Any] = {
            "compile_s": round(max(0.0, sum(ts[:PROBE_READY_STEPS]) - PROBE_READY_STEPS * steady), 3),
            "first_s": round(ts[0], 3),
            "steady_s": steady,
            "ready_s": round(sum(ts[:PROBE_READY_STEPS]), 3),
            "breakdown": phase_breakdown(arms.is_kiln(args.compiler)),
        }
        if arms.is_kiln(args.compiler):
            data["counts"] = compile_counts()
    except Exception as e:  # noqa: BLE001 - reported to the parent as one line
        data = {"error": one_line(e)}
    print(PROBE_TAG + json.dumps(data), flush=True)
    return 0


# ------------------------------------------------------------------ a run
def _progress(i: int, total: int, name: str, results: list[Result], t0: float, ends: list[float]) -> None:
    from harness.bench.core.stats import eta_text
    from harness.bench.reports.report import fmt_ns

    spent = time.monotonic() - t0
    ends.append(spent)
    eta = eta_text(ends, total)
    cells = []
    for r in results:
        if r.status != "ok":
            cells.append(f"{r.compiler} error")
            continue
        if r.phase == COMPILE_PHASE:
            warm = r.meta.compile_warm_s
            cells.append(
                f"{r.compiler} cold {r.compile_s:.1f} s warm {'-' if warm is None else f'{warm:.1f}'} s"
            )
            continue
        ok = r.meta.accuracy_passed is not False
        cells.append(f"{r.compiler} {fmt_ns(r.median_ns)}{'' if ok else ' FAIL'}")
    print(
        f"[{i + 1:>2}/{total}] {name:<28} {'  '.join(cells)}  ({spent:.0f}s, {eta})",
        file=sys.stderr,
        flush=True,
    )


def run_models(
    cfg: ModelBenchConfig,
    store: Store,
    cases: list[mdl.ModelCase],
    *,
    label: str | None = None,
    git_ref: str | None = None,
    skipped: dict[str, str] | None = None,
    progress: bool = True,
) -> tuple[RunInfo, list[Result], list[str]]:
    """Measure `cases`, storing each result as it comes; the run is `complete` only at the very end. With
    `cfg.budget_s`, a case is not started when the mean time per case so far says it would end past the
    budget: (run, results, names of the cases left for a later `--resume`)."""
    config = {**cfg.as_dict(), "tier": "models", "cases": [c.name for c in cases], "skipped": skipped or {}}
    run = env.new_run(f"models-{cfg.profile}", cfg.device, cfg.compilers, config, label, git_ref)
    ex = ModelExecutor(cfg)
    store.begin_run(run)
    results: list[Result] = []
    deferred: list[str] = []
    try:
        t0 = time.monotonic()
        ends: list[float] = []  # when each case ended (the progress line's estimate)
        if cfg.compile_only and cfg.compile_jobs > 1:
            results, deferred = _compile_in_parallel(cfg, ex, store, run, cases, t0, progress)
            cases = []  # measured above
        for i, case in enumerate(cases):
            spent = time.monotonic() - t0
            if cfg.budget_s and i and spent + spent / i > cfg.budget_s:  # the next case would likely overrun
                deferred = [c.name for c in cases[i:]]
                break
            if cfg.compile_only:
                rs = ex.compile_case(case, cfg.compilers)
            else:
                rs = ex.measure_case(case, cfg.compilers)
            for r in rs:
                store.add_result(run.id, r)
            results += rs
            if progress:
                _progress(i, len(cases), case.name, rs, t0, ends)
            raise_if_terminated()  # a SIGTERM that a compile swallowed: stop here, the run aborted
        store.finish_run(run.id, "complete")
        run.status = "complete"
        return run, results, deferred
    except BaseException:
        with suppress(Exception):  # the store may be what failed: keep the original error
            store.finish_run(run.id, "aborted")
        raise


def _compile_in_parallel(
    cfg: ModelBenchConfig,
    ex: ModelExecutor,
    store: Store,
    run: RunInfo,
    cases: list[mdl.ModelCase],
    t0: float,
    progress: bool,
) -> tuple[list[Result], list[str]]:
    """Compile-only: `cfg.compile_jobs` cases probed at once, each job on its own disjoint share of this
    process's CPUs (`compile_times.cpu_slices`; a case's compilers run in turn on the same share, so they
    meet the same neighbours), results stored from this thread as cases finish. With `cfg.budget_s` a case
    is not started when the mean case time so far says it would end past the budget: (results, names of
    the cases left for a later `--resume`)."""
    from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

    from harness.bench.models.compile_times import cpu_slices

    free = cpu_slices(cfg.compile_jobs)
    todo = list(cases)
    results: list[Result] = []
    durations: list[float] = []
    ends: list[float] = []
    running: dict[Future, tuple[mdl.ModelCase, tuple[int, ...], float]] = {}

    pool = ThreadPoolExecutor(max_workers=cfg.compile_jobs, thread_name_prefix="compile-probe")
    try:
        while todo or running:
            while todo and free:
                spent = time.monotonic() - t0
                mean = sum(durations) / len(durations) if durations else 0.0
                if cfg.budget_s and durations and spent + mean > cfg.budget_s:
                    break
                case, cpus = todo.pop(0), free.pop(0)
                fut = pool.submit(ex.compile_case, case, cfg.compilers, cpus)
                running[fut] = (case, cpus, time.monotonic())
            if not running:
                break  # the budget stops every case left
            done, _pending = wait(list(running), return_when=FIRST_COMPLETED)
            for fut in done:
                case, cpus, started = running.pop(fut)
                free.append(cpus)
                durations.append(time.monotonic() - started)
                rs = fut.result()  # compile_case turns a probe's failure into an error result
                for r in rs:
                    store.add_result(run.rid, r)
                results += rs
                if progress:
                    _progress(len(durations) - 1, len(cases), case.name, rs, t0, ends)
            raise_if_terminated()
    finally:  # stopped early (a signal, a store error): cases not started are dropped, running probes end alone
        pool.shutdown(wait=not running, cancel_futures=True)
    return results, [c.name for c in todo]


def _model_baseline(store: Store, spec: str, run: RunInfo, results: list[Result]):
    """A baseline restricted to this run's cases. `latest`: per case, the newest earlier complete run of the
    same profile and device that has it (runs are often chunks of the tier); else compare.py's specs."""
    from harness.bench.judge.compare import Baseline, load_baseline, resolve_baseline, same_kind

    names = {r.workload for r in results}
    if spec.strip() == "latest":
        picked: dict[str, tuple[RunInfo, list[Result]]] = {}
        for b in store.runs(complete_only=True):
            if b.id == run.id or not same_kind(b, run):
                continue
            rs = [r for r in store.results(b.rid) if r.workload in names and r.workload not in picked]
            for w in {r.workload for r in rs}:
                picked[w] = (b, [r for r in rs if r.workload == w])
            if len(picked) == len(names):
                break
        if not picked:
            raise BaselineError(f"no earlier complete {run.profile} run has any of these models")
        runs = list({b.id: b for b, _ in picked.values()}.values())
        return Baseline.of(runs, [rs for _, rs in picked.values()])
    base = load_baseline(store, resolve_baseline(store, spec, run))
    base.results = {k: v for k, v in base.results.items() if k[0] in names}
    return base


def stored_cases(
    store: Store,
    profile: str,
    device: str,
    cases: list[mdl.ModelCase],
    compilers: list[str],
    phase: str = "main",
) -> set[str]:
    """Names of `cases` whose every compiler has a result (ok or error) of `phase` with the case's current
    source hash in a run of this profile on this device (`--resume` skips them)."""
    name = env.device_name(device)
    want = {c.name: c.source_hash for c in cases}
    have: dict[str, set[str]] = {}
    for run in store.runs():
        if run.profile != f"models-{profile}" or run.device_name != name:
            continue
        for r in store.results(run.rid, phase=phase):
            if want.get(r.workload) == r.source_hash:
                have.setdefault(r.workload, set()).add(r.compiler)
    return {w for w, cs in have.items() if set(compilers) <= cs}


def cmd_models(args: argparse.Namespace) -> int:
    """The `models` verb (see `python -m harness bench models --help`); with `--json -` the report's JSON is
    all that goes to stdout (progress, tables and notes go to stderr)."""
    from harness import conventions

    with conventions.human_to_stderr(conventions.to_stdout(getattr(args, "json", None))):
        return _models(args)


def _models(args: argparse.Namespace) -> int:
    from harness.bench.kernels.execute import resolve_device
    from harness.bench.models import report as mrep
    from harness.settings import bench_settings

    device = resolve_device(args.device)
    kw = defaults_for(device)
    profile = args.profile or kw["profile"]
    kw.pop("profile", None)
    from harness.bench.stores.store import default_path

    # no --out: the machine's one bench store (results/bench/<backend>/bench.sqlite) and its models/ folder, as
    # `nox -s ci` and `nox -s bench` write them; --out alone: a folder with its own store (a GPU tier in chunks)
    out = args.out or default_path().parent / "models"
    db = args.db or (out / "bench.sqlite" if args.out else default_path())
    if args.list:
        return _list(profile, device, args.only)
    if args.report:
        with Store(db) as store:
            return mrep.write_reports(store, profile, out, args, print_table=True)
    for name in ("target_s", "rounds", "budget_s"):
        if getattr(args, name) is not None:
            kw[name] = getattr(args, name)
    if args.compile_times is not None:
        kw["compile_times"] = (
            []
            if args.compile_times in ("", "none")
            else [c.strip() for c in args.compile_times.split(",") if c.strip()]
        )
    kw["autotune_times"] = bool(getattr(args, "autotune_times", False))
    compilers, notes = check_compilers([c.strip() for c in args.compilers.split(",") if c.strip()], device)
    if args.compile_only:  # the compilers are those of --compile-times; eager has no compile time
        if not kw["compile_times"]:
            raise UsageError("--compile-only needs --compile-times with at least one compiler")
        compilers, notes = check_compilers(kw["compile_times"], device)
        compilers = [c for c in compilers if c != BASELINE_COMPILER]
        if not compilers:
            raise UsageError("--compile-only: eager has no compile time; name a compiler in --compile-times")
        kw["compile_only"] = True
    jobs = getattr(args, "compile_jobs", 1)
    if not 1 <= jobs <= usable_cpus():
        raise UsageError(f"--compile-jobs {jobs}: give 1 to {usable_cpus()} (the CPUs this process may use)")
    if jobs > 1 and not args.compile_only:
        raise UsageError("--compile-jobs above 1 needs --compile-only (step timing runs one case at a time)")
    if jobs > 1 and not hasattr(os, "sched_setaffinity"):
        raise UsageError("--compile-jobs above 1 needs CPU affinity (Linux)")
    kw["compile_jobs"] = jobs
    kw["compile_warm"] = not getattr(args, "cold_only", False)
    cfg = ModelBenchConfig(
        device=device, compilers=compilers, only=args.only, profile=profile, notes=notes, **kw
    )
    cs = mdl.cases(profile, args.only, device)
    runnable, problems = mdl.available(cs)
    for line in notes + list(problems.values()):
        print(f"note: {line}", file=sys.stderr)
    if not runnable:  # skipped, not failed: a machine without the optional packages has nothing to run
        print(f"note: no selected {profile} model can run here; nothing measured", file=sys.stderr)
        return 0
    with Store(db) as store:
        if args.resume:
            phase = COMPILE_PHASE if args.compile_only else "main"
            done = stored_cases(store, profile, device, runnable, compilers, phase)
            if done:
                print(
                    f"resume: {len(done)} case(s) already stored in {db}: "
                    f"{', '.join(c.name for c in runnable if c.name in done)}",
                    file=sys.stderr,
                )
            runnable = [c for c in runnable if c.name not in done]
            if not runnable:
                print("resume: every selected case is stored; rewriting the report only", file=sys.stderr)
                return mrep.write_reports(store, profile, out, args, print_table=True)
        if device == "cpu" and args.threads:
            torch.set_num_threads(args.threads)
        if device.startswith("cuda"):
            from harness.bench.kernels.gpu_run import WARM_S, warm_clocks

            warm_clocks(device, WARM_S)
        run, results, deferred = run_models(
            cfg,
            store,
            runnable,
            label=args.label,
            git_ref=args.git_ref or bench_settings().git_ref,
            skipped={
                c.name: problems[c.spec.package]
                for c in cs
                if c not in runnable and c.spec.package in problems
            },
            progress=not args.quiet,
        )
        cmps = None
        if args.baseline and results and not args.compile_only:  # compile times have no samples to compare
            from harness.bench.judge.compare import compare, config_from_args, mark_suspects
            from harness.bench.reports.report import comparison_table, counts_line, interpreted, terminal

            cmp_cfg = config_from_args(args).for_device(device)
            try:
                base = _model_baseline(store, args.baseline.rstrip("?"), run, results)
                # the model tier has no side-by-side confirmation: its flags stay suspects, never a failure
                cmps = mark_suspects(
                    compare(results, base, cmp_cfg, new_run=run), "earlier runs' stored samples"
                )
                interp = interpreted(device, compilers)
                for c in cmps:
                    c.interpreter = c.compiler in interp
                print(f"against earlier runs {', '.join(str(b.id) for b in base.runs)}: {counts_line(cmps)}")
                flagged = comparison_table(cmps, only_flagged=True)
                if len(flagged) > 1:
                    print(terminal(flagged))
            except BaselineError as e:
                if not args.baseline.endswith("?"):
                    raise
                print(f"note: no baseline ({e}); this run is stored without comparison", file=sys.stderr)
        mrep.write_reports(store, profile, out, args, print_table=True, comparisons=cmps)
    if deferred:
        print(
            f"time budget ({cfg.budget_s:.0f} s) used: not run: {', '.join(deferred)}; run the same command "
            "with --resume to continue"
        )
    if cmps is not None and not args.no_fail and any(c.verdict == Verdict.REGRESSED for c in cmps):
        return 1
    return 0


def _list(profile: str, device: str, only: str | None) -> int:
    cs = mdl.cases(profile, only, device)
    runnable, problems = mdl.available(cs)
    for c in cs:
        why = "" if c in runnable else f"  (skipped: {c.spec.package} not importable)"
        print(f"{c.name:<28} {c.spec.package:<13} {c.source_hash}{why}")
    for line in problems.values():
        print(f"note: {line}")
    print(f"{len(cs)} {profile} model cases, {len(runnable)} runnable here")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["probe"]:
        return probe_main(argv[1:])
    print(
        "usage: python -m harness.bench.models.run probe CASE --profile P --device D --compiler C "
        "(internal; use `python -m harness bench models`)",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
