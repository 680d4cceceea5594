"""Where a run's processes run (harness.suites.place): the place chosen once by the command line's mode rule,
the command lines, environments and folders each place gives, and a shard process given the same place."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from harness import commands, gpus, matrix
from harness.exc import HarnessError
from harness.suites import runner, sharded, steps
from harness.suites.options import RunOptions
from harness.suites.place import CONTAINER, NATIVE, ContainerPlace, NativePlace, chosen
from harness.suites.shard import Shard

ROOT = Path(__file__).resolve().parents[2]
M = matrix.load(ROOT / "ci" / "matrix.json")


def _env_of(argv: list[str]) -> dict[str, str]:
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--env" and "=" in argv[i + 1])


def test_the_mode_rule_native_with_the_flag_else_kiln_native_else_the_container(monkeypatch):
    monkeypatch.delenv("KILN_NATIVE", raising=False)
    assert chosen(None) == ContainerPlace()
    assert chosen(None, "kiln-cpu:dev", "base:1") == ContainerPlace("kiln-cpu:dev", "base:1")
    assert chosen(True, "kiln-cpu:dev") == NativePlace()  # --native wins over --image, as it always has
    monkeypatch.setenv("KILN_NATIVE", "1")
    assert chosen(None, "kiln-cpu:dev") == NativePlace()
    assert chosen(False) == ContainerPlace()  # the flag given (False) is not overridden by the variable


def test_each_place_says_where_a_folder_lands_and_what_the_processes_inherit(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_PLACE_TEST", "x")
    assert NativePlace().seen(tmp_path) == str(tmp_path)
    assert ContainerPlace("t").seen(tmp_path) == commands.CONTAINER_RESULTS
    assert NativePlace().inherited()["KILN_PLACE_TEST"] == "x" and dict(ContainerPlace("t").inherited()) == {}
    assert (NativePlace().python, ContainerPlace("t").python) == (sys.executable, "python")


def test_a_native_launch_runs_this_python_from_the_tree_and_reports_the_native_hardware_class(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("KILN_ROOT", str(ROOT))
    monkeypatch.delenv("KILN_RUN_MODE", raising=False)
    b = M.backend("cpu")
    how = NativePlace().launch(
        b, ["python", "-m", "pytest", "t"], out_dir=tmp_path, name="alpha", env={"KILN_SEEN": "1"}
    )
    assert how.argv == [sys.executable, "-m", "pytest", "t"] and how.cwd == ROOT and how.container is None
    assert how.env is not None and how.env["KILN_SEEN"] == "1"
    assert how.env["PYTHONPATH"].split(":")[0] == str(ROOT)
    # harness.store.runner's hardware class: KILN_RUN_MODE, unset natively
    assert how.env.get(commands.RUN_MODE, NATIVE) == NativePlace().mode == NATIVE


def test_a_container_launch_is_docker_run_with_the_results_mounted_and_the_container_hardware_class(
    tmp_path, monkeypatch
):
    monkeypatch.setattr("harness.images.cleanup.mark_used", lambda image: None)
    monkeypatch.setenv("KILN_COMPILE_CACHE", "off")
    b = M.backend("cpu")
    how = ContainerPlace("kiln-cpu:0123456789abcdef").launch(
        b, ["python", "-m", "pytest", "t"], out_dir=tmp_path, name="alpha", env={"KILN_SEEN": "1"}
    )
    argv = how.argv
    assert argv[1:4] == ["run", "--rm", "--init"] and how.env is None and how.cwd is None
    assert how.container is not None and argv[argv.index("--name") + 1] == how.container
    assert how.container.startswith("kiln-cpu-alpha-")  # removed after the process (harness.process.execute)
    assert f"{tmp_path}:{commands.CONTAINER_RESULTS}" in argv
    assert argv[-5:] == ["kiln-cpu:0123456789abcdef", "python", "-m", "pytest", "t"]
    env = _env_of(argv)
    assert env["KILN_SEEN"] == "1" and env[commands.RUN_MODE] == ContainerPlace().mode == CONTAINER


def test_a_container_place_without_an_image_is_one_clear_error(tmp_path):
    with pytest.raises(HarnessError, match="container mode needs an image tag"):
        ContainerPlace().launch(M.backend("cpu"), ["true"], out_dir=tmp_path, name="x", env={})


def test_run_pytest_gives_the_process_the_environment_it_is_handed(tmp_path, monkeypatch):
    """The run's environment is computed once (the Plan's `env`); run_pytest passes it on, adding `env_extra`
    with {out} as the place sees the folder."""
    calls = []

    def fake_execute(argv, *, log, timeout_s, env=None, cwd=None, container=None, **kw):
        calls.append((argv, env, container))
        log.write_text("")
        return 0, False

    monkeypatch.setattr(runner, "execute", fake_execute)
    monkeypatch.setattr("harness.images.cleanup.mark_used", lambda image: None)
    monkeypatch.setenv("KILN_COMPILE_CACHE", "off")
    b = M.backend("cpu")
    run = runner.run_pytest(
        ContainerPlace("kiln-cpu:0"),
        b,
        ["t"],
        tmp_path,
        "t",
        env={"ONLY_HERE": "1"},
        env_extra={"SAVE": "{out}/x"},
        echo=False,
    )
    argv, env, container = calls[-1]
    assert _env_of(argv)["ONLY_HERE"] == "1" and _env_of(argv)["SAVE"] == "/results/x" and env is None
    assert container is not None and f"--junitxml={commands.CONTAINER_RESULTS}/t.xml" in argv
    assert run.junit == tmp_path / "t.xml"
    runner.run_pytest(
        NativePlace(),
        b,
        ["t"],
        tmp_path,
        "t",
        env={"ONLY_HERE": "1"},
        env_extra={"SAVE": "{out}/x"},
        echo=False,
    )
    argv, env, container = calls[-1]
    assert env["ONLY_HERE"] == "1" and env["SAVE"] == f"{tmp_path}/x" and container is None
    assert f"--junitxml={tmp_path}/t.xml" in argv


def test_the_plan_carries_the_place_and_the_environment_computed_once(monkeypatch):
    monkeypatch.setenv("KILN_ROOT", str(ROOT))
    place = ContainerPlace("kiln-cpu:t")
    plan = steps.plan_of("cpu", place, RunOptions(suites=["numerics"], devices=(), record_history=False))
    assert plan.place is place and plan.mode == CONTAINER and plan.label == "cpu/container"
    assert plan.env == commands.suite_env(plan.m, plan.b) and plan.history_db is None
    assert plan.suites == ("numerics",) and plan.policy == plan.m.retries_for(plan.b)


@pytest.mark.parametrize("place", [NativePlace(), ContainerPlace("kiln-cpu:t", "base:1")])
def test_a_shard_process_is_given_the_same_place(place, tmp_path, monkeypatch):
    """The `harness run` line of a shard, read back by `harness run`'s own parser and mode rule, is the
    parent's place; the shard's environment says the same (KILN_NATIVE)."""
    monkeypatch.setenv("KILN_NATIVE", place.cli_env()["KILN_NATIVE"])
    options = RunOptions(suites=["alpha"], extra=["-x"], health=False, retries=matrix.Retries(2, 3))
    argv = sharded.shard_argv("cpu", Shard(1, 2), ["0"], tmp_path / "shard-1", place, options)
    assert argv[1:4] == ["-m", "harness", "run"]
    parser = argparse.ArgumentParser()
    steps.cli_add_arguments(parser)
    args = parser.parse_args(argv[4:])
    assert chosen(args.native, args.image, args.base_image) == place
    assert args.suites == ["alpha"] and args.no_health and args.retries == 2 and args.shard == "1/2"
    assert args.pytest_args == ["--", "-x"] and args.devices == "0" and args.no_history


def test_a_launch_from_another_source_folder_runs_that_tree(tmp_path, monkeypatch):
    """`src` (bench bisect's scratch worktree) is the process's source natively and the /src mount in a
    container."""
    monkeypatch.setattr("harness.images.cleanup.mark_used", lambda image: None)
    monkeypatch.setenv("KILN_COMPILE_CACHE", "off")
    tree = tmp_path / "tree"
    tree.mkdir()
    b = M.backend("cpu")
    native = NativePlace().launch(b, ["python", "-V"], out_dir=tmp_path, name="x", env={}, src=tree)
    assert native.cwd == tree and native.env is not None
    assert native.env["PYTHONPATH"].split(":")[0] == str(tree)
    argv = (
        ContainerPlace("kiln-cpu:t")
        .launch(b, ["python", "-V"], out_dir=tmp_path, name="x", env={}, src=tree)
        .argv
    )
    assert f"{tree}:/src:ro" in argv


def test_a_place_gives_a_child_its_flags_only_once_it_knows_them():
    """`bench job-summary` hands its place to each `bench bisect` it starts: `--native`, or a prepared
    container's image; an unprepared container place gives nothing (the child builds the backend's image)."""
    assert NativePlace().cli_args() == ["--native"]
    assert ContainerPlace().cli_args() == []
    assert ContainerPlace("kiln-cpu:t").cli_args() == ["--image", "kiln-cpu:t"]


def test_each_place_pins_a_gpu_backend_its_own_way():
    cuda = M.backend("cuda")
    env = {"CUDA_VISIBLE_DEVICES": "2,3"}
    assert gpus.pin_visible(cuda, ["3"], env=env).env["CUDA_VISIBLE_DEVICES"] == "3"
    assert gpus.pin(cuda, ["3"], env=env).container_options[:2] == ("--gpus", "device=3")
    assert NativePlace().pin(M.backend("cpu"), ["0"]) == M.backend("cpu")


def test_a_native_gpu_place_is_ready_only_where_this_torch_sees_the_gpu():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from harness.exc import NoDeviceError

    assert NativePlace().prepared(M.backend("cpu")) == NativePlace()
    with pytest.raises(NoDeviceError, match="^backend cuda needs an NVIDIA GPU with a CUDA build of torch"):
        NativePlace().prepared(M.backend("cuda"))
