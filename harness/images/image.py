"""Backend images: tagged by the hash of what goes into them, rebuilt only when that hash changes.

Terms:
  inputs     everything that determines an image: the Dockerfile, the build args (base image reference,
             `tag@sha256:...` when the matrix pins its digest; torch and triton pins), the base's local image
             id when it is not pinned by digest (a bootstrapped or tag-only base), the lock file
             (docker/lock/<backend>.txt, harness/images/lock.py), docker/requirements-test.txt and the project
             metadata (pyproject.toml's [project] table). Their sha256 (first 16 hex digits) is the image tag.
  base image the FROM image: the matrix's `base_image` tag, pinned by `base_digest` when set (`image --pin`
             fills it where the registry is reachable; a build on an unpinned tag warns "base image not
             pinned by digest"). When it is neither present locally nor pullable (no registry reachable)
             and the backend has a `bootstrap` entry, it is made with `debootstrap` + `docker import`.
  lock       the image's Python packages, each with its hashes; installed with `--require-hashes --no-deps`.
             A backend without a lock does not build unless KILN_ALLOW_UNLOCKED=1 (then loudly unlocked).
  labels     kiln.inputs-hash, kiln.base-image, kiln.base-digest, kiln.base-id, kiln.lock-sha256: what
             `image --check` (harness/images/image_check.py) compares with the matrix and the tree.
  scope      an image a job of trust scope branch, pr or fork builds or bootstraps is named with the scope
             (`kiln-cpu-pr:<hash>`, harness.trust.scoped_image): never a name main reuses. Any scope runs main's
             image of the same inputs hash when it is there (same inputs, same image).
The `python -m harness image` command line lives in harness/images/image_check.py (it uses both modules).
  wheelhouse a folder of wheels the harness downloads with the host's pip (which reaches this
             machine's wheel cache) and hands to the build as `wheels/`, so the build needs no index.
  context    .kiln/build/<backend>/: Dockerfile, requirements-test.txt, lock.txt, wheels/.
  logs       debootstrap-<backend>.log, wheelhouse-<backend>.log, build-<backend>.log in settings().logs_dir
             (<results>/logs: the workflows upload results/); each step prints a progress line every 30 s while
             it runs (harness.process.Heartbeat), and a failure quotes the log's last lines.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import trust
from harness.docker_client import docker, docker_base, require_docker  # noqa: F401  (image.docker: the one client)
from harness.exc import HarnessError, ImageError, ImageInputError, MissingTool
from harness.images import lock as lock_mod
from harness.matrix import Backend
from harness.process import execute
from harness.settings import settings

REQUIREMENTS = "docker/requirements-test.txt"
HASH_LEN = 16


def image_id(ref: str) -> str | None:
    """The local image id of `ref` (sha256:...), or None when it is not present locally."""
    proc = docker("image", "inspect", "--format", "{{.Id}}", ref, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else None


# ---- hash tag ------------------------------------------------------------------------------------------


def _project_metadata(root: Path) -> str:
    """pyproject.toml's [project] table as canonical JSON (the whole file when tomllib is missing)."""
    path = root / "pyproject.toml"
    if not path.exists():
        return ""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        return path.read_text()
    project = tomllib.loads(path.read_text()).get("project", {})
    return json.dumps(project, sort_keys=True)


def image_inputs(
    backend: Backend, base_image: str | None = None, root: Path | None = None, base_id: str | None = None
) -> dict[str, str]:
    """Everything that determines the image, as name -> text, in a fixed order. `base_id`: the base's local
    image id, for a base not pinned by digest (see base_id_for_hash)."""
    root = root or settings().root
    dockerfile = root / backend.dockerfile
    for path in (dockerfile, root / REQUIREMENTS):
        if not path.exists():
            raise ImageInputError(f"{path} not found (backend {backend.name})")
    lock = lock_mod.lock_path(backend, root)
    inputs = {
        "dockerfile": dockerfile.read_text(),
        "build_args": json.dumps(backend.build_args(base_image), sort_keys=True),
        "lock": lock.read_text() if lock.exists() else lock_mod.unlocked_text(backend, root),
        "requirements": (root / REQUIREMENTS).read_text(),
        "project": _project_metadata(root),
    }
    if base_id:
        inputs["base_id"] = base_id
    return inputs


