"""Profiler-timer attribution, on synthetic profiler events (the GPU path itself runs on the device)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from harness.bench.kernels.measure import attribute_kernel_time

CPU, GPU = "cpu", "cuda"


@dataclass
class Range:
    start: float
    end: float


@dataclass
class Event:
    name: str
    device_type: str
    time_range: Range
    is_user_annotation: bool = False


def ev(name: str, dev: str, lo: float, hi: float, annotation: bool = False) -> Event:
    return Event(name, dev, Range(lo, hi), annotation)


def one_bwd_call(i: int, t: float) -> list[Event]:
    """A fwd+bwd call at time `t` (us): flush before its marker, 2 forward kernels from the main thread,
    3 backward kernels from autograd's thread, and the annotations Kineto mirrors onto the GPU."""
    return [
        ev("flush_fill", GPU, t - 20, t - 10),  # the L2 flush: before the marker, not counted
        ev(f"mark{i}", CPU, t, t + 100, annotation=True),  # record_function: an annotation too
        ev(f"mark{i}", GPU, t + 5, t + 25, annotation=True),  # spans the forward kernels only
        ev("Torch-Compiled Region: 0/0", GPU, t + 5, t + 25, annotation=True),
        ev("fwd_a", GPU, t + 5, t + 15),
        ev("fwd_b", GPU, t + 15, t + 25),
        ev("bwd_a", GPU, t + 40, t + 50),  # autograd thread: not a child of the marker
        ev("bwd_b", GPU, t + 50, t + 70),
        ev("memset", GPU, t + 70, t + 72),
    ]


def test_backward_kernels_count_and_annotations_do_not():
    events = one_bwd_call(0, 1000) + one_bwd_call(1, 2000)
    assert attribute_kernel_time(events, "mark", 2, CPU, GPU) == [
        52_000.0,
        52_000.0,
    ]  # 10 + 10 + 10 + 20 + 2 us


def test_missing_markers_or_kernels_are_errors_not_zeros():
    events = one_bwd_call(0, 1000)
    with pytest.raises(RuntimeError, match="1 of 2 call markers"):
        attribute_kernel_time(events, "mark", 2, CPU, GPU)
    empty_call = [ev("mark1", CPU, 5000, 5100, annotation=True)]
    with pytest.raises(RuntimeError, match="no device activity"):
        attribute_kernel_time(events + empty_call, "mark", 2, CPU, GPU)
