"""Lock files: every Python package of a backend's image pinned to one version and its sha256 hashes.

Terms:
  lock     docker/lock/<backend>.txt, written by `nox -s lock` (`nox -s lock-<backend>`: pip-tools'
           `pip-compile --generate-hashes` under the backend's Python, through `python -m harness image lock`);
           the image installs it with `pip install --require-hashes --no-deps`, so nothing outside it
           gets in and every file is checked against its hash.
  inputs   what a lock is resolved from: the backend's torch and triton pins, its torch variant and
           Python version (ci/matrix.json) and docker/requirements-test.txt. Their sha256 stands in the
           lock's header (`# kiln-lock-inputs: sha256:...`), so a lock made before they changed is stale.
  digest   sha256 of the lock file's bytes (`sha256:...`): part of the image's hash tag, in its labels
           (kiln.lock-sha256) and in every run's environment record (env.json host.lock / device.lock).

Where the packages come from is not in the lock or the repository: pip's own configuration and
variables, plus `KILN_TORCH_INDEX_URL/<torch_variant>` for PyTorch's wheels (harness/settings.py) when the
backend's `torch_index` is "pip" or "variant". A backend whose `torch_index` is "index" (cuda) is resolved
against the package index alone (`index_only_env`): the configuration's local wheel folders (this machine's
`+cpu` torch) and extra indexes are left out, its index URL and CA bundle kept, so the lock names PyPI's CUDA
build and its `nvidia-*` runtime wheels (checked by `resolved_problems`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.exc import ImageError, ImageInputError, MissingTool
from harness.matrix import Backend
from harness.process import Heartbeat, heartbeat_interval
from harness.results import atomic_write_text
from harness.settings import settings

LOCK_DIR = "docker/lock"
REQUIREMENTS = "docker/requirements-test.txt"
INPUTS_LINE = "# kiln-lock-inputs: "
LOCK_ENV = "KILN_LOCK_FILE"  # set in the images: the lock they were installed from
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def lock_path(backend: Backend, root: Path | None = None) -> Path:
    """docker/lock/<backend>.txt under `root` (default: the source tree)."""
    return (root or settings().root) / LOCK_DIR / f"{backend.name}.txt"


def file_digest(path: Path) -> str:
    """`sha256:<hex>` of the file's bytes."""
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def requirement_lines(backend: Backend, root: Path | None = None) -> list[str]:
    """The top-level requirements a lock is resolved from: torch and triton pins, then the test pins."""
    path = (root or settings().root) / REQUIREMENTS
    if not path.exists():
        raise ImageInputError(f"{path} not found (backend {backend.name})")
    tests = [ln.split("#", 1)[0].strip() for ln in path.read_text().splitlines()]
    return [backend.torch, backend.triton, *[ln for ln in tests if ln]]


def inputs_digest(backend: Backend, root: Path | None = None) -> str:
    """sha256 of everything the lock is resolved from (written into the lock's header)."""
    inputs = {
        "python": backend.python,
        "torch_variant": backend.torch_variant,
        "requirements": requirement_lines(backend, root),
    }
    return "sha256:" + hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def pins(path: Path) -> dict[str, str]:
    """name -> version of every `name==version` line of a lock (names normalized as pip does)."""
    return pins_text(path.read_text())


