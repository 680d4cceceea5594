"""The harness's settings: every environment variable the harness reads is read here.

Variables (all optional):
  KILN_ROOT         source tree to test (default: the checkout this package lives in)
  KILN_MATRIX       path of the matrix file (default: <root>/ci/matrix.json)
  KILN_RESULTS      folder that receives one sub-folder per run (default: <root>/results)
  KILN_STATE        harness scratch folder: wheel caches, build contexts, bootstrap roots (<root>/.kiln)
  KILN_DOCKER       docker client to call (default: /usr/bin/docker when present, else `docker` on PATH)
  KILN_NATIVE       "1" runs the suites on this machine's Python instead of in a container
  KILN_BOOTSTRAP    "1" bootstraps the base image with debootstrap without trying to pull it first
  KILN_ALLOW_UNLOCKED "1" lets an image build without a current lock file (docker/lock/<backend>.txt): its
                    packages are then not hash-checked, which the build says (default: such a build fails)
  KILN_DEBIAN_MIRROR  Debian mirror for debootstrap (default: the one apt's sources name for the suite)
  KILN_TORCH_INDEX_URL  base URL of PyTorch's per-variant wheel indexes (the matrix's `torch_variant`, e.g.
                    cu130, is appended) for GPU images; unset: pip's own configuration decides
  PIP_INDEX_URL, PIP_EXTRA_INDEX_URL  pip's own variables, handed to image builds as they are
  KILN_MIN_FREE_GB  free disk (GB) the pre-flight wants at the docker root (harness/checks/preflight.py; default
                    by backend, preflight.MIN_FREE_GB)
  KILN_HEARTBEAT_S  seconds between the progress lines of a long step that prints nothing itself (image build,
                    debootstrap, wheel download, compile-check: harness/process.py; default 30, 0: none)
  KILN_LOGS         where image builds, debootstrap and wheel downloads write their logs (default <results>/logs,
                    so that the workflows' upload of results/ carries them)
  GITHUB_STEP_SUMMARY  the job summary file of a GitHub Actions step (reports append to it when asked)
  KILN_GITHUB_SUMMARY "1": reports append to $GITHUB_STEP_SUMMARY (set by every verb's `--github-summary`, for
                    the verb and the processes it starts; harness/conventions.py)
  KILN_HISTORY_DB   the test-history SQLite store (harness/suites/history.py; may be the bench's file; `~` expanded;
                    a job of scope branch, pr or fork keeps its own beside it: trust.scoped_path);
                    `--history DB` overrides it. Default: history/history.sqlite in the lasting data folder,
                    outside the checkout (a fresh CI checkout would wipe it): $XDG_DATA_HOME/kiln, else
                    ~/.local/share/kiln, the folder of the bench's lasting stores too; `run --shard` also
                    finds durations/<backend>.json next to it (written by `durations --from-history`)
  XDG_DATA_HOME     the base of the lasting data folder (default ~/.local/share)
  KILN_COMPILE_CACHE  the per-runner compile-cache folder mounted at /cache in the suites' containers (Triton's
                    and kiln's kernel caches; natively TRITON_CACHE_DIR/KILN_CACHE_DIR point there), one folder
                    per trust scope and toolchain below it (harness.commands.compile_cache_dir); default
                    $XDG_CACHE_HOME/kiln/compile (~/.cache/kiln/compile); 0/off/false/no: no shared cache
  KILN_CACHE_SCOPE  narrows the job's trust scope, which the harness derives from the GitHub event, ref and
                    repository (harness/trust.py: main, branch, local, pr, fork); naming a wider scope than the
                    derived one is an error (exit 2). The scope picks the compile-cache folders, the history and
                    bench files a job writes, whether it may write the fleet store and which image tags it sets
  KILN_CACHE_KEY, KILN_CACHE_KEY_FILE  the runner secret (or a file holding it) that signs and checks main's
                    cache entries (HMAC, compiler/runtime/cache.py); handed to main's jobs only (README: Trust)
  KILN_CONTAINER_USER  `uid:gid` the suites' containers run as (default: this process's, the runner's, so
                    what they write in the checkout is the runner's); `image`: the image's own user
  KILN_JOB_ID       this CI job's id, the `kiln.job` label of its containers (`harness cleanup` removes them);
                    default on GitHub Actions: <GITHUB_RUN_ID>-<GITHUB_RUN_ATTEMPT>-<RUNNER_NAME>-<hash of
                    RUNNER_TEMP> (unique per job on a host with several runners, and per job under `act`),
                    else none
  KILN_PRUNE_IMAGES "0" keeps superseded kiln image tags at a job's teardown (`harness cleanup`; default on; e.g.
                    a rehearsal on a machine shared with other checkouts)
  CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES  the GPUs this runner was given (harness.gpus
                    reads them): runs and shards use only those
  KILN_TEST_SELECTION  a pytest `-k` expression that `run`, `flakes` and `compile-check` add to every pytest they
                    start (a reduced run: the workflows' `selection` input, the rehearsal in ci/rehearse/);
                    unset or empty: every test

The fleet store's variables, read by `fleet_settings()` (harness/store/url.py, runner.py, spool.py):
  KILN_STORE_URL    one location for both stores (`--store URL` overrides it): `sqlite:///PATH` or
                    `postgresql://USER@HOST/DB` (psycopg 3). Unset: each store where it is today (KILN_BENCH_DB,
                    the lasting stores, KILN_HISTORY_DB). An explicit `--db`/`--history` still wins over it.
  KILN_STORE_SPOOL  the local SQLite spool that keeps results while the server is unreachable (default
                    spool/store.sqlite in the lasting data folder); pushed by the next run that reaches it
  KILN_STORE_STRICT "1": an unreachable server is an error (exit 3) instead of a spooled run (`--store-strict`)
  KILN_STORE_READ_ONLY "1": KILN_STORE_URL is read (baselines, history, failure counts) but never written:
                    writers keep their own defaults (a pull request's job: its results stay on the runner).
                    A job of trust scope branch, pr or fork (harness/trust.py) is read-only whatever this says
                    and whatever URL it is given: only main (and a machine outside CI) writes the fleet store
  RUNNER_NAME       the runner's name recorded with each run (GitHub Actions sets it; default: the host name)
  KILN_GPU_LABEL    the matrix's GPU label of the job (e.g. h100), recorded with each run: the hardware class
  KILN_RUN_MODE     `container` inside the suites' and benchmarks' containers (the harness sets it in every
                    `docker run`); unset: native. Part of the hardware class: the two modes are never compared

The benchmarks' variables, read by `bench_settings()` (only where the bench runs; command-line flags override):
  KILN_BENCH_DB     the bench's SQLite store (default: results/bench/<backend>/bench.sqlite, <backend> the one this
                    machine runs, as `python -m harness detect` prints it: where `nox -s ci`, `nox -s bench` and
                    `bench backend` write, and what every bench verb reads; harness.bench.stores.store.default_path)
  KILN_BENCH_PLANT  a planted slowdown, `PATTERN[@COMPILER][=FRACTION]` (default fraction 0.2): extra time
                    equal to FRACTION of the measured time is added after every call of the matching workload
                    (on a GPU as device-side sleep), so CI can prove that a slowdown is flagged. Never set it
                    for real results.
  KILN_BENCH_THRESHOLD, KILN_BENCH_ALPHA  regression threshold (fraction slower; default by device kind, see
                    bench/compare.py) and Mann-Whitney test level (default 0.01)
  KILN_BENCH_GIT_REF  the git ref recorded for a bench run (else GITHUB_REF_NAME, else `git` itself)
  KILN_BENCH_STORE  the lasting store of the CI bench jobs (`--lasting BACKEND`; `{backend}` is replaced): a path
                    on the runner outside the checkout; it overrides the backend's `bench_store` in the matrix
                    (neither: ~/.local/share/kiln/bench/{backend}.sqlite)
  KILN_BENCH_BISECT_MAX  confirmed regressions a CI bench job bisects at most (`bench job-summary`; default 2;
                    0: none); `--bisect-max N` overrides it

Boolean variables (KILN_NATIVE, KILN_BOOTSTRAP, KILN_ALLOW_UNLOCKED, KILN_PRUNE_IMAGES, KILN_GITHUB_SUMMARY) are read
by `flag`: 1/true/yes/on or
0/false/no/off (any case; unset or empty: off); anything else is a SettingsError naming the variable (exit 2),
never silently off.

No package index or mirror host is written in the repository: they come from these variables or from the
tools' own configuration, so mirrors and air-gapped sites work unchanged.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import sys
import types
from dataclasses import dataclass
from collections.abc import Mapping
from fnmatch import fnmatchcase
from pathlib import Path

from harness import trust
from harness.exc import SettingsError, UsageError

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BENCH_ALPHA = 0.01
DEFAULT_PLANT_FRACTION = 0.2
DEFAULT_BENCH_STORE = Path("~/.local/share/kiln/bench/{backend}.sqlite")
DEFAULT_BENCH_BISECT_MAX = 2
DEFAULT_HEARTBEAT_S = 30.0


TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def parse_bool(name: str, raw: str | None, default: bool = False) -> bool:
    """`raw` (the value of variable `name`) as a boolean: TRUE_WORDS or FALSE_WORDS in any case, `default` when
    unset or empty; any other value raises SettingsError naming the variable and what it accepts."""
    value = (raw or "").strip().lower()
    if not value:
        return default
    if value in TRUE_WORDS:
        return True
    if value in FALSE_WORDS:
        return False
    raise SettingsError(f"{name}={raw!r} is not a boolean: use one of {'/'.join(TRUE_WORDS)} or "
                        f"{'/'.join(FALSE_WORDS)}")


def flag(name: str, default: bool = False) -> bool:
    """The boolean environment variable `name` (parse_bool)."""
    return parse_bool(name, os.environ.get(name), default)


def _default_docker() -> str:
    # Debian's client builds with its built-in BuildKit; a newer client on PATH may need a buildx plugin.
    if Path("/usr/bin/docker").exists():
        return "/usr/bin/docker"
    return shutil.which("docker") or "docker"


@dataclass(frozen=True)
class Settings:
    """Typed view of the harness's environment variables (see the module docstring)."""

    root: Path
    matrix_path: Path
    results_root: Path
    state_dir: Path
    docker: str
    native: bool
    bootstrap: bool
    allow_unlocked: bool = False
    debian_mirror: str = ""
    torch_index_url: str = ""
    pip_index_url: str = ""
    pip_extra_index_url: str = ""
    github_step_summary: str = ""
    github_summary: bool = False
    history_db: Path = Path("~/.local/share/kiln/history/history.sqlite")
    data_dir: Path = Path("~/.local/share/kiln")
    compile_cache: Path | None = None  # None: off
    cache_scope: str = "local"
    container_user: str | None = None  # `uid:gid`; None: the image's user
    job_id: str = ""
    prune_images: bool = True
    min_free_gb: float | None = None  # KILN_MIN_FREE_GB (None: the pre-flight's default for the backend)
    heartbeat_s: float = DEFAULT_HEARTBEAT_S  # KILN_HEARTBEAT_S (0: no progress lines)
    logs_dir: Path = Path("results/logs")  # KILN_LOGS
    test_selection: str = ""  # KILN_TEST_SELECTION: a pytest -k expression ("" selects every test)


