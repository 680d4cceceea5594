"""The bench's typed records (harness/bench/core/records.py): `Meta` reads every stored `meta` object and writes
it back in the same flat shape; a report's comparisons read as `Comparison` records."""

from __future__ import annotations

import json

import pytest

from harness.bench.core.records import AutotuneTimes, Meta, Result, RunInfo, Verdict, comparisons_of


def test_meta_reads_a_stored_model_row_and_writes_the_same_keys():
    stored = {
        "tier": "models",
        "family": "gpt2",
        "mode": "train",
        "dtype": "fp32",
        "shape": {"batch": 2, "seq": 8},
        "accuracy": {"pass": False, "note": "output: error 0.1"},
        "peak_mem_bytes": 2000,
        "compile_warm_s": 0.5,
        "compile_autotune_s": 30.0,
        "compile_autotune_warm_s": 2.5,
        "probe_step_s": 0.02,
        "probe_autotune_step_s": 0.016,
        "compile_autotune_error": "boom",
        "written_by_a_newer_harness": [1, 2],
    }
    meta = Meta.from_dict(json.loads(json.dumps(stored)))
    assert (meta.family, meta.shape, meta.peak_mem_bytes, meta.compile_warm_s) == (
        "gpt2",
        {"batch": 2, "seq": 8},
        2000,
        0.5,
    )
    assert meta.accuracy_passed is False and meta.accuracy_note == "output: error 0.1"
    assert meta.autotune == AutotuneTimes(30.0, 2.5, 0.02, 0.016, "boom")
    assert meta.extra == {"written_by_a_newer_harness": [1, 2]}
    assert meta.as_dict() == stored


def test_a_result_given_a_plain_meta_object_holds_a_meta_and_round_trips():
    r = Result("w", "kiln", "h", samples=[1.0, 2.0], meta={"rounds": [1.0, 2.0], "family": "softmax"})
    assert isinstance(r.meta, Meta) and r.meta.rounds == [1.0, 2.0] and r.meta.accuracy_passed is None
    d = r.as_dict()
    assert d["meta"] == {"rounds": [1.0, 2.0], "family": "softmax"}
    assert Result.from_dict(json.loads(json.dumps(d))) == r


def test_an_unsaved_run_has_no_rid():
    run = RunInfo(id=None, uid="u", created_at="2026-01-01T00:00:00+00:00")
    with pytest.raises(ValueError, match="not stored yet"):
        _ = run.rid
    run.id = 7
    assert run.rid == 7


def test_comparisons_of_a_report():
    assert comparisons_of(None) is None and comparisons_of({"runs": []}) is None
    cmps = comparisons_of(
        {
            "comparisons": [
                {
                    "workload": "a",
                    "compiler": "kiln",
                    "verdict": "regressed",
                    "confirmed": True,
                    "ratio": 1.3,
                },
                {"workload": "b", "compiler": "kiln", "verdict": "regressed", "confirmed": None},
                {
                    "workload": "c",
                    "compiler": "kiln",
                    "verdict": "ok",
                },  # an older harness's spelling: kept as it is
            ]
        }
    )
    assert cmps is not None
    assert [c.confirmed_regression for c in cmps] == [True, False, False]
    assert cmps[0].verdict is Verdict.REGRESSED and cmps[2].verdict == "ok"
