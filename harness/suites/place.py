"""Where a run's processes run: natively, with this machine's Python, or in the backend's container.

The place is chosen once per run (`chosen`, the mode rule of `harness run` and `harness flakes`: `--native`, or
KILN_NATIVE=1 when the flag is not given, runs natively; else the container of the image `--image` names, or of
the one built for the backend) and carried in the run's Plan (harness.suites.steps) and a `--shards` run's state
(harness.suites.sharded). Every step that starts a process asks the place instead of testing a flag.

What a place answers (the protocol `Place`; `NativePlace` and `ContainerPlace` implement it):
  mode             `native` or `container`: the run folder's suffix, the record's `mode`, and the hardware class
                   the processes it starts report (KILN_RUN_MODE is `container` in every container's environment,
                   harness.commands.container_argv; unset natively): harness.store.runner never compares a
                   container's timings with native ones
  seen(folder)     where a host folder lands as the process sees it (natively itself; in a container /results)
  inherited()      the harness's environment that the processes inherit (natively all of it; in a container none)
  launch(...)      the command line of one process (from the source folder `src`, default the checkout), its
                   full environment and working folder, and the container to remove after it (harness.process.execute's `container`: its reaper removes it whatever
                   happens to the harness)
  test_timeout_s   pytest-timeout's per-test limit the place can honour (0 natively without pytest-timeout);
                   `per_test_timeout` records whether it can
  pin(b, devices)  the backend confined to GPU ids of the runner's visible set (natively the visible-devices
                   variable; in a container the GPU options, harness.gpus.pin)
  check_host()     what this host needs before anything is written (natively: pytest for this Python)
  preflight(...)   harness.checks.preflight's check of this place (docker and its disk in container mode)
  prepared(b)      the place ready to run backend `b`: natively this Python's torch sees a GPU of a GPU backend's
                   vendor; a container place with its image described or built
  cli_args/cli_env the `harness run` arguments and environment that give a shard process the same place
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import secrets
import subprocess
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from harness import gpus
from harness.commands import (
    BACKEND_LABEL,
    CONTAINER_RESULTS,
    JOB_LABEL,
    compile_cache_dir,
    container_argv,
    native_cache_env,
    native_command,
    scope_env,
)
from harness.exc import HarnessError, MissingTool, NoDeviceError
from harness.matrix import Backend
from harness.settings import settings

NATIVE, CONTAINER = "native", "container"


@dataclass(frozen=True)
class Launch:
    """One process as a place starts it: `argv`; `env` its whole environment (None: this process's, as for
    the docker client); `cwd` its working folder (None: this one); `container` the container to remove after it."""

    argv: list[str]
    env: dict[str, str] | None = None
    cwd: Path | None = None
    container: str | None = None


class Place(Protocol):
    """Where a run's processes run (module docstring)."""

    @property
    def mode(self) -> str: ...

    @property
    def python(self) -> str: ...

    @property
    def per_test_timeout(self) -> bool: ...

    @property
    def image(self) -> dict[str, Any] | None: ...

    def seen(self, folder: Path) -> str: ...

    def inherited(self) -> Mapping[str, str]: ...

    def launch(
        self,
        b: Backend,
        inner: Sequence[str],
        *,
        out_dir: Path,
        name: str,
        env: dict[str, str],
        src: Path | None = None,
    ) -> Launch: ...

    def test_timeout_s(self, b: Backend) -> int: ...

    def pin(self, b: Backend, devices: Sequence[str]) -> Backend: ...

    def check_host(self) -> None: ...

    def preflight(self, b: Backend, *, need_gpus: int = 1, results: Path | None = None) -> Any: ...

    def prepared(self, b: Backend) -> Place: ...

    def cli_args(self) -> list[str]: ...

    def cli_env(self) -> dict[str, str]: ...


def chosen(native: bool | None, image_tag: str | None = None, base_image: str | None = None) -> Place:
    """The place of a run asked for on the command line: natively with `--native` (None: KILN_NATIVE decides),
    else in the container of `image_tag` (None: the backend's hash-tagged image, built on `base_image`)."""
    if settings().native if native is None else native:
        return NativePlace()
    return ContainerPlace(image_tag, base_image)


# ---- natively -------------------------------------------------------------------------------------------


def pytest_timeout_available() -> bool:
    """Whether this Python has pytest-timeout (native mode only; images always have it)."""
    return importlib.util.find_spec("pytest_timeout") is not None