def data_dir() -> Path:
    """The lasting data folder outside any checkout: $XDG_DATA_HOME/kiln, else ~/.local/share/kiln."""
    base = os.environ.get("XDG_DATA_HOME", "").strip()
    return (Path(base).expanduser() if base else Path.home() / ".local" / "share") / "kiln"


def compile_cache_root(raw: str | None) -> Path | None:
    """KILN_COMPILE_CACHE: None when it is a false word (no shared cache), the folder it names, else the
    default $XDG_CACHE_HOME/kiln/compile."""
    value = (raw or "").strip()
    if value.lower() in FALSE_WORDS:
        return None
    if value:
        return Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(base).expanduser() if base else Path.home() / ".cache") / "kiln" / "compile"


def container_user(raw: str | None) -> str | None:
    """KILN_CONTAINER_USER: `uid:gid` as given, None for `image`, else this process's uid:gid."""
    value = (raw or "").strip()
    if value.lower() == "image":
        return None
    if value:
        if not re.fullmatch(r"\d+(:\d+)?", value):
            raise SettingsError(f"KILN_CONTAINER_USER={raw!r}: expected uid:gid (numbers) or `image`")
        return value
    return f"{os.getuid()}:{os.getgid()}"


def job_id(env: dict[str, str] | None = None) -> str:
    """KILN_JOB_ID, else GitHub Actions' run id, attempt and runner name, else "" (module docstring)."""
    env = dict(os.environ) if env is None else env
    raw = env.get("KILN_JOB_ID", "").strip()
    if not raw and env.get("GITHUB_RUN_ID"):
        parts = [env.get(k, "") for k in ("GITHUB_RUN_ID", "GITHUB_RUN_ATTEMPT", "RUNNER_NAME")]
        if env.get("RUNNER_TEMP"):  # per runner on GitHub; per job under `act`, whose runs all have run id 1
            parts.append(hashlib.sha256(env["RUNNER_TEMP"].encode()).hexdigest()[:8])
        raw = "-".join(parts)
    return re.sub(r"[^A-Za-z0-9_.-]", "-", raw)


