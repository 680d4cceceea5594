"""The numerics suite saves its kiln runs (KILN_NUMERICS_SAVE); saved suite runs compare case by case, and the
harness report of a suite run points at them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from numerics_helpers import harness

from harness.numerics import report
from harness.numerics.records import ProgramKind
from harness.numerics.store import RunFolder
from harness.suites.report import _numerics_lines

ROOT = Path(__file__).resolve().parents[3]
TESTS = [
    "tests/numerics/test_numerics.py::test_error_vs_fp64_not_worse_than_eager[softmax-bf16]",
    "tests/numerics/test_numerics.py::test_emulate_eager_precision_closes_the_gap[bf16]",
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("suite") / "numerics-outputs"
    env = {**os.environ, "KILN_NUMERICS_SAVE": str(out), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", *TESTS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_each_kiln_run_of_a_test_is_a_run_folder(saved):
    cases = sorted(p.name for p in saved.iterdir())
    assert cases == [
        "tests.numerics.test_numerics.py.test_emulate_eager_precision_closes_the_gap_bf16_",
        "tests.numerics.test_numerics.py.test_emulate_eager_precision_closes_the_gap_bf16_-1",
        "tests.numerics.test_numerics.py.test_error_vs_fp64_not_worse_than_eager_softmax-bf16_",
    ]
    run = RunFolder(saved / cases[1])
    assert [s.compiler for s in run.sides] == ["kiln-emulate", "eager"]
    assert run.program.kind is ProgramKind.SUITE_CASE and set(run.manifest.reference or {}) == {"out"}


def test_suite_runs_compare_case_by_case(saved, tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(saved, other)
    rc, _, err = harness(
        capsys, "numerics", "compare", f"{saved}:kiln", f"{other}:kiln", "--out", tmp_path / "c"
    )
    assert rc == 0, err
    reports = report.read_json(tmp_path / "c" / "report.json").reports
    assert len(reports) == 2  # the kiln-emulate case has no 'kiln' side: left out with a note
    assert all(p.differing == 0 for r in reports for o in r.outputs for p in o.pairs)
    md = (tmp_path / "c" / "report.md").read_text()
    assert "left out" in md and "closes_the_gap_bf16_-1" in md
    # within one saved run: kiln against eager, the fp64 reference stored with the case
    rc, _out, err = harness(
        capsys, "numerics", "compare", saved, "--json", tmp_path / "one.json", "--md", "/dev/null"
    )
    assert rc == 0, err
    one = {r.program.ref: r for r in report.read_json(tmp_path / "one.json").reports}
    softmax = one[TESTS[0]]
    assert softmax.reference == "stored with the run (fp64 eager on CPU)"
    assert [s.compiler for s in softmax.sides] == ["kiln", "eager"]
    emulate = one[TESTS[1] + "#1"].outputs[0].pairs[0]
    assert emulate.differing == 0  # kiln-emulate is bitwise eager, as the test itself asserts


def test_harness_results_folder_is_found_and_reported(saved, tmp_path, capsys):
    run = tmp_path / "results" / "run1"
    shutil.copytree(saved, run / "suites" / "numerics-outputs")
    lines = _numerics_lines(SimpleNamespace(path=run))
    assert lines == [
        (
            f"numerics outputs: {run / 'suites' / 'numerics-outputs'} (3 cases); compare: python -m harness "
            f"numerics compare OTHER_RUN:kiln {run}:kiln --out {run / 'numerics-compare'}"
        )
    ]
    rc, _, err = harness(
        capsys, "numerics", "compare", f"{run}:kiln", f"{saved}:kiln", "--out", run / "numerics-compare"
    )
    assert rc == 0, err
    assert (
        _numerics_lines(SimpleNamespace(path=run))[1]
        == f"numerics comparison: {run / 'numerics-compare' / 'report.md'}"
    )
