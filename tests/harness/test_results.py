"""JUnit parsing, classification, node ids, atomic writes, summary lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import results as res
from harness.exc import ResultsError

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="2" skipped="2" tests="7">
<testcase classname="tests.numerics.test_a" name="test_ok" file="tests/numerics/test_a.py" line="1" time="0.1"/>
<testcase classname="tests.numerics.test_a" name="test_bad" file="tests/numerics/test_a.py" time="0.2">
  <failure message="assert 1 == 2">trace</failure></testcase>
<testcase classname="tests.numerics.test_a.TestC" name="test_p[2-fp32]" file="tests/numerics/test_a.py" time="0">
  <failure message="[XPASS(strict)] known">x</failure></testcase>
<testcase classname="tests.numerics.test_a" name="test_err" file="tests/numerics/test_a.py" time="0">
  <error message="failed on setup with &quot;RuntimeError&quot;">e</error></testcase>
<testcase classname="tests.numerics.test_a" name="test_skip" file="tests/numerics/test_a.py" time="0">
  <skipped type="pytest.skip" message="no gpu">s</skipped></testcase>
<testcase classname="tests.numerics.test_a" name="test_xf" file="tests/numerics/test_a.py" time="0">
  <skipped type="pytest.xfail" message="known bug"/></testcase>
<testcase classname="tests.numerics.test_a" name="test_two" file="tests/numerics/test_a.py" time="0.5"/>
</testsuite></testsuites>
"""


def _write(tmp_path: Path, text: str = JUNIT) -> Path:
    p = tmp_path / "s.xml"
    p.write_text(text)
    return p


def test_outcomes_and_node_ids(tmp_path):
    tests = res.parse_junit(_write(tmp_path))
    got = [(t.id, t.outcome) for t in tests]
    assert got == [
        ("tests/numerics/test_a.py::test_ok", "passed"),
        ("tests/numerics/test_a.py::test_bad", "failed"),
        ("tests/numerics/test_a.py::TestC::test_p[2-fp32]", "failed"),
        ("tests/numerics/test_a.py::test_err", "error"),
        ("tests/numerics/test_a.py::test_skip", "skipped"),
        ("tests/numerics/test_a.py::test_xf", "xfailed"),
        ("tests/numerics/test_a.py::test_two", "passed"),
    ]
    assert res.counts(tests) == {"passed": 2, "failed": 2, "error": 1, "skipped": 1, "xfailed": 1}
    assert tests[1].message == "assert 1 == 2" and tests[1].failing and not tests[0].failing


def test_node_id_without_file_attribute_resolves_module_from_the_tree(tmp_path):
    (tmp_path / "tests" / "pkg").mkdir(parents=True)
    (tmp_path / "tests" / "pkg" / "test_m.py").write_text("")
    xml = JUNIT.replace(' file="tests/numerics/test_a.py"', "").replace(
        "tests.numerics.test_a", "tests.pkg.test_m"
    )
    ids = [t.id for t in res.parse_junit(_write(tmp_path, xml), root=tmp_path)]
    assert ids[2] == "tests/pkg/test_m.py::TestC::test_p[2-fp32]"
    assert ids[0] == "tests/pkg/test_m.py::test_ok"


def test_truncated_junit_is_a_clear_error(tmp_path):
    with pytest.raises(ResultsError, match="not valid XML.*cut off"):
        res.parse_junit(_write(tmp_path, JUNIT[:200]))
    with pytest.raises(ResultsError, match="not found"):
        res.parse_junit(tmp_path / "missing.xml")


def test_atomic_write_replaces_whole_files(tmp_path):
    target = tmp_path / "sub" / "run.json"
    res.atomic_write_json(target, {"b": 1, "a": [1, 2]})
    assert res.read_json(target) == {"a": [1, 2], "b": 1}
    assert target.read_text().index('"a"') < target.read_text().index('"b"')  # sorted keys
    res.atomic_write_text(target, "x")
    assert target.read_text() == "x"
    assert [p.name for p in target.parent.iterdir()] == ["run.json"]  # no temp files left