def settings() -> Settings:
    """Read the environment now and return the settings."""
    root = Path(os.environ.get("KILN_ROOT") or PACKAGE_ROOT).resolve()
    scope = trust.resolve().scope
    results_root = Path(os.environ.get("KILN_RESULTS") or root / "results")
    return Settings(
        root=root,
        matrix_path=Path(os.environ.get("KILN_MATRIX") or root / "ci" / "matrix.json"),
        results_root=results_root,
        state_dir=Path(os.environ.get("KILN_STATE") or root / ".kiln"),
        docker=os.environ.get("KILN_DOCKER") or _default_docker(),
        native=flag("KILN_NATIVE"),
        bootstrap=flag("KILN_BOOTSTRAP"),
        allow_unlocked=flag("KILN_ALLOW_UNLOCKED"),
        debian_mirror=os.environ.get("KILN_DEBIAN_MIRROR", "").strip(),
        torch_index_url=os.environ.get("KILN_TORCH_INDEX_URL", "").strip().rstrip("/"),
        pip_index_url=os.environ.get("PIP_INDEX_URL", "").strip(),
        pip_extra_index_url=os.environ.get("PIP_EXTRA_INDEX_URL", "").strip(),
        github_step_summary=os.environ.get("GITHUB_STEP_SUMMARY", "").strip(),
        github_summary=flag("KILN_GITHUB_SUMMARY"),
        history_db=trust.scoped_path(Path(os.environ.get("KILN_HISTORY_DB", "").strip()
                                          or data_dir() / "history" / "history.sqlite").expanduser(), scope),
        data_dir=data_dir(),
        compile_cache=compile_cache_root(os.environ.get("KILN_COMPILE_CACHE")),
        cache_scope=scope,
        container_user=container_user(os.environ.get("KILN_CONTAINER_USER")),
        job_id=job_id(),
        prune_images=flag("KILN_PRUNE_IMAGES", True),
        min_free_gb=_float("KILN_MIN_FREE_GB", None),
        heartbeat_s=_float("KILN_HEARTBEAT_S", DEFAULT_HEARTBEAT_S) or 0.0,
        logs_dir=Path(os.environ.get("KILN_LOGS", "").strip() or results_root / "logs"),
        test_selection=os.environ.get("KILN_TEST_SELECTION", "").strip(),
    )


