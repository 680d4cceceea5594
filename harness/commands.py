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
  compile cache   a per-runner host folder mounted at /cache for every lasting compiler cache (`cache_env`:
                  Triton's, kiln's kernels and binary index, kiln's graph and front caches, the autotune
                  choices, Inductor's), one per trust scope (harness/trust.py) and image (`compile_cache_dir`),
                  so a new toolchain never reads an old cache and a pull request never writes main's. Main's
                  jobs also get KILN_CACHE_AUTH=1 (entries must carry the runner key's HMAC) and the key; no
                  other scope is handed the key (`scope_env`, `native_command`).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from harness import trust
from harness.matrix import Backend, Matrix
from harness.trust import KEY_VARIABLES

CONTAINER_SRC = "/src"
CONTAINER_RESULTS = "/results"
CONTAINER_HOME = "/tmp/kiln-home"  # HOME of a container run as the runner's uid (no passwd entry there)
CONTAINER_CACHE = "/cache"
CONTAINER_KEY_FILE = "/run/kiln-cache.key"
HOST_GPUS = "KILN_HOST_GPUS"  # in a container's env: the host GPU ids it was given, or `all`
RUN_MODE = (
    "KILN_RUN_MODE"  # `container` in every container's env: part of the hardware class (store/runner.py)
)
JOB_LABEL = "kiln.job"
BACKEND_LABEL = "kiln.backend"


def suite_env(m: Matrix, b: Backend) -> dict[str, str]:
    """The environment every suite of backend `b` runs with: the matrix's suite_env, then the backend's."""
    return {**m.suite_env, **b.env}


def pytest_argv(
    targets: Sequence[str],
    *,
    junit: str | None = None,
    test_timeout_s: float | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The inner command: one process (`-p no:xdist`), JUnit with file names (xunit1) and every test's exact
    node id (`-p harness.suites.flake_plugin`: the id quarantine and repro lines use), per-test timeout."""
    argv = [
        "python",
        "-m",
        "pytest",
        "-p",
        "no:xdist",
        "-p",
        "harness.suites.flake_plugin",
        "-o",
        "junit_family=xunit1",
        "--tb=short",
    ]
    if junit:
        argv.append(f"--junitxml={junit}")
    if test_timeout_s:
        argv.append(f"--timeout={test_timeout_s}")
    return [*argv, *extra, *targets]


def container_argv(
    b: Backend,
    image: str,
    inner: Sequence[str],
    *,
    src: Path | str,
    env: dict[str, str],
    results: Path | str | None = None,
    name: str | None = None,
    network: bool = False,
    docker: str = "docker",
    user: str | None = None,
    cache: Path | str | None = None,
    labels: Mapping[str, str] | None = None,
    scope_vars: Mapping[str, str] | None = None,
    key_file: Path | str | None = None,
    key_env: bool = False,
) -> list[str]:
    """`docker run` of `inner` in backend `b`'s image: source read-only, results mounted, no network.
    `user` (`uid:gid`): run as that user, HOME and XDG caches in the container's /tmp; `cache`: the host's
    compile-cache folder, mounted at /cache for every compiler cache; `labels`: `--label k=v` (the job's);
    `scope_vars`: the trust scope's (`scope_env`); main's cache key as `key_file` (mounted read-only) or
    `key_env` (`--env KILN_CACHE_KEY` by name: docker copies its value from its own environment, so the
    secret is never on a command line)."""
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
    if key_file is not None:
        argv += ["--volume", f"{key_file}:{CONTAINER_KEY_FILE}:ro"]
    argv += ["--workdir", CONTAINER_SRC]
    env = {
        **(user_env() if user else {}),
        **(cache_env(CONTAINER_CACHE) if cache is not None else {}),
        **key_free(env, "other"),
        **(scope_vars or {}),
        RUN_MODE: "container",
    }
    if key_file is not None:
        env["KILN_CACHE_KEY_FILE"] = CONTAINER_KEY_FILE
    for key in sorted(env):
        argv += ["--env", f"{key}={env[key]}"]
    if key_env:
        argv += ["--env", "KILN_CACHE_KEY"]
    return [*argv, *b.container_options, image, *inner]


def user_env(home: str = CONTAINER_HOME) -> dict[str, str]:
    """A container run as a uid the image does not know: a writable HOME and caches, a user name (Python's
    getpass, Inductor's cache folder)."""
    return {"HOME": home, "XDG_CACHE_HOME": f"{home}/.cache", "USER": "kiln", "LOGNAME": "kiln"}


def cache_env(folder: str) -> dict[str, str]:
    """Every lasting compiler cache under `folder` (the compile cache, harness.commands docstring): Triton's,
    kiln's kernels (and binary index, kept in KILN_CACHE_DIR), kiln's graph and front caches, the autotune
    choices and Inductor's."""
    return {
        "TRITON_CACHE_DIR": f"{folder}/triton",
        "KILN_CACHE_DIR": f"{folder}/kiln",
        "KILN_GRAPH_CACHE_DIR": f"{folder}/graphs",
        "KILN_AUTOTUNE_DIR": f"{folder}/autotune",
        "TORCHINDUCTOR_CACHE_DIR": f"{folder}/inductor",
    }


def scope_env(scope: str) -> dict[str, str]:
    """What the trust `scope` adds to a suite's environment: main's jobs authenticate their cache entries
    (KILN_CACHE_AUTH=1; without KILN_CACHE_KEY or KILN_CACHE_KEY_FILE they then load none)."""
    return {"KILN_CACHE_AUTH": "1"} if scope == "main" else {}


def key_free(env: Mapping[str, str], scope: str) -> dict[str, str]:
    """`env` less the cache key, for every scope but main and local (harness/trust.py: Trust.holds_key)."""
    if scope in ("main", "local"):
        return dict(env)
    return {k: v for k, v in env.items() if k not in KEY_VARIABLES}


def native_cache_env() -> dict[str, str]:
    """Natively: every lasting compiler cache (`cache_env`) in the compile-cache folder of this job's trust scope
    and toolchain (torch and triton versions), with the scope's variables (`scope_env`). Outside CI (scope
    local) a cache variable the runner set itself wins and KILN_COMPILE_CACHE=0 leaves the caches where the tools
    put them; in CI the scope's folders always win (no workflow or runner variable points a job at another
    scope's folder), and KILN_COMPILE_CACHE=0 gives the job folders under KILN_STATE (the checkout's .kiln)."""
    import importlib.metadata

    from harness.settings import settings

    s = settings()
    local = s.cache_scope == "local"
    root = s.compile_cache
    if root is None:
        if local:
            return {}
        root = s.state_dir / "compile-cache"
    versions = []
    for dist in ("torch", "triton", "pytorch-triton-rocm"):
        try:
            versions.append(f"{dist}{importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    folder = compile_cache_dir(root, s.cache_scope, "-".join(["native", *versions]))
    env = cache_env(str(folder))
    if local:
        env = {k: v for k, v in env.items() if k not in os.environ}
    return {**env, **scope_env(s.cache_scope)}


def scope_this_process() -> dict[str, str]:
    """Make this process's own environment its trust scope's (for the verbs that compile or measure in-process,
    such as the bench's Inductor and kiln arms, and every child they start): `native_cache_env`'s folders, and no
    cache key outside main (harness/trust.py). Returns what it set."""
    added = native_cache_env()
    os.environ.update(added)
    if not trust.resolve().holds_key:
        for name in KEY_VARIABLES:
            if os.environ.pop(name, None) is not None:
                print(
                    trust.untrusted_key_problem(trust.resolve(), {name: "set"}), file=sys.stderr, flush=True
                )
    return added


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
        return ["--gpus", f'"{value}"' if "," in value else value], {
            **env,
            "CUDA_VISIBLE_DEVICES": str(inside),
        }
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
            gpu = (
                flag == "--gpus"
                or (flag == "--device" and _gpu_device(given))
                or (flag == "--group-add" and given in ("video", "render"))
            )
            if gpu:
                i += 1 if inline else 2
                continue
        out.append(opt)
        i += 1
    return out


def with_gpus(b: Backend, access: GpuAccess) -> Backend:
    """Backend `b` with the GPU options of `access` in place of the matrix's, its env renumbered inside."""
    opts, env = gpu_options(access)
    return replace(
        b, container_options=(*opts, *without_gpu_options(b.container_options)), env={**b.env, **env}
    )


def native_command(
    inner: Sequence[str], env: dict[str, str], *, src: Path, python: str | None = None
) -> tuple[list[str], dict[str, str]]:
    """(argv, full environment) that run `inner` with this machine's Python from the source tree: this
    process's environment, then `env`; the cache key only where `env` holds main's KILN_CACHE_AUTH=1."""
    argv = [python or sys.executable, *inner[1:]] if inner and inner[0] == "python" else list(inner)
    # the cache key travels only with main's KILN_CACHE_AUTH=1 (scope_env, which the harness adds itself) and
    # outside CI (a developer's own key)
    keeps = env.get("KILN_CACHE_AUTH") == "1" or trust.derive()[0] == "local"
    full = key_free({**os.environ, **env}, "main" if keeps else "other")
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
