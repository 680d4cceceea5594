"""The README's commands on a machine whose pip reaches only the package index, and one job whatever the host.

The package index is played by a folder of tiny wheels (pip with `--no-index --find-links`, none of this machine's
pip configuration): torch's index build requiring another triton than the matrix pins, torch's CPU build, or no
torch at all. `nox` runs for real in a scratch copy of the noxfile, the matrix and pyproject.toml.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CPU = json.loads((ROOT / "ci" / "matrix.json").read_text())["backends"]["cpu"]
TORCH = CPU["torch"].split("==")[1]
TRITON = CPU["triton"].split("==")[1]
OTHER_TRITON = "3.7.1" if TRITON != "3.7.1" else "3.6.0"


def wheel(folder: Path, name: str, version: str, requires: list[str] = ()) -> Path:
    """A minimal pure-Python wheel `name==version` with `requires` as its dependencies."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{dist}-py3-none-any.whl"
    files = {
        f"{dist}.dist-info/METADATA": "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
            name, version, "".join(f"Requires-Dist: {r}\n" for r in requires)
        ),
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: kiln-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    with zipfile.ZipFile(path, "w") as z:
        for arc, text in files.items():
            z.writestr(arc, text)
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
            record.append(f"{arc},sha256={digest},{len(text)}")
        z.writestr(f"{dist}.dist-info/RECORD", "\n".join([*record, f"{dist}.dist-info/RECORD,,"]) + "\n")
    return path


def index_env(wheels: Path, home: Path) -> dict[str, str]:
    """A stranger's environment: a user's PATH, a fresh HOME, pip reaching only `wheels` (the 'index')."""
    return {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "LANG": "C.UTF-8",
    }


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A scratch tree holding what the noxfile reads before it runs a command: itself, the matrix, pyproject."""
    pytest.importorskip("nox")
    tree = tmp_path / "kiln"
    (tree / "ci").mkdir(parents=True)
    shutil.copy(ROOT / "noxfile.py", tree)
    shutil.copy(ROOT / "ci" / "matrix.json", tree / "ci")
    shutil.copy(ROOT / "pyproject.toml", tree)
    return tree


def nox(tree: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nox", *args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_the_torch_pin_where_pip_reaches_only_the_index(checkout, tmp_path):
    """Three indexes in turn, one venv: (1) no torch: nox stops at once with one line naming what to set; (2)
    torch's index build, which requires another triton (and nvidia-* runtime wheels): that pair is installed
    instead of dying in pip's resolver, and one line says so; (3) torch's CPU build too: the matrix's pair."""
    (wheels := tmp_path / "wheels").mkdir()
    env = index_env(wheels, tmp_path / "home")
    p = nox(checkout, env, "-s", "tests")
    assert p.returncode != 0
    out = p.stdout + p.stderr
    lines = [ln for ln in out.splitlines() if "pip cannot install" in ln]
    assert len(lines) == 1, out
    assert f"torch=={TORCH} with triton=={TRITON} (ci/matrix.json)" in lines[0]
    assert "KILN_TORCH_INDEX_URL" in lines[0] and "PIP_FIND_LINKS" in lines[0]
    assert "Traceback" not in out
    assert not (checkout / ".nox" / "kiln" / "kiln-installed.json").exists()

    wheel(wheels, "torch", TORCH, [f"triton=={OTHER_TRITON}", "nvidia-cublas==13.1"])
    wheel(wheels, "triton", TRITON)
    wheel(wheels, "triton", OTHER_TRITON)
    wheel(wheels, "nvidia-cublas", "13.1")
    p = nox(checkout, env, "-s", "tests")
    out = p.stdout + p.stderr
    said = [ln for ln in out.splitlines() if ln.startswith(f"nox > torch {TORCH}, triton {OTHER_TRITON}:")]
    assert len(said) == 1, out
    assert (
        f"no torch=={TORCH} that goes with triton=={TRITON}" in said[0]
        and "1 nvidia-* runtime wheels" in said[0]
    )
    assert "ResolutionImpossible" not in out
    assert "installed first in 1 batches" in said[0]  # the runtime wheels before torch: `runtime_stages`
    staged = [ln for ln in out.splitlines() if "pip install --no-deps" in ln]
    assert len(staged) == 1 and staged[0].endswith("nvidia-cublas==13.1"), out
    venv = checkout / ".nox" / "kiln" / "bin" / "python"
    shown = subprocess.run(
        [str(venv), "-m", "pip", "list", "--format", "json"], capture_output=True, text=True, check=True
    ).stdout
    assert {d["name"]: d["version"] for d in json.loads(shown)}["triton"] == OTHER_TRITON
    assert p.returncode != 0  # the project's own install needs the real index (absent here): it stops there

    wheel(wheels, "torch", f"{TORCH}+cpu")  # a local version outranks the index's build of the same version
    p = nox(checkout, env, "-s", "tests")
    assert f"nox > torch {TORCH}+cpu, triton {TRITON}: ci/matrix.json's pins" in p.stdout + p.stderr