def image_tag(
    backend: Backend, base_image: str | None = None, root: Path | None = None, base_id: str | None = None
) -> str:
    """`<image>:<hash>` for the backend, e.g. `kiln-cpu:3f2a...`."""
    h = hashlib.sha256()
    for name, text in image_inputs(backend, base_image, root, base_id).items():
        h.update(name.encode() + b"\0" + text.encode() + b"\0")
    return f"{backend.image}:{h.hexdigest()[:HASH_LEN]}"


def digest_pinned(backend: Backend, base: str) -> bool:
    """True when `base` is the matrix's base pinned by digest (the digest then names its content)."""
    return bool(backend.base_digest) and base == backend.base_ref


def unpinned_warning(backend: Backend, base: str) -> str | None:
    """ "base image not pinned by digest" when the build would take a registry tag as it is today."""
    if digest_pinned(backend, base) or "@sha256:" in base:
        return None
    if backend.bootstrap is not None and base == backend.bootstrap.image:
        return None  # made here by debootstrap: recorded by its local id (kiln.base-id), not by a registry digest
    return (
        f"base image not pinned by digest: {base} (set base_digest for {backend.name} in ci/matrix.json "
        f"with `python -m harness image --pin --backend {backend.name}` where the registry is reachable)"
    )


def base_id_for_hash(backend: Backend, base: str) -> str | None:
    """The base's local image id when it goes into the hash: any base not pinned by digest (its name alone
    does not say what it holds); None for a digest-pinned base or one not present locally."""
    return None if digest_pinned(backend, base) else image_id(base)


# ---- base image ----------------------------------------------------------------------------------------


APT_DIR = Path("/etc/apt")


def _apt_entries(apt_dir: Path) -> list[tuple[str, list[str]]]:
    """(URI, suites) of every `deb` source apt is configured with: one-line `*.list` files and deb822
    `*.sources` stanzas, in apt's reading order."""
    out: list[tuple[str, list[str]]] = []
    files = [apt_dir / "sources.list"] + sorted((apt_dir / "sources.list.d").glob("*.list"))
    for f in files:
        if not f.is_file():
            continue
        for line in f.read_text(errors="replace").splitlines():
            words = [w for w in line.split("#", 1)[0].split() if w]
            if words and words[0] == "deb":
                words = words[1:]
                if words and words[0].startswith("["):  # options: [arch=amd64 signed-by=...]
                    while words and not words[0].endswith("]"):
                        words = words[1:]
                    words = words[1:]
                if len(words) >= 2:
                    out.append((words[0], [words[1]]))
    for f in sorted((apt_dir / "sources.list.d").glob("*.sources")):
        for stanza in re.split(r"\n\s*\n", f.read_text(errors="replace")):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if ":" in line and not line.startswith(("#", " ")):
                    key, value = line.split(":", 1)
                    fields[key.strip().lower()] = value.strip()
            if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes").lower() != "no":
                for uri in fields.get("uris", "").split():
                    out.append((uri, fields.get("suites", "").split()))
    return out


def debian_mirror(suite: str, apt_dir: Path = APT_DIR) -> str:
    """The Debian mirror for `suite`: KILN_DEBIAN_MIRROR, else the first apt source serving that suite."""
    configured = settings().debian_mirror
    if configured:
        return configured
    for uri, suites in _apt_entries(apt_dir):
        if suite in suites:
            return uri
    raise ImageError(
        f"no Debian mirror for {suite}: set KILN_DEBIAN_MIRROR=URL, or configure an apt source "
        f"for {suite} under {apt_dir}"
    )


def bootstrap_argv(backend: Backend, rootfs: Path, mirror: str) -> list[str]:
    """The debootstrap command that makes the backend's base root file system in `rootfs`."""
    b = backend.bootstrap
    if b is None:
        raise ImageInputError(f"backend {backend.name} has no bootstrap entry in the matrix")
    return [find_tool("debootstrap") or "debootstrap", f"--variant={b.variant}", b.suite, str(rootfs), mirror]


SBIN = (
    "/usr/local/sbin",
    "/usr/sbin",
    "/sbin",
)  # where Debian puts root's tools; a user's PATH often lacks them


def find_tool(name: str) -> str | None:
    """The program `name` on PATH, else in the sbin folders (SBIN); None when neither has it."""
    return shutil.which(name) or shutil.which(name, path=os.pathsep.join(SBIN))