def check_native_python() -> bool:
    """Native mode needs pytest; without pytest-timeout per-test timeouts are off (warned, and False)."""
    if importlib.util.find_spec("pytest") is None:  # the suites need torch and triton too: name all it lacks
        lacks = ", ".join(m for m in ("pytest", "torch", "triton") if importlib.util.find_spec(m) is None)
        raise MissingTool(
            f"pytest is not installed for {sys.executable} (it lacks {lacks}); native mode runs the "
            "suites with this Python: drop KILN_NO_VENV (the sessions' shared venv .nox/kiln has them), "
            "or install the project into it (pip install -e '.[test]' with the matrix's torch and triton)"
        )
    if not pytest_timeout_available():
        warnings.warn(
            "pytest-timeout is not installed: per-test timeouts are off, only the suite timeout "
            "applies (pip install pytest-timeout)",
            stacklevel=3,
        )
        return False
    return True


def require_torch_gpu(b: Backend) -> None:
    """NoDeviceError unless this Python's torch is built for `b`'s GPU vendor (CUDA or ROCm) and sees a GPU."""
    probe = "import torch; print(int(torch.cuda.is_available()), int(bool(torch.version.hip)))"
    try:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
        available, hip = (int(x) for x in out.stdout.split())
    except (subprocess.SubprocessError, ValueError):
        raise NoDeviceError(f"backend {b.name}: could not import torch to look for a GPU") from None
    want_hip = gpus.vendor(b) == gpus.AMD
    if not available or bool(hip) != want_hip:
        kind = (
            "an AMD GPU with a ROCm build of torch"
            if want_hip
            else "an NVIDIA GPU with a CUDA build of torch"
        )
        raise NoDeviceError(
            f"backend {b.name} needs {kind}; none found on this machine "
            "(use --backend cpu for Triton's interpreter)"
        )


@dataclass(frozen=True)
class NativePlace:
    """This machine's Python, from the source tree, with this job's compile caches (harness.commands)."""

    mode = NATIVE

    @property
    def python(self) -> str:
        return sys.executable

    @property
    def per_test_timeout(self) -> bool:
        return pytest_timeout_available()

    @property
    def image(self) -> dict[str, Any] | None:
        return None

    def seen(self, folder: Path) -> str:
        return str(folder)

    def inherited(self) -> Mapping[str, str]:
        return os.environ

    def launch(
        self,
        b: Backend,
        inner: Sequence[str],
        *,
        out_dir: Path,
        name: str,
        env: dict[str, str],
        src: Path | None = None,
    ) -> Launch:
        src = src or settings().root
        argv, full_env = native_command(inner, {**native_cache_env(), **env}, src=src)
        return Launch(argv, full_env, src)

    def test_timeout_s(self, b: Backend) -> int:
        return b.timeouts.test_s if check_native_python() else 0

    def pin(self, b: Backend, devices: Sequence[str]) -> Backend:
        return gpus.pin_visible(b, devices)

    def check_host(self) -> None:
        check_native_python()

    def preflight(self, b: Backend, *, need_gpus: int = 1, results: Path | None = None) -> Any:
        from harness.checks import preflight

        return preflight.check(b, docker=False, need_gpus=need_gpus, results=results)

    def prepared(self, b: Backend) -> NativePlace:
        """This place, once a GPU backend's torch here sees a GPU of its vendor (`require_torch_gpu`)."""
        if gpus.vendor(b) is not None:
            require_torch_gpu(b)
        return self

    def cli_args(self) -> list[str]:
        return ["--native"]

    def cli_env(self) -> dict[str, str]:
        return {"KILN_NATIVE": "1"}


# ---- in a container -------------------------------------------------------------------------------------


def container_name(backend: str, name: str) -> str:
    """A fresh container name for one process: the backend, the process's name, a random suffix."""
    safe = re.sub(r"[^a-zA-Z0-9_.-]", "-", name)[:40]
    return f"kiln-{backend}-{safe}-{secrets.token_hex(4)}"


def container_backend(b: Backend, env: dict[str, str]) -> tuple[Backend, dict[str, str]]:
    """(backend, env) of a container run: a GPU backend not yet confined to its GPUs (harness.gpus.pin: shards
    and `run` pin theirs) gets the runner's visible set, its renumbered variables added to `env`."""
    if gpus.vendor(b) is None or gpus.pinned(b):
        return b, env
    pinned = gpus.pin(b)
    return pinned, {**env, **{k: v for k, v in pinned.env.items() if k not in b.env}}