# ---- the workflows' variables ----------------------------------------------------------------------------

# Every workflow (.github/workflows/*.yml) sets exactly these in its top-level `env:`, from this one list
# (tests/harness/test_workflows.py checks it; no job or step sets them again). Index variables are repository
# variables (an unset one is empty, which pip and the harness read as unset; no index host is written in the
# repository); the stores are the runner's lasting folders outside the checkout; the compile cache's scope is
# `main` only for main's pushes.
WORKFLOW_ENV: dict[str, str] = {
    "KILN_ALLOW_UNLOCKED": "${{ vars.KILN_ALLOW_UNLOCKED }}",
    "KILN_TORCH_INDEX_URL": "${{ vars.KILN_TORCH_INDEX_URL }}",
    "PIP_INDEX_URL": "${{ vars.PIP_INDEX_URL }}",
    "PIP_EXTRA_INDEX_URL": "${{ vars.PIP_EXTRA_INDEX_URL }}",
    "KILN_HISTORY_DB": "~/.local/share/kiln/history/history.sqlite",
    "KILN_BENCH_STORE": "~/.local/share/kiln/bench/{backend}.sqlite",
    # the fleet store (issue 27): unset secrets keep every store on the runner (SQLite, as before); pull requests
    # read the fleet store through a read-only URL (a SELECT-only role) and never write it
    "KILN_STORE_URL": "${{ github.event_name == 'pull_request' && secrets.KILN_STORE_READ_URL || secrets.KILN_STORE_URL }}",
    "KILN_STORE_READ_ONLY": "${{ github.event_name == 'pull_request' && '1' || '' }}",
}


