"""Execute a bench run: prepare each workload under each compiler, measure them interleaved, record results.

Steps per workload (case): make inputs -> float64 reference (eager) -> for each compiler: compile, first call
(cold compile time), max error vs the reference, warm-up, per-call estimate -> rounds of samples, the
compilers taking turns (so slow drifts of the machine hit all compilers alike) -> one `Result` per compiler,
committed to the store at once. A compiler that fails on a workload gives an `error` result; the run goes on.
With `passes` > 1 (the CPU default) every case is prepared first and the samples are taken in several sweeps
over all cases (`Executor.measure_cases`).

Compilers: the kernel tier's arms of `harness/arms.py` (`eager`: plain PyTorch, no torch.compile, the baseline;
`kiln`; `inductor`), or any other registered torch.compile backend, each compiled with `dynamic=False`. The
shape of a case (open, arms in turns, close) is `executor.CaseExecutor`'s; this module supplies what a kernel
workload needs (inputs, float64 reference, bytes moved, planted slowdowns, sweeps over all cases).
"""

from __future__ import annotations

import gc
import math
import time
import types
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from harness import arms
from harness.bench.core.executor import CaseExecutor, OpenCase, finished, gc_paused, live, one_line
from harness.bench.core.executor import deadline as _deadline
from harness.bench.core.records import Meta, Result
from harness.bench.core.stats import Stats
from harness.bench.kernels import workloads as wl
from harness.bench.kernels.measure import Timer, ceiling_gbps, flatten, make_timer, max_errors, unique_bytes
from harness.exc import UsageError
from harness.settings import Plant

__all__ = [
    "BenchConfig",
    "Executor",
    "OpenCase",
    "Prepared",
    "gc_paused",
    "one_line",
]  # sbs_worker imports these

BASELINE_COMPILER = arms.EAGER
TIER = "kernel"


@dataclass
class BenchConfig:
    """What to run and how long to measure it (see `defaults_for`)."""

    profile: str = "tiny"
    device: str = "cpu"
    compilers: list[str] = field(default_factory=lambda: list(arms.names(TIER)))
    timer: str = "wall"
    only: str | None = None
    target_s: float = 0.08  # measuring time per workload+compiler, split into `rounds`
    min_reps: int = 30
    max_reps: int = 400
    cap_s: float = (
        1.0  # slow calls (Triton's interpreter: up to ~1 s a call) get fewer reps, at least `floor_reps`
    )
    floor_reps: int = 5
    rounds: int = 5
    passes: int = 1  # sweeps over all workloads, each taking 1/passes of every workload's samples
    warmup_s: float = 0.02
    ceiling_mib: int = 64
    plant: Plant | None = None
    seed: int = 0
    compile_timeout_s: float = 600.0  # a compile + first call taking longer is an error result

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["plant"] = self.plant.spec() if self.plant else None
        return d


def defaults_for(device: str) -> dict[str, Any]:
    """Profile, timer and budgets suited to a device kind (tiny CPU runs vs GPU-sized runs)."""
    if device.startswith("cuda"):
        return {
            "profile": "gpu",
            "timer": "event",
            "target_s": 0.1,
            "min_reps": 20,
            "max_reps": 300,
            "warmup_s": 0.05,
            "ceiling_mib": 1024,
        }
    return {"profile": "tiny", "timer": "wall", "passes": 3}


def resolve_device(spec: str) -> str:
    """`auto` -> `cuda` when a GPU is present, else `cpu`; validates explicit devices."""
    if spec == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(spec)
    except RuntimeError:
        raise UsageError(f"bad device {spec!r} (use auto, cpu, cuda or cuda:N)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device {spec!r} requested but torch sees no GPU")
    if dev.type not in ("cpu", "cuda"):
        raise UsageError(f"unsupported device {spec!r} (use cpu or cuda; ROCm GPUs are 'cuda' in torch)")
    return spec


def check_compilers(names: list[str]) -> list[str]:
    """Validate compiler names (the kernel tier's arms or registered backends); `eager` (the baseline) is
    always measured and listed last."""
    out = [a.name for a in arms.check(names, TIER, any_backend=True) if a.name != BASELINE_COMPILER]
    return out + [BASELINE_COMPILER]


def compile_fn(fn: Callable[..., Any], compiler: str) -> Callable[..., Any]:
    """`fn` compiled by `compiler` (a private copy of its code object, so Dynamo caches never mix)."""
    arm = arms.get(compiler, TIER, any_backend=True)
    if arm.eager:
        return fn
    clone = types.FunctionType(
        fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
    return arm.compile(clone, dynamic=False)


def make_call(
    fn: Callable[..., Any], mode: str, inputs: tuple, grad_outs: list[torch.Tensor] | None
) -> Callable:
    """A no-argument callable running `fn` forward (`fwd`) or forward + backward (`bwd`)."""
    if mode == "fwd":
        return lambda: fn(*inputs)
    diff = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]

    def fwd_bwd() -> tuple:
        outs = flatten(fn(*inputs))
        needs = [o for o in outs if o.requires_grad]
        grads = torch.autograd.grad(needs, diff, grad_outs)
        return (*outs, *grads)

    return fwd_bwd


