"""The quarantine file: validation with one clear error per problem, matching, and apply()'s verdict."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.exc import QuarantineError
from harness.suites import quarantine as q

ROOT = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "quarantine.toml"
    path.write_text(text)
    return path


def test_project_quarantine_file_is_valid():
    assert isinstance(q.load(ROOT / "ci" / "quarantine.toml"), q.Quarantine)


def test_valid_entries_load_in_order(tmp_path):
    path = _write(
        tmp_path,
        """
[[test]]
id = "tests/a/test_x.py::test_one"
reason = "races on teardown"
backends = ["rocm"]
issue = "#7"

[[test]]
id = "tests/a/test_x.py::test_two[3]"
reason = "bf16 tolerance"
""",
    )
    quarantine = q.load(path)
    assert [e.id for e in quarantine.entries] == [
        "tests/a/test_x.py::test_one",
        "tests/a/test_x.py::test_two[3]",
    ]
    assert quarantine.entries[0].backends == ("rocm",)
    assert quarantine.entries[0].issue == "#7"


@pytest.mark.parametrize(
    "text, message",
    [
        ('[[test]]\nid = "tests/a.py::t"\nreason = \n', "not valid TOML: Invalid value (at line 3"),
        ('[[test]]\nid = "tests/a.py::t"\n', "[[test]] #1 (id 'tests/a.py::t'): missing 'reason'"),
        ('[[test]]\nid = "tests/a.py::t"\nreason = "  "\n', "missing 'reason'"),
        ('[[test]]\nreason = "x"\n', "[[test]] #1: missing 'id'"),
        ('[[test]]\nid = "test_a"\nreason = "x"\n', "must be a pytest node id"),
        ('[[test]]\nid = "tests/a.py::t"\nreason = "x"\nowner = "me"\n', "unknown key(s) ['owner']"),
        ('[[test]]\nid = "tests/a.py::t"\nreason = "x"\nbackends = ["tpu"]\n', "unknown backend(s) ['tpu']"),
        ('[[test]]\nid = "tests/a.py::t"\nreason = "x"\nbackends = "rocm"\n', "'backends' must be a list"),
        ("tests = []\n", "unknown top-level key(s) ['tests']"),
        ('test = "x"\n', "'test' must be an array of tables"),
        (
            '[[test]]\nid = "tests/a.py::t"\nreason = "x"\n[[test]]\nid = "tests/b.py::u"\nreason = "y"\n'
            '[[test]]\nid = "tests/a.py::t"\nreason = "z"\n',
            "duplicate id 'tests/a.py::t' in [[test]] #1 and #3",
        ),
    ],
)
def test_broken_file_gives_one_clear_error(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(QuarantineError) as info:
        q.load(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_and_wrong_kind_of_file(tmp_path):
    with pytest.raises(QuarantineError, match="quarantine file not found"):
        q.load(tmp_path / "nope.toml")
    (tmp_path / "q.json").write_text("{}")
    with pytest.raises(QuarantineError, match="must be a .toml file"):
        q.load(tmp_path / "q.json")


def test_id_without_params_covers_every_parametrization():
    quarantine = q.parse(
        {"test": [{"id": "tests/a.py::t", "reason": "r"}, {"id": "tests/a.py::u[2]", "reason": "r"}]}
    )
    assert quarantine.match("tests/a.py::t[1-bf16]") is not None
    assert quarantine.match("tests/a.py::t") is not None
    assert quarantine.match("tests/a.py::tt") is None
    assert quarantine.match("tests/a.py::u[2]") is not None
    assert quarantine.match("tests/a.py::u[3]") is None


def test_backends_limit_an_entry():
    quarantine = q.parse({"test": [{"id": "tests/a.py::t", "reason": "r", "backends": ["rocm"]}]})
    assert quarantine.match("tests/a.py::t", "rocm") is not None
    assert quarantine.match("tests/a.py::t", "cuda") is None
    assert quarantine.match("tests/a.py::t") is not None  # no backend given: every entry applies


def test_apply_splits_blocking_quarantined_and_ready_to_leave():
    quarantine = q.parse(
        {
            "test": [
                {"id": "tests/a.py::flaky", "reason": "known race"},
                {"id": "tests/a.py::fixed", "reason": "was flaky"},
                {"id": "tests/a.py::gone", "reason": "deleted test"},
                {"id": "tests/a.py::amd_only", "reason": "rocm only", "backends": ["rocm"]},
            ]
        }
    )
    outcomes = {
        "tests/a.py::broken": ["failed", "failed"],
        "tests/a.py::ok": "passed",
        "tests/a.py::flaky": ["passed", "failed", "passed"],
        "tests/a.py::fixed": ["passed", "passed", "xfailed"],
        "tests/a.py::amd_only": ["error"],
    }
    verdict = q.apply(outcomes, quarantine, backend="cuda")
    assert verdict.failing == ["tests/a.py::amd_only", "tests/a.py::broken"]
    assert not verdict.ok
    assert [(r.id, r.failures, r.runs) for r in verdict.quarantined_failing] == [("tests/a.py::flaky", 1, 3)]
    assert [(r.id, r.runs) for r in verdict.ready_to_leave] == [("tests/a.py::fixed", 3)]
    assert [e.id for e in verdict.not_run] == ["tests/a.py::gone"]
    md = verdict.markdown()
    assert "Ready to leave quarantine" in md and "`tests/a.py::fixed`: passed 3/3" in md
    assert verdict.to_dict()["quarantined_failing"][0]["reason"] == "known race"

    on_rocm = q.apply({"tests/a.py::amd_only": "error", "tests/a.py::flaky": "failed"}, quarantine, "rocm")
    assert on_rocm.ok and on_rocm.failing == []


def test_apply_rejects_unknown_outcomes():
    with pytest.raises(QuarantineError, match="unknown test outcome 'boom'"):
        q.apply({"tests/a.py::t": "boom"}, q.Quarantine())


def test_cli_reports_broken_quarantine_file_in_one_line(tmp_path):
    path = _write(tmp_path, '[[test]]\nid = "tests/a.py::t"\n')
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "flakes",
            "--quarantine",
            str(path),
            "tests/harness/planted/planted_flakes.py",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"harness flakes: error: {path}: [[test]] #1 (id 'tests/a.py::t'): missing 'reason' "
        "(say why the test is quarantined)"
    ]
    assert "Traceback" not in proc.stderr


def test_apply_takes_the_runners_test_results():
    from harness.record import TestOutcome

    tests = [
        TestOutcome("tests/a.py::t", "failed", "boom", 0.1),
        TestOutcome("tests/a.py::u", "passed", "", 0.1),
    ]
    quarantine = q.parse({"test": [{"id": "tests/a.py::t", "reason": "known"}]})
    verdict = q.apply(q.outcomes_of(tests), quarantine, "cpu")
    assert verdict.ok
    assert [r.id for r in verdict.quarantined_failing] == ["tests/a.py::t"]
