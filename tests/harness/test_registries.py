"""No package index or mirror host in the repository: images and bootstraps take them from the environment or
the tools' own configuration (harness/settings.py), so mirrors and air-gapped sites work unchanged."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness import matrix
from harness.exc import ImageError
from harness.images import image
from harness.settings import Settings, settings

ROOT = Path(__file__).resolve().parents[2]
# written in pieces so that this file does not hold them either
HOSTS = [
    ".".join(p)
    for p in (
        ("pypi", "org"),
        ("download", "pytorch", "org"),
        ("deb", "debian", "org"),
        ("files", "pythonhosted", "org"),
        ("registry-1", "docker", "io"),
    )
]


def test_no_registry_host_in_tracked_files():
    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    if not files:
        pytest.skip("not a git checkout")
    hits = []
    for name in files:
        path = ROOT / name
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        hits += [f"{name}: {h}" for h in HOSTS if h in text]
    assert hits == []


def _apt(tmp_path: Path) -> Path:
    d = tmp_path / "apt"
    (d / "sources.list.d").mkdir(parents=True)
    (d / "sources.list").write_text(
        "# comment\ndeb [arch=amd64 signed-by=/k.gpg] http://one.test/debian bullseye main\n"
    )
    (d / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://two.test/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\n"
        "Types: deb\nURIs: http://two.test/debian-security\nSuites: bookworm-security\nComponents: main\n"
    )
    return d


def test_debian_mirror_comes_from_apt_sources(tmp_path, monkeypatch):
    monkeypatch.delenv("KILN_DEBIAN_MIRROR", raising=False)
    apt = _apt(tmp_path)
    assert image.debian_mirror("bookworm", apt) == "http://two.test/debian"
    assert image.debian_mirror("bullseye", apt) == "http://one.test/debian"
    with pytest.raises(ImageError, match="no Debian mirror for trixie: set KILN_DEBIAN_MIRROR"):
        image.debian_mirror("trixie", apt)


def test_debian_mirror_variable_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_DEBIAN_MIRROR", "http://three.test/debian")
    assert image.debian_mirror("bookworm", _apt(tmp_path)) == "http://three.test/debian"


def test_index_args_come_from_the_environment():
    m = matrix.load(ROOT / "ci" / "matrix.json")
    base = settings()
    rocm, cpu, cuda = m.backend("rocm"), m.backend("cpu"), m.backend("cuda")
    empty = Settings(
        **{**base.__dict__, "pip_index_url": "", "pip_extra_index_url": "", "torch_index_url": ""}
    )
    assert rocm.index_args(empty) == ""  # pip's own configuration decides
    assert (
        cpu.index_args(empty) == "--no-index" == cuda.index_args(empty)
    )  # a wheelhouse build needs no index
    full = Settings(
        **{
            **base.__dict__,
            "pip_index_url": "http://idx.test/simple",
            "pip_extra_index_url": "http://a.test/simple http://b.test/simple",
            "torch_index_url": "http://torch.test/whl",
        }
    )
    assert rocm.index_args(full).split() == [
        "--index-url",
        "http://idx.test/simple",
        "--extra-index-url",
        "http://a.test/simple",
        "--extra-index-url",
        "http://b.test/simple",
        "--extra-index-url",
        "http://torch.test/whl/rocm7.0",
    ]
    assert "torch.test" not in " ".join(rocm.build_args().values())  # where packages come from is not hashed
