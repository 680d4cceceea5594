"""Sharding: the assignment's properties (a partition, deterministic, balanced by durations or count), GPU
pinning, bad command lines, merging shard folders, and end to end on a small planted project: `--shard 1/2`
and `2/2` run every test exactly once and merge green; `--shards 2` runs them at once into one report with
repro lines; a crashed and a hung shard are reported as such while the other shard's results stand."""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness import gpus, matrix
from harness.exc import HarnessError, ResultsError
from harness.record import RunRecord
from harness.suites import merge, repro, shard
from harness.suites.collect import load_run
from harness.suites.options import RunOptions
from harness.suites.place import ContainerPlace, NativePlace
from scratch_project import scratch_project

ROOT = Path(__file__).resolve().parents[2]
PLANTED = Path(__file__).resolve().parent / "planted" / "shards"
M = matrix.load(ROOT / "ci" / "matrix.json")


# ---- assignment ------------------------------------------------------------------------------------------

IDS = [f"tests/s/test_{k % 7}.py::test_{k}[{k % 3}]" for k in range(53)]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 53, 60])
def test_assign_is_a_partition_balanced_by_count(n):
    shards = shard.assign(IDS, n)
    assert len(shards) == n
    flat = [t for s in shards for t in s]
    assert sorted(flat) == sorted(IDS) and len(flat) == len(set(flat))  # every test exactly once
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1


def test_assign_is_deterministic_whatever_the_order():
    durations = {t: random.Random(1).random() * 10 for t in IDS[::2]}
    first = shard.assign(IDS, 4, durations)
    for seed in range(5):
        ids = list(IDS)
        random.Random(seed).shuffle(ids)
        assert shard.assign(ids, 4, dict(reversed(list(durations.items())))) == first
    for k in range(1, 5):  # what one shard selects is what the whole split gives it, in the given order
        mine = shard.select(list(reversed(IDS)), shard.Shard(k, 4), durations)
        assert mine == [t for t in reversed(IDS) if t in set(first[k - 1])]


@pytest.mark.parametrize("seed", range(6))
def test_assign_balances_by_durations(seed):
    rng = random.Random(seed)
    durations = {t: rng.choice([0.01, 0.5, 2.0, 30.0]) * rng.random() for t in IDS}
    for n, offset in ((2, 0), (3, 0), (3, 2), (4, 1), (4, 7)):
        shards = shard.assign(IDS, n, durations, offset)
        loads = [sum(max(durations[t], shard.MIN_WEIGHT_S) for t in s) for s in shards]
        # greedy into the lightest shard: the heaviest shard was the lightest when it got its last test
        assert max(loads) - min(loads) <= max(durations.values()) + 1e-9
        assert sorted(t for s in shards for t in s) == sorted(IDS)


def test_longest_first_and_ties_by_node_id():
    durations = {"a": 10.0, "b": 9.0, "c": 1.0, "d": 1.0, "e": 1.0}
    # a, b; c joins b (9 < 10); d: a tie at 10, the lower index; e the lighter shard 2
    assert shard.assign(durations, 2, durations) == [["a", "d"], ["b", "c", "e"]]
    assert shard.assign(["x2", "x1", "x3"], 2) == [["x1", "x3"], ["x2"]]  # equal weights: by id, lowest shard


def test_an_offset_rotates_where_ties_go_first():
    assert shard.assign(["a", "b", "c"], 3, None, 1) == [["c"], ["a"], ["b"]]
    assert shard.assign(["a", "b", "c", "d"], 3, {"a": 5.0, "b": 1.0, "c": 1.0, "d": 1.0}, 2)[2] == [
        "a"
    ]  # the heaviest starts shard 3
    for offset in range(7):  # still a partition, sizes within one, the same whatever the order
        shards = shard.assign(IDS, 3, None, offset)
        assert (
            sorted(t for s in shards for t in s) == sorted(IDS)
            and max(map(len, shards)) - min(map(len, shards)) <= 1
        )
        assert shard.assign(list(reversed(IDS)), 3, None, offset) == shards


