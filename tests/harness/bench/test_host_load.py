"""Other processes' CPU use while an arm is sampled (harness/bench/core/host_load.py): the window arithmetic, the
executor filling `meta.host_load`, and the report's note for arms measured beside other work."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest

from harness.bench.core import host_load
from harness.bench.core.executor import CaseExecutor, OpenCase
from harness.bench.core.host_load import Snapshot
from harness.bench.core.records import Result


def test_a_window_counts_what_other_processes_used_per_wall_second():
    # 4 s of wall time; the host was busy 9 CPU-seconds of which this process used 1: 2 other cores
    load = host_load.add(None, Snapshot(100.0, 10.0, 50.0), Snapshot(109.0, 11.0, 54.0))
    assert load["other_cpu_s"] == 8.0 and load["wall_s"] == 4.0 and load["other_cores"] == 2.0
    # a second, quiet window of 4 s halves the average
    load = host_load.add(load, Snapshot(109.0, 11.0, 54.0), Snapshot(110.0, 12.0, 58.0))
    assert load["other_cpu_s"] == 8.0 and load["wall_s"] == 8.0 and load["other_cores"] == 1.0
    # counters read a tick apart can put own time above the host's: never below zero
    assert host_load.add(None, Snapshot(1.0, 0.0, 0.0), Snapshot(1.0, 0.5, 1.0))["other_cores"] == 0.0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")
def test_a_real_snapshot_reads_the_host_and_this_process():
    a = host_load.snapshot()
    sum(i * i for i in range(200_000))  # some CPU time of our own
    b = host_load.snapshot()
    assert a is not None and b is not None
    assert b.busy_s >= a.busy_s and b.own_s >= a.own_s and b.wall_s > a.wall_s
    assert a.own_s <= a.busy_s  # this process's time is part of the host's


def test_without_proc_stat_nothing_is_recorded(monkeypatch, tmp_path):
    monkeypatch.setattr(host_load, "PROC_STAT", tmp_path / "missing")
    assert host_load.snapshot() is None
    r = Result("w", "kiln", "h")
    with host_load.measured(r.meta):
        pass
    assert r.meta.host_load is None


@dataclass
class Arm:
    result: Result
    planned: int = 4


class Counting(CaseExecutor[Arm]):
    """An executor whose samples are made up: what is under test is the turns' bookkeeping."""

    def take(self, p: Arm, n: int) -> list[float]:
        return [1.0] * n


def test_the_executor_records_the_load_of_each_arms_turns(monkeypatch):
    clock = iter(range(0, 1000, 2))  # each snapshot 2 s after the last

    def fake() -> Snapshot:
        t = float(next(clock))
        return Snapshot(busy_s=3 * t, own_s=t, wall_s=t)  # 3 busy cores, one of them ours: 2 others

    monkeypatch.setattr(host_load, "snapshot", fake)
    ex = Counting.__new__(Counting)
    ex.cfg = type("Cfg", (), {"rounds": 2})()
    arms = {c: Arm(Result("w", c, "h")) for c in ("kiln", "inductor")}
    ex.sample_case(OpenCase("case", dict(arms)))
    for arm in arms.values():
        load = arm.result.meta.host_load
        assert load["other_cores"] == 2.0 and load["wall_s"] == 4.0  # two turns of 2 s
        assert len(arm.result.samples) == 4
    again = Result.from_dict(arms["kiln"].result.as_dict())
    assert again.meta.host_load == arms["kiln"].result.meta.host_load


def test_the_report_notes_an_arm_measured_beside_other_work():
    quiet = {"other_cores": 0.1, "cpus": 32}
    busy = {"other_cores": 7.6, "cpus": 32}
    assert host_load.busy_note("ci_bert.infer.bf16", "kiln", quiet) is None
    assert host_load.busy_note("ci_bert.infer.bf16", "kiln", None) is None
    line = host_load.busy_note("ci_bert.infer.bf16", "kiln", busy)
    assert line is not None and line.startswith(
        "ci_bert.infer.bf16 kiln: other processes kept 7.6 of 32 cores"
    )