def bootstrap_base(backend: Backend, *, force: bool = False) -> str:
    """Make the base image with debootstrap + `docker import` unless it exists; return its name."""
    b = backend.bootstrap
    if b is None:
        raise ImageInputError(f"backend {backend.name} has no bootstrap entry in the matrix")
    name = trust.scoped_image(b.image, settings().cache_scope)  # an untrusted job never makes main's base
    for have in dict.fromkeys(
        (b.image, name)
    ):  # main's base serves every scope (one lookup when they are one)
        if not force and image_id(have):
            return have
    if find_tool("debootstrap") is None:
        raise MissingTool(
            f"debootstrap not found on PATH nor in {', '.join(SBIN)}: install it (apt-get install "
            "debootstrap) to bootstrap "
            f"{b.image}, or provide a base image with --base-image"
        )
    if os.geteuid() != 0:
        raise ImageError("debootstrap needs root to bootstrap the base image")
    mirror = debian_mirror(b.suite)
    state = settings().state_dir
    state.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bootstrap-", dir=state) as tmp:
        rootfs = Path(tmp) / "rootfs"
        log = log_path("debootstrap", backend)
        print(
            f"harness image: bootstrapping {b.image} ({b.suite}/{b.variant} from {mirror}); log {log}",
            file=sys.stderr,
        )
        rc, _ = execute(
            bootstrap_argv(backend, rootfs, mirror),
            log=log,
            timeout_s=None,
            echo=False,
            step=f"debootstrap of {b.image}",
        )
        if rc != 0:
            raise ImageError(f"debootstrap failed (exit {rc}): {' | '.join(log_tail(log, 3))} (log {log})")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imp = subprocess.run(
            [*docker_base(), "import", "-", name], stdin=tar.stdout, capture_output=True, text=True
        )
        assert tar.stdout is not None
        tar.stdout.close()
        if tar.wait() != 0 or imp.returncode != 0:
            raise ImageError(f"docker import of the bootstrapped root failed: {imp.stderr.strip()}")
    return name


def resolve_base(backend: Backend, base_image: str | None = None, *, bootstrap: bool | None = None) -> str:
    """The base image to build on: the given one, else the pinned one when present or pullable, else
    the bootstrapped one (KILN_BOOTSTRAP=1 / bootstrap=True skips the pull attempt)."""
    if base_image:
        return base_image
    bootstrap = settings().bootstrap if bootstrap is None else bootstrap
    if backend.bootstrap is not None and image_id(backend.bootstrap.image):
        return backend.bootstrap.image
    if not bootstrap:
        ref = backend.base_ref  # tag@sha256:... when pinned: the pull gets exactly that content
        if image_id(ref):
            return ref
        pulled = docker("pull", ref, check=False, timeout=600)
        if pulled.returncode == 0:
            return ref
        if backend.bootstrap is None:
            raise ImageError(
                f"cannot pull base image {ref} and backend {backend.name} has "
                "no bootstrap entry; pass --base-image"
            )
        print(f"harness image: cannot pull {ref}; bootstrapping a base instead", file=sys.stderr)
    return bootstrap_base(backend)


# ---- build ---------------------------------------------------------------------------------------------


def log_path(what: str, backend: Backend) -> Path:
    """`<logs>/<what>-<backend>.log` (settings().logs_dir: <results>/logs), its folder made."""
    logs = settings().logs_dir
    logs.mkdir(parents=True, exist_ok=True)
    return logs / f"{what}-{backend.name}.log"


def log_tail(log: Path, n: int) -> list[str]:
    """The last `n` non-empty lines of a log ([] when unreadable)."""
    try:
        return [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-n:]
    except OSError:
        return []


def wheelhouse_argv(backend: Backend, dest: Path, root: Path) -> list[str]:
    """`pip download` for the image's Python into `dest`: the lock's files, hashes checked (no lock: the pins)."""
    major_minor = backend.python.replace(".", "")
    lock = lock_mod.lock_path(backend, root)
    what = (
        ["--require-hashes", "--no-deps", "-r", str(lock)]
        if lock.exists()
        else [backend.torch, backend.triton, "-r", str(root / REQUIREMENTS)]
    )
    return [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--progress-bar",
        "off",
        "--dest",
        str(dest),
        "--only-binary=:all:",
        "--python-version",
        backend.python,
        "--implementation",
        "cp",
        "--abi",
        f"cp{major_minor}",
        *platform_args(),
        *what,
    ]


GLIBC = (2, 36)  # the images' C library (Debian bookworm): wheels for any older manylinux run on it


def platform_args(glibc: tuple[int, int] = GLIBC) -> list[str]:
    """pip's `--platform` list for the images: every manylinux_2_N from the image's glibc down to 2_5 (the
    CUDA runtime wheels are tagged 2_18, 2_25, 2_27...), the legacy aliases and plain linux."""
    tags = [f"manylinux_{glibc[0]}_{n}_x86_64" for n in range(glibc[1], 4, -1)]
    tags += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]
    return [arg for tag in tags for arg in ("--platform", tag)]