def test_unknown_tests_weigh_the_mean_of_the_known():
    w = shard.weights(["a", "b", "new"], {"a": 1.0, "b": 3.0, "gone": 100.0})
    assert w == {"a": 1.0, "b": 3.0, "new": 2.0}
    assert shard.weights(["a", "b"]) == {"a": 1.0, "b": 1.0}


@pytest.mark.parametrize(
    "text,message",
    [
        ("3/2", "the shard index must be between 1 and 2"),
        ("0/2", "the shard index must be between 1 and 2"),
        ("x", "expected I/N"),
        ("1/0", "at least 1"),
        ("1/", "expected I/N"),
        ("-1/2", "expected I/N"),
    ],
)
def test_bad_shards(text, message):
    with pytest.raises(HarnessError, match=re.escape(message)):
        shard.parse_shard(text)


def test_good_shards():
    assert shard.parse_shard("2/3") == shard.Shard(2, 3) and str(shard.parse_shard(" 1 / 1 ")) == "1/1"
    assert shard.parse_shard_count("auto") is None and shard.parse_shard_count("4") == 4


# ---- devices ---------------------------------------------------------------------------------------------


def test_pinned_devices_in_a_container_and_natively():
    cuda, rocm, cpu = M.backend("cuda"), M.backend("rocm"), M.backend("cpu")
    one = gpus.pin(cuda, ["1"], env={})
    assert one.container_options[:2] == ("--gpus", "device=1") and "all" not in one.container_options
    assert one.env["CUDA_VISIBLE_DEVICES"] == "0"  # inside the container, its one GPU is device 0
    two = gpus.pin(cuda, ["2", "3"], env={})
    assert two.container_options[:2] == ("--gpus", '"device=2,3"')  # docker reads --gpus as CSV
    assert gpus.pin_visible(cuda, ["1"], env={}).env["CUDA_VISIBLE_DEVICES"] == "1"
    r = gpus.pin(rocm, ["3"], env={})
    assert r.env["HIP_VISIBLE_DEVICES"] == "0" and "--device=/dev/dri" not in r.container_options
    assert "--device=/dev/kfd" in r.container_options and "video" not in r.container_options
    assert gpus.pin_visible(rocm, ["3"], env={}).env["HIP_VISIBLE_DEVICES"] == "3"
    assert gpus.pin_visible(cpu, ["0"]) == cpu and gpus.pin_visible(cuda, []) == cuda
    assert gpus.pin(cuda, [], env={}).container_options[:2] == ("--gpus", "all")


def test_device_groups_and_visible_gpus():
    gpus = ["0", "1", "2", "3"]
    assert shard.device_groups(True, None, 1, gpus) == [["0"], ["1"], ["2"], ["3"]]
    assert shard.device_groups(True, None, 2, gpus) == [["0", "1"], ["2", "3"]]
    assert shard.device_groups(True, 3, 1, gpus) == [["0"], ["1"], ["2"]]
    with pytest.raises(HarnessError, match="needs 6 GPUs; 4 visible"):
        shard.device_groups(True, 3, 2, gpus)
    with pytest.raises(HarnessError, match="0 GPU"):
        shard.device_groups(True, None, 1, [])
    assert shard.device_groups(False, None, 1, []) == [[]]  # CPU: auto is one shard
    assert shard.device_groups(False, 3, 1, []) == [[], [], []]
    # --devices 0,0: two shards share one GPU (a one-GPU box checking that shards run at once)
    assert shard.device_groups(True, 2, 1, ["0", "0"]) == [["0"], ["0"]]
    assert shard.visible_gpus("cuda", {"CUDA_VISIBLE_DEVICES": "4,6"}) == ["4", "6"]
    assert shard.visible_gpus("rocm", {"HIP_VISIBLE_DEVICES": "1"}) == ["1"]


