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
  KILN_GITHUB_SUMMARY "1": reports append to $GITHUB_STEP_SUMMARY (set by every verb's `--github-summary`, for
                    the verb and the processes it starts; harness/conventions.py)
  KILN_HISTORY_DB   the test-history SQLite store (harness/suites/history.py; may be the bench's file; `~` expanded);
                    `--history DB` overrides it. Default: history/history.sqlite in the lasting data folder,
                    outside the checkout (a fresh CI checkout would wipe it): $XDG_DATA_HOME/kiln, else
                    ~/.local/share/kiln, the folder of the bench's lasting stores too; `run --shard` also
                    finds durations/<backend>.json next to it (written by `durations --from-history`)
  XDG_DATA_HOME     the base of the lasting data folder (default ~/.local/share)

The benchmarks' variables, read by `bench_settings()` (only where the bench runs; command-line flags override):
  KILN_BENCH_DB     the bench's SQLite store (default: results/bench/<backend>/bench.sqlite, <backend> the one this
                    machine runs, as `python -m harness detect` prints it: where `nox -s ci`, `nox -s bench` and
                    `bench backend` write, and what every bench verb reads; harness.bench.store.default_path)
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

Boolean variables (KILN_NATIVE, KILN_BOOTSTRAP, KILN_ALLOW_UNLOCKED, KILN_GITHUB_SUMMARY) are read by `flag`: 1/true/yes/on or
0/false/no/off (any case; unset or empty: off); anything else is a SettingsError naming the variable (exit 2),
never silently off.

No package index or mirror host is written in the repository: they come from these variables or from the
tools' own configuration, so mirrors and air-gapped sites work unchanged.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import types
from dataclasses import dataclass
from collections.abc import Mapping
from fnmatch import fnmatchcase
from pathlib import Path

from harness.exc import SettingsError, UsageError

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
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
    github_summary: bool = False
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
        github_summary=flag("KILN_GITHUB_SUMMARY"),
        history_db=Path(os.environ.get("KILN_HISTORY_DB", "").strip()
                        or data_dir() / "history" / "history.sqlite").expanduser(),
        data_dir=data_dir(),
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

    db: Path | None  # KILN_BENCH_DB; None: unset (harness.bench.store.default_path picks the backend's store)
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