def _as_f64(inputs: tuple) -> tuple:
    return tuple(
        x.detach().to(torch.float64).requires_grad_(x.requires_grad) if x.is_floating_point() else x
        for x in inputs
    )


@dataclass
class Prepared:
    """A compiled, checked, warmed-up workload+compiler ready to be sampled."""

    call: Callable[[], Any]
    result: Result
    reps: int
    est_ns: float

    @property
    def planned(self) -> int:
        return self.reps


@dataclass
class Setup:
    """What every arm of a kernel case shares: its inputs, float64 reference outputs, output gradients (`bwd`)
    and the bytes it moves."""

    inputs: tuple
    refs: list[torch.Tensor]
    grad_outs: list[torch.Tensor] | None
    bytes_moved: int


class Executor(CaseExecutor[Prepared]):
    """Measures cases under compilers with one timer on one device (see module docstring)."""

    setup_failure = "workload setup failed"

    def __init__(self, cfg: BenchConfig, log: Callable[[str], None] | None = None):
        super().__init__(cfg, log)
        self.timer: Timer = make_timer(cfg.timer, self.device)
        self.ceiling: float | None = None

    def measure_ceiling(self) -> float:
        self.ceiling = ceiling_gbps(self.timer, self.cfg.ceiling_mib << 20)
        return self.ceiling

    # -------------------------------------------------------------- one case
    def _reference(
        self, case: wl.Case, inputs: tuple
    ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        """Float64 eager outputs (and the fixed output gradients, for `bwd` cases)."""
        outs = flatten(case.fn(*inputs))
        grad_outs = None
        if case.mode == "bwd":
            gen = torch.Generator(device=self.device)
            gen.manual_seed(self.cfg.seed + 1)
            grad_outs = [
                torch.randn(o.shape, generator=gen, device=self.device, dtype=torch.float32).to(o.dtype)
                for o in outs
                if o.requires_grad
            ]
        ref_in = _as_f64(inputs)
        ref_go = [g.to(torch.float64) for g in grad_outs] if grad_outs is not None else None
        with torch.no_grad() if case.mode == "fwd" else torch.enable_grad():
            refs = [r.detach() for r in flatten(make_call(case.fn, case.mode, ref_in, ref_go)())]
        return refs, grad_outs

    def _estimate(self, call: Callable[[], Any]) -> float:
        """Warm up for `warmup_s` (at least 3 calls) and return the median time of a call, ns."""
        samples = self.timer.sample(call, 3)
        deadline = time.perf_counter() + self.cfg.warmup_s
        while time.perf_counter() < deadline and len(samples) < 200:
            samples += self.timer.sample(call, max(1, len(samples) // 2))
        return Stats.of(samples[len(samples) // 3 :]).median

    def setup(self, case: wl.Case) -> Setup:
        """Inputs, reference and bytes moved (`CaseExecutor.open_case` prepares every compiler on them)."""
        inputs = case.make_inputs(self.device, self.cfg.seed)
        refs, grad_outs = self._reference(case, inputs)
        eager_outs = flatten(make_call(case.fn, case.mode, inputs, grad_outs)())
        bytes_moved = unique_bytes(
            [x for x in inputs if isinstance(x, torch.Tensor)] + eager_outs + (grad_outs or [])
        )
        del eager_outs
        return Setup(inputs, refs, grad_outs, bytes_moved)

    def failed(self, case: wl.Case, compiler: str, phase: str, error: str) -> Result:
        return Result(
            case.name,
            compiler,
            case.source_hash,
            status="error",
            phase=phase,
            timer=self.timer.name,
            error=error,
        )

    def prepare(self, case: wl.Case, setup: Setup, compiler: str, phase: str) -> Prepared | Result:
        """Compile, check, warm up; returns a `Prepared`, or an `error` Result when anything fails."""
        inputs, refs, grad_outs = setup.inputs, setup.refs, setup.grad_outs
        res = Result(
            workload=case.name,
            compiler=compiler,
            source_hash=case.source_hash,
            phase=phase,
            timer=self.timer.name,
            bytes=setup.bytes_moved,
            flops=case.flops(),
            ceiling_gbps=self.ceiling,
            meta=Meta(family=case.family.name, mode=case.mode, dtype=case.dtype_name, shape=list(case.shape)),
        )
        try:
            call = make_call(compile_fn(case.fn, compiler), case.mode, inputs, grad_outs)
            t0 = time.perf_counter()
            with _deadline(self.cfg.compile_timeout_s, f"{compiler} compile + first call"):
                outs = flatten(call())
                self.timer.sync()
            first_s = time.perf_counter() - t0
            res.max_abs_err, res.max_rel_err = max_errors(outs, refs)
            del outs
            est = self._estimate(call)
            if compiler != BASELINE_COMPILER:
                res.compile_s = max(0.0, first_s - est * 1e-9)
            plant = self.cfg.plant
            if plant and plant.applies(case.name, compiler):
                call = self.timer.planted(call, plant.fraction * est, plant.fraction)
                res.planted = plant.fraction
                est *= 1 + plant.fraction
            reps = int(
                min(self.cfg.max_reps, max(self.cfg.min_reps, self.cfg.target_s * 1e9 / max(est, 1.0)))
            )
            reps = min(reps, max(self.cfg.floor_reps, int(self.cfg.cap_s * 1e9 / max(est, 1.0))))
            return Prepared(call, res, reps, est)
        except Exception as e:  # noqa: BLE001 - a compiler failing a workload is a result, not a crash
            res.status, res.error = "error", one_line(e)
            return res

    def take(self, p: Prepared, n: int) -> list[float]:
        return self.timer.sample(p.call, n)

    def release(self) -> None:
        self.timer.reset()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def measure_cases(
        self, cases: list[wl.Case], compilers: list[str], done: Callable[[int, wl.Case, list[Result]], None]
    ) -> list[Result]:
        """Every case's results. With `passes` > 1 all cases are prepared first and then sampled in that
        many sweeps over the whole list, each taking its share of the samples: a burst of machine noise
        lasting seconds (a neighbour on a shared host) then lands in a fraction of every workload's samples
        instead of in all samples of a few consecutive workloads, which a median shrugs off."""
        passes = max(1, self.cfg.passes)
        out: list[Result] = []
        if passes == 1:
            for i, case in enumerate(cases):
                rs = self.measure_case(case, compilers)
                done(i, case, rs)
                out += rs
            return out
        torch._dynamo.reset()  # once: a reset per case would drop the compiled code of the open cases
        opened = []
        for i, case in enumerate(cases):
            self.log(f"[prepare {i + 1:>3}/{len(cases)}] {case.name}")
            opened.append(self.open_case(case, compilers))
        # Every case's compiled state is alive now: a full collection before each batch of samples would walk
        # all of it (seconds each on CI's heap). Frozen objects are skipped by the collector.
        gc.collect()
        gc.freeze()
        try:
            for p in range(passes):
                for i, oc in enumerate(opened):
                    self.sample_case(oc, 1.0 / passes)
                    if p == passes - 1:
                        rs = self.close_case(oc)
                        done(i, oc.case, rs)
                        out += rs
        finally:
            gc.unfreeze()
        return out

    def measure_arms(
        self,
        cases: list[wl.Case],
        compilers: list[str],
        arms: dict[str, Plant | None],
        done: Callable[[int, wl.Case, dict[str, list[Result]]], None],
    ) -> dict[str, list[Result]]:
        """Every case under every compiler in several arms measured side by side: an arm is a run of its own
        (its own results) whose calls may carry a planted slowdown. Each case is compiled once; in every round
        the arms take turns (their order rotating from round to round), so a swing of the machine lasting
        seconds or minutes lands on every arm alike. Used by the self-test, where runs measured one after
        another on a shared 2-core host differed by up to 2x (see `selftest`)."""
        torch._dynamo.reset()
        opened: list[tuple[OpenCase[Prepared], dict[str, dict[str, Prepared | Result]]]] = []
        for i, case in enumerate(cases):
            self.log(f"[prepare {i + 1:>3}/{len(cases)}] {case.name}")
            oc = self.open_case(case, compilers)
            opened.append((oc, {arm: self._arm(oc, plant) for arm, plant in arms.items()}))
        gc.collect()
        gc.freeze()
        out: dict[str, list[Result]] = {arm: [] for arm in arms}
        passes, rounds = max(1, self.cfg.passes), max(1, self.cfg.rounds)
        try:
            for p in range(passes):
                for i, (oc, by_arm) in enumerate(opened):
                    for r in range(rounds):
                        order = list(by_arm)[r % len(by_arm) :] + list(by_arm)[: r % len(by_arm)]
                        for arm in order:
                            for prep in live(by_arm[arm].values()):
                                self._sample(prep, max(1, math.ceil(prep.reps / (passes * rounds))))
                    if p == passes - 1:
                        self.close_case(oc)
                        rs = {arm: [finished(x) for x in by_arm[arm].values()] for arm in by_arm}
                        for arm, r_arm in rs.items():
                            out[arm] += r_arm
                        done(i, oc.case, rs)
        finally:
            gc.unfreeze()
        return out

    def _arm(self, oc: OpenCase, plant: Plant | None) -> dict[str, Prepared | Result]:
        """Per compiler, an arm's own copy of the case's prepared call (planted where `plant` applies)."""
        arm: dict[str, Prepared | Result] = {}
        for c, prep in oc.prepared.items():
            if not isinstance(prep, Prepared):
                arm[c] = replace(prep)
                continue
            res, call = replace(prep.result, samples=[], meta=replace(prep.result.meta)), prep.call
            if plant and plant.applies(oc.case.name, c):
                call, res.planted = (
                    self.timer.planted(call, plant.fraction * prep.est_ns, plant.fraction),
                    plant.fraction,
                )
            arm[c] = Prepared(call, res, prep.reps, prep.est_ns)
        return arm
