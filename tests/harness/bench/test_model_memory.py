"""The model tier's memory measurement (`harness/bench/models/memory.py`) against a fake caching allocator: one
definition for every arm, CUDA-graph recording inside the window, compile-time allocations outside it."""

from __future__ import annotations

import pytest

from harness.bench.core.records import Meta, Result
from harness.bench.models import memory as mm
from harness.bench.models import report as mrep

MIB = 2**20


class FakeAllocator:
    """Allocated and reserved bytes as the caching allocator counts them: the general pool keeps freed blocks
    cached (reserved) until `release`; a private (CUDA-graph) pool keeps its memory reserved for good."""

    def __init__(self) -> None:
        self.allocated = self.reserved = 0
        self.cached = 0  # reserved general-pool bytes no tensor uses
        self.alloc_peak = self.res_peak = 0

    def _peaks(self) -> None:
        self.alloc_peak = max(self.alloc_peak, self.allocated)
        self.res_peak = max(self.res_peak, self.reserved)

    def alloc(self, n: int) -> None:
        take = min(n, self.cached)
        self.cached -= take
        self.reserved += n - take
        self.allocated += n
        self._peaks()

    def free(self, n: int) -> None:
        self.allocated -= n
        self.cached += n

    def pool(self, n: int) -> None:
        """A recording's private pool: reserved for good; its tensors allocated while they live."""
        self.reserved += n
        self.allocated += n
        self._peaks()

    def pool_free(self, n: int) -> None:
        self.allocated -= n  # the pool's memory stays reserved

    def source(self) -> mm.StatsSource:
        def stats() -> dict[str, int]:
            return {
                mm.ALLOC_NOW: self.allocated,
                mm.ALLOC_PEAK: self.alloc_peak,
                mm.RES_NOW: self.reserved,
                mm.RES_PEAK: self.res_peak,
            }

        def reset() -> None:
            self.alloc_peak, self.res_peak = self.allocated, self.reserved

        def release() -> None:
            self.reserved -= self.cached
            self.cached = 0

        return mm.StatsSource(stats, reset, release)


WEIGHTS, ACT, COMPILE_TMP = 100 * MIB, 300 * MIB, 1000 * MIB


def _eager_step(a: FakeAllocator) -> None:
    a.alloc(ACT)
    a.free(ACT)


def _arm(a: FakeAllocator, cuda_graphs: str, window: str) -> dict:
    """Baseline, weights, first step (with a compile-time temporary), warm-up, recording, two steady steps.
    `cuda_graphs`: "" (no graphs), "kiln" (pool tensors stay allocated: handed out as aliases), "inductor"
    (outputs handed out from pool memory the allocator no longer counts). `window`: "v2" (this module) or
    "v1" (the old one: peaks reset after warm-up and recording)."""
    w = mm.MemoryWindow(a.source())
    w.baseline()
    a.alloc(WEIGHTS)
    a.alloc(COMPILE_TMP)  # e.g. a compile-time matmul benchmark
    a.free(COMPILE_TMP)
    _eager_step(a)  # the first step runs unrecorded (warm-up) under both CUDA-graph modes
    if window == "v2":
        w.open()
    if cuda_graphs:
        a.pool(ACT)  # the recording: its intermediates live while it records
        a.pool_free(ACT - (10 * MIB if cuda_graphs == "kiln" else 0))  # Inductor: outputs no longer counted
    else:
        _eager_step(a)
    if window == "v1":
        w.open()
    for _ in range(2):  # steady state: replays allocate nothing
        if not cuda_graphs:
            _eager_step(a)
    return w.close()


@pytest.mark.parametrize("graphs", ["", "kiln", "inductor"])
def test_window_counts_recording_and_leaves_compile_time_out(graphs):
    m = _arm(FakeAllocator(), graphs, "v2")
    assert m["definition"] == mm.DEFINITION
    assert m["peak_allocated_bytes"] == WEIGHTS + ACT  # the step's worst moment, whatever the mode
    assert m["peak_reserved_bytes"] >= WEIGHTS + ACT  # a graph pool stays reserved
    assert m["peak_allocated_bytes"] < WEIGHTS + COMPILE_TMP