def workflow_env_yaml() -> str:
    """WORKFLOW_ENV as the workflows' top-level `env:` block (what each workflow file carries)."""
    lines = ["env:"]
    for key, value in WORKFLOW_ENV.items():
        quoted = value if value.startswith("${{") else f'"{value}"' if "{" in value else value
        lines.append(f"  {key}: {quoted}")
    return "\n".join(lines) + "\n"


def selection_args(verb: str) -> list[str]:
    """`["-k", EXPR]` for KILN_TEST_SELECTION (one note line naming it, so a reduced run says so), else []."""
    expr = settings().test_selection
    if not expr:
        return []
    print(f"{verb}: note: KILN_TEST_SELECTION selects the tests matching -k {expr!r} (a reduced run)", flush=True)
    return ["-k", expr]


# ---- the fleet store ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FleetSettings:
    """Typed view of the fleet store's variables (see the module docstring)."""

    store_url: str | None
    spool: Path
    strict: bool
    read_only: bool
    runner_name: str
    gpu_label: str
    run_mode: str = "native"


def fleet_settings() -> FleetSettings:
    """Read the fleet store's variables now."""
    spool = os.environ.get("KILN_STORE_SPOOL", "").strip()
    return FleetSettings(
        store_url=os.environ.get("KILN_STORE_URL", "").strip() or None,
        spool=trust.scoped_path(Path(spool).expanduser() if spool else data_dir() / "spool" / "store.sqlite",
                                trust.resolve().scope),  # main drains its own spool only
        strict=flag("KILN_STORE_STRICT"),
        read_only=flag("KILN_STORE_READ_ONLY") or not trust.resolve().writes_fleet,
        runner_name=os.environ.get("RUNNER_NAME", "").strip(),
        gpu_label=os.environ.get("KILN_GPU_LABEL", "").strip(),
        run_mode=os.environ.get("KILN_RUN_MODE", "").strip() or "native",
    )


# ---- the benchmarks ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plant:
    """A planted slowdown: workloads matching `pattern` (and `compiler`, if set) get `fraction` extra time."""

    pattern: str
    compiler: str | None
    fraction: float

    @classmethod
    def parse(cls, spec: str) -> "Plant":
        """`PATTERN[@COMPILER][=FRACTION]`, from KILN_BENCH_PLANT or `--plant`; UsageError when malformed."""
        body, _, frac = spec.partition("=")
        pattern, _, compiler = body.partition("@")
        try:
            fraction = float(frac) if frac else DEFAULT_PLANT_FRACTION
        except ValueError:
            raise UsageError(f"bad plant {spec!r}: fraction {frac!r} is not a number") from None
        if not pattern or fraction <= 0:
            raise UsageError(f"bad plant {spec!r}: expected PATTERN[@COMPILER][=FRACTION>0]")
        return cls(pattern, compiler or None, fraction)

    def applies(self, workload: str, compiler: str) -> bool:
        return fnmatchcase(workload, self.pattern) and (self.compiler is None or self.compiler == compiler)

    def spec(self) -> str:
        return f"{self.pattern}{'@' + self.compiler if self.compiler else ''}={self.fraction:g}"