def container_extras(b: Backend, image: str | None) -> dict[str, Any]:
    """container_argv's runner options: the docker client, the runner's uid:gid (KILN_CONTAINER_USER), the
    job's labels, the compile-cache folder of this trust scope and image (made here, owned by the runner), the
    scope's variables and, for main's jobs only, the cache key (harness/trust.py)."""
    from harness.images.cleanup import mark_used

    s = settings()
    labels = {BACKEND_LABEL: b.name, **({JOB_LABEL: s.job_id} if s.job_id else {})}
    if image:
        mark_used(image)  # `harness cleanup` keeps an image a run started a container from lately
    cache = None
    if s.compile_cache is not None and image:
        cache = compile_cache_dir(s.compile_cache, s.cache_scope, toolchain_key(image))
        cache.mkdir(parents=True, exist_ok=True)
    holds_key = s.cache_scope in ("main", "local")  # harness.trust.Trust.holds_key
    key_file = os.environ.get("KILN_CACHE_KEY_FILE", "").strip() if holds_key else ""
    key_env = holds_key and bool(os.environ.get("KILN_CACHE_KEY", "").strip())
    return {
        "docker": s.docker,
        "user": s.container_user,
        "labels": labels,
        "cache": cache,
        "scope_vars": scope_env(s.cache_scope),
        "key_file": Path(key_file).expanduser() if key_file else None,
        "key_env": key_env,
    }


HASH_TAG = re.compile(r":[0-9a-f]{16}$")  # harness.images.image's tags: the hash of the image's inputs


@functools.lru_cache(maxsize=32)
def toolchain_key(image: str) -> str:
    """The compile cache's key of `image`: its tag when it is a hash tag (`kiln-cuda:<inputs hash>`: torch,
    triton, the lock), else the tag and its local image id (`--image kiln-cuda:dev` rebuilt is another key)."""
    if HASH_TAG.search(image):
        return image
    from harness.images.image import image_id

    try:
        found = image_id(image)
    except (OSError, HarnessError):
        found = None
    return f"{image}-{found.split(':')[-1][:16]}" if found else image


@dataclass(frozen=True)
class ContainerPlace:
    """The backend's image under `docker run` (harness.commands.container_argv): `image_tag` the image (None
    until `prepared`: the backend's hash-tagged one), `base_image` the base it is built on, `info` its record
    (harness.images.image.Image.record) once prepared."""

    image_tag: str | None = None
    base_image: str | None = None
    info: dict[str, Any] | None = None

    mode = CONTAINER

    @property
    def python(self) -> str:
        return "python"

    @property
    def per_test_timeout(self) -> bool:
        return True  # the images always carry pytest-timeout

    @property
    def image(self) -> dict[str, Any] | None:
        return self.info

    def seen(self, folder: Path) -> str:
        return CONTAINER_RESULTS

    def inherited(self) -> Mapping[str, str]:
        return {}  # a container starts from the image's environment, not the harness's

    def launch(
        self,
        b: Backend,
        inner: Sequence[str],
        *,
        out_dir: Path,
        name: str,
        env: dict[str, str],
        src: Path | None = None,
    ) -> Launch:
        if not self.image_tag:
            raise HarnessError(
                "container mode needs an image tag (build one with `python -m harness image build`)"
            )
        container = container_name(b.name, name)
        cb, cenv = container_backend(b, env)
        argv = container_argv(
            cb,
            self.image_tag,
            inner,
            src=src or settings().root,
            env=cenv,
            results=out_dir,
            name=container,
            **container_extras(b, self.image_tag),
        )
        return Launch(argv, container=container)

    def test_timeout_s(self, b: Backend) -> int:
        return b.timeouts.test_s

    def pin(self, b: Backend, devices: Sequence[str]) -> Backend:
        return gpus.pin(b, devices)

    def check_host(self) -> None:
        return None  # docker and the devices are the pre-flight's and `prepared`'s

    def preflight(self, b: Backend, *, need_gpus: int = 1, results: Path | None = None) -> Any:
        from harness.checks import preflight

        return preflight.check(
            b,
            docker=True,
            need_gpus=need_gpus,
            results=results,
            present=lambda backend: preflight.image_present(backend, self.image_tag, self.base_image),
        )

    def prepared(self, b: Backend) -> ContainerPlace:
        """Devices and docker present, then the given image described or the backend's built (once)."""
        from harness.checks import health
        from harness.images import image as image_mod

        health.require_host_devices(b)
        info = image_mod.ready(b, self.image_tag, self.base_image)
        return ContainerPlace(info["tag"], info.get("base", self.base_image), info)

    def cli_args(self) -> list[str]:
        """`--image TAG` once the image is known (`prepared`), and its `--base-image`; none before."""
        if not self.image_tag:
            return []
        return ["--image", self.image_tag, *(["--base-image", self.base_image] if self.base_image else [])]

    def cli_env(self) -> dict[str, str]:
        return {"KILN_NATIVE": "0"}
