"""Flake detection end to end: planted tests run N times under pytest-flakefinder and are classified."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.exc import FlakeRunError, PreflightError, RunInterrupted, UnknownBackend
from harness.suites import flakes
from harness.suites import quarantine as q
from harness.suites.flake_plugin import base_nodeid

ROOT = Path(__file__).resolve().parents[2]
PLANTED = "tests/harness/planted/planted_flakes.py"
# The planted module needs neither torch nor the compiler: keep tests/conftest.py out of its process.
ISOLATE = ["--confcutdir=tests/harness/planted"]
RUNS = 6
FLAKES = [sys.executable, "-m", "harness", "flakes"]  # the CLI under test, in a subprocess


@pytest.fixture
def planted(tmp_path, monkeypatch):
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("KILN_PLANTED_STATE", str(state))
    monkeypatch.delenv("KILN_PLANTED_INTERRUPT", raising=False)
    return tmp_path


def _by_id(report: dict) -> dict[str, dict]:
    return {t["id"].rsplit("::", 1)[-1]: t for t in report["tests"]}


def test_planted_tests_are_classified_passing_failing_and_flaky(planted):
    report = flakes.detect(
        [PLANTED],
        backend="cpu",
        runs=RUNS,
        out_dir=planted / "out",
        quarantine=q.Quarantine(),
        extra=ISOLATE,
        root=ROOT,
    )
    tests = _by_id(report)
    assert tests["test_planted_passing"]["status"] == "passing"
    assert tests["test_planted_broken"]["status"] == "failing"
    assert tests["test_planted_broken"]["failure_rate"] == 1.0
    flaky = tests["test_planted_flaky"]
    assert (flaky["status"], flaky["failed"], flaky["passed"]) == ("flaky", RUNS // 3, RUNS - RUNS // 3)
    assert flaky["failure_rate"] == pytest.approx(1 / 3, abs=1e-3)
    assert "planted flake: run 3 fails" in flaky["first_failure"]
    assert all(t["runs"] == RUNS for t in report["tests"])
    assert report["complete"] and not report["ok"]
    assert report["blocking"] == [f"{PLANTED}::test_planted_broken", f"{PLANTED}::test_planted_flaky"]
    assert report["counts"] == {"passing": 3, "failing": 1, "flaky": 1, "skipped": 0}
    saved = json.loads((planted / "out" / "flakes.json").read_text())
    assert saved == report
    md = (planted / "out" / "flakes.md").read_text()
    assert f"| `{PLANTED}::test_planted_flaky` | flaky | 2 / 6 | 33% | no |" in md


def test_quarantined_tests_run_and_are_reported_but_do_not_block(planted):
    quarantine = q.parse(
        {
            "test": [
                {"id": f"{PLANTED}::test_planted_flaky", "reason": "planted flake"},
                {"id": f"{PLANTED}::test_planted_passing", "reason": "was flaky once"},
            ]
        }
    )
    ids = [f"{PLANTED}::test_planted_flaky", f"{PLANTED}::test_planted_passing"]
    report = flakes.detect(
        ids,
        backend="cpu",
        runs=RUNS,
        out_dir=planted / "out",
        quarantine=quarantine,
        extra=ISOLATE,
        root=ROOT,
    )
    assert report["ok"] and report["blocking"] == []
    tests = _by_id(report)
    assert tests["test_planted_flaky"]["status"] == "flaky" and tests["test_planted_flaky"]["quarantined"]
    assert [r["id"] for r in report["quarantine"]["ready_to_leave"]] == [f"{PLANTED}::test_planted_passing"]
    assert report["quarantine"]["quarantined_failing"][0]["failures"] == RUNS // 3
    assert "Ready to leave quarantine" in (planted / "out" / "flakes.md").read_text()


def test_cli_exit_codes_and_summary(planted):
    state = planted / "state"
    base = [
        *FLAKES,
        "--native",
        "--runs",
        "3",
        "--quarantine",
        str(ROOT / "ci" / "quarantine.toml"),
        *(f"--pytest-arg={a}" for a in ISOLATE),
    ]
    env = {**_env(), "KILN_PLANTED_STATE": str(state)}
    ok = subprocess.run(
        [*base, "--out", str(planted / "a"), f"{PLANTED}::test_planted_passing"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert "flakes cpu: 1 tests x 3 runs: 1 passing, 0 failing, 0 flaky, 0 blocking" in ok.stdout
    bad = subprocess.run(
        [*base, "--out", str(planted / "b"), f"{PLANTED}::test_planted_flaky"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 1
    assert "1 flaky (test_planted_flaky 33%), 1 blocking" in bad.stdout


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("KILN_PLANTED")}


def test_interrupted_run_keeps_partial_results_marked_incomplete(planted, monkeypatch):
    monkeypatch.setenv("KILN_PLANTED_INTERRUPT", "1")
    out = planted / "out"
    with pytest.raises(RunInterrupted, match="partial results"):
        flakes.detect(
            [f"{PLANTED}::test_planted_interrupt"],
            backend="cpu",
            runs=RUNS,
            out_dir=out,
            quarantine=q.Quarantine(),
            extra=ISOLATE,
            root=ROOT,
        )
    report = json.loads((out / "flakes.json").read_text())
    assert report["complete"] is False and report["ok"] is False
    assert report["tests"][0]["passed"] == 1  # the run before the interrupt was kept


def test_bad_input_is_a_clear_error(planted):
    with pytest.raises(UnknownBackend, match="unknown backend 'tpu'"):
        flakes.detect([PLANTED], backend="tpu", runs=RUNS, out_dir=planted / "o", quarantine=q.Quarantine())
    with pytest.raises(FlakeRunError, match="at least 2"):
        flakes.detect([PLANTED], backend="cpu", runs=1, out_dir=planted / "o", quarantine=q.Quarantine())
    with pytest.raises(FlakeRunError, match="no tests collected"):
        flakes.detect(
            [f"{PLANTED}::test_planted_passing"],
            backend="cpu",
            runs=2,
            out_dir=planted / "o",
            quarantine=q.Quarantine(),
            extra=[*ISOLATE, "-k", "nothing_matches"],
            root=ROOT,
        )
    proc = subprocess.run(
        [*FLAKES, "--native", "tests/no_such_dir"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "harness flakes: error: no such test path: tests/no_such_dir"


def test_gpu_backend_without_gpu_is_a_clear_error(planted):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    for backend in (
        "cuda",
        "rocm",
    ):  # the pre-flight stops it before pytest starts (harness/checks/preflight.py)
        with pytest.raises(PreflightError, match=f"^pre-flight {backend}: no (NVIDIA|AMD GPU) driver"):
            flakes.detect(
                [PLANTED], backend=backend, runs=2, out_dir=planted / "o", quarantine=q.Quarantine()
            )


def test_truncated_junit_is_an_error_not_a_result(tmp_path):
    path = tmp_path / "junit.xml"
    path.write_text('<?xml version="1.0"?><testsuites><testsuite><testcase classname="a" name="b">')
    with pytest.raises(FlakeRunError, match="not valid XML.*cut off.*did not finish"):
        flakes.read_junit(path)
    with pytest.raises(FlakeRunError, match="not found: pytest did not finish"):
        flakes.read_junit(tmp_path / "missing.xml")


def test_junit_without_plugin_properties_maps_back_to_node_ids(tmp_path):
    (tmp_path / "tests" / "sub").mkdir(parents=True)
    (tmp_path / "tests" / "sub" / "test_m.py").write_text("")
    path = tmp_path / "junit.xml"
    path.write_text(
        "<testsuites><testsuite>"
        '<testcase classname="tests.sub.test_m.TestK" name="test_a[x]"><error message="boom"/></testcase>'
        '<testcase classname="tests.sub.test_m" name="test_b">'
        '<skipped type="pytest.xfail" message="x"/></testcase>'
        '<testcase classname="tests.sub.test_m" name="test_c">'
        '<skipped type="pytest.skip" message="s"/></testcase>'
        "</testsuite></testsuites>"
    )
    runs = flakes.read_junit(path, tmp_path)
    assert [(r.id, r.outcome) for r in runs] == [
        ("tests/sub/test_m.py::TestK::test_a[x]", "error"),
        ("tests/sub/test_m.py::test_b", "xfailed"),
        ("tests/sub/test_m.py::test_c", "skipped"),
    ]
    stats = {s.id.rsplit("::", 1)[-1]: s.status for s in flakes.classify(runs)}
    assert stats == {"test_a[x]": "failing", "test_b": "passing", "test_c": "skipped"}


@pytest.mark.parametrize(
    "nodeid, name, original, run, base",
    [
        ("t.py::test_x[3]", "test_x[3]", "test_x", 3, "t.py::test_x"),
        ("t.py::test_x[3-a-b]", "test_x[3-a-b]", "test_x", 3, "t.py::test_x[a-b]"),
        ("t.py::TestC::test_m[0]", "test_m[0]", "test_m", 0, "t.py::TestC::test_m"),
        (
            "t.py::test_x[12-[[a]]\\n-x::y[1]]",
            "test_x[12-[[a]]\\n-x::y[1]]",
            "test_x",
            12,
            "t.py::test_x[[[a]]\\n-x::y[1]]",
        ),
        ("t.py::test_x[a]", "test_x[a]", "test_x", None, "t.py::test_x[a]"),
    ],
)
def test_flakefinder_index_is_taken_out_of_node_ids(nodeid, name, original, run, base):
    assert base_nodeid(nodeid, name, original, run) == base


def test_parametrized_ids_with_brackets_fold_into_one_test_each(planted, tmp_path):
    test_file = tmp_path / "test_params.py"
    test_file.write_text(
        "import pytest\n"
        "@pytest.mark.parametrize('text', ['[[test]]\\nid = 1', 'a-b::c[0]', 'plain'])\n"
        "def test_p(text):\n"
        "    assert text\n"
    )
    report = flakes.detect(
        [str(test_file)],
        backend="cpu",
        runs=3,
        out_dir=tmp_path / "out",
        quarantine=q.Quarantine(),
        # an empty ini of its own (pytest 9.2 refuses `-c /dev/null`: "unsupported format")
        extra=[f"--rootdir={tmp_path}", "-c", str(_empty_ini(tmp_path))],
        root=ROOT,
    )
    assert [(t["id"].split("::", 1)[1], t["runs"]) for t in report["tests"]] == [
        ("test_p[[[test]]\\nid = 1]", 3),
        ("test_p[a-b::c[0]]", 3),
        ("test_p[plain]", 3),
    ]


def test_planted_tests_are_not_collected_by_normal_suites():
    # collecting the folder (as `pytest tests/harness` does) finds nothing: the file name is not test_*.py
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "tests/harness/planted", *ISOLATE],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 5, proc.stdout  # 5: no tests collected
    # named explicitly but without its state folder, the module skips itself
    direct = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", PLANTED, *ISOLATE],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert direct.returncode == 5 and "1 skipped" in direct.stdout, direct.stdout


def test_container_mode_without_docker_is_a_clear_error(planted):
    env = {**_env(), "KILN_DOCKER": "/nonexistent/docker", "KILN_NATIVE": ""}
    proc = subprocess.run(
        [*FLAKES, "--runs", "2", "--out", str(planted / "o"), PLANTED],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3  # infrastructure (harness/exc.py EXIT_INFRA), not a usage error
    assert proc.stderr.startswith("harness flakes: error: docker client '/nonexistent/docker' not found")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_failing_and_flaky_tests_carry_a_rerun_command_that_reproduces_them(planted):
    out = planted / "out"
    report = flakes.detect(
        [PLANTED], backend="cpu", runs=RUNS, out_dir=out, quarantine=q.Quarantine(), extra=ISOLATE, root=ROOT
    )
    tests = _by_id(report)
    assert tests["test_planted_passing"]["rerun"] == ""
    rerun = tests["test_planted_broken"]["rerun"]
    assert rerun == (
        f"python -m harness flakes --backend cpu --native --runs 6 {PLANTED}::test_planted_broken"
    )
    assert rerun in (out / "flakes.md").read_text()
    argv = [sys.executable, *rerun.split()[1:], "--out", str(planted / "again"), "--pytest-arg=" + ISOLATE[0]]
    proc = subprocess.run(
        argv,
        cwd=ROOT,
        env=_env() | {"KILN_PLANTED_STATE": str(planted / "state")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "1 tests x 6 runs: 0 passing, 1 failing, 0 flaky" in proc.stdout


def test_sigterm_keeps_the_runs_so_far_marked_incomplete(planted):
    import signal
    import time

    out = planted / "out"
    env = _env() | {"KILN_PLANTED_STATE": str(planted / "state"), "KILN_PLANTED_SLOW": "0.2"}
    proc = subprocess.Popen(
        [
            *FLAKES,
            "--native",
            "--runs",
            "100",
            "--out",
            str(out),
            f"--pytest-arg={ISOLATE[0]}",
            f"{PLANTED}::test_planted_slow",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    log = out / "pytest.log"
    deadline = time.monotonic() + 300  # a bound for a hang, not a speed: a loaded host starts pytest slowly
    while _progress_passes(log) < 3:  # wait until some runs have passed
        assert time.monotonic() < deadline and proc.poll() is None, "no 3 runs passed in 300 s"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "partial results (marked incomplete)" in err
    report = json.loads((out / "flakes.json").read_text())
    assert report["complete"] is False and report["ok"] is False
    assert 3 <= report["tests"][0]["passed"] < 100, log.read_text()[-3000:]


def _progress_passes(log) -> int:
    """Passed runs in pytest's progress lines of `log` (the `.` of lines made of outcome letters only, so that a
    warning or a path printed before the first run counts nothing); 0 before the log exists."""
    import re

    if not log.exists():
        return 0
    return sum(m.count(".") for m in re.findall(r"^[.sFExX]+(?= |$)", log.read_text(), re.M))


def _empty_ini(folder) -> object:
    ini = folder / "empty-pytest.ini"
    ini.write_text("[pytest]\n")
    return ini


def test_dash_k_selects_tests_as_pytest_does(planted):
    """`flakes ... -k EXPR` (not only `--pytest-arg=-k --pytest-arg=EXPR`): only the matching test runs."""
    proc = subprocess.run(
        [
            *FLAKES,
            "--native",
            "--runs",
            "2",
            "--quarantine",
            str(ROOT / "ci" / "quarantine.toml"),
            *(f"--pytest-arg={a}" for a in ISOLATE),
            "--out",
            str(planted / "k"),
            PLANTED,
            "-k",
            "planted_passing",
        ],
        cwd=ROOT,
        env={**_env(), "KILN_PLANTED_STATE": str(planted / "state")},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "flakes cpu: 1 tests x 2 runs: 1 passing, 0 failing, 0 flaky, 0 blocking" in proc.stdout
