"""`python -m harness image --check` verdicts and `--pin` (harness/images/image_check.py), with docker faked."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from harness import matrix
from harness.exc import ImageError
from harness.images import image, image_check

ROOT = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "ab" * 32


class FakeDocker:
    """The docker commands image.py and image_check.py run, answered from a dict of local images."""

    def __init__(self) -> None:
        self.images: dict[str, dict] = {}  # ref -> {"id", "labels", "repo_digests"}
        self.pullable: dict[str, list[str]] = {}  # ref -> RepoDigests after a pull
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, *args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        self.calls.append(args)
        out, rc = "", 0
        if args[:2] == ("image", "inspect"):
            img = self.images.get(args[-1])
            fmt = args[3]
            if img is None:
                rc = 1
            elif fmt == "{{.Id}}":
                out = img["id"]
            elif fmt == "{{json .Config.Labels}}":
                out = json.dumps(img.get("labels"))
            elif fmt == "{{json .RepoDigests}}":
                out = json.dumps(img.get("repo_digests", []))
        elif args[:2] == ("image", "ls"):
            backend = args[3].split("=")[-1]
            out = "\n".join(
                r for r, i in self.images.items() if (i.get("labels") or {}).get("kiln.backend") == backend
            )
        elif args[0] == "pull":
            if args[1] in self.pullable:
                self.images[args[1]] = {"id": "sha256:pulled", "repo_digests": self.pullable[args[1]]}
            else:
                rc = 1
        proc = subprocess.CompletedProcess(args, rc, out + "\n", "" if rc == 0 else "Error: no such image\n")
        if check and rc:
            raise ImageError(f"docker {args[0]} failed")
        return proc


@pytest.fixture
def fake(monkeypatch, tmp_path):
    root = tmp_path / "root"
    (root / "docker" / "lock").mkdir(parents=True)
    (root / "ci").mkdir()
    for rel in (
        "docker/cpu.Dockerfile",
        "docker/cuda.Dockerfile",
        "docker/rocm.Dockerfile",
        "docker/requirements-test.txt",
        "docker/lock/cpu.txt",
        "pyproject.toml",
        "ci/matrix.json",
    ):
        shutil.copy(ROOT / rel, root / rel)
    monkeypatch.setenv("KILN_ROOT", str(root))
    monkeypatch.delenv("KILN_MATRIX", raising=False)
    d = FakeDocker()
    monkeypatch.setattr(image, "docker", d)
    monkeypatch.setattr(image, "require_docker", lambda: None)
    d.root = root
    return d


def _cpu(root: Path) -> matrix.Backend:
    return matrix.load(root / "ci/matrix.json").backend("cpu")


def _build_cpu(d: FakeDocker, **label_overrides: str) -> str:
    """Put a bootstrapped base and the CPU image the tree asks for into the fake docker; return its tag."""
    cpu = _cpu(d.root)
    d.images[cpu.bootstrap.image] = {"id": "sha256:" + "11" * 32}
    base = image.local_base(cpu)
    base_id = image.base_id_for_hash(cpu, base)
    tag = image.image_tag(cpu, base, d.root, base_id)
    labels = {**image.image_labels(cpu, tag, base, base_id, d.root), **label_overrides}
    d.images[tag] = {"id": "sha256:" + "22" * 32, "labels": labels}
    return tag


def test_a_matching_image_is_ok(fake):
    tag = _build_cpu(fake)
    v = image_check.check(_cpu(fake.root))
    assert v.ok and v.tag == tag
    line = v.line()
    assert line.startswith(
        f"cpu: ok: {tag} (base kiln-base/debian:bookworm-minbase id sha256:111111111111, lock sha256:"
    )
    assert "warning" not in line


def test_no_image_and_a_stale_image_are_mismatches(fake):
    cpu = _cpu(fake.root)
    v = image_check.check(cpu)
    assert not v.ok and "base image kiln-base/debian:bookworm-minbase" not in v.line()  # debian:... tag then
    assert "is not present locally" in v.line() and "base image not pinned by digest" in v.line()
    old = _build_cpu(fake)
    lock = fake.root / "docker/lock/cpu.txt"
    lock.write_text(lock.read_text().replace("pytest==9.2.0", "pytest==9.2.1"))  # the tree moved on
    v = image_check.check(cpu)
    assert not v.ok and v.tag != old
    assert v.line().startswith(f"cpu: MISMATCH: no local image {v.tag} ({old} was built with inputs hash")
    assert "lock sha256:" in v.line() and "python -m harness image build --backend cpu" in v.line()


def test_labels_that_disagree_are_a_mismatch(fake):
    tag = _build_cpu(fake, **{"kiln.lock-sha256": "sha256:" + "99" * 32})
    v = image_check.check(_cpu(fake.root))
    now = image.lock_mod.file_digest(fake.root / "docker/lock/cpu.txt")
    want = f"cpu: MISMATCH: {tag} was built with lock sha256:999999999999, the tree says {image_check.short(now)}"
    assert v.line() == want
    fake.images[tag]["labels"].pop("kiln.lock-sha256")
    line = image_check.check(_cpu(fake.root)).line()
    assert "has no kiln.lock-sha256 label (built before images were locked)" in line


def test_missing_or_stale_lock_fails_the_check(fake):
    _build_cpu(fake)
    (fake.root / "docker/requirements-test.txt").write_text("pytest==1.0\n")
    line = image_check.check(_cpu(fake.root)).line()
    assert line.startswith("cpu: MISMATCH: lock file docker/lock/cpu.txt is stale")
    rocm = matrix.load(fake.root / "ci/matrix.json").backend("rocm")
    line = image_check.check(rocm).line()
    assert line.startswith(
        "rocm: MISMATCH: no lock file docker/lock/rocm.txt: run `nox -s lock -- --backend rocm`"
    )


def test_unpinned_base_warns_and_fails_under_strict(fake):
    rocm = matrix.load(fake.root / "ci/matrix.json").backend("rocm")
    text = (
        fake.root / "docker/lock/cpu.txt"
    ).read_text()  # a current lock for rocm: its inputs in the header
    header = next(ln for ln in text.splitlines() if ln.startswith("# kiln-lock-inputs"))
    current = f"# kiln-lock-inputs: {image.lock_mod.inputs_digest(rocm, fake.root)}"
    (fake.root / "docker/lock/rocm.txt").write_text(text.replace(header, current))
    fake.images[rocm.base_image] = {"id": "sha256:" + "33" * 32}
    base_id = image.base_id_for_hash(rocm, rocm.base_image)
    tag = image.image_tag(rocm, rocm.base_image, fake.root, base_id)
    fake.images[tag] = {
        "id": "sha256:44",
        "labels": image.image_labels(rocm, tag, rocm.base_image, base_id, fake.root),
    }
    v = image_check.check(rocm)
    assert v.ok and "(warning: base image not pinned by digest: rocm/dev-ubuntu-24.04:7.0.2" in v.line()
    strict = image_check.check(rocm, strict=True)
    assert not strict.ok and strict.line().startswith("rocm: MISMATCH: base image not pinned by digest")


def test_pin_writes_the_digest_into_the_matrix_and_the_dockerfile(fake):
    m = matrix.load(fake.root / "ci/matrix.json")
    rocm = m.backend("rocm")
    before = (fake.root / "ci/matrix.json").read_text()
    with pytest.raises(ImageError, match="pinning needs a machine that reaches its registry"):
        image_check.pin(rocm)
    assert (fake.root / "ci/matrix.json").read_text() == before  # nothing invented
    fake.pullable[rocm.base_image] = ["other/repo@sha256:" + "00" * 32, f"rocm/dev-ubuntu-24.04@{DIGEST}"]
    assert image_check.pin(rocm) == DIGEST
    after = (fake.root / "ci/matrix.json").read_text()
    changed = [(a, b) for a, b in zip(before.splitlines(), after.splitlines()) if a != b]
    assert changed == [('      "base_digest": null,', f'      "base_digest": "{DIGEST}",')]  # layout kept
    pinned = matrix.load(fake.root / "ci/matrix.json").backend("rocm")
    assert pinned.base_digest == DIGEST
    assert matrix.load(fake.root / "ci/matrix.json").backend("cuda").base_digest is None
    assert (
        f"ARG BASE_IMAGE=rocm/dev-ubuntu-24.04:7.0.2@{DIGEST}\n"
        in (fake.root / "docker/rocm.Dockerfile").read_text()
    )
    assert image.unpinned_warning(pinned, pinned.base_ref) is None
    image_check.write_matrix_digest(fake.root / "ci/matrix.json", "rocm", "sha256:" + "ef" * 32)  # re-pin
    assert matrix.load(fake.root / "ci/matrix.json").backend("rocm").base_digest == "sha256:" + "ef" * 32


def test_repository_names():
    assert image_check._repository("nvidia/cuda:13.0.1-x") == "nvidia/cuda"
    assert image_check._repository("registry.test:5000/a/b:1") == "registry.test:5000/a/b"
    assert image_check._same_repo("docker.io/library/debian", "debian")


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run(
        [sys.executable, "-m", "harness", "image", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=full,
        timeout=60,
    )


def test_check_without_docker_is_one_clean_line():
    proc = _cli("--check", KILN_DOCKER="/nonexistent/docker")
    assert proc.returncode == 3 and "Traceback" not in proc.stderr  # infrastructure: no docker
    assert proc.stderr.strip().splitlines() == [
        "harness image: error: docker client '/nonexistent/docker' not found: install docker (apt-get install "
        "docker.io) or run natively with --native / KILN_NATIVE=1"
    ]


def test_check_through_the_cli_with_a_fake_docker_client(tmp_path):
    """A docker client script that knows no image: every backend is a mismatch, one line each, exit 1."""
    client = tmp_path / "docker"
    client.write_text(
        '#!/bin/sh\ncase "$1" in version) echo 20.10; exit 0;; image) [ "$2" = ls ] && exit 0; '
        "echo 'Error: No such image' >&2; exit 1;; esac\nexit 1\n"
    )
    client.chmod(client.stat().st_mode | stat.S_IEXEC)
    proc = _cli("--check", KILN_DOCKER=str(client))
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["cpu", "cuda", "rocm"]
    assert all(": MISMATCH: " in ln for ln in lines)
    assert "no lock file docker/lock/rocm.txt" in lines[2]
    proc = _cli("--check", "--backend", "cpu", KILN_DOCKER=str(client))
    assert len(proc.stdout.strip().splitlines()) == 1
    assert (
        _cli("build", "--check")
        .stderr.strip()
        .endswith("give either the action 'build' or --check/--pin, not both")
    )
