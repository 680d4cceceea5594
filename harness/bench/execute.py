"""Execute a bench run: prepare each workload under each compiler, measure them interleaved, record results.

Steps per workload (case): make inputs -> float64 reference (eager) -> for each compiler: compile, first call
(cold compile time), max error vs the reference, warm-up, per-call estimate -> rounds of samples, the
compilers taking turns (so slow drifts of the machine hit all compilers alike) -> one `Result` per compiler,
committed to the store at once. A compiler that fails on a workload gives an `error` result; the run goes on.
With `passes` > 1 (the CPU default) every case is prepared first and the samples are taken in several sweeps
over all cases (`Executor.measure_cases`).

Compilers: `eager` (plain PyTorch, no torch.compile: the baseline), `kiln` (`import compiler`), `inductor`,
or any other registered torch.compile backend.
"""

from __future__ import annotations

import gc
import importlib
import math
import signal
import sys
import threading
import time
import types
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterable, Iterator

import torch

from harness.exc import UsageError
from harness.settings import Plant

from . import workloads as wl
from .measure import Timer, ceiling_gbps, flatten, make_timer, max_errors, unique_bytes
from .records import Result
from .stats import Stats

BASELINE_COMPILER = "eager"


@dataclass
class BenchConfig:
    """What to run and how long to measure it (see `defaults_for`)."""

    profile: str = "tiny"
    device: str = "cpu"
    compilers: list[str] = field(default_factory=lambda: ["kiln", "inductor", "eager"])
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
    """Validate compiler names; `eager` (the baseline) is always measured and listed last."""
    known = {"eager", "kiln", "inductor", "aot_eager"}
    if not set(names) <= known:
        # loading the backends' entry points imports kiln: only when a name needs it (kiln imported after
        # Inductor's triton warns that it cannot choose the interpreter, which an inductor-only run need not say)
        known |= set(torch._dynamo.list_backends())
    bad = [n for n in names if n not in known]
    if bad:
        raise UsageError(f"unknown compiler {bad[0]!r} (known: {', '.join(sorted(known))})")
    out = [n for n in dict.fromkeys(names) if n != BASELINE_COMPILER]
    return out + [BASELINE_COMPILER]