def pins_text(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        found = _PIN.match(line.strip())
        if found:
            out[normalize(found.group(1))] = found.group(2)
    return out


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class LockState:
    """A backend's lock as found in the tree, against what it should be resolved from."""

    backend: str
    path: Path
    digest: str | None  # None: no lock file
    recorded_inputs: str | None  # the inputs digest in its header
    inputs: str  # the inputs digest now

    @property
    def exists(self) -> bool:
        return self.digest is not None

    @property
    def stale(self) -> bool:
        return self.exists and self.recorded_inputs != self.inputs

    def problem(self) -> str | None:
        """One line saying what is wrong with the lock, or None when it is current."""
        fix = f"`nox -s lock -- --backend {self.backend}` on a machine that reaches the backend's package indexes"
        if not self.exists:
            return f"no lock file {self.rel}: run {fix}"
        if self.stale:
            return (
                f"lock file {self.rel} is stale (the matrix's pins or {REQUIREMENTS} changed since it was "
                f"made): run {fix}"
            )
        return None

    @property
    def rel(self) -> str:
        try:
            return str(self.path.relative_to(settings().root))
        except ValueError:
            return str(self.path)

    def record(self) -> dict[str, Any]:
        """The lock's entry of the environment record."""
        return {"path": self.rel, "sha256": self.digest, "stale": self.stale if self.exists else None}


def state(backend: Backend, root: Path | None = None) -> LockState:
    """The backend's lock: digest, the inputs it was made from and the inputs now."""
    path = lock_path(backend, root)
    digest = recorded = None
    if path.exists():
        digest = file_digest(path)
        for line in path.read_text().splitlines():
            if line.startswith(INPUTS_LINE):
                recorded = line[len(INPUTS_LINE) :].strip()
                break
    return LockState(backend.name, path, digest, recorded, inputs_digest(backend, root))


def unlocked_text(backend: Backend, root: Path | None = None) -> str:
    """What an explicitly unlocked build (KILN_ALLOW_UNLOCKED=1) installs instead of a lock: the top-level
    pins, without hashes; pip resolves the rest at build time."""
    lines = requirement_lines(backend, root)
    return (
        f"# UNLOCKED: no {LOCK_DIR}/{backend.name}.txt; top-level pins only, no hashes\n"
        + "\n".join(lines)
        + "\n"
    )


# ---- what a Python has installed, against a lock (environment record) -----------------------------------


def installed_mismatches(locked: dict[str, str]) -> list[str]:
    """`name: installed X, locked Y` for every locked package this Python has at another version or not
    at all (local version labels such as +cpu count)."""
    from importlib import metadata

    out = []
    for name, version in sorted(locked.items()):
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            have = None
        if have != version:
            out.append(f"{name}: installed {have or 'none'}, locked {version}")
    return out


def device_record(backend: Backend | None) -> dict[str, Any] | None:
    """The lock this Python was installed from ($KILN_LOCK_FILE in the images; natively the backend's lock in
    the tree): its digest and the locked packages installed at another version."""
    env = os.environ.get(LOCK_ENV)
    if env:
        path = Path(env)
    elif backend is not None:
        path = lock_path(backend)
    else:
        return None
    if not path.exists():
        return {"path": str(path), "sha256": None}
    unlocked = path.read_text().startswith("# UNLOCKED")
    return {
        "path": str(path),
        "sha256": None if unlocked else file_digest(path),
        "unlocked": unlocked,
        "installed_mismatches": installed_mismatches(pins(path)),
    }


# ---- making a lock: `python -m harness image lock --backend B` (nox -s lock) ----------------------------


def compile_argv(backend: Backend, output: Path, python: str | None = None) -> list[str]:
    """pip-compile of the backend's requirements (read from stdin) into `output`, hashes for every package.
    Indexes: pip's configuration, plus KILN_TORCH_INDEX_URL/<variant> when set (not for `torch_index` "index",
    see index_only_env); none are written out."""
    argv = [
        python or sys.executable,
        "-m",
        "piptools",
        "compile",
        "--generate-hashes",
        "--allow-unsafe",
        "--strip-extras",
        "--no-header",
        "--no-emit-index-url",
        "--no-emit-find-links",
        "--no-emit-trusted-host",
        "--quiet",
        "--output-file",
        str(output),
    ]
    torch_index = settings().torch_index_url
    if torch_index and backend.torch_index != "index":
        argv += ["--extra-index-url", f"{torch_index}/{backend.torch_variant}"]
    return [*argv, "-"]


def _pip_config(key: str, python: str) -> str:
    """pip's configured value of `key` (e.g. global.index-url), "" when unset or pip cannot say."""
    try:
        proc = subprocess.run(
            [python, "-m", "pip", "config", "get", key], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout.strip() if proc.returncode == 0 else ""


# pip's variables that add wheels besides the index: left out of an index-only resolution
_NOT_INDEX = ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT", "PIP_NO_INDEX")


def index_only_env(
    env: dict[str, str] | None = None, python: str | None = None, config: Any = None
) -> dict[str, str]:
    """The environment of an index-only resolution (`torch_index` "index"): pip reads no configuration file
    (PIP_CONFIG_FILE=os.devnull), the variables that add local wheel folders or other indexes are dropped, and
    the index URL and CA bundle that pip is configured with are kept as PIP_INDEX_URL/PIP_CERT (none: pip's
    default index). `config(key)` reads pip's configuration (default: `pip config get` under `python`)."""
    env = dict(os.environ if env is None else env)
    read = config or (lambda key: _pip_config(key, python or sys.executable))
    for var, key in (("PIP_INDEX_URL", "global.index-url"), ("PIP_CERT", "global.cert")):
        if not env.get(var):
            value = read(key)
            if value:
                env[var] = value
    for var in _NOT_INDEX:
        env.pop(var, None)
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def resolved_problems(backend: Backend, body: str) -> list[str]:
    """What is wrong with a resolved lock body for the backend: pins without hashes, a torch or triton other than
    the matrix's pins, and for a CUDA backend resolved from the index alone a torch with a local label (+cpu) or
    without its CUDA runtime wheels (nvidia-cuda-runtime)."""
    out = []
    unhashed = [
        ln.strip() for ln in body.splitlines() if _PIN.match(ln.strip()) and not ln.rstrip().endswith("\\")
    ]
    if unhashed:
        out.append(f"packages without hashes: {', '.join(unhashed[:3])}")
    got = pins_text(body)
    for spec in (backend.torch, backend.triton):
        name, _, version = spec.partition("==")
        have = got.get(normalize(name))
        if have is None or (
            have != version and not (backend.torch_index != "index" and have.startswith(version + "+"))
        ):
            out.append(f"{name} resolved as {have or 'nothing'}, the matrix pins {spec}")
    if backend.torch_index == "index" and backend.torch_variant.startswith("cu"):
        torch = got.get("torch", "")
        if "+" in torch:
            out.append(f"torch resolved as {torch}: a local build, not the index's CUDA wheel")
        if not any(name.startswith("nvidia-cuda-runtime") for name in got):
            out.append("no nvidia-cuda-runtime wheel: the torch resolved is not a CUDA build")
    return out


def header(backend: Backend, root: Path | None = None) -> str:
    return (
        f"# Lock of the {backend.name} image's Python packages, hashes included. Generated: do not edit;\n"
        f"# `nox -s lock -- --backend {backend.name}` makes it again (pip-compile --generate-hashes under\n"
        f"# Python {backend.python}, linux x86-64) from ci/matrix.json's pins and {REQUIREMENTS}\n"
        "# (`-r -` below). The image installs it with pip install --require-hashes --no-deps.\n"
        f"{INPUTS_LINE}{inputs_digest(backend, root)}\n"
    )


def write(backend: Backend, root: Path | None = None) -> LockState:
    """Resolve the backend's requirements with pip-compile under this Python and write its lock file."""
    root = root or settings().root
    want = backend.python
    have = f"{sys.version_info.major}.{sys.version_info.minor}"
    if have != want:
        raise ImageInputError(
            f"backend {backend.name}'s image runs Python {want}, this is Python {have}: run "
            f"`nox -s lock-{backend.name}` (a Python {want} session)"
        )
    try:
        import piptools  # noqa: F401
    except ImportError:
        raise MissingTool(
            "pip-tools is not installed in this Python: run `nox -s lock` "
            "(it installs pip-tools) or `pip install pip-tools`"
        ) from None
    path = lock_path(backend, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="lock-") as tmp:
        out = Path(tmp) / path.name
        if path.exists():  # pip-compile keeps the existing pins where they still fit
            out.write_text(path.read_text())
        text = "\n".join(requirement_lines(backend, root)) + "\n"
        print(
            f"harness image: resolving {backend.name}'s lock with pip-compile (Python {have})",
            file=sys.stderr,
        )
        env = index_only_env() if backend.torch_index == "index" else None
        with Heartbeat(
            f"pip-compile of the {backend.name} lock", heartbeat_interval(None)
        ):  # minutes, silent
            proc = subprocess.run(
                compile_argv(backend, out), input=text, capture_output=True, text=True, cwd=root, env=env
            )
        if proc.returncode != 0:
            tail = [ln for ln in proc.stderr.splitlines() if ln.strip() and "is ignored" not in ln][-4:]
            raise ImageError(
                f"pip-compile failed for {backend.name} (exit {proc.returncode}): {' | '.join(tail)}"
            )
        body = out.read_text()
    problems = resolved_problems(backend, body)
    if problems:
        raise ImageError(f"pip-compile's {backend.name} lock is not usable: {'; '.join(problems)}")
    torch = pins_text(body).get("torch", "")
    if backend.torch_index != "index" and torch and not torch.endswith(f"+{backend.torch_variant}"):
        print(
            f"harness image: warning: torch resolved as {torch}, without +{backend.torch_variant}: check that "
            f"KILN_TORCH_INDEX_URL/{backend.torch_variant} served it (PyPI's default build may be another variant)",
            file=sys.stderr,
        )
    atomic_write_text(path, header(backend, root) + body)
    return state(backend, root)