def test_the_old_window_missed_inductors_recorded_step():
    """The issue's symptom: the window opened after recording saw weights only for Inductor's mode (eager /
    inductor-cg ratio ~4 here), and the kiln mode's live pool outputs: one mode counted, the other not."""
    eager, kiln, ind = (
        _arm(FakeAllocator(), g, "v1")["peak_allocated_bytes"] for g in ("", "kiln", "inductor")
    )
    assert eager == WEIGHTS + ACT and ind == WEIGHTS and kiln == WEIGHTS + 10 * MIB
    new = {g: _arm(FakeAllocator(), g, "v2")["peak_allocated_bytes"] for g in ("", "kiln", "inductor")}
    assert new[""] == new["kiln"] == new["inductor"]


def test_closing_an_unopened_window_is_an_error():
    with pytest.raises(RuntimeError, match="before it was opened"):
        mm.MemoryWindow(FakeAllocator().source()).close()


def _r(compiler: str, meta: dict) -> Result:
    return Result("model.x.train.fp32", compiler, "h", timer="step", meta=meta)


def test_ratios_only_between_equal_definitions():
    new = lambda n, res: {
        "memory": {
            "definition": mm.DEFINITION,
            "peak_allocated_bytes": n,  # noqa: E731
            "peak_reserved_bytes": res,
        },
        "peak_mem_bytes": n,
    }
    eager, kiln = _r("eager", new(400, 800)), _r("kiln-cg", new(200, 1600))
    assert mrep.mem_ratio(eager, kiln) == 2.0
    assert mrep.mem_ratio(eager, kiln, "peak_reserved_bytes") == 0.5
    old = _r("inductor-cg", {"peak_mem_bytes": 100})
    assert mm.definition_of(old.meta) == "window-v1" and mrep.mem_ratio(eager, old) is None
    assert mrep.mem_ratio(_r("eager", {"peak_mem_bytes": 300}), old) == 3.0  # two old ones: as before
    assert mm.definition_of(Meta()) is None and mrep.mem_ratio(_r("eager", {}), _r("kiln", {})) is None


def test_memcheck_markdown_shows_tier_and_by_hand_numbers_and_failures():
    from harness.bench.models import memcheck as mc

    point = {
        "point": "window opened",
        mm.ALLOC_NOW: 100 * MIB,
        mm.ALLOC_PEAK: 100 * MIB,
        mm.RES_NOW: 120 * MIB,
        mm.RES_PEAK: 120 * MIB,
        "driver_used": 900 * MIB,
    }
    arm = {
        "tier": {"peak_allocated_bytes": 400 * MIB, "peak_reserved_bytes": 500 * MIB},
        "by_hand": {
            "points": [point],
            "peak_allocated_bytes": 396 * MIB,
            "peak_reserved_bytes": 510 * MIB,
            "driver_used_delta_bytes": 530 * MIB,
            "static_bytes": 300 * MIB,
        },
    }
    res = {
        "case": "model.ci_bert.train.fp32",
        "definition": mm.DEFINITION,
        "counted": mm.DESCRIPTION,
        "arms": {"inductor-cg": arm},
        "failed": ["kiln-cg: the tier measured nothing (boom)"],
        "notes": [],
    }
    md = mc.markdown(res)
    assert "| inductor-cg | 400.0 | 396.0 | 500.0 | 510.0 | 530.0 | 300.0 |" in md
    assert "| window opened | 100.0 | 100.0 | 120.0 | 120.0 | 900.0 |" in md
    assert "- FAILED: kiln-cg: the tier measured nothing (boom)" in md and mm.DESCRIPTION in md
