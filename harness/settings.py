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
  GITHUB_STEP_SUMMARY  the job summary file of a GitHub Actions step (reports append to it when asked)
  KILN_HISTORY_DB   the test-history SQLite store (harness/suites/history.py; may be the bench's file; `~` expanded);
                    `--history DB` overrides it. Default: history/history.sqlite in the lasting data folder,
                    outside the checkout (a fresh CI checkout would wipe it): $XDG_DATA_HOME/kiln, else
                    ~/.local/share/kiln, the folder of the bench's lasting stores too; `run --shard` also
                    finds durations/<backend>.json next to it (written by `durations --from-history`)
  XDG_DATA_HOME     the base of the lasting data folder (default ~/.local/share)

The fleet store's variables, read by `fleet_settings()` (harness/store/url.py, runner.py, spool.py):
  KILN_STORE_URL    one location for both stores (`--store URL` overrides it): `sqlite:///PATH` or
                    `postgresql://USER@HOST/DB` (psycopg 3). Unset: each store where it is today (KILN_BENCH_DB,
                    the lasting stores, KILN_HISTORY_DB). An explicit `--db`/`--history` still wins over it.
  KILN_STORE_SPOOL  the local SQLite spool that keeps results while the server is unreachable (default
                    spool/store.sqlite in the lasting data folder); pushed by the next run that reaches it
  KILN_STORE_STRICT "1": an unreachable server is an error (exit 3) instead of a spooled run (`--store-strict`)
  KILN_STORE_READ_ONLY "1": KILN_STORE_URL is read (baselines, history, failure counts) but never written:
                    writers keep their own defaults (a pull request's job: its results stay on the runner)
  RUNNER_NAME       the runner's name recorded with each run (GitHub Actions sets it; default: the host name)
  KILN_GPU_LABEL    the matrix's GPU label of the job (e.g. h100), recorded with each run: the hardware class

The benchmarks' variables, read by `bench_settings()` (only where the bench runs; command-line flags override):
  KILN_BENCH_DB     the bench's SQLite store (default: results/bench.sqlite)
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

Boolean variables (KILN_NATIVE, KILN_BOOTSTRAP, KILN_ALLOW_UNLOCKED) are read by `flag`: 1/true/yes/on or
0/false/no/off (any case; unset or empty: off); anything else is a SettingsError naming the variable (exit 2),
never silently off.

No package index or mirror host is written in the repository: they come from these variables or from the
tools' own configuration, so mirrors and air-gapped sites work unchanged.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from harness.exc import SettingsError, UsageError

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BENCH_DB = Path("results") / "bench.sqlite"
DEFAULT_BENCH_ALPHA = 0.01
DEFAULT_PLANT_FRACTION = 0.2
DEFAULT_BENCH_STORE = Path("~/.local/share/kiln/bench/{backend}.sqlite")
DEFAULT_BENCH_BISECT_MAX = 2


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
    history_db: Path = Path("~/.local/share/kiln/history/history.sqlite")
    data_dir: Path = Path("~/.local/share/kiln")


def data_dir() -> Path:
    """The lasting data folder outside any checkout: $XDG_DATA_HOME/kiln, else ~/.local/share/kiln."""
    base = os.environ.get("XDG_DATA_HOME", "").strip()
    return (Path(base).expanduser() if base else Path.home() / ".local" / "share") / "kiln"


def settings() -> Settings:
    """Read the environment now and return the settings."""
    root = Path(os.environ.get("KILN_ROOT") or PACKAGE_ROOT).resolve()
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
        history_db=Path(os.environ.get("KILN_HISTORY_DB", "").strip()
                        or data_dir() / "history" / "history.sqlite").expanduser(),
        data_dir=data_dir(),
    )


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


def fleet_settings() -> FleetSettings:
    """Read the fleet store's variables now."""
    spool = os.environ.get("KILN_STORE_SPOOL", "").strip()
    return FleetSettings(
        store_url=os.environ.get("KILN_STORE_URL", "").strip() or None,
        spool=Path(spool).expanduser() if spool else data_dir() / "spool" / "store.sqlite",
        strict=flag("KILN_STORE_STRICT"),
        read_only=flag("KILN_STORE_READ_ONLY"),
        runner_name=os.environ.get("RUNNER_NAME", "").strip(),
        gpu_label=os.environ.get("KILN_GPU_LABEL", "").strip(),
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

    db: Path
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
        db=Path(os.environ.get("KILN_BENCH_DB") or DEFAULT_BENCH_DB),
        plant=parsed,
        threshold=_float("KILN_BENCH_THRESHOLD", None),
        alpha=_float("KILN_BENCH_ALPHA", DEFAULT_BENCH_ALPHA) or DEFAULT_BENCH_ALPHA,
        git_ref=os.environ.get("KILN_BENCH_GIT_REF") or os.environ.get("GITHUB_REF_NAME") or None,
        store=Path(store) if (store := os.environ.get("KILN_BENCH_STORE", "").strip()) else None,
        bisect_max=_count("KILN_BENCH_BISECT_MAX", DEFAULT_BENCH_BISECT_MAX),
    )
