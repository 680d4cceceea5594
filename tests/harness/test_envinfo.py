"""The environment record (harness/envinfo.py) names the lock: the tree's (host) and the one the running Python
was installed from (device), so two runs on one image id can be told to have run the same bits."""

from __future__ import annotations

from pathlib import Path

from harness import envinfo, matrix
from harness.images import lock

ROOT = Path(__file__).resolve().parents[2]


def test_host_record_carries_the_lock_digest(monkeypatch):
    monkeypatch.setenv("KILN_DOCKER", "/nonexistent/docker")
    host = envinfo.capture_host({"tag": "kiln-cpu:1", "lock_sha256": "sha256:x"}, root=ROOT, backend="cpu")
    want = lock.file_digest(ROOT / "docker/lock/cpu.txt")
    assert host["lock"] == {"path": "docker/lock/cpu.txt", "sha256": want, "stale": False}
    assert host["image"]["lock_sha256"] == "sha256:x"
    assert envinfo.capture_host(root=ROOT)["lock"] is None  # no backend: nothing to name
    assert envinfo.lock_record("tpu", ROOT)["error"].startswith("UnknownBackend")


def test_device_record_carries_the_installed_lock(monkeypatch, tmp_path):
    f = tmp_path / "lock.txt"
    f.write_text((ROOT / "docker/lock/cpu.txt").read_text())
    monkeypatch.setenv(lock.LOCK_ENV, str(f))  # as in the images (ENV KILN_LOCK_FILE)
    rec = envinfo.device_lock("cpu")
    assert rec["path"] == str(f) and rec["sha256"] == lock.file_digest(f) and rec["unlocked"] is False
    assert isinstance(rec["installed_mismatches"], list)
    monkeypatch.delenv(lock.LOCK_ENV)
    native = envinfo.device_lock("cpu")  # natively: the backend's lock in the tree
    assert native["sha256"] == lock.file_digest(ROOT / "docker/lock/cpu.txt")
    f.write_text(lock.unlocked_text(matrix.load(ROOT / "ci/matrix.json").backend("cuda"), ROOT))
    monkeypatch.setenv(lock.LOCK_ENV, str(f))
    assert envinfo.device_lock("cuda")["unlocked"] is True and envinfo.device_lock("cuda")["sha256"] is None


def test_lock_record_takes_the_backend_the_caller_holds():
    from harness import matrix

    by_name = envinfo.lock_record("cpu", ROOT)
    assert by_name is not None and "error" not in by_name
    assert envinfo.lock_record(matrix.load(ROOT / "ci" / "matrix.json").backend("cpu"), ROOT) == by_name