def prepare_context(backend: Backend, root: Path | None = None) -> Path:
    """Fill .kiln/build/<backend>/ with the Dockerfile, requirements and wheels/; return the folder."""
    root = root or settings().root
    state = settings().state_dir
    ctx = state / "build" / backend.name
    if ctx.exists():
        shutil.rmtree(ctx)
    (ctx / "wheels").mkdir(parents=True)
    shutil.copy2(root / backend.dockerfile, ctx / "Dockerfile")
    shutil.copy2(root / REQUIREMENTS, ctx / "requirements-test.txt")
    lock = lock_mod.lock_path(backend, root)
    (ctx / "lock.txt").write_text(
        lock.read_text() if lock.exists() else lock_mod.unlocked_text(backend, root)
    )
    if backend.wheelhouse:
        cache = state / "wheels" / f"{backend.name}-py{backend.python}"  # per backend: only its wheels in ctx
        cache.mkdir(parents=True, exist_ok=True)
        log = log_path("wheelhouse", backend)
        print(
            f"harness image: downloading wheels for {backend.name} into {cache}; log {log}", file=sys.stderr
        )
        rc, _ = execute(
            wheelhouse_argv(backend, cache, root),
            log=log,
            timeout_s=None,
            echo=False,
            step=f"wheel download for {backend.name}",
        )
        if rc != 0:
            lines = log_tail(log, 40)
            errors = [ln for ln in lines if "ERROR" in ln] or lines[-2:]
            raise ImageError(f"pip download of the wheelhouse failed: {' '.join(errors)} (log {log})")
        for whl in sorted(cache.glob("*.whl")):
            try:
                os.link(whl, ctx / "wheels" / whl.name)
            except OSError:
                shutil.copy2(whl, ctx / "wheels" / whl.name)
    return ctx


LOCKED_PIP_ARGS = "--require-hashes --no-deps"  # the Dockerfiles' PIP_LOCK_ARGS default


def image_labels(
    backend: Backend, tag: str, base_image: str, base_id: str | None = None, root: Path | None = None
) -> dict[str, str]:
    """The labels that tie a built image to the matrix and the tree (read back by `image --check`)."""
    lock = lock_mod.state(backend, root)
    return {
        "kiln.backend": backend.name,
        "kiln.inputs-hash": tag.split(":")[-1],
        "kiln.base-image": base_image,
        "kiln.base-digest": (backend.base_digest or "") if digest_pinned(backend, base_image) else "",
        "kiln.base-id": base_id or "",
        "kiln.lock-sha256": lock.digest or "none",
    }


def build_argv(
    backend: Backend,
    tag: str,
    ctx: Path,
    base_image: str,
    *,
    base_id: str | None = None,
    root: Path | None = None,
) -> list[str]:
    """The `docker build` command for the backend's image: labels, then the build args."""
    argv = [*docker_base(), "build", "--progress=plain", "--tag", tag]
    for key, value in image_labels(backend, tag, base_image, base_id, root).items():
        argv += ["--label", f"{key}={value}"]
    locked = lock_mod.lock_path(backend, root).exists()
    for key, value in {
        **backend.build_args(base_image),
        "PIP_INDEX_ARGS": backend.index_args(),
        "PIP_LOCK_ARGS": LOCKED_PIP_ARGS if locked else "",
    }.items():
        argv += ["--build-arg", f"{key}={value}"]
    return [*argv, str(ctx)]


@dataclass(frozen=True)
class Image:
    """A built image: its hash tag, local id and whether this call built it."""

    tag: str
    id: str
    built: bool
    base_image: str
    base_digest: str | None = None
    base_id: str | None = None
    lock_sha256: str | None = None

    def record(self) -> dict[str, Any]:
        """The image's entry of run.json and the environment record."""
        return {
            "tag": self.tag,
            "id": self.id,
            "base": self.base_image,
            "built": self.built,
            "base_digest": self.base_digest,
            "base_id": self.base_id,
            "lock_sha256": self.lock_sha256,
        }


def labels(ref: str) -> dict[str, str]:
    """The labels of a local image ({} when it has none or is absent)."""
    proc = docker("image", "inspect", "--format", "{{json .Config.Labels}}", ref, check=False)
    if proc.returncode != 0:
        return {}
    try:
        return json.loads(proc.stdout.strip() or "null") or {}
    except json.JSONDecodeError:
        return {}


