"""A bench job on a runner without its GPU stops at its pre-flight: `nox -s bench-record` / `bench-pr` /
`preflight` with the cuda backend, run by nox itself on a copy of the project's harness, where `nvidia-smi`
answers with an error (the driver is not usable). Nothing is opened, created or set aside: no job store, no
lasting store, no results folder; the session prints one line besides nox's own framing, and fails."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
pytest.importorskip("nox")


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """The noxfile, the matrix, the harness and the compiler in a fresh folder (nox runs the sessions from the noxfile's
    folder: the job's results folder is made there, if at all), and a broken `nvidia-smi` on PATH."""
    where = tmp_path_factory.mktemp("job")  # the lasting store's folder: beside it (outside the checkout)
    for name in ("noxfile.py", "pyproject.toml"):
        shutil.copy(ROOT / name, where / name)
    shutil.copytree(ROOT / "ci", where / "ci")
    shutil.copytree(ROOT / "harness", where / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    # the harness reads its settings through compiler.envvars and compiler.config
    shutil.copytree(ROOT / "compiler", where / "compiler", ignore=shutil.ignore_patterns("__pycache__"))
    tools = where / "tools"
    tools.mkdir()
    smi = tools / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the driver' >&2\n"
        "exit 9\n"
    )
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    return where


def _nox(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "KILN_NO_VENV": "1",
        "PATH": f"{project / 'tools'}{os.pathsep}{os.environ['PATH']}",
        "KILN_BENCH_STORE": str(project.parent / f"{project.name}-runner" / "{backend}.sqlite"),
        "GITHUB_STEP_SUMMARY": str(project / "summary.md"),
    }
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        [sys.executable, "-m", "nox", "-f", str(project / "noxfile.py"), *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize("session", ["bench-record", "bench-pr", "preflight"])
@pytest.mark.parametrize("native", [[], ["--native"]], ids=["container", "native"])
def test_a_bench_job_without_its_gpu_stops_at_the_preflight_and_leaves_nothing(project, session, native):
    p = _nox(project, "-s", session, "--", "--backend", "cuda", *native)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    own = [ln for ln in out.splitlines() if ln.strip() and not ln.startswith("nox > ")]
    assert own == [], f"lines besides nox's framing: {own}"
    failed = [
        ln
        for ln in out.splitlines()
        if f"Session {session} aborted" in ln or f"Session {session} failed" in ln
    ]
    assert len(failed) == 1 and "error: pre-flight cuda: nvidia-smi failed (exit 9" in failed[0], out
    assert "bench export" not in out and "bench import" not in out and "bench backend" not in out, out
    assert not (project / "results").exists(), sorted(p.name for p in (project / "results").rglob("*"))
    assert not (project.parent / f"{project.name}-runner").exists() and not (project / "summary.md").exists()


def test_the_main_job_runs_the_preflight_before_its_venv_its_suites_and_its_stores(project, monkeypatch):
    """`nox -s ci` on a runner whose detected backend is cuda but whose driver fails: the session stops with the
    pre-flight's line after detecting the backend, before the shared venv, the suites or any bench step."""
    from noxfile_loader import noxfile

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("PATH", f"{project / 'tools'}{os.pathsep}{os.environ['PATH']}")
    ran: list[tuple] = []

    class Stop(Exception):
        pass

    class Session:
        posargs: tuple[str, ...] = ()

        def run(self, *args, **kw):
            ran.append(args)
            return "native" if "--mode" in args else "cuda"

        def log(self, line):
            pass

        def error(self, line):
            raise Stop(line)

    monkeypatch.setattr(noxfile(), "shared_python", lambda *a, **k: ran.append(("shared_python",)) or "py")
    ci = noxfile().ci
    with pytest.raises(Stop) as stopped:
        (ci.func if hasattr(ci, "func") else ci)(Session())
    assert "error: pre-flight cuda: nvidia-smi failed (exit 9" in str(stopped.value)
    assert [a[3:] for a in ran] == [("detect",)], (
        ran
    )  # nothing after the detection (the mode is a rule, not asked)