def test_summary_line(tmp_path):
    tests = res.parse_junit(_write(tmp_path))
    line = res.summary_line("numerics", "cpu/container", tests, 1.25, "FAILED", "r/numerics.xml")
    assert line == (
        "suite numerics [cpu/container] FAILED: 2 passed, 2 failed, 1 error, 1 skipped, 1 xfailed "
        "in 1.2s -> r/numerics.xml"
    )
    assert (
        res.summary_line("x", "cpu/native", [], 0.0, "EMPTY")
        == "suite x [cpu/native] EMPTY: no tests in 0.0s"
    )


def test_parse_junit_skips_the_bare_testcase_of_an_interrupted_test(tmp_path):
    """pytest writes a nameless <testcase/> for the test a Ctrl-C cut short; it is not a passed test."""
    from harness.results import parse_junit

    xml = tmp_path / "junit.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_a" name="test_ok" time="0.1"/>'
        '<testcase classname="tests.test_a" name="test_bad" time="0.1">'
        '<skipped type="pytest.skip" message="s"/><error message="teardown broke"/></testcase>'
        '<testcase time="0.000"/>'
        "</testsuite></testsuites>"
    )
    results = parse_junit(xml)
    assert [(r.outcome, r.message) for r in results] == [("passed", ""), ("error", "teardown broke")]


def test_atomic_write_leaves_a_device_or_fifo_in_place(tmp_path):
    """`--md /dev/null` must not replace /dev/null with a file: a non-regular path is written in place."""
    import os
    import threading

    from harness.results import atomic_write_text

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo).read()))
    reader.start()
    atomic_write_text(fifo, "report\n")
    reader.join(timeout=10)
    assert got == ["report\n"]
    assert fifo.is_fifo()


def test_node_id_prefers_the_plugins_exact_id():
    import xml.etree.ElementTree as ET

    from harness.results import node_id

    case = ET.fromstring(
        '<testcase classname="tests.numerics.test_numerics" name="test_x[a.b::c-1]" file="tests/numerics/test_numerics.py">'
        '<properties><property name="kiln_nodeid" value="tests/numerics/test_numerics.py::test_x[a.b::c-1]"/>'
        "</properties></testcase>"
    )
    assert node_id(case) == "tests/numerics/test_numerics.py::test_x[a.b::c-1]"
    bare = ET.fromstring(
        '<testcase classname="tests.numerics.test_numerics" name="test_y" '
        'file="tests/numerics/test_numerics.py"/>'
    )
    assert node_id(bare) == "tests/numerics/test_numerics.py::test_y"  # files written without the plugin


def test_job_summary_is_appended_only_on_github(tmp_path, monkeypatch):
    from harness.results import append_job_summary

    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    assert append_job_summary("# nothing") is False
    target = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(target))
    monkeypatch.delenv("KILN_GITHUB_SUMMARY", raising=False)
    assert append_job_summary("# not asked") is False and not target.exists()  # opt-in: --github-summary
    assert append_job_summary("# forced\n", force=True)  # `bench summary`, `bench job-summary`
    monkeypatch.setenv("KILN_GITHUB_SUMMARY", "1")  # what every verb's --github-summary sets
    assert append_job_summary("# one\n") and append_job_summary("# two")
    assert target.read_text() == "# forced\n\n# one\n\n# two\n\n"


def test_printable_escapes_what_xml_and_utf8_cannot_carry_and_keeps_the_rest():
    text = "a\x00b\x1b[31mred\ud800 \x07\x7f\uffff\t\n\r é ✓"
    assert res.printable(text) == "a\\x00b\\x1b[31mred\\ud800 \\x07\\x7f\\uffff\t\n\r é ✓"
    assert res.printable("plain") == "plain"


def test_atomic_write_text_escapes_an_unpaired_surrogate(tmp_path):
    res.atomic_write_text(tmp_path / "r.txt", "x\ud800y")
    assert (tmp_path / "r.txt").read_text(encoding="utf-8") == "x\\ud800y"


def test_runs_started_in_the_same_second_get_folders_of_their_own(tmp_path):
    """Parallel test workers (or two jobs on one runner) may start runs in one second: each process gets its own
    folder (the mkdir is the claim), none fails."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    code = (
        "import sys; from pathlib import Path; from harness.suites.runner import new_run_dir; "
        "print(new_run_dir('cpu', 'native', Path(sys.argv[1])))"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path / "results")],
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    made = [out.strip() for out, _ in outs]
    assert len(set(made)) == 6 and all(Path(m).is_dir() for m in made)
