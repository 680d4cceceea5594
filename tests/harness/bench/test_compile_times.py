"""harness/bench/models/compile_times.py: which probes run with which environment, and the table it reports (the
probes themselves are faked: real ones are fresh processes compiling a model, the device stage's job)."""

from __future__ import annotations

import os
import sys

import pytest

from harness.bench.core.records import AutotuneTimes, Result
from harness.bench.models import catalog as mdl
from harness.bench.models import compile_times as ct
from harness.bench.models import warmcache
from harness.bench.models.run import ModelBenchConfig, compile_probe


def _probe(case="model.gpt2.infer.fp32"):
    return compile_probe(mdl.find(case, "tiny", "cpu"), "kiln", ModelBenchConfig(device="cpu"))


def test_autotune_env_per_compiler():
    assert ct.autotune_env("kiln") == {"KILN_AUTOTUNE": "1"}
    assert ct.autotune_env("kiln-cg") == {"KILN_AUTOTUNE": "1"}
    assert ct.autotune_env("inductor") == {"TORCHINDUCTOR_MAX_AUTOTUNE": "1"}
    assert ct.autotune_env("eager") is None


def test_measure_runs_a_cold_warm_pair_then_an_autotuned_pair(monkeypatch):
    calls = []
    answers = iter(
        [
            {"compile_s": 10.0, "steady_s": 0.02},
            {"compile_s": 2.0, "steady_s": 0.020},
            {"compile_s": 30.0, "steady_s": 0.019},
            {"compile_s": 2.5, "steady_s": 0.016},
        ]
    )

    def fake_probe(p, environ):
        calls.append((environ.get("KILN_AUTOTUNE"), environ["XDG_CACHE_HOME"]))
        return next(answers)

    monkeypatch.setattr(ct, "probe", fake_probe)
    t = ct.measure("model.gpt2.infer.fp32", "kiln", _probe())
    assert (t.cold_s, t.warm_s, t.autotune_s, t.autotune_warm_s) == (10.0, 2.0, 30.0, 2.5)
    assert [c[0] for c in calls] == [None, None, "1", "1"]
    assert (
        calls[0][1] == calls[1][1] != calls[2][1] == calls[3][1]
    )  # warm reuses cold's caches; autotune: fresh
    assert t.step_s == 0.020 and t.autotune_step_s == 0.016 and not t.error


def test_a_failed_cold_probe_skips_the_rest(monkeypatch):
    monkeypatch.setattr(ct, "probe", lambda p, environ: {"error": "boom"})
    t = ct.measure("model.gpt2.infer.fp32", "kiln", _probe())
    assert t.cold_s is None and t.autotune_s is None and t.error == "cold: boom"


def test_cold_only_runs_one_probe_and_takes_its_steady_step(monkeypatch):
    calls = []

    def fake_probe(p, environ):
        calls.append(environ["XDG_CACHE_HOME"])
        return {"compile_s": 10.0, "steady_s": 0.02}

    monkeypatch.setattr(ct, "probe", fake_probe)
    t = ct.measure("model.gpt2.infer.fp32", "kiln", _probe(), autotune=False, warm=False)
    assert len(calls) == 1 and (t.cold_s, t.warm_s, t.step_s) == (10.0, None, 0.02) and not t.error


def test_a_kiln_cold_probe_without_aot_autograd_is_flagged_not_cold(monkeypatch):
    """kiln compiles every graph through AOTAutograd: a cold breakdown without it means a cache answered. The
    seconds stay, with the problem named; Inductor's breakdown (no kiln phases) is never flagged."""
    answers = {
        "kiln": {"compile_s": 2.0, "steady_s": 0.01, "breakdown": {"dynamo": 1.0, "kiln.front_cache": 0.1}},
        "inductor": {"compile_s": 5.0, "steady_s": 0.01, "breakdown": {"dynamo": 1.0, "backend": 3.0}},
    }
    for compiler, answer in answers.items():
        monkeypatch.setattr(ct, "probe", lambda p, environ, a=answer: a)
        t = ct.measure("model.gpt2.infer.fp32", compiler, _probe(), autotune=False, warm=False)
        assert t.cold_s == answer["compile_s"]
        assert t.error == ("cold: " + ct.NOT_COLD if compiler == "kiln" else "")
    cold = {"compile_s": 3.0, "breakdown": {"dynamo": 1.0, "aot_autograd": 0.5, "kiln.pass.lower": 0.2}}
    monkeypatch.setattr(ct, "probe", lambda p, environ: cold)
    assert not ct.measure("model.gpt2.infer.fp32", "kiln", _probe(), autotune=False, warm=False).error


def test_cpu_slices_split_the_cpus_into_disjoint_near_equal_runs():
    assert ct.cpu_slices(1, (0, 1, 2)) == [(0, 1, 2)]
    assert ct.cpu_slices(3, tuple(range(16))) == [tuple(range(6)), tuple(range(6, 11)), tuple(range(11, 16))]
    assert ct.cpu_slices(2, (7, 3, 5, 1)) == [(1, 3), (5, 7)]
    for bad in (0, 5):
        with pytest.raises(ValueError, match="1 to 4 CPUs"):
            ct.cpu_slices(bad, (0, 1, 2, 3))


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux's")
def test_a_pinned_probe_and_its_children_run_on_their_cpus_only(tmp_path):
    """`pinned` sets the affinity before the probe's interpreter starts: the probe, and a child it starts,
    see exactly the given CPUs (both compilers size their compile workers from that set)."""
    mine = sorted(os.sched_getaffinity(0))
    cpus = (mine[-1],)
    script = (
        "import os, subprocess, sys; "
        "kid = subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'], "
        "capture_output=True, text=True).stdout.strip(); "
        "print('TAG' + __import__('json').dumps({'compile_s': 1.0, 'me': sorted(os.sched_getaffinity(0)), "
        "'kid': kid}))"
    )
    p = ct.Probe([sys.executable, "-c", script], lambda folder: {}, "TAG", str(tmp_path), 60, cpus=cpus)
    got = ct.probe(p, dict(os.environ))
    assert got["me"] == list(cpus) and got["kid"] == str(list(cpus))
    assert ct.pinned(["x"], None) == ["x"]