def test_repro_line_of_a_pinned_shard_names_its_gpu_and_image_but_no_shard():
    b = ContainerPlace().pin(M.backend("cuda"), ["1"])
    manifest = {
        "backend": "cuda",
        "mode": "container",
        "src": "/repo",
        "image": {"tag": "kiln-cuda:0123"},
        "env": {"KILN_TEST_DEVICE": "cuda"},
        "test_timeout_s": 300,
        "pytest_extra": ["-x"],
        "container_options": list(b.container_options),
        "shard": {"index": 2, "count": 2},
    }
    line = shlex.split(repro.repro_line(RunRecord.from_json(manifest), "tests/a/test_b.py::test_c[1]"))
    assert line[line.index("--gpus") + 1] == "device=1" and "kiln-cuda:0123" in line
    assert line[-1] == "tests/a/test_b.py::test_c[1]" and not any("shard" in a for a in line)


# ---- command line ----------------------------------------------------------------------------------------


def cli(*args: str, root: Path = ROOT, plant: str = "", timeout: float = 240) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "KILN_ROOT": str(root),
        "KILN_RESULTS": str(root / "results"),
        "KILN_PLANT": plant,
    }
    env.pop("KILN_NATIVE", None)
    env.pop("KILN_HISTORY_DB", None)  # runs record into the test's own XDG_DATA_HOME (conftest.py)
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        capture_output=True,
        text=True,
        cwd=root,
        env=env,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    "args,message",
    [
        (["--shard", "3/2"], "--shard 3/2: the shard index must be between 1 and 2"),
        (["--shard", "0/2"], "--shard 0/2: the shard index must be between 1 and 2"),
        (["--shard", "x"], "--shard 'x': expected I/N"),
        (["--shards", "0"], "--shards '0': expected a positive number of shards or `auto`"),
        (["--shard", "1/2", "--shards", "2"], "give one of them"),
        (["--shards", "auto", "--gpus-per-shard", "0"], "--gpus-per-shard 0: expected at least 1"),
        (
            ["--shard", "1/2", "--durations", "/nonexistent.json"],
            "durations file /nonexistent.json not found",
        ),
    ],
)
def test_bad_shard_options_give_one_error_line(args, message):
    proc = cli("run", "--backend", "cpu", "--native", *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("harness run: error: ") and message in lines[0], (
        proc.stderr
    )


# ---- merging (folders written here, no processes) --------------------------------------------------------


def fake_shard(
    folder: Path, index: int, count: int, tests: list[str], *, collected: list[str], status: str = "complete"
) -> Path:
    """A shard's results folder as `harness run --shard` writes it: run.json, one suite's JUnit and record."""
    (folder / "suites").mkdir(parents=True)
    cases = "".join(
        f'<testcase classname="x" name="{t}" time="0.5"><properties><property name="kiln_nodeid" '
        f'value="{t}"/></properties></testcase>'
        for t in tests
    )
    (folder / "suites" / "alpha.xml").write_text(f"<testsuites><testsuite>{cases}</testsuite></testsuites>")
    (folder / "suites" / "alpha.shard.json").write_text(
        json.dumps(
            {
                "shard": [index, count],
                "collected": len(collected),
                "collected_sha256": shard.digest(collected),
                "durations_sha256": None,
                "selected": tests,
            }
        )
    )
    (folder / "run.json").write_text(
        json.dumps(
            {
                "backend": "cpu",
                "mode": "native",
                "status": status,
                "src": str(folder),
                "env": {},
                "python": "python",
                "shard": {"index": index, "count": count},
                "started": "2025-01-01T00:00:00+00:00",
                "wall_s": 1.5,
                "suites": [
                    {"name": "alpha", "status": "passed", "junit": "suites/alpha.xml", "duration_s": 1.0}
                ],
            }
        )
    )
    return folder


def test_merge_of_a_partition_is_complete(tmp_path):
    ids = ["t::a", "t::b", "t::c"]
    fake_shard(tmp_path / "in" / "x", 1, 2, ["t::a", "t::c"], collected=ids)
    fake_shard(tmp_path / "in" / "y" / "deeper", 2, 2, ["t::b"], collected=ids)
    folders, count = merge.find_shards([tmp_path / "in"])
    assert count == 2 and sorted(folders) == [1, 2]
    summary = merge.merge_shards(tmp_path / "out", folders, count)
    assert summary.ok and summary.counts["passed"] == 3 and summary.shard == "2 shards"
    run = load_run(tmp_path / "out")
    assert run.merged and run.test_shards == {"t::a": 1, "t::c": 1, "t::b": 2}
    shard_2 = json.loads((tmp_path / "out" / "shard-2" / "run.json").read_text())
    assert run.record_for("t::b") == RunRecord.from_json(shard_2)
    # merging again into the same folder (from the merged folder itself) gives the same
    assert merge.merge_shards(tmp_path / "out", *merge.find_shards([tmp_path / "out"])).ok


def test_merge_reports_missing_overlapping_and_disagreeing_shards(tmp_path):
    ids = ["t::a", "t::b", "t::c"]
    fake_shard(tmp_path / "one", 1, 2, ["t::a", "t::c"], collected=ids)
    summary = merge.merge_shards(tmp_path / "out1", {1: tmp_path / "one"}, 2)
    manifest = json.loads((tmp_path / "out1" / "run.json").read_text())
    assert not summary.ok and summary.status == "incomplete" and summary.counts["passed"] == 2
    assert "shard 2/2 missing" in manifest["reason"]
    assert "shard 2/2 MISSING" in (tmp_path / "out1" / "report.txt").read_text()

    fake_shard(tmp_path / "two", 2, 2, ["t::b", "t::c"], collected=ids)  # t::c in both
    summary = merge.merge_shards(tmp_path / "out2", {1: tmp_path / "one", 2: tmp_path / "two"}, 2)
    problems = json.loads((tmp_path / "out2" / "run.json").read_text())["problems"]
    assert summary.status == "inconsistent" and not summary.ok
    assert (
        "suite alpha: t::c was selected by shards 1 and 2" in problems
        and "t::c ran in shards 1 and 2" in problems
    )

    fake_shard(tmp_path / "three", 2, 2, ["t::b"], collected=ids + ["t::d"])  # collected another test set
    merge.merge_shards(tmp_path / "out3", {1: tmp_path / "one", 2: tmp_path / "three"}, 2)
    problems = json.loads((tmp_path / "out3" / "run.json").read_text())["problems"]
    assert any("the shards collected different tests (shard 1: 3, shard 2: 4)" in p for p in problems)


def test_merge_reports_crashed_and_hung_local_shards(tmp_path):
    fake_shard(tmp_path / "shard-1", 1, 3, ["t::a"], collected=["t::a", "t::b", "t::c"])
    fake_shard(tmp_path / "shard-2", 2, 3, [], collected=["t::a", "t::b", "t::c"], status="running")
    procs = {
        1: merge.ShardProcess(0, 3.0),
        2: merge.ShardProcess(-9, 2.0),
        3: merge.ShardProcess(None, 9.0, True),
    }
    summary = merge.merge_shards(
        tmp_path, {i: tmp_path / f"shard-{i}" for i in (1, 2, 3)}, 3, processes=procs
    )
    rows = {r["index"]: r for r in json.loads((tmp_path / "summary.json").read_text())["shards"]}
    assert [rows[i]["status"] for i in (1, 2, 3)] == ["complete", "crashed", "hung"]
    assert rows[2]["reason"] == "stopped without finishing (exit -9)" and rows[3]["wall_s"] == 9.0
    assert summary.status == "incomplete" and summary.counts["passed"] == 1  # shard 1's results stand


def test_find_shards_errors(tmp_path):
    with pytest.raises(ResultsError, match="no shard results folders"):
        merge.find_shards([tmp_path])
    fake_shard(tmp_path / "a", 1, 2, [], collected=[])
    fake_shard(tmp_path / "b", 1, 2, [], collected=[])
    with pytest.raises(ResultsError, match="two folders hold shard 1/2"):
        merge.find_shards([tmp_path])
    fake_shard(tmp_path / "c", 2, 3, [], collected=[])
    with pytest.raises(ResultsError, match="shards of different splits"):
        merge.find_shards([tmp_path / "a", tmp_path / "c"])


# ---- end to end on a planted project ---------------------------------------------------------------------


def make_project(tmp_path: Path) -> Path:
    """Suites alpha and beta from tests/harness/planted/shards, the real matrix otherwise."""
    return scratch_project(
        tmp_path / "proj", {s: (PLANTED / f"{s}.py").read_text() for s in ("alpha", "beta")}
    )


def collected(root: Path) -> list[str]:
    """Every test id of the planted suites, as `pytest --collect-only -q` lists them."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/alpha",
            "tests/beta",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout
    return [ln for ln in proc.stdout.splitlines() if "::" in ln]


def junit_ids(folder: Path) -> list[str]:
    out = []
    for xml in sorted((folder / "suites").glob("*.xml")):
        for case in ET.parse(xml).iter("testcase"):
            out += [p.get("value") for p in case.iter("property") if p.get("name") == "kiln_nodeid"]
    return out


def test_two_shards_run_every_test_exactly_once_and_merge_green(tmp_path):
    root = make_project(tmp_path)
    every = collected(root)
    assert len(every) == 17
    alpha = [t for t in every if "alpha" in t]
    durations = {t: (20.0 if t.endswith("test_broken") else 1.0) for t in alpha}  # beta: none recorded
    shard.write_durations(root / "durations.json", durations, "cpu")
    for k in (1, 2):
        proc = cli(
            "run",
            "--backend",
            "cpu",
            "--native",
            "--no-health",
            "--quiet",
            "--shard",
            f"{k}/2",
            "--durations",
            "durations.json",
            "--results",
            f"results/shard-{k}",
            root=root,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"kiln cpu/native shard {k}/2 OK" in proc.stdout
    ran = [junit_ids(root / "results" / f"shard-{k}") for k in (1, 2)]
    assert sorted(ran[0] + ran[1]) == sorted(every)  # the union is every test, each exactly once
    beta = [t for t in every if "beta" in t]
    for k in (1, 2):  # balanced as the durations say: alpha by weight, beta (no durations) by count
        # the k-th suite of the matrix (0-based) starts its split at shard k+1
        expected = shard.assign(alpha, 2, durations, 0)[k - 1] + shard.assign(beta, 2, durations, 1)[k - 1]
        assert sorted(ran[k - 1]) == sorted(expected)
    assert (
        "tests/alpha/test_alpha.py::test_broken" in ran[0] and len([t for t in ran[0] if "alpha" in t]) == 1
    )

    merged = cli("merge", "results", "--out", "results/merged", "--check", root=root)
    assert merged.returncode == 0, merged.stdout + merged.stderr
    assert merged.stdout.splitlines()[0] == "kiln cpu/native 2 shards OK: 16 passed, 1 skipped"
    assert re.search(r"^shard 1/2 COMPLETE: 3 passed in [0-9.]+s -> shard-1$", merged.stdout, re.MULTILINE)
    report = cli("report", "results/merged", "--check", root=root)
    assert report.returncode == 0 and "suite alpha [cpu/native] PASSED: 11 passed, 1 skipped" in report.stdout

    out = cli("durations", "results/merged", "--out", "recorded.json", root=root)
    assert out.returncode == 0, out.stderr
    assert sorted(shard.load_durations(root / "recorded.json")) == sorted(every)


def test_parallel_shards_merge_into_one_report_with_repro_lines(tmp_path):
    root = make_project(tmp_path)
    proc = cli(
        "run",
        "--backend",
        "cpu",
        "--native",
        "--no-health",
        "--shards",
        "2",
        "--results",
        "results/par",
        root=root,
        plant="fail",
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(r"^\[shard 1/2\] kiln cpu/native shard 1/2 FAILED", proc.stdout, re.MULTILINE)
    assert re.search(r"^\[shard 2/2\] kiln cpu/native shard 2/2 OK", proc.stdout, re.MULTILINE)
    assert "kiln cpu/native 2 shards FAILED: 15 passed, 1 failed, 1 skipped" in proc.stdout
    run_dir = root / "results" / "par"
    assert sorted(junit_ids(run_dir / "shard-1") + junit_ids(run_dir / "shard-2")) == sorted(collected(root))
    rows = json.loads((run_dir / "summary.json").read_text())["shards"]
    assert [(r["status"], r["dir"]) for r in rows] == [("complete", "shard-1"), ("complete", "shard-2")]
    assert all(r["wall_s"] > 0 for r in rows) and (run_dir / "shard-1.log").exists()
    assert "| 1/2 | - | complete | 7 | 1 |" in (run_dir / "report.md").read_text()

    lines = [
        ln
        for ln in cli("repro", "--print", str(run_dir), root=root).stdout.splitlines()
        if not ln.startswith("#")
    ]
    assert len(lines) == 1 and lines[0].endswith("tests/alpha/test_alpha.py::test_broken")
    assert "kiln-shard" not in lines[0] and "shard_plugin" not in lines[0] and f"cd {root} " in lines[0]
    again = subprocess.run(
        ["bash", "-c", lines[0]],
        capture_output=True,
        text=True,
        timeout=120,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("KILN_")}, "KILN_PLANT": "fail"},
    )
    assert again.returncode == 1 and "1 failed" in again.stdout


def test_a_crashed_and_a_hung_shard_are_reported_while_the_other_stands(tmp_path, monkeypatch):
    from harness.suites import sharded

    root = make_project(tmp_path)
    alpha = [t for t in collected(root) if "alpha" in t]
    durations = {t: 100.0 if t.endswith(("test_crash", "test_hang")) else 1.0 for t in alpha}
    shard.write_durations(root / "durations.json", durations, "cpu")
    split = shard.assign(alpha, 3, durations)  # test_crash alone in shard 1, test_hang in 2, the rest in 3
    assert split[:2] == [["tests/alpha/test_alpha.py::test_crash"], ["tests/alpha/test_alpha.py::test_hang"]]
    monkeypatch.setenv("KILN_ROOT", str(root))
    monkeypatch.setenv("KILN_RESULTS", str(root / "results"))
    monkeypatch.setenv("KILN_PLANT", "crash,hang")
    monkeypatch.delenv("KILN_NATIVE", raising=False)
    # the stopped shard is killed after timeout_s: long enough for a loaded host to run shard 3's 12 quick tests
    options = RunOptions(
        run_dir=root / "results" / "three", health=False, durations=root / "durations.json", echo=False
    )
    run_dir, code = sharded.run_shards("cpu", [[], [], []], NativePlace(), options, timeout_s=90)
    assert code == 1
    manifest = json.loads((run_dir / "run.json").read_text())
    assert [s["status"] for s in manifest["shards"]] == ["crashed", "hung", "complete"]
    assert manifest["status"] == "incomplete" and "shard 1/3 crashed" in manifest["reason"]
    assert "shard 2/3 hung: killed after" in manifest["reason"]
    run = load_run(run_dir)
    # the hung shard's harness, stopped and then terminated, kept the test it had finished (an
    # interrupt keeps what ran); the crashed shard's pytest died with its harness and wrote nothing
    assert sorted(t.id for s in run.suites for t in s.tests) == sorted(
        [*junit_ids(run_dir / "shard-3"), "tests/alpha/test_alpha.py::test_hang"]
    )
    assert len(junit_ids(run_dir / "shard-3")) == 10 + 2  # alpha's other tests, beta's b and e (offset 1)
    text = (run_dir / "report.txt").read_text()
    assert text.startswith("kiln cpu/native 3 shards FAILED [run INCOMPLETE]: 12 passed, 1 skipped")
    assert "shard 1/3 CRASHED (stopped without finishing (exit -9); see shard-1.log)" in text


def test_a_stop_arriving_while_a_shard_starts_stops_that_shard_too(tmp_path, monkeypatch):
    """SIGTERM delivered just after a shard's process started, before the run had recorded it: the run still
    stops that shard (held while it starts, delivered once it is in the table) and ends interrupted."""
    import signal

    from harness.exc import RunInterrupted
    from harness.suites import sharded

    root = make_project(tmp_path)
    monkeypatch.setenv("KILN_ROOT", str(root))
    monkeypatch.setenv("KILN_RESULTS", str(root / "results"))
    monkeypatch.delenv("KILN_NATIVE", raising=False)
    started = []
    real_spawn = sharded.spawn

    def spawn_then_stop(argv, log, **kw):
        spawned = real_spawn(argv, log, **kw)
        started.append(spawned.proc)
        os.kill(os.getpid(), signal.SIGTERM)  # handled before launch_shards records the shard
        return spawned

    monkeypatch.setattr(sharded, "spawn", spawn_then_stop)
    options = RunOptions(run_dir=root / "results" / "stopped", health=False, echo=False)
    with pytest.raises(RunInterrupted, match="run terminated"):
        sharded.run_shards("cpu", [[], []], NativePlace(), options, timeout_s=90)
    assert len(started) == 1  # the second shard never started
    assert started[0].poll() is not None  # stopped, not left running unsupervised


def faked_container_run(tmp_path, monkeypatch) -> tuple[Path, list[list[str]]]:
    """A planted project as KILN_ROOT and a container run's outside faked (no driver, docker, image or host
    capture): (project root, the argv of every command the run executes, filled as it runs)."""
    from harness import envinfo
    from harness.checks import health, preflight
    from harness.images import image
    from harness.suites import runner

    root = make_project(tmp_path)
    monkeypatch.setenv("KILN_ROOT", str(root))
    monkeypatch.setattr(health, "require_host_devices", lambda b: None)
    monkeypatch.setattr(preflight, "check", lambda b, **kw: preflight.Report(b.name))  # no driver here
    monkeypatch.setattr(image, "require_docker", lambda: None)
    monkeypatch.setattr(image, "image_id", lambda tag: "sha256:0")
    monkeypatch.setattr(envinfo, "capture_host", lambda img: {})
    calls: list[list[str]] = []

    def fake_execute(argv, *, log, timeout_s, **kw):
        calls.append(argv)
        log.write_text("")
        return 0, False

    monkeypatch.setattr(runner, "execute", fake_execute)
    return root, calls


def test_a_container_shard_runs_pinned_with_the_plugin_and_repro_lines_without_it(tmp_path, monkeypatch):
    """The commands of `run --backend cuda --shard 2/2 --devices 1` in container mode (docker faked)."""
    from harness.suites import steps

    root, calls = faked_container_run(tmp_path, monkeypatch)
    shard.write_durations(root / "d.json", {}, "cuda")
    run_dir, _ = steps.run_suites(
        "cuda",
        ContainerPlace("kiln-cuda:t"),
        RunOptions(
            suites=["alpha"],
            run_dir=tmp_path / "run",
            health=False,
            echo=False,
            extra=["-x"],
            shard=shard.Shard(2, 2),
            durations=root / "d.json",
            devices=["1"],
        ),
    )
    argv = calls[-1]
    assert argv[argv.index("--gpus") + 1] == "device=1" and "all" not in argv
    inner = argv[argv.index("kiln-cuda:t") + 1 :]
    # the run's extra arguments, the shard plugin, then crash isolation's journal (harness.suites.isolation)
    assert inner[-12:] == [
        "-x",
        "-p",
        "harness.suites.shard_plugin",
        "--kiln-shard=2/2",
        "--kiln-durations=/results/shard-durations.json",
        "--kiln-shard-offset=0",
        "--kiln-shard-record=/results/alpha.shard.json",
        "-p",
        "harness.suites.journal_plugin",
        "--kiln-journal=/results/alpha.journal",
        "--continue-on-collection-errors",
        "tests/alpha",
    ]
    assert (run_dir / "suites" / "shard-durations.json").exists()
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["shard"] == {"index": 2, "count": 2, "durations": "suites/shard-durations.json"}
    assert manifest["pytest_extra"] == ["-x"] and manifest["devices"] == ["1"]
    line = repro.repro_line(RunRecord.from_json(manifest), "tests/alpha/test_alpha.py::test_broken")
    assert "--gpus device=1" in line and "kiln-cuda:t" in line and "shard" not in line.split("kiln-cuda:t")[1]


def test_a_container_run_on_a_runner_given_one_gpu_uses_only_it(tmp_path, monkeypatch):
    """`run --backend cuda` (no --devices) on a runner whose CUDA_VISIBLE_DEVICES names one GPU by UUID: every
    container (environment capture, suites) gets that GPU alone, renumbered 0, and the record and repro line
    say so (docker faked)."""
    from harness.suites import steps

    uuid = "GPU-0f0e0d0c-0b0a-0908-0706-050403020100"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", uuid)
    root, calls = faked_container_run(tmp_path, monkeypatch)
    run_dir, _ = steps.run_suites(
        "cuda",
        ContainerPlace("kiln-cuda:t"),
        RunOptions(suites=["alpha"], run_dir=tmp_path / "run", health=False, echo=False),
    )
    assert len(calls) >= 2 and all(a[a.index("--gpus") + 1] == f"device={uuid}" for a in calls)
    assert all("CUDA_VISIBLE_DEVICES=0" in a for a in calls)
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["container_options"][:2] == ["--gpus", f"device={uuid}"]
    line = repro.repro_line(RunRecord.from_json(manifest), "tests/alpha/test_alpha.py::test_broken")
    assert f"--gpus device={uuid}" in line and "CUDA_VISIBLE_DEVICES=0" in line


def test_merge_command_errors_are_one_line(tmp_path):
    for args, message in (
        (["merge", str(tmp_path / "none"), "--out", str(tmp_path / "o")], "is not a folder"),
        (["merge", str(tmp_path), "--out", str(tmp_path / "o")], "no shard results folders"),
    ):
        proc = cli(*args)
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr


def test_the_merge_output_below_its_input_is_not_searched(tmp_path):
    fake_shard(tmp_path / "a", 1, 1, ["t::a"], collected=["t::a"])
    merge.merge_shards(tmp_path / "merged", *merge.find_shards([tmp_path]))
    folders, _ = merge.find_shards(
        [tmp_path], exclude=tmp_path / "merged"
    )  # else shard 1 would be there twice
    assert folders == {1: (tmp_path / "a").resolve()}


def test_shards_auto_on_the_cpu_is_the_plain_run(tmp_path):
    root = make_project(tmp_path)
    proc = cli(
        "run",
        "--backend",
        "cpu",
        "--native",
        "--no-health",
        "--quiet",
        "--shards",
        "auto",
        "--suite",
        "beta",
        "--results",
        "results/auto",
        root=root,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] == "kiln cpu/native OK: 5 passed"
    assert not (root / "results" / "auto" / "shard-1").exists()
