"""noxfile.py's GPU host rules: a bench holds the host's GPU lock alone (GPU test and flake sessions share it), and
the GPU's process list sampled during a bench names the compute processes that were not the bench's."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest
from noxfile_loader import noxfile


class _Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def log(self, line: str) -> None:
        self.lines.append(line)


def _holder(path: str, mode: str) -> subprocess.Popen:
    """Another process that holds the lock file (`sh` shared, `ex` exclusive) until its stdin closes."""
    code = (
        "import fcntl, sys; fh = open(sys.argv[1], 'a'); fcntl.flock(fh, fcntl.LOCK_SH if sys.argv[2] == 'sh' "
        "else fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, path, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_bench_waits_for_gpu_tests_and_gpu_tests_share_the_host(tmp_path, monkeypatch):
    import fcntl

    nf = noxfile()
    path = str(tmp_path / "gpu.lock")
    monkeypatch.setenv("KILN_GPU_LOCK", path)
    tests = _holder(path, "sh")
    try:
        log = _Log()
        shared = nf._gpu_host_lock(log, exclusive=False)  # two GPU test jobs side by side: no wait
        assert log.lines == []
        shared.close()
        with (
            open(path, "a") as probe,
            pytest.raises(BlockingIOError),
        ):  # a bench: refused while the tests hold it
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        tests.communicate("")
    bench = nf._gpu_host_lock(_Log(), exclusive=True)  # free now: taken at once
    with open(path, "a") as other, pytest.raises(BlockingIOError):
        fcntl.flock(other, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a GPU test job waits for the bench
    bench.close()


def _nvidia_smi(folder, body: str) -> None:
    tool = folder / "nvidia-smi"
    tool.write_text("#!/bin/sh\n" + body)
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)


def test_gpu_work_beside_the_bench_is_named_and_the_bench_own_is_not(tmp_path, monkeypatch):
    nf = noxfile()
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    _nvidia_smi(tmp_path, f"echo '{os.getpid()}, python3'\n")  # the bench itself (this process)
    with nf._Neighbours("cuda", every_s=0.05) as own:
        while own.samples < 2:
            pass
    assert own.lines() == [] and own.samples >= 2
    other = subprocess.Popen(["sleep", "30"])  # a process outside this tree stands for another job's
    try:
        _nvidia_smi(tmp_path, f"echo '{other.pid}, /usr/bin/python3'\necho '{os.getpid()}, python3'\n")
        assert nf._gpu_pids("cuda") == {str(other.pid): "/usr/bin/python3", str(os.getpid()): "python3"}
        # _own_pids walks this process's tree: the sleep is a child here, so it stands outside only when it is not
        monkeypatch.setattr(nf, "_own_pids", lambda: {str(os.getpid())})
        with nf._Neighbours("cuda", every_s=0.05) as beside:
            while beside.samples < 2:
                pass
        (line,) = beside.lines()
        assert line.startswith(f"bench cuda: ran beside other GPU work: pid {other.pid} (/usr/bin/python3, ")
        assert line.endswith("; its timings may be noise")
    finally:
        other.kill()
        other.wait()
    assert str(os.getpid()) in nf._own_pids()
    _nvidia_smi(tmp_path, "exit 9\n")
    assert nf._gpu_pids("cuda") == {}