def test_table_and_report_lines():
    rows = [
        ct.CompileTimes("model.a", "kiln", 10.0, 2.0, 30.0, 2.5, 0.020, 0.016),
        ct.CompileTimes("model.a", "inductor", 20.0, 4.0, None, None, None, None, "autotuned: timeout"),
    ]
    lines = ct.table(rows)
    assert "| model.a | kiln | 10.0 | 2.0 | 20% | 30.0 | 2.5 | 20.00 | 16.00 | 1.250 |" in lines
    assert any("geomean over 1 rows: kiln 1.250" in ln for ln in lines)
    assert "- model.a inductor: autotuned: timeout" in lines
    result = Result(
        "model.a",
        "kiln",
        "h",
        compile_s=10.0,
        meta={
            "compile_warm_s": 2.0,
            "compile_autotune_s": 30.0,
            "compile_autotune_warm_s": 2.5,
            "probe_step_s": 0.02,
            "probe_autotune_step_s": 0.016,
        },
    )  # a stored result's keys
    assert result.meta.autotune == AutotuneTimes(30.0, 2.5, 0.02, 0.016)
    section = ct.report_lines([result, Result("b", "kiln", "h", compile_s=1.0)])
    assert (
        section[0].startswith("### Compile times") and sum(ln.startswith("| model.a") for ln in section) == 1
    )
    assert ct.report_lines([]) == []


def test_goals_are_counted_row_by_row():
    rows = [
        ct.CompileTimes("model.a", "kiln", 10.0, 2.0, 30.0, 2.5, 0.020, 0.016),
        ct.CompileTimes("model.a", "inductor", 20.0, 4.0),
        ct.CompileTimes("model.b", "kiln", 8.0, 3.0, 20.0, 2.9, 0.010, 0.011),
        ct.CompileTimes("model.b", "inductor", 9.0, 2.5),
        ct.CompileTimes("model.c", "kiln", 5.0, None, error="warm: boom"),
    ]
    lines = ct.goals(rows)
    assert "- goal warm <= inductor warm (kiln): 1/2 rows; not on model.b" in lines
    assert "- goal warm <= 25% of cold (kiln): 1/2 rows; not on model.b" in lines
    assert "- goal autotuned step >= heuristic (probes) (kiln): 1/2 rows; not on model.b" in lines
    assert "- goal autotuned warm <= warm (kiln): 1/2 rows; not on model.a" in lines
    assert all(ln in ct.table(rows) for ln in lines) and ct.goals(rows[1:2]) == []


def test_warmcache_command_bad_input_is_one_line(capsys):
    assert warmcache.main(["--only", "no-such-model", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "no-such-model" in err


def test_the_model_tier_runs_each_pair_of_probes_once(monkeypatch):
    """`--compile-times` with `--autotune-times`: one cold/warm pair and one autotuned pair (four fresh
    processes, not six), the cold/warm error in `compile_probe_error`, an autotuned one in its own key."""
    from harness.bench.core.records import Result
    from harness.bench.models.run import ModelExecutor

    seen = []
    answers = iter(
        [
            {"compile_s": 10.0, "steady_s": 0.02},
            {"compile_s": 2.0, "steady_s": 0.02},
            {"compile_s": 30.0},
            {"error": "timeout"},
        ]
    )

    def fake_probe(p, environ):
        seen.append(environ.get("KILN_AUTOTUNE"))
        return next(answers)

    monkeypatch.setattr(ct, "probe", fake_probe)
    ex = ModelExecutor(ModelBenchConfig(device="cpu", compile_times=("kiln",), autotune_times=True))
    res = Result("model.gpt2.infer.fp32", "kiln", "h")
    assert ex._compile_times(mdl.find("model.gpt2.infer.fp32", "tiny", "cpu"), res) == ""
    assert seen == [None, None, "1", "1"]
    assert (res.compile_s, res.meta.compile_warm_s, res.meta.autotune.cold_s) == (10.0, 2.0, 30.0)
    assert res.meta.autotune.error == "autotuned warm: timeout" and res.meta.compile_probe_error is None
    assert res.meta.as_dict()["compile_autotune_error"] == "autotuned warm: timeout"  # the stored key


def test_errors_of_the_two_pairs_stay_apart(monkeypatch):
    answers = iter([{"compile_s": 1.0}, {"compile_s": 0.5}, {"error": "boom"}])
    monkeypatch.setattr(ct, "probe", lambda p, environ: next(answers))
    t = ct.measure("model.gpt2.infer.fp32", "kiln", _probe())
    assert (t.error, t.autotune_error, t.problems) == ("", "autotuned: boom", "autotuned: boom")
    assert ct.autotune_times(t).error == "autotuned: boom"


def test_a_probe_line_without_seconds_is_an_error(monkeypatch):
    monkeypatch.setattr(ct, "probe", lambda p, environ: {"steady_s": 0.01})
    t = ct.measure("model.gpt2.infer.fp32", "kiln", _probe())
    assert t.cold_s is None and t.error == "cold: no result" and t.autotune_s is None
