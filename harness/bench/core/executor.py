"""The executor skeleton shared by the kernel tier (`execute.Executor`) and the model tier
(`model_run.ModelExecutor`): open a case, measure its arms in turns, close it into one `Result` per arm.

Terms:
- *case*: what one tier measures under every compiler arm (`harness/arms.py`): a kernel workload (`workloads.Case`)
  or a model step (`models.ModelCase`).
- *open*: the case's *setup* is made once (kernel: inputs, float64 reference, bytes moved; model: the model
  built on the CPU and its higher-precision reference step): a failing setup is an `error` Result for every arm
  (`setup_failure: Type: message`). Then each arm is *prepared* (compiled, first call timed and checked, warmed
  up, its samples planned): a `Prepared` (anything with `result` and `planned`), or an `error` Result.
- *turns*: `rounds` rounds; in each, every live arm (prepared, not failed) takes its share of its planned
  samples in turn, so a slow drift of the machine hits all arms alike. The garbage collector is paused while
  sampling (`gc_paused`), and other processes' CPU use is read around each turn (`host_load`, into
  `meta.host_load`). An arm failing while sampling becomes an `error` Result; the others go on.
- *close*: the results (an error result keeps no samples: they would mix into statistics), the case's
  compiled state released (`release`).

A tier supplies only what differs: `setup`, `failed` (the error Result of an arm that never ran), `prepare`,
`take` (n samples of a prepared arm) and `release`.
"""

from __future__ import annotations

import gc
import math
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from harness.bench.core import host_load
from harness.bench.core.records import Result


class Measurable(Protocol):
    """A prepared arm: its result (samples accumulate there) and how many samples it plans in all."""

    result: Result

    @property
    def planned(self) -> int: ...


P = TypeVar("P", bound=Measurable)


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


@contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
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
    sample is host jitter, not the workload's cost. The young generations are collected first (the garbage of the
    calls before); the old one is not walked at every turn: with torch and compiled code loaded it holds
    hundreds of thousands of objects, a full collection costing about 0.2-1 s of CPU each time."""
    was = gc.isenabled()
    gc.collect(1)
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def live(prepared: Iterable[Any]) -> list[Any]:
    """The prepared arms still measuring (not failed at preparation or while sampling)."""
    return [p for p in prepared if not isinstance(p, Result) and p.result.status == "ok"]


def finished(p: Any) -> Result:
    """The result of a prepared arm or an error; an error keeps no samples (they would mix into stats)."""
    res = p if isinstance(p, Result) else p.result
    if res.status == "error":
        res.samples = []
    return res


@dataclass
class OpenCase(Generic[P]):
    """A case between `open_case` and `close_case`: per compiler a prepared arm, or an error `Result`."""

    case: Any
    prepared: dict[str, P | Result]

    def live(self) -> list[P]:
        return live(self.prepared.values())


class CaseExecutor(Generic[P]):
    """The skeleton (module docstring) over a tier's config (`device`, `rounds`: turns per case); subclasses
    supply the hooks below."""

    setup_failure = "setup failed"  # the error of every arm when `setup` raises

    def __init__(self, cfg: Any, log: Callable[[str], None] | None = None):
        import torch

        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))

    @property
    def rounds(self) -> int:
        return self.cfg.rounds

    # ------------------------------------------------------------ what a tier supplies
    def setup(self, case: Any) -> Any:
        """What every arm of `case` shares (raises when the case cannot be set up)."""
        raise NotImplementedError

    def failed(self, case: Any, compiler: str, phase: str, error: str) -> Result:
        """The `error` Result of an arm that could not run."""
        raise NotImplementedError

    def prepare(self, case: Any, setup: Any, compiler: str, phase: str) -> P | Result:
        """The arm prepared (compiled, checked, warmed up), or an `error` Result; never raises."""
        raise NotImplementedError

    def take(self, p: P, n: int) -> list[float]:
        """`n` samples (ns) of a prepared arm."""
        raise NotImplementedError

    def release(self) -> None:
        """After a case is closed: free what its arms held (caches, device memory)."""

    # ------------------------------------------------------------ the shape
    def open_case(self, case: Any, compilers: list[str], phase: str = "main") -> OpenCase[P]:
        """The case's setup made and every arm prepared, in the order given."""
        try:
            made = self.setup(case)
        except Exception as e:  # noqa: BLE001 - a broken case is reported for every arm
            why = f"{self.setup_failure}: {one_line(e)}"
            return OpenCase(case, {c: self.failed(case, c, phase, why) for c in compilers})
        return OpenCase(case, {c: self.prepare(case, made, c, phase) for c in compilers})

    def sample_case(self, oc: OpenCase[P], reps_scale: float = 1.0) -> None:
        """Add `reps_scale` of each arm's planned samples to its result, the arms taking turns in rounds."""
        rounds = max(1, self.rounds)
        for _ in range(rounds):
            for p in oc.live():
                self._sample(p, max(1, math.ceil(p.planned * reps_scale / rounds)))

    def _sample(self, p: P, n: int) -> None:
        try:
            with host_load.measured(p.result.meta), gc_paused():
                p.result.samples += self.take(p, n)
        except Exception as e:  # noqa: BLE001 - an arm failing while sampling is an error result
            p.result.status, p.result.error = "error", one_line(e)

    def close_case(self, oc: OpenCase[P]) -> list[Result]:
        """The case's results (error results keep no samples); its compiled state and memory released."""
        out = [finished(p) for p in oc.prepared.values()]
        oc.prepared.clear()
        self.release()
        return out

    def measure_case(
        self, case: Any, compilers: list[str], phase: str = "main", reps_scale: float = 1.0
    ) -> list[Result]:
        """Results of `case` under each compiler, sampled in turns."""
        import torch

        torch._dynamo.reset()
        oc = self.open_case(case, compilers, phase)
        self.sample_case(oc, reps_scale)
        return self.close_case(oc)