@dataclass(frozen=True)
class BenchSettings:
    """Typed view of the benchmarks' environment variables (see the module docstring)."""

    db: Path | None  # KILN_BENCH_DB; None: unset (harness.bench.stores.store.default_path picks the backend's store)
    plant: Plant | None
    threshold: float | None
    alpha: float
    git_ref: str | None
    store: Path | None = None  # KILN_BENCH_STORE, `{backend}` not yet replaced (None: unset; see store.lasting_path)
    bisect_max: int = DEFAULT_BENCH_BISECT_MAX  # KILN_BENCH_BISECT_MAX (`--bisect-max` wins)


def _float(name: str, default: float | None) -> float | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None


def _count(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit():
        raise SettingsError(f"{name}={raw!r} is not a count")
    return int(raw)


def bench_settings() -> BenchSettings:
    """Read the benchmarks' variables now (cheap; call it where needed rather than caching it at import).
    A malformed value is a SettingsError (a plant's own message) naming what is wrong."""
    plant = os.environ.get("KILN_BENCH_PLANT")
    try:
        parsed = Plant.parse(plant) if plant else None
    except UsageError as e:
        raise SettingsError(str(e)) from None
    return BenchSettings(
        db=Path(db) if (db := os.environ.get("KILN_BENCH_DB", "").strip()) else None,
        plant=parsed,
        threshold=_float("KILN_BENCH_THRESHOLD", None),
        alpha=_float("KILN_BENCH_ALPHA", DEFAULT_BENCH_ALPHA) or DEFAULT_BENCH_ALPHA,
        git_ref=os.environ.get("KILN_BENCH_GIT_REF") or os.environ.get("GITHUB_REF_NAME") or None,
        store=Path(store) if (store := os.environ.get("KILN_BENCH_STORE", "").strip()) else None,
        bisect_max=_count("KILN_BENCH_BISECT_MAX", DEFAULT_BENCH_BISECT_MAX),
    )


# ---- the compiler's settings, read without importing the compiler ------------------------------------------


def compiler_config(folder: Path | None = None) -> types.ModuleType | None:
    """compiler/config.py of the tree under test (`folder`: its compiler/ folder), loaded under a private
    package name with compiler/exc.py: it needs only the standard library, so the harness reads the compiler's
    settings without importing torch, triton or the compiler package (whose import chooses Triton's
    interpreter). None where the tree has no compiler (a scratch project in the harness's tests)."""
    folder = folder or settings().root / "compiler"
    if not (folder / "config.py").is_file():
        return None
    name = "_kiln_settings_check"
    pkg = types.ModuleType(name)
    pkg.__path__ = [str(folder)]
    saved = {k: sys.modules.get(k) for k in (name, f"{name}.exc", f"{name}.config")}
    sys.modules[name] = pkg
    try:
        module = None
        for mod in ("exc", "config"):
            spec = importlib.util.spec_from_file_location(f"{name}.{mod}", folder / f"{mod}.py")
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[f"{name}.{mod}"] = module
            spec.loader.exec_module(module)
        return module
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def compiler_settings_problem(env: Mapping[str, str]) -> str | None:
    """What is wrong with the kiln compiler settings (`KILN_*`) in `env`, in one line, or None (checked before
    any suite or measurement starts: a bad value would otherwise fail every test's import or every kiln row)."""
    config = compiler_config()
    if config is None:
        return None
    try:
        config.from_env(dict(env))
    except ValueError as e:  # compiler.exc.ConfigError is a ValueError
        return str(e)
    return None


def require_compiler_settings(env: Mapping[str, str] | None = None) -> None:
    """A SettingsError (one line, exit 2) when the compiler settings in `env` (default: this process's
    environment) are bad; for every verb that compiles with kiln in this process or its children."""
    problem = compiler_settings_problem(os.environ if env is None else env)
    if problem:
        raise SettingsError(f"bad compiler setting: {problem} (compiler/config.py)")
