"""The comparison's typed records (harness/numerics/comparison.py): what compare makes, report.json holds and
report.read_json reads back: round trip, the old shape, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from numerics_helpers import harness, planted, save

from harness.numerics import compare as cmp
from harness.numerics import report
from harness.numerics.comparison import (
    Both,
    Check,
    Closer,
    Comparison,
    OutputComparison,
    Pair,
    RowSummary,
    WorstElement,
)
from harness.numerics.exc import NumericsError, RecordError
from harness.numerics.records import Structure
from harness.numerics.store import RunFolder


def _bump(out, call):
    out.view(-1)[[3, 300, 1000]] += 0.5
    return out


@pytest.fixture(scope="module")
def comparison(tmp_path_factory: pytest.TempPathFactory) -> Comparison:
    """softmax_rows (a rows program) under eager and eager with three elements changed, run twice."""
    base = tmp_path_factory.mktemp("comparison")
    run = save(base / "r", ["eager", planted("bumped", _bump, "softmax_rows")], ref="softmax_rows", repeat=2)
    folder = RunFolder(run)
    return cmp.compare([cmp.Side("A", folder, "eager"), cmp.Side("B", folder, "bumped")])


def test_compare_makes_typed_records(comparison):
    assert comparison.program.structure is Structure.ROWS and comparison.baseline == "A"
    (out,) = comparison.outputs
    (pair,) = out.pairs
    assert (pair.a, pair.b, pair.mismatched) == ("A", "B", 3)
    assert pair.closer_mismatched == Closer(3, 0, 0)
    assert pair.max_err_mismatched.of("B", "A") == pair.max_err_mismatched.b > pair.max_err_mismatched.a
    w = pair.worst[0]
    assert w.closer == "A" and isinstance(w.inputs["x"], RowSummary) and w.inputs["x"].length == 128
    assert all(s.nondeterminism is not None and s.nondeterminism.identical for s in out.sides)
    assert pair.verdict.startswith("run B is further from fp64 on 3 of 3 mismatched elements")


def test_round_trip_and_the_json_keys_by_label(comparison):
    d = comparison.to_dict()
    again = Comparison.from_dict(json.loads(json.dumps(d)))
    assert again == comparison and again.to_dict() == d
    pair = d["outputs"][0]["pairs"][0]
    assert set(pair["closer_mismatched"]) == {"A", "B", "tie"} and set(pair["max_err"]) == {"A", "B"}
    worst = pair["worst"][0]
    assert {"A", "B", "err_A", "err_B", "ulp_A", "ulp_B", "fp64", "at", "closer"} <= set(worst)
    assert set(worst["inputs"]["x"]) == {"length", "nonfinite", "min", "max", "mean"}


def test_report_file_round_trip(comparison, tmp_path):
    check = Check(2.0, None, ["softmax_rows out: run B max error ..."])
    report.write_json(tmp_path / "r.json", [comparison], check)
    back = report.read_json(tmp_path / "r.json")
    assert back.reports == [comparison] and back.check == check


def test_a_report_of_the_old_shape_reads(comparison):
    """Reports written before `ref_absmax`, `case`, `left_out` and `check` existed."""
    d = comparison.to_dict()
    for key in ("case", "left_out", "check"):
        d.pop(key)
    for o in d["outputs"]:
        o.pop("ref_absmax")
    old = Comparison.from_dict(d)
    assert old.case == "" and old.left_out == [] and old.check is None
    assert old.outputs[0].ref_absmax == 0.0
    assert any("run B max error" in f for f in cmp.check(old, 2.0, None))
    assert report.markdown(old).splitlines()[0] == "# Numerics: `softmax_rows`"


def test_bad_reports_are_one_clear_error(comparison, tmp_path):
    d = comparison.to_dict()
    del d["outputs"][0]["pairs"][0]["closer_mismatched"]
    with pytest.raises(RecordError, match="malformed pair .*no 'closer_mismatched'"):
        Comparison.from_dict(d)
    d = comparison.to_dict()
    d["program"]["kind"] = "script"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"schema": 1, "reports": [d], "check": None}))
    with pytest.raises(NumericsError, match=f"{path}: program kind 'script' is not one of"):
        report.read_json(path)
    path.write_text(json.dumps({"schema": 99, "reports": []}))
    with pytest.raises(NumericsError, match="schema version 99"):
        report.read_json(path)
    path.write_text("[]")
    with pytest.raises(NumericsError, match="no list of reports"):
        report.read_json(path)


def test_values_keyed_by_label():
    assert Both(1.0, 2.0).to_dict("A", "C") == {"A": 1.0, "C": 2.0}
    assert Closer.from_dict({"A": 1, "C": 2, "tie": 3}, "A", "C") == Closer(1, 2, 3)
    with pytest.raises(RecordError, match="no 'C'"):
        Closer.from_dict({"A": 1, "tie": 3}, "A", "C")
    w = WorstElement([1], Both(1.0, 2.0), 1.5, Both(0.5, 0.5), Both(1.0, 1.0), "tie", {"x": 3.0})
    assert WorstElement.from_dict(w.to_dict("S1", "S2"), "S1", "S2") == w
    assert RowSummary.from_dict(RowSummary(4, 4).to_dict()) == RowSummary(4, 4)  # no finite value: no min/max


def test_pair_and_output_records_are_values(comparison):
    out: OutputComparison = comparison.outputs[0]
    pair: Pair = out.pairs[0]
    with pytest.raises(AttributeError):
        pair.verdict = "changed"  # type: ignore[misc]
    assert Pair.from_dict(pair.to_dict()) == pair and OutputComparison.from_dict(out.to_dict()) == out


def test_report_json_written_by_the_cli_reads_back(comparison, tmp_path: Path, capsys):
    """`compare --json` output is what read_json reads (case, left_out and check set by the command line)."""
    run = comparison.sides[0].run
    args = ("numerics", "compare", f"{run}:eager,bumped", "--json", tmp_path / "r.json", "--md", "/dev/null")
    rc, _, err = harness(capsys, *args, "--check")
    assert rc == 1, err  # B is further from fp64 than the bound
    back = report.read_json(tmp_path / "r.json")
    (r,) = back.reports
    assert back.check is not None and back.check.failures and r.check is not None
    assert r.check.failures == cmp.check(r, 2.0, None) and r.outputs == comparison.outputs