def describe(tag: str, base_image: str | None = None) -> dict[str, Any] | None:
    """The record of an existing local image (run --image TAG), from its labels; None when absent."""
    img_id = image_id(tag)
    if not img_id:
        return None
    lab = labels(tag)
    return Image(
        tag,
        img_id,
        False,
        base_image or lab.get("kiln.base-image", ""),
        lab.get("kiln.base-digest") or None,
        lab.get("kiln.base-id") or None,
        lab.get("kiln.lock-sha256") or None,
    ).record()


def ready(backend: Backend, tag: str | None, base_image: str | None) -> dict[str, Any]:
    """Container mode's image, once docker answers: `tag` described from its labels (it must be present locally),
    else the backend's hash-tagged image, built when missing. Its record (`Image.record`); the runs and the
    shards' parent use it."""
    require_docker()
    if tag:
        info = describe(tag, base_image)
        if not info:
            raise HarnessError(f"image {tag} is not present locally")
        return info
    return build(backend, base_image=base_image).record()


def require_lock(backend: Backend, allow_unlocked: bool | None = None) -> lock_mod.LockState:
    """The backend's lock; a missing or stale one stops the build unless unlocked builds are allowed
    (KILN_ALLOW_UNLOCKED=1), which then says so on stderr."""
    state = lock_mod.state(backend)
    problem = state.problem()
    if problem:
        allow = settings().allow_unlocked if allow_unlocked is None else allow_unlocked
        if not allow:
            raise ImageInputError(f"{problem} (or set KILN_ALLOW_UNLOCKED=1 to build without a current lock)")
        print(
            f"harness image: warning: {problem}; building anyway (KILN_ALLOW_UNLOCKED=1)"
            + ("" if state.exists else ": packages are NOT hash-checked"),
            file=sys.stderr,
        )
    return state


def build(
    backend: Backend,
    *,
    base_image: str | None = None,
    force: bool = False,
    bootstrap: bool | None = None,
    allow_unlocked: bool | None = None,
) -> Image:
    """Make sure the backend's image exists locally, building it only when its hash tag is absent."""
    require_docker()
    lock = require_lock(backend, allow_unlocked)
    base = resolve_base(backend, base_image, bootstrap=bootstrap)
    warning = unpinned_warning(backend, base)
    if warning:
        print(f"harness image: warning: {warning}", file=sys.stderr)
    base_id = base_id_for_hash(backend, base)
    tag = image_tag(backend, base, base_id=base_id)
    digest = backend.base_digest if digest_pinned(backend, base) else None
    existing = image_id(tag)  # main's image of these inputs: any scope may run it (same inputs, same image)
    own = trust.scoped_image(tag, settings().cache_scope)  # what this scope tags an image it builds
    if own != tag and not (existing and not force):
        tag, existing = own, image_id(own)
    if existing and not force:
        print(f"harness image: {tag} is up to date", file=sys.stderr)
        return Image(tag, existing, False, base, digest, base_id, lock.digest)
    ctx = prepare_context(backend)
    log = log_path("build", backend)
    print(f"harness image: building {tag} on {base}; log {log}", file=sys.stderr)
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    rc, _ = execute(
        build_argv(backend, tag, ctx, base, base_id=base_id),
        log=log,
        timeout_s=None,
        env=env,
        echo=False,
        step=f"image build {tag}",
    )
    if rc != 0:
        raise ImageError(
            f"docker build of {tag} failed (exit {rc}); last lines of {log}:\n  "
            + "\n  ".join(log_tail(log, 15))
        )
    shutil.rmtree(ctx / "wheels", ignore_errors=True)
    new_id = image_id(tag)
    if not new_id:
        raise ImageError(f"docker build reported success but {tag} is not present")
    return Image(tag, new_id, True, base, digest, base_id, lock.digest)


def local_base(backend: Backend) -> str:
    """The base `build` would take now without pulling or bootstrapping: the bootstrapped one when it exists
    locally, else the matrix's (tag@digest when pinned)."""
    if backend.bootstrap is not None and image_id(backend.bootstrap.image):
        return backend.bootstrap.image
    return backend.base_ref


def current_tag(backend: Backend, base_image: str | None = None, root: Path | None = None) -> str:
    """The tag `build` would use now for the tree at `root` (default: this checkout), without building: the
    bootstrapped base when it exists locally."""
    base = base_image or local_base(backend)
    return image_tag(backend, base, root=root, base_id=base_id_for_hash(backend, base))
