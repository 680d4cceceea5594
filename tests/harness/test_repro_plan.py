"""The plan of `harness repro` (harness/suites/repro_plan.py): mode, image, commit and hardware, and the ONE line
that says what cannot match the run."""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness.exc import ResultsError
from harness.record import RunRecord, RunStatus
from harness.suites.repro_plan import (
    CONTAINER,
    NATIVE,
    Here,
    choose_image,
    choose_mode,
    differs_line,
    gpu_difference,
    outcome_line,
    plan,
    run_env,
    version_differences,
)
from harness.suites.repro_source import Failing, RunSource

SHA = "0123456789abcdef0123456789abcdef01234567"
TAG = "kiln-cuda:aaaaaaaaaaaaaaaa"
H100 = "NVIDIA H100 80GB HBM3"


def source(
    mode: str = CONTAINER,
    *,
    backend: str = "cuda",
    gpus: tuple[str, ...] = (H100,),
    dirty: bool = False,
    failing: tuple[str, ...] = ("tests/a/test_a.py::test_x",),
    **record,
) -> RunSource:
    rec = RunRecord(
        "run-1",
        backend,
        RunStatus.COMPLETE,
        mode=mode,
        image={"tag": TAG} if mode == CONTAINER else None,
        env={"PYTHONHASHSEED": "0", "KILN_TEST_DEVICE": "cuda"},
        seeds={"PYTHONHASHSEED": "0"},
        commit={"sha": SHA, "dirty": dirty, "dirty_files": ["compiler/a.py"] if dirty else []},
        **record,
    )
    return RunSource(
        "art.zip",
        rec,
        tuple(Failing("a", t, "failed") for t in failing),
        gpus=gpus,
        versions={"torch": "2.11.0", "python": "3.11.2"},
    )


HERE_SAME = Here(
    docker=True, gpus=(H100,), versions={"torch": "2.11.0", "python": "3.11.2"}, image_present=True
)


def test_the_same_machine_differs_in_nothing_and_reruns_in_the_run_image():
    p = plan(source(), HERE_SAME, {"A": "1"})
    assert (p.mode, p.image, p.build, p.drop_gpus) == (CONTAINER, TAG, False, False)
    assert p.targets == ("tests/a/test_a.py::test_x",)
    assert differs_line(p) == "differs: nothing: same commit, mode, image and hardware as the run"


def test_a_container_run_without_docker_here_reruns_natively_and_says_so():
    assert choose_mode(source(), replace(HERE_SAME, docker=False), False) == (
        NATIVE,
        "mode: native here (no docker daemon answers), the run was in a container",
    )
    assert (
        choose_mode(source(), HERE_SAME, True)[0] == NATIVE
        and "--native" in choose_mode(source(), HERE_SAME, True)[1]
    )
    assert choose_mode(source(NATIVE), HERE_SAME, False) == (NATIVE, None)  # docker here does not matter


def test_the_image_is_reused_rebuilt_by_its_hash_or_replaced_with_a_line():
    assert choose_image(source(), HERE_SAME) == (TAG, False, None)
    absent = replace(HERE_SAME, image_present=False)
    assert choose_image(source(), replace(absent, rebuild_tag=TAG)) == (TAG, True, None)
    image, build, why = choose_image(source(), replace(absent, rebuild_tag="kiln-cuda:bbbbbbbbbbbbbbbb"))
    assert (image, build) == ("kiln-cuda:bbbbbbbbbbbbbbbb", True)
    assert why.startswith(f"image: {TAG} cannot be rebuilt here") and "bbbbbbbbbbbbbbbb" in why
    with pytest.raises(ResultsError, match="no image for the container rerun"):
        choose_image(source(), absent)


@pytest.mark.parametrize(
    "run, here, says",
    [
        ((H100,), (), f"GPU: the run had 1x {H100}, here no GPU (backend cuda tests may skip or fail)"),
        (
            (H100, H100),
            ("NVIDIA A100-SXM4-40GB",),
            f"GPU: the run had 2x {H100}, here 1x NVIDIA A100-SXM4-40GB",
        ),
        ((H100,), (H100,), None),
        ((), ("NVIDIA A100-SXM4-40GB",), None),  # a CPU run does not care which GPU is here
    ],
)
def test_the_gpu_phrase(run, here, says):
    assert gpu_difference(run, here, "cuda") == says


def test_no_gpu_here_drops_the_containers_gpu_options_and_the_line_says_why():
    p = plan(source(), replace(HERE_SAME, gpus=()), {})
    assert p.drop_gpus and p.mode == CONTAINER
    line = differs_line(p)
    assert line == f"differs: GPU: the run had 1x {H100}, here no GPU (backend cuda tests may skip or fail)"


def test_a_native_rerun_names_the_versions_that_differ():
    assert version_differences(
        {"torch": "2.13.0", "triton": "3.9.0"}, {"torch": "2.11.0", "triton": "3.9.0"}
    ) == ["torch 2.11.0 here, 2.13.0 in the run"]
    p = plan(source(NATIVE), replace(HERE_SAME, versions={"torch": "2.13.0", "python": "3.11.2"}), {})
    assert differs_line(p) == "differs: torch 2.13.0 here, 2.11.0 in the run"


def test_several_differences_are_one_line():
    here = Here(docker=False, gpus=(), versions={"torch": "2.13.0"}, head="f" * 40)
    p = plan(source(dirty=True), here, {})
    line = differs_line(p)
    assert "\n" not in line and line.count("; ") == 3
    assert "tree: the run's checkout had uncommitted changes (compiler/a.py)" in line
    assert "mode: native here" in line and "GPU: the run had" in line and "torch 2.13.0 here" in line


def test_a_commit_not_here_stops_unless_here_is_asked():
    here = replace(HERE_SAME, has_commit=False, head="f" * 40)
    with pytest.raises(ResultsError) as e:
        plan(source(), here, {})
    assert f"commit {SHA[:12]} of the run is not in this repository" in str(e.value) and "--here" in str(
        e.value
    )
    p = plan(source(), here, {}, use_here=True)
    assert (
        p.here_tree
        and f"this checkout's tree (HEAD ffffffffffff) instead of the run's {SHA[:12]}" in differs_line(p)
    )


def test_a_store_run_takes_the_commit_matrix_env_with_the_seeds_last_and_says_so():
    src = replace(
        source(NATIVE),
        from_store=True,
        record=replace(source(NATIVE).record, env={}, seeds={"PYTHONHASHSEED": "7"}),
    )
    env = run_env(src, {"PYTHONHASHSEED": "0", "TRITON_INTERPRET": "1"})
    assert env == {"PYTHONHASHSEED": "7", "TRITON_INTERPRET": "1"}
    assert "environment: the commit's matrix" in differs_line(plan(src, HERE_SAME, env))
    assert run_env(source(NATIVE), {"OTHER": "1"}) == {"PYTHONHASHSEED": "0", "KILN_TEST_DEVICE": "cuda"}


def test_nothing_to_reproduce_and_the_last_line():
    with pytest.raises(ResultsError, match="no failing tests"):
        plan(source(failing=()), HERE_SAME, {})
    p = plan(source(failing=("t::a", "t::a", "t::b")), HERE_SAME, {})
    assert p.targets == ("t::a", "t::b")
    assert outcome_line(1, 2) == "reproduced: 1 of 2 failing test(s) fail again"
