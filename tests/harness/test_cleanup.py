"""`harness cleanup`, a CI job's teardown: the job's containers, stale ones, superseded kiln image tags (docker
faked; the keep-list is the tags the matrix and this tree hash to now)."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from harness import matrix
from harness.images import cleanup, image

ROOT = Path(__file__).resolve().parents[2]
M = matrix.load(ROOT / "ci" / "matrix.json")
HOUR = 3600.0


def test_superseded_keeps_the_current_tag_and_recent_ones():
    now = 1_000_000.0
    imgs = [
        cleanup.LocalImage("kiln-cuda", "cur", now - 50 * HOUR),  # current: kept however old
        cleanup.LocalImage("kiln-cuda", "old", now - 5 * HOUR),
        cleanup.LocalImage("kiln-cuda", "new", now - 0.5 * HOUR),  # built lately (another runner's tree)
        cleanup.LocalImage("kiln-cuda", "used", now - 9 * HOUR),  # old, but a run started from it lately
        cleanup.LocalImage("kiln-rocm", "x", now - 9 * HOUR),  # its current tag is unknown: kept
        cleanup.LocalImage("kiln-base/debian", "bookworm", now - 99 * HOUR),
    ]  # not a matrix repo
    keep = {"kiln-cuda": "kiln-cuda:cur", "kiln-rocm": None}
    got = cleanup.superseded(imgs, keep, now=now, grace_s=1.5 * HOUR, used={"kiln-cuda:used": now - HOUR})
    assert got == ["kiln-cuda:old"]
    assert cleanup.superseded(imgs, keep, now=now, grace_s=0) == [
        "kiln-cuda:new",
        "kiln-cuda:old",
        "kiln-cuda:used",
    ]


def test_the_keep_list_is_every_backends_current_tag(monkeypatch):
    monkeypatch.setattr(
        image, "image_id", lambda ref: None
    )  # no local base: the matrix's reference is hashed
    keep = cleanup.current_tags(M)
    assert set(keep) == {b.image for b in M.backends.values()}
    for b in M.backends.values():
        assert keep[b.image] == image.current_tag(b) and keep[b.image].startswith(f"{b.image}:")


def test_the_grace_period_is_the_longest_job():
    assert cleanup.grace_default(M) == 60 * max(b.timeouts.job_min for b in M.backends.values())


def test_docker_dates_read():
    first = cleanup._epoch("2026-11-25 17:46:51 +0000 UTC")
    assert first == pytest.approx(cleanup._epoch("2026-11-25T17:46:51.123456789Z") - 0.123456)


class FakeDocker:
    """Answers the docker commands cleanup runs from a table of containers and images; records removals."""

    def __init__(
        self,
        containers: dict[str, tuple[dict[str, str], str]],
        images: list[tuple[str, str, str]],
        in_use: tuple[str, ...] = (),
    ):
        self.containers, self.images, self.in_use, self.calls = containers, images, in_use, []

    def __call__(self, *args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        self.calls.append(args)
        out, rc, err = "", 0, ""
        if args[:2] == ("ps", "-a"):
            key, _, value = args[-1].removeprefix("label=").partition("=")
            out = "\n".join(
                cid
                for cid, (labels, _) in self.containers.items()
                if key in labels and (not value or labels[key] == value)
            )
        elif args[0] == "inspect":
            out = "\n".join(f"{cid}\t{self.containers[cid][1]}" for cid in args[3:])
        elif args[:2] == ("image", "ls"):
            out = "\n".join(f"{r}\t{t}\t{c}" for r, t, c in self.images if r == args[2])
        elif args[:2] == ("image", "rm") and args[2] in self.in_use:
            rc, err = 1, "Error: conflict: unable to remove repository reference (must force) - container abc"
        return subprocess.CompletedProcess(args, rc, out, err)

    def removed(self, what: str) -> list[str]:
        if what == "containers":
            return [c for a in self.calls if a[:2] == ("rm", "--force") for c in a[2:]]
        return [a[2] for a in self.calls if a[:2] == ("image", "rm")]


def test_cleanup_removes_the_jobs_containers_and_superseded_tags_only(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_COMPILE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setattr(image, "image_id", lambda ref: None)
    keep = cleanup.current_tags(M)
    old = "2020-01-01 00:00:00 +0000 UTC"
    recent = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S +0000 UTC")
    fake = FakeDocker(
        containers={
            "c-mine": ({"kiln.job": "7-1-r1", "kiln.backend": "cuda"}, recent),
            "c-other": ({"kiln.job": "7-1-r2", "kiln.backend": "cuda"}, recent),  # another runner's job
            "c-stale": ({"kiln.job": "3-1-r1", "kiln.backend": "cpu"}, old),
            "c-foreign": ({}, old),  # not kiln's
            "c-manual": ({"kiln.backend": "cpu"}, old),
        },  # a kiln image run by hand: its image's labels
        images=[(r, t.split(":")[1], old) for r, t in keep.items()]
        + [
            ("kiln-cuda", "0000000000000000", old),
            ("kiln-cpu", "1111111111111111", old),
            ("kiln-cpu", "2222222222222222", old),
            ("kiln-base/debian", "bookworm-minbase", old),
        ],
        in_use=("kiln-cpu:2222222222222222",),
    )
    monkeypatch.setattr(cleanup, "docker", fake)
    cache = tmp_path / "cache" / "untrusted" / "kiln-cuda-0000000000000000"
    cache.mkdir(parents=True)
    current_cache = tmp_path / "cache" / "main" / keep["kiln-cuda"].replace(":", "-")
    current_cache.mkdir(parents=True)
    lines = cleanup.cleanup(job="7-1-r1", images=True, grace_s=1.5 * HOUR)
    assert sorted(fake.removed("containers")) == ["c-mine", "c-stale"]
    assert fake.removed("images") == [
        "kiln-cpu:1111111111111111",
        "kiln-cpu:2222222222222222",
        "kiln-cuda:0000000000000000",
    ]
    assert not any(ref in fake.removed("images") for ref in keep.values())  # the current tags stay
    assert not cache.exists() and current_cache.exists()
    assert any(line.startswith("kept image kiln-cpu:2222222222222222: Error: conflict") for line in lines)
    # a dry run removes nothing
    fake.calls.clear()
    cleanup.cleanup(job="7-1-r1", images=True, grace_s=1.5 * HOUR, dry_run=True)
    assert fake.removed("containers") == [] and fake.removed("images") == []


def test_a_recent_use_mark_keeps_an_old_tag(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    cleanup.mark_used("kiln-cuda:0000000000000000")
    used = cleanup.last_used(["kiln-cuda:0000000000000000", "kiln-cuda:1"])
    assert list(used) == ["kiln-cuda:0000000000000000"]
    imgs = [cleanup.LocalImage("kiln-cuda", "0000000000000000", 0.0)]
    assert (
        cleanup.superseded(
            imgs,
            {"kiln-cuda": "kiln-cuda:cur"},
            now=used["kiln-cuda:0000000000000000"] + 60,
            grace_s=HOUR,
            used=used,
        )
        == []
    )


def test_cleanup_without_docker_says_so_and_succeeds(monkeypatch, capsys):
    from harness.__main__ import main
    from harness.exc import DockerError

    def no_docker():
        raise DockerError("docker client 'docker' not found")

    monkeypatch.setattr(cleanup, "require_docker", no_docker)
    assert main(["cleanup"]) == 0
    assert "nothing to clean" in capsys.readouterr().out


def test_cleanup_without_a_daemon_gives_no_advice_meant_for_other_verbs(monkeypatch, capsys):
    """The newcomer transcript: `harness cleanup` said "... start it ... or run natively with --native", which
    cleanup has no use for: the reason alone."""
    from harness.__main__ import main
    from harness.exc import DockerError

    def no_daemon():
        raise DockerError(
            "cannot reach the docker daemon (Cannot connect); start it (e.g. `dockerd &`) or run "
            "natively with --native"
        )

    monkeypatch.setattr(cleanup, "require_docker", no_daemon)
    assert main(["cleanup"]) == 0
    out = capsys.readouterr().out
    assert out.strip() == "harness cleanup: nothing to clean: cannot reach the docker daemon (Cannot connect)"


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"KILN_JOB_ID": "mine"}, "mine"),
        ({"GITHUB_RUN_ID": "12", "GITHUB_RUN_ATTEMPT": "3", "RUNNER_NAME": "h100 #2"}, "12-3-h100--2"),
        ({}, ""),
    ],
)
def test_the_job_id(env, expected):
    from harness.settings import job_id

    assert job_id(env) == expected


def test_prune_can_be_turned_off(monkeypatch, capsys):
    from harness.__main__ import main

    fake = FakeDocker(containers={}, images=[("kiln-cpu", "0", "2020-01-01 00:00:00 +0000 UTC")])
    monkeypatch.setattr(cleanup, "docker", fake)
    monkeypatch.setattr(cleanup, "require_docker", lambda: None)
    monkeypatch.setenv("KILN_PRUNE_IMAGES", "0")
    assert main(["cleanup", "--job", "j"]) == 0
    assert not any(a[0] == "image" for a in fake.calls) and "image tags left alone" in capsys.readouterr().out


def test_two_jobs_of_one_run_id_on_one_host_have_two_job_ids():
    """Under `act` every run has run id 1 and no runner name: the job's own RUNNER_TEMP tells two jobs apart, so
    one job's teardown never removes another's containers."""
    from harness.settings import job_id

    base = {"GITHUB_RUN_ID": "1", "GITHUB_RUN_ATTEMPT": "1"}
    a, b = (
        job_id({**base, "RUNNER_TEMP": "/cache/act/1a/tmp"}),
        job_id({**base, "RUNNER_TEMP": "/cache/act/2b/tmp"}),
    )
    assert a != b and a.startswith("1-1-") and b.startswith("1-1-")
    assert job_id({**base, "RUNNER_TEMP": "/cache/act/1a/tmp"}) == a  # every step of one job: the same id