def one_line(e: BaseException, limit: int = 300) -> str:
    """`Type: first line`, naming the innermost cause too (Dynamo wraps backend errors)."""
    root = e
    for _ in range(10):
        inner = getattr(root, "inner_exception", None) or root.__cause__
        if inner is None or inner is root:
            break
        root = inner
    lines = [ln for ln in str(root).strip().splitlines() if ln.strip()]
    text = f"{type(root).__name__}: {lines[0].strip() if lines else ''}".strip()
    if root is not e:
        text = f"{type(e).__name__}: {text}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def compile_fn(fn: Callable[..., Any], compiler: str) -> Callable[..., Any]:
    """`fn` compiled by `compiler` (a private copy of its code object, so Dynamo caches never mix)."""
    if compiler == BASELINE_COMPILER:
        return fn
    if compiler == "kiln":
        importlib.import_module("compiler")  # registers the backend
    clone = types.FunctionType(
        fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
    return torch.compile(clone, backend=compiler, dynamic=False)


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


@contextmanager
def _deadline(seconds: float, what: str) -> Iterator[None]:
    """Raise TimeoutError in this (main) thread after `seconds` (SIGALRM; a no-op elsewhere or without it)."""
    usable = (
        seconds > 0 and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    )
    if not usable:
        yield
        return

    def fire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"{what} took longer than {seconds:.0f}s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while timing (as `timeit` does): a collection inside a
    sample is host jitter, not the workload's cost."""
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@dataclass
class Prepared:
    """A compiled, checked, warmed-up workload+compiler ready to be sampled."""

    call: Callable[[], Any]
    result: Result
    reps: int
    est_ns: float


class Executor:
    """Measures cases under compilers with one timer on one device (see module docstring)."""

    def __init__(self, cfg: BenchConfig, log: Callable[[str], None] | None = None):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.timer: Timer = make_timer(cfg.timer, self.device)
        self.ceiling: float | None = None
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))

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

    def prepare(
        self,
        case: wl.Case,
        compiler: str,
        inputs: tuple,
        refs: list[torch.Tensor],
        grad_outs: list[torch.Tensor] | None,
        bytes_moved: int,
        phase: str,
    ) -> Prepared | Result:
        """Compile, check, warm up; returns a `Prepared`, or an `error` Result when anything fails."""
        res = Result(
            workload=case.name,
            compiler=compiler,
            source_hash=case.source_hash,
            phase=phase,
            timer=self.timer.name,
            bytes=bytes_moved,
            flops=case.flops(),
            ceiling_gbps=self.ceiling,
            meta={
                "family": case.family.name,
                "mode": case.mode,
                "dtype": case.dtype_name,
                "shape": list(case.shape),
            },
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
                call = self.timer.planted(call, plant.fraction * est)
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

    def open_case(self, case: wl.Case, compilers: list[str], phase: str = "main") -> "OpenCase":
        """Inputs, reference and every compiler prepared (compiled, checked, warmed up) for `case`."""
        try:
            inputs = case.make_inputs(self.device, self.cfg.seed)
            refs, grad_outs = self._reference(case, inputs)
            eager_outs = flatten(make_call(case.fn, case.mode, inputs, grad_outs)())
            bytes_moved = unique_bytes(
                [x for x in inputs if isinstance(x, torch.Tensor)] + eager_outs + (grad_outs or [])
            )
            del eager_outs
        except Exception as e:  # noqa: BLE001 - a broken workload is reported for every compiler
            failed = [
                Result(
                    case.name,
                    c,
                    case.source_hash,
                    status="error",
                    phase=phase,
                    timer=self.timer.name,
                    error=f"workload setup failed: {one_line(e)}",
                )
                for c in compilers
            ]
            return OpenCase(case, {r.compiler: r for r in failed})
        return OpenCase(
            case, {c: self.prepare(case, c, inputs, refs, grad_outs, bytes_moved, phase) for c in compilers}
        )

    def sample_case(self, oc: "OpenCase", reps_scale: float = 1.0) -> None:
        """Add `reps_scale` of each compiler's planned samples to its result, in interleaved rounds."""
        rounds = max(1, self.cfg.rounds)
        for _ in range(rounds):
            for p in oc.live():
                self._sample(p, max(1, math.ceil(p.reps * reps_scale / rounds)))

    def close_case(self, oc: "OpenCase") -> list[Result]:
        """The case's results (error results keep no samples); its compiled state and memory released."""
        out = [_finished(p) for p in oc.prepared.values()]
        oc.prepared.clear()
        self.timer.reset()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return out

    def measure_case(
        self, case: wl.Case, compilers: list[str], phase: str = "main", reps_scale: float = 1.0
    ) -> list[Result]:
        """Results of `case` under each compiler, sampled in interleaved rounds."""
        torch._dynamo.reset()
        oc = self.open_case(case, compilers, phase)
        self.sample_case(oc, reps_scale)
        return self.close_case(oc)

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
        opened: list[tuple[OpenCase, dict[str, dict[str, Prepared | Result]]]] = []
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
                        order = list(by_arm)[r % len(by_arm):] + list(by_arm)[: r % len(by_arm)]
                        for arm in order:
                            for prep in _live(by_arm[arm].values()):
                                self._sample(prep, max(1, math.ceil(prep.reps / (passes * rounds))))
                    if p == passes - 1:
                        self.close_case(oc)
                        rs = {arm: [_finished(x) for x in by_arm[arm].values()] for arm in by_arm}
                        for arm, r_arm in rs.items():
                            out[arm] += r_arm
                        done(i, oc.case, rs)
        finally:
            gc.unfreeze()
        return out

    def _arm(self, oc: "OpenCase", plant: Plant | None) -> dict[str, Prepared | Result]:
        """Per compiler, an arm's own copy of the case's prepared call (planted where `plant` applies)."""
        arm: dict[str, Prepared | Result] = {}
        for c, prep in oc.prepared.items():
            if not isinstance(prep, Prepared):
                arm[c] = replace(prep)
                continue
            res, call = replace(prep.result, samples=[], meta=dict(prep.result.meta)), prep.call
            if plant and plant.applies(oc.case.name, c):
                call, res.planted = self.timer.planted(call, plant.fraction * prep.est_ns), plant.fraction
            arm[c] = Prepared(call, res, prep.reps, prep.est_ns)
        return arm

    def _sample(self, p: Prepared, n: int) -> None:
        try:
            with gc_paused():
                p.result.samples += self.timer.sample(p.call, n)
        except Exception as e:  # noqa: BLE001
            p.result.status, p.result.error = "error", one_line(e)


def _live(prepared: Iterable[Prepared | Result]) -> list[Prepared]:
    """The prepared calls still measuring (not failed at preparation or while sampling)."""
    return [p for p in prepared if isinstance(p, Prepared) and p.result.status == "ok"]


def _finished(p: Prepared | Result) -> Result:
    """The result of a prepared call or an error; an error keeps no samples (they would mix into stats)."""
    res = p.result if isinstance(p, Prepared) else p
    if res.status == "error":
        res.samples = []
    return res


@dataclass
class OpenCase:
    """A case between `open_case` and `close_case`: per compiler a `Prepared`, or an error `Result`."""

    case: wl.Case
    prepared: dict[str, Prepared | Result]

    def live(self) -> list[Prepared]:
        return _live(self.prepared.values())