def test_the_runtime_wheels_are_staged_in_batches_and_a_short_disk_is_one_line():
    """The index build's nvidia-* wheels go in batches of RUNTIME_STAGE (each batch's downloads freed before the
    next); with less free space than the build needs the session stops first, with one line naming the way out."""
    from noxfile_loader import noxfile

    nf = noxfile()
    got = {f"nvidia-lib{i}": f"1.{i}" for i in range(nf.RUNTIME_STAGE * 2 + 1)} | {
        "torch": TORCH,
        "sympy": "1",
    }
    stages = nf.runtime_stages(got, ["--extra-index-url", "u"])
    assert [len(s) - 2 for s in stages] == [nf.RUNTIME_STAGE, nf.RUNTIME_STAGE, 1]
    assert all(s[:2] == ["--extra-index-url", "u"] for s in stages)
    assert sorted(a for s in stages for a in s[2:]) == sorted(
        f"{n}=={v}" for n, v in got.items() if "nvidia" in n
    )
    assert nf.runtime_stages({"torch": TORCH}, []) == []
    assert nf.runtime_disk_shortfall(".nox/kiln", free_gb=lambda path: nf.RUNTIME_NEED_GB) == ""
    line = nf.runtime_disk_shortfall(".nox/kiln", free_gb=lambda path: 2.5)
    assert line.startswith("nox: 2.5 GB free at the venv's folder") and "KILN_TORCH_INDEX_URL" in line
    assert "\n" not in line


# ---- one job whatever the host ---------------------------------------------------------------------------
def _ci_lines(*posargs: str, env: dict[str, str] | None = None) -> list[str]:
    """`nox -s ci --install-only` (no command runs) in this checkout: the session's lines."""
    pytest.importorskip("nox")
    e = {k: v for k, v in os.environ.items() if k != "KILN_NATIVE"}
    e.update({"KILN_NO_VENV": "1", **(env or {})})
    p = subprocess.run(
        [sys.executable, "-m", "nox", "-s", "ci", "--install-only", *(["--", *posargs] if posargs else [])],
        cwd=ROOT,
        env=e,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return [
        ln.removeprefix("nox > ")
        for ln in (p.stdout + p.stderr).splitlines()
        if ln.startswith("nox > ") and "uv binary" not in ln and not ln.startswith("nox > Running")
    ]


def test_the_main_job_says_its_mode_and_rule_first_and_a_daemon_does_not_choose_it():
    lines = _ci_lines()
    assert lines[0] == (
        "mode: native (rule: native unless `-- --container` or `-- --image REF`; the docker daemon "
        "is not consulted)"
    )
    assert "backend: cpu (native)" in lines
    container = _ci_lines("--container")
    assert container[0].startswith("mode: container (rule: ") and "backend: cpu (container)" in container
    assert container[-2].startswith("bench models: not run (container mode")  # among the job's last lines


def test_asking_for_both_modes_is_one_line():
    lines = _ci_lines("--container", env={"KILN_NATIVE": "1"})
    assert any("--container and --native (or KILN_NATIVE=1) ask for both modes" in ln for ln in lines), lines
    assert not any(ln.startswith("mode:") for ln in lines)


def test_ci_mode_rule():
    from noxfile_loader import noxfile

    nf = noxfile()
    assert nf.ci_mode([])[:1] == ("native",)
    assert nf.ci_mode(["--native", "--suite", "fallback"]) == (
        "native",
        nf.CI_MODE_RULE,
        ["--suite", "fallback"],
    )
    assert nf.ci_mode(["--container"])[0] == "container"
    assert nf.ci_mode(["--image", "kiln-cpu:x"]) == ("container", nf.CI_MODE_RULE, ["--image", "kiln-cpu:x"])
