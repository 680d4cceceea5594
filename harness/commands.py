"""Pure command builders for every harness step that starts a process: the suites' environment, the pytest
argv, `docker run` and native command lines. Nothing here runs anything, so each builder is tested alone and
the runner, repro lines, flakes and compile-check build the same commands.

Terms:
  inner command   the `python -m pytest ...` argv run inside the container or, with this machine's Python,
                  natively (`pytest_argv`); identical in both modes.
  container mode  `docker run --rm --init --network none` with the source tree mounted read-only at /src, the
                  output folder at /results, the backend's container options (GPU flags) and environment;
                  on a runner also as the runner's uid:gid (HOME in the container's /tmp), labelled with the
                  job (`kiln.job`, so the job's teardown finds its containers) and with the compile cache.
  native mode     the inner command with this machine's Python, from the source tree, same environment.
  GPU options     what a container gets of the host's GPUs (`GpuAccess`, made by harness.gpus from the
                  runner's visible set): NVIDIA `--gpus all` or `--gpus "device=1,3"` (the quotes are docker's:
                  it reads the value as CSV); AMD `/dev/kfd`, `/dev/dri` or the render nodes of the given GPUs,
                  and `--group-add` of the host's gids owning them (never a group name resolved in the image).
                  Inside, the given GPUs are renumbered from 0 (CUDA_/HIP_VISIBLE_DEVICES=0,...).
  compile cache   a per-runner host folder mounted at /cache for Triton's and kiln's kernel caches
                  (TRITON_CACHE_DIR, KILN_CACHE_DIR), one per trust scope and image (`compile_cache_dir`), so
                  a new toolchain never reads an old cache and a pull request never writes main's.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from harness.matrix import Backend, Matrix

CONTAINER_SRC = "/src"
CONTAINER_RESULTS = "/results"
CONTAINER_HOME = "/tmp/kiln-home"  # HOME of a container run as the runner's uid (no passwd entry there)
CONTAINER_CACHE = "/cache"
HOST_GPUS = "KILN_HOST_GPUS"  # in a container's env: the host GPU ids it was given, or `all`
RUN_MODE = "KILN_RUN_MODE"  # `container` in every container's env: part of the hardware class (store/runner.py)
JOB_LABEL = "kiln.job"
BACKEND_LABEL = "kiln.backend"


def suite_env(m: Matrix, b: Backend) -> dict[str, str]:
    """The environment every suite of backend `b` runs with: the matrix's suite_env, then the backend's."""
    return {**m.suite_env, **b.env}


def pytest_argv(targets: Sequence[str], *, junit: str | None = None, test_timeout_s: int | None = None,
                extra: Sequence[str] = ()) -> list[str]:
    """The inner command: one process (`-p no:xdist`), JUnit with file names (xunit1) and every test's exact
    node id (`-p harness.suites.flake_plugin`: the id quarantine and repro lines use), per-test timeout."""
    argv = ["python", "-m", "pytest", "-p", "no:xdist", "-p", "harness.suites.flake_plugin", "-o", "junit_family=xunit1",
            "--tb=short"]
    if junit:
        argv.append(f"--junitxml={junit}")
    if test_timeout_s:
        argv.append(f"--timeout={test_timeout_s}")
    return [*argv, *extra, *targets]


def container_argv(b: Backend, image: str, inner: Sequence[str], *, src: Path | str, env: dict[str, str],
                   results: Path | str | None = None, name: str | None = None, network: bool = False,
                   docker: str = "docker", user: str | None = None, cache: Path | str | None = None,
                   labels: Mapping[str, str] | None = None) -> list[str]:
    """`docker run` of `inner` in backend `b`'s image: source read-only, results mounted, no network.
    `user` (`uid:gid`): run as that user, HOME and XDG caches in the container's /tmp; `cache`: the host's
    compile-cache folder, mounted at /cache for Triton and kiln; `labels`: `--label k=v` (the job's)."""
    argv = [docker, "run", "--rm", "--init"]
    if name:
        argv += ["--name", name]
    for key in sorted(labels or {}):
        argv += ["--label", f"{key}={(labels or {})[key]}"]
    if user:
        argv += ["--user", user]
    if not network:
        argv += ["--network", "none"]
    argv += ["--volume", f"{src}:{CONTAINER_SRC}:ro"]
    if results is not None:
        argv += ["--volume", f"{results}:{CONTAINER_RESULTS}"]
    if cache is not None:
        argv += ["--volume", f"{cache}:{CONTAINER_CACHE}"]
    argv += ["--workdir", CONTAINER_SRC]
    env = {**(user_env() if user else {}), **(cache_env(CONTAINER_CACHE) if cache is not None else {}), **env,
           RUN_MODE: "container"}
    for key in sorted(env):
        argv += ["--env", f"{key}={env[key]}"]
    return [*argv, *b.container_options, image, *inner]


def user_env(home: str = CONTAINER_HOME) -> dict[str, str]:
    """A container run as a uid the image does not know: a writable HOME and caches, a user name (Python's
    getpass, Inductor's cache folder)."""
    return {"HOME": home, "XDG_CACHE_HOME": f"{home}/.cache", "USER": "kiln", "LOGNAME": "kiln"}


def cache_env(folder: str) -> dict[str, str]:
    """Triton's and kiln's kernel caches under `folder` (the compile cache, harness.commands docstring)."""
    return {"TRITON_CACHE_DIR": f"{folder}/triton", "KILN_CACHE_DIR": f"{folder}/kiln"}


def compile_cache_dir(root: Path | str, scope: str, key: str) -> Path:
    """The compile-cache folder of trust `scope` and toolchain `key` (an image tag `kiln-cuda:<inputs hash>`,
    or `native-torch<v>-triton<v>`) under the per-runner `root`."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "-", key)
    return Path(root) / re.sub(r"[^A-Za-z0-9_.-]", "-", scope or "local") / safe


# ---- GPU options ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuAccess:
    """What a container gets of the host's GPUs (module docstring): `vendor` nvidia/amd, the host GPU ids
    (None: every GPU), for AMD the render nodes of those GPUs and the host gids to add."""

    vendor: str
    devices: tuple[str, ...] | None
    render_nodes: tuple[str, ...] = ()
    groups: tuple[int, ...] = ()


def gpu_options(access: GpuAccess) -> tuple[list[str], dict[str, str]]:
    """(docker options, container environment) of `access`."""
    devices = None if access.devices is None else tuple(dict.fromkeys(access.devices))
    env = {HOST_GPUS: "all" if devices is None else ",".join(devices)}
    inside = None if devices is None else ",".join(str(k) for k in range(len(devices)))
    if access.vendor == "nvidia":
        if devices is None:
            return ["--gpus", "all"], env
        value = f"device={','.join(devices)}"
        return ["--gpus", f'"{value}"' if "," in value else value], {**env, "CUDA_VISIBLE_DEVICES": str(inside)}
    opts = ["--device=/dev/kfd"]
    opts += ["--device=/dev/dri"] if devices is None else [f"--device={n}" for n in access.render_nodes]
    for gid in access.groups:
        opts += ["--group-add", str(gid)]
    return opts, env if inside is None else {**env, "HIP_VISIBLE_DEVICES": inside}


def _gpu_device(path: str) -> bool:
    return path.startswith(("/dev/kfd", "/dev/dri", "/dev/nvidia"))


def without_gpu_options(options: Sequence[str]) -> list[str]:
    """`options` less what gives GPUs (`--gpus X`, `--device` of /dev/kfd, /dev/dri*, /dev/nvidia*, `--group-add`
    of video/render): the matrix's other options (shm size, seccomp) stay."""
    out, i = [], 0
    while i < len(options):
        opt = options[i]
        value = options[i + 1] if i + 1 < len(options) else ""
        flag, _, inline = opt.partition("=")
        if flag in ("--gpus", "--device", "--group-add"):
            given = inline if inline else value
            gpu = flag == "--gpus" or (flag == "--device" and _gpu_device(given)) or \
                (flag == "--group-add" and given in ("video", "render"))
            if gpu:
                i += 1 if inline else 2
                continue
        out.append(opt)
        i += 1
    return out


def with_gpus(b: Backend, access: GpuAccess) -> Backend:
    """Backend `b` with the GPU options of `access` in place of the matrix's, its env renumbered inside."""
    opts, env = gpu_options(access)
    return replace(b, container_options=(*opts, *without_gpu_options(b.container_options)), env={**b.env, **env})


def native_command(inner: Sequence[str], env: dict[str, str], *, src: Path,
                   python: str | None = None) -> tuple[list[str], dict[str, str]]:
    """(argv, full environment) that run `inner` with this machine's Python from the source tree."""
    argv = [python or sys.executable, *inner[1:]] if inner and inner[0] == "python" else list(inner)
    full = {**os.environ, **env}
    full["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), os.environ.get("PYTHONPATH", "")) if p)
    return argv, full


def native_shell_line(argv: Sequence[str], env: dict[str, str], src: Path) -> str:
    """A shell line for a native command: `cd SRC && env K=V ... argv`."""
    assigns = [f"{k}={env[k]}" for k in sorted(env)]
    return f"cd {shlex.quote(str(src))} && " + shlex.join(["env", *assigns, *argv])


def with_pythonpath(env: dict[str, str], root: Path | str) -> dict[str, str]:
    """`env` with `root` first on PYTHONPATH (so `harness` and `compiler` import from the source tree)."""
    out = dict(env)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), out.get("PYTHONPATH", "")) if p)
    return out

