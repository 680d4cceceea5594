"""The harness's settings: every environment variable the harness reads is declared here, once.

Each is a field of ``Settings`` (the run's variables), ``FleetSettings`` (the fleet store's, read by
harness/store) or ``BenchSettings`` (the benchmarks', read only where the bench runs; command-line flags
override them), declared with ``setting(...)`` (``compiler/envvars.py``, the compiler's settings use the same):
its variable, type, default, parser and help text. ``settings()``, ``fleet_settings()`` and ``bench_settings()``
read the environment now; ``override(**fields)`` scopes changes for tests. A bad value is a SettingsError of
one line naming the variable and what it accepts (exit 2), never silently a default.

``python -m harness settings --md`` prints every variable of the harness and of the compiler as tables;
docs/settings.md is that output (``--write`` refreshes it; tests/harness/test_settings.py checks it is current).

Read elsewhere: the GPU visibility variables (CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES:
harness/gpus.py), the trust model's GitHub variables (harness/trust.py), and the compiler's ``KILN_*`` settings
(compiler/config.py; ``require_compiler_settings`` checks them before anything compiles).

No package index or mirror host is written in the repository: they come from these variables or from the
tools' own configuration, so mirrors and air-gapped sites work unchanged.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import importlib
import os
import re
import shutil
import sys
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, TypeVar

from compiler import envvars
from compiler.envvars import FALSE_WORDS, TRUE_WORDS, boolean, count, number, path, setting, text
from harness import trust
from harness.exc import SettingsError, UsageError

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BENCH_ALPHA = 0.01
DEFAULT_PLANT_FRACTION = 0.2
DEFAULT_BENCH_STORE = Path("~/.local/share/kiln/bench/{backend}.sqlite")
DEFAULT_BENCH_BISECT_MAX = 2
DEFAULT_HEARTBEAT_S = 30.0
DOCS = Path("docs") / "settings.md"  # below the project's root

S = TypeVar("S")


def parse_bool(name: str, raw: str | None, default: bool = False) -> bool:
    """`raw` (the value of variable `name`) as a boolean: TRUE_WORDS or FALSE_WORDS in any case, `default` when
    unset or empty; any other value raises SettingsError naming the variable and what it accepts."""
    if not (raw or "").strip():
        return default
    try:
        return boolean(raw or "")
    except ValueError as e:
        raise SettingsError(f"{name}={raw!r}: {e}") from None


def _default_docker() -> str:
    # Debian's client builds with its built-in BuildKit; a newer client on PATH may need a buildx plugin.
    if Path("/usr/bin/docker").exists():
        return "/usr/bin/docker"
    return shutil.which("docker") or "docker"


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


def _uid_gid(raw: str) -> str | None:
    value = raw.strip()
    if value.lower() == "image":
        return None
    if not re.fullmatch(r"\d+(:\d+)?", value):
        raise ValueError("expected uid:gid (numbers) or `image`")
    return value


def container_user(raw: str | None) -> str | None:
    """KILN_CONTAINER_USER: `uid:gid` as given, None for `image`, else this process's uid:gid."""
    if not (raw or "").strip():
        return f"{os.getuid()}:{os.getgid()}"
    try:
        return _uid_gid(raw or "")
    except ValueError as e:
        raise SettingsError(f"KILN_CONTAINER_USER={raw!r}: {e}") from None


def job_id(env: dict[str, str] | None = None) -> str:
    """KILN_JOB_ID, else GitHub Actions' run id, attempt and runner name (and a hash of RUNNER_TEMP: unique per
    job on a host with several runners, and per job under `act`), else ""."""
    env = dict(os.environ) if env is None else env
    raw = env.get("KILN_JOB_ID", "").strip()
    if not raw and env.get("GITHUB_RUN_ID"):
        parts = [env.get(k, "") for k in ("GITHUB_RUN_ID", "GITHUB_RUN_ATTEMPT", "RUNNER_NAME")]
        if env.get("RUNNER_TEMP"):  # per runner on GitHub; per job under `act`, whose runs all have run id 1
            parts.append(hashlib.sha256(env["RUNNER_TEMP"].encode()).hexdigest()[:8])
        raw = "-".join(parts)
    return re.sub(r"[^A-Za-z0-9_.-]", "-", raw)


def _scope() -> str:
    return trust.resolve().scope


def _root(raw: str) -> Path:
    return Path(raw.strip()).expanduser().resolve()


def _url(raw: str) -> str:
    return raw.strip().rstrip("/")


def _optional_float(raw: str) -> float | None:
    return number(raw)


def _history_db(p: Path) -> Path:
    return trust.scoped_path(p.expanduser(), _scope())


@dataclass(frozen=True)
class Settings:
    """The run's environment variables, each declared once (docs/settings.md is generated from them)."""

    root: Path = setting(
        parse=_root,
        derive=lambda v: PACKAGE_ROOT.resolve(),
        env="KILN_ROOT",
        default_doc="this checkout",
        help="The source tree to test.",
    )
    matrix_path: Path = setting(
        env="KILN_MATRIX",
        derive=lambda v: v["root"] / "ci" / "matrix.json",
        default_doc="<root>/ci/matrix.json",
        help="The matrix file.",
    )
    results_root: Path = setting(
        env="KILN_RESULTS",
        derive=lambda v: v["root"] / "results",
        default_doc="<root>/results",
        help="The folder that receives one sub-folder per run.",
    )
    state_dir: Path = setting(
        env="KILN_STATE",
        derive=lambda v: v["root"] / ".kiln",
        default_doc="<root>/.kiln",
        help="The harness's scratch folder: wheel caches, build contexts, bootstrap roots.",
    )
    docker: str = setting(
        env="KILN_DOCKER",
        derive=lambda v: _default_docker(),
        default_doc="/usr/bin/docker when present, else `docker` on PATH",
        help="The docker client to call.",
    )
    native: bool = setting(
        False, env="KILN_NATIVE", help="Run the suites on this machine's Python instead of in a container."
    )
    bootstrap: bool = setting(
        False,
        env="KILN_BOOTSTRAP",
        help="Bootstrap the base image with debootstrap without trying to pull it first.",
    )
    allow_unlocked: bool = setting(
        False,
        env="KILN_ALLOW_UNLOCKED",
        help="Let an image build without a current lock file (`docker/lock/<backend>.txt`): its packages are then "
        "not hash-checked, which the build says (off: such a build fails).",
    )
    debian_mirror: str = setting(
        "",
        env="KILN_DEBIAN_MIRROR",
        default_doc="the one apt's sources name for the suite",
        help="The Debian mirror for debootstrap.",
    )
    torch_index_url: str = setting(
        "",
        env="KILN_TORCH_INDEX_URL",
        parse=_url,
        default_doc="unset: pip's own configuration decides",
        help="Base URL of PyTorch's per-variant wheel indexes for GPU images (the matrix's `torch_variant`, e.g. "
        "cu130, is appended).",
    )
    pip_index_url: str = setting(
        "", env="PIP_INDEX_URL", help="pip's own variable, handed to image builds as it is."
    )
    pip_extra_index_url: str = setting(
        "", env="PIP_EXTRA_INDEX_URL", help="pip's own variable, handed to image builds as it is."
    )
    github_step_summary: str = setting(
        "",
        env="GITHUB_STEP_SUMMARY",
        help="The job summary file of a GitHub Actions step (reports append to it when asked).",
    )
    github_summary: bool = setting(
        False,
        env="KILN_GITHUB_SUMMARY",
        help="Reports append to $GITHUB_STEP_SUMMARY (set by every verb's `--github-summary`, for the verb and the "
        "processes it starts; harness/conventions.py).",
    )
    data_dir: Path = setting(
        env="XDG_DATA_HOME",
        parse=lambda raw: path(raw) / "kiln",
        derive=lambda v: data_dir(),
        default_doc="~/.local/share",
        help="The base of the lasting data folder, its `kiln` sub-folder (`data_dir`), outside any checkout (a "
        "fresh CI checkout would wipe it): the test history, the bench's lasting stores and the fleet "
        "store's spool live there.",
    )
    cache_scope: str = setting(
        env="KILN_CACHE_SCOPE",
        parse=lambda raw: _scope(),
        derive=lambda v: _scope(),
        default_doc="derived from the GitHub event, ref and repository",
        help="Narrows the job's trust scope (harness/trust.py: main, branch, local, pr, fork); naming a wider "
        "scope than the derived one is an error (exit 2). The scope picks the compile-cache folders, the "
        "history and bench files a job writes, whether it may write the fleet store and which image tags "
        "it sets.",
    )
    history_db: Path = setting(
        env="KILN_HISTORY_DB",
        parse=lambda raw: _history_db(path(raw)),
        derive=lambda v: _history_db(v["data_dir"] / "history" / "history.sqlite"),
        default_doc="<data_dir>/history/history.sqlite",
        help="The test-history SQLite store (harness/suites/history.py; may be the bench's file); a job of scope "
        "branch, pr or fork keeps its own beside it (trust.scoped_path); `--history DB` overrides it. "
        "`run --shard` also finds durations/<backend>.json next to it.",
    )
    compile_cache: Path | None = setting(
        env="KILN_COMPILE_CACHE",
        parse=compile_cache_root,
        derive=lambda v: compile_cache_root(None),
        default_doc="$XDG_CACHE_HOME/kiln/compile",
        help="The per-runner compile-cache folder mounted at /cache in the suites' containers (Triton's and "
        "kiln's kernel caches; natively TRITON_CACHE_DIR/KILN_CACHE_DIR point there), one folder per trust "
        "scope and toolchain below it (harness.commands.compile_cache_dir); 0/off/false/no: no shared cache.",
    )
    container_user: str | None = setting(
        env="KILN_CONTAINER_USER",
        parse=_uid_gid,
        derive=lambda v: container_user(None),
        default_doc="this process's uid:gid",
        help="`uid:gid` the suites' containers run as (the runner's, so what they write in the checkout is the "
        "runner's); `image`: the image's own user.",
    )
    job_id: str = setting(
        env="KILN_JOB_ID",
        parse=lambda raw: job_id({"KILN_JOB_ID": raw}),
        derive=lambda v: job_id(),
        default_doc="on GitHub Actions: <GITHUB_RUN_ID>-<GITHUB_RUN_ATTEMPT>-<RUNNER_NAME>-<hash of RUNNER_TEMP>",
        help="This CI job's id, the `kiln.job` label of its containers (`harness cleanup` removes them).",
    )
    prune_images: bool = setting(
        True,
        env="KILN_PRUNE_IMAGES",
        help="Remove superseded kiln image tags at a job's teardown (`harness cleanup`); off e.g. for a "
        "rehearsal on a machine shared with other checkouts.",
    )
    min_free_gb: float | None = setting(
        None,
        env="KILN_MIN_FREE_GB",
        parse=_optional_float,
        default_doc="by backend: to build (preflight.MIN_FREE_GB), image present (PRESENT_MIN_FREE_GB)",
        help="Free disk (GB) the pre-flight wants at the docker root (harness/checks/preflight.py), whether or "
        "not the job's image is already there.",
    )
    heartbeat_s: float = setting(
        DEFAULT_HEARTBEAT_S,
        env="KILN_HEARTBEAT_S",
        help="Seconds between the progress lines of a long step that prints nothing itself (image build, "
        "debootstrap, wheel download, compile-check: harness/process.py); 0: none.",
    )
    logs_dir: Path = setting(
        env="KILN_LOGS",
        derive=lambda v: v["results_root"] / "logs",
        default_doc="<results>/logs",
        help="Where image builds, debootstrap and wheel downloads write their logs (the workflows' upload of "
        "results/ carries them).",
    )
    test_selection: str = setting(
        "",
        env="KILN_TEST_SELECTION",
        default_doc="unset: every test",
        help="A pytest `-k` expression that `run`, `flakes` and `compile-check` add to every pytest they start "
        "(a reduced run: the workflows' `selection` input, the rehearsal in ci/rehearse/).",
    )


_overrides: dict[type, dict[str, Any]] = {}


def _read(cls: type[S]) -> S:
    value = envvars.read(cls, os.environ, error=SettingsError)
    extra = _overrides.get(cls)
    return dataclasses.replace(value, **extra) if extra else value  # type: ignore[type-var]


@contextlib.contextmanager
def override(**fields: Any) -> Iterator[None]:
    """Scoped overrides of settings fields (of Settings, FleetSettings or BenchSettings, by field name) that
    `settings()`, `fleet_settings()` and `bench_settings()` return while the block runs (for tests)."""
    owners = {
        f.name: cls for cls in (Settings, FleetSettings, BenchSettings) for f in dataclasses.fields(cls)
    }
    unknown = sorted(set(fields) - set(owners))
    if unknown:
        raise SettingsError(f"unknown harness setting(s): {', '.join(unknown)}")
    saved = {cls: dict(v) for cls, v in _overrides.items()}
    for name, value in fields.items():
        _overrides.setdefault(owners[name], {})[name] = value
    try:
        yield
    finally:
        _overrides.clear()
        _overrides.update(saved)


def settings() -> Settings:
    """Read the environment now and return the settings."""
    return _read(Settings)


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
    # the fleet store: unset secrets keep every store on the runner (SQLite, as before); pull requests
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
    print(
        f"{verb}: note: KILN_TEST_SELECTION selects the tests matching -k {expr!r} (a reduced run)",
        flush=True,
    )
    return ["-k", expr]


# ---- the fleet store ------------------------------------------------------------------------------------


def _spool(p: Path) -> Path:
    return trust.scoped_path(p, _scope())  # main drains its own spool only


@dataclass(frozen=True)
class FleetSettings:
    """The fleet store's environment variables (harness/store/url.py, runner.py, spool.py), declared once."""

    store_url: str | None = setting(
        None,
        env="KILN_STORE_URL",
        default_doc="unset: each store where it is today",
        help="One location for both stores (`--store URL` overrides it): `sqlite:///PATH` or "
        "`postgresql://USER@HOST/DB` (psycopg 3). Unset: KILN_BENCH_DB, the lasting stores, KILN_HISTORY_DB. "
        "An explicit `--db`/`--history` still wins over it.",
    )
    spool: Path = setting(
        env="KILN_STORE_SPOOL",
        parse=lambda raw: _spool(path(raw)),
        derive=lambda v: _spool(data_dir() / "spool" / "store.sqlite"),
        default_doc="<data_dir>/spool/store.sqlite",
        help="The local SQLite spool that keeps results while the server is unreachable; pushed by the next run "
        "that reaches it.",
    )
    strict: bool = setting(
        False,
        env="KILN_STORE_STRICT",
        help="An unreachable server is an error (exit 3) instead of a spooled run (`--store-strict`).",
    )
    read_only: bool = setting(
        env="KILN_STORE_READ_ONLY",
        parse=lambda raw: boolean(raw) or not trust.resolve().writes_fleet,
        derive=lambda v: not trust.resolve().writes_fleet,
        default_doc="off (on for scopes branch, pr, fork)",
        help="KILN_STORE_URL is read (baselines, history, failure counts) but never written: writers keep their "
        "own defaults (a pull request's job: its results stay on the runner). A job of trust scope branch, "
        "pr or fork is read-only whatever this says: only main (and a machine outside CI) writes the fleet "
        "store.",
    )
    runner_name: str = setting(
        "",
        env="RUNNER_NAME",
        default_doc="the host name (where recorded)",
        help="The runner's name recorded with each run (GitHub Actions sets it).",
    )
    gpu_label: str = setting(
        "",
        env="KILN_GPU_LABEL",
        help="The matrix's GPU label of the job (e.g. h100), recorded with each run: the hardware class.",
    )
    run_mode: str = setting(
        "native",
        env="KILN_RUN_MODE",
        help="`container` inside the suites' and benchmarks' containers (the harness sets it in every "
        "`docker run`). Part of the hardware class: the two modes are never compared.",
    )


def fleet_settings() -> FleetSettings:
    """Read the fleet store's variables now."""
    return _read(FleetSettings)


# ---- the benchmarks ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plant:
    """A planted slowdown: workloads matching `pattern` (and `compiler`, if set) get `fraction` extra time."""

    pattern: str
    compiler: str | None
    fraction: float

    @classmethod
    def parse(cls, spec: str) -> Plant:
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


def _plant(raw: str) -> Plant:
    try:
        return Plant.parse(raw)
    except UsageError as e:  # the variable and its value lead the line already
        raise ValueError(str(e).removeprefix(f"bad plant {raw!r}: ")) from None


def _optional_path(raw: str) -> Path | None:
    return Path(raw.strip())


@dataclass(frozen=True)
class BenchSettings:
    """The benchmarks' environment variables (read only where the bench runs; flags override), declared once."""

    db: Path | None = setting(
        None,
        env="KILN_BENCH_DB",
        parse=_optional_path,
        default_doc="results/bench/<backend>/bench.sqlite (harness.bench.stores.store.default_path)",
        help="The bench's SQLite store: where `nox -s ci`, `nox -s bench` and `bench backend` write, and what "
        "every bench verb reads (`<backend>`: the one this machine runs, as `python -m harness detect` "
        "prints it).",
    )
    plant: Plant | None = setting(
        None,
        env="KILN_BENCH_PLANT",
        parse=_plant,
        default_doc="unset",
        help="A planted slowdown, `PATTERN[@COMPILER][=FRACTION]` (fraction 0.2 when omitted): extra time equal "
        "to FRACTION of the measured time is added after every call of the matching workload (on a GPU as "
        "device-side sleep), so CI can prove that a slowdown is flagged. Never set it for real results.",
    )
    threshold: float | None = setting(
        None,
        env="KILN_BENCH_THRESHOLD",
        parse=_optional_float,
        default_doc="by device kind (bench/compare.py)",
        help="The regression threshold (fraction slower).",
    )
    alpha: float = setting(
        DEFAULT_BENCH_ALPHA,
        env="KILN_BENCH_ALPHA",
        parse=lambda raw: number(raw) or DEFAULT_BENCH_ALPHA,
        help="The Mann-Whitney test level of a regression.",
    )
    git_ref: str | None = setting(
        env="KILN_BENCH_GIT_REF",
        parse=text,
        derive=lambda v: os.environ.get("GITHUB_REF_NAME") or None,
        default_doc="GITHUB_REF_NAME, else `git`",
        help="The git ref recorded for a bench run.",
    )
    store: Path | None = setting(
        None,
        env="KILN_BENCH_STORE",
        parse=_optional_path,
        default_doc=str(DEFAULT_BENCH_STORE),
        help="The lasting store of the CI bench jobs (`--lasting BACKEND`; `{backend}` is replaced): a path on "
        "the runner outside the checkout; it overrides the backend's `bench_store` in the matrix.",
    )
    bisect_max: int = setting(
        DEFAULT_BENCH_BISECT_MAX,
        env="KILN_BENCH_BISECT_MAX",
        parse=count,
        help="Confirmed regressions a CI bench job bisects at most (`bench job-summary`; 0: none); "
        "`--bisect-max N` overrides it.",
    )


def bench_settings() -> BenchSettings:
    """Read the benchmarks' variables now (cheap; call it where needed rather than caching it at import)."""
    return _read(BenchSettings)


# ---- the compiler's settings --------------------------------------------------------------------------------


def compiler_config(folder: Path | None = None) -> types.ModuleType | None:
    """compiler/config.py (its declarations need only the standard library, and ``import compiler`` has no side
    effects: the harness reads the compiler's settings without importing torch or triton). None where the tree
    under test (`folder`: its compiler/ folder; default: the root's) has no compiler (a scratch project in the
    harness's tests)."""
    folder = folder or settings().root / "compiler"
    if not (folder / "config.py").is_file():
        return None
    return importlib.import_module("compiler.config")


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


# ---- the docs: `python -m harness settings` ---------------------------------------------------------------


def docs_markdown() -> str:
    """docs/settings.md: every variable of the harness and of the compiler, from their declarations."""
    from compiler import config

    parts = [
        "# Settings: the environment variables",
        "",
        "Generated from the declarations (harness/settings.py, compiler/config.py) by "
        "`python -m harness settings --write`; do not edit by hand. Booleans take "
        f"{'/'.join(TRUE_WORDS)} or {'/'.join(FALSE_WORDS)} (any case); a bad value is one line naming the "
        "variable (exit 2).",
        "",
    ]
    for title, cls, prefix in (
        ("The harness (`settings()`)", Settings, ""),
        ("The fleet store (`fleet_settings()`)", FleetSettings, ""),
        ("The benchmarks (`bench_settings()`; flags override them)", BenchSettings, ""),
        ("The compiler (`compiler.config.settings()`)", config.Settings, config.PREFIX),
    ):
        parts += [f"## {title}", "", envvars.markdown(cls, prefix)]
    return "\n".join(parts)


def cli_add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--md", action="store_true", help="print the tables as markdown (the default)")
    g.add_argument("--write", action="store_true", help=f"write them to {DOCS} in the checkout")
    g.add_argument("--check", action="store_true", help=f"exit 1 when {DOCS} differs from the declarations")


def cli_main(args: argparse.Namespace) -> int:
    text_ = docs_markdown()
    target = PACKAGE_ROOT / DOCS
    if args.write:
        target.write_text(text_)
        print(f"harness settings: wrote {target}")
    elif args.check:
        if not target.is_file() or target.read_text() != text_:
            print(
                f"harness settings: {DOCS} is not current: run `python -m harness settings --write`",
                file=sys.stderr,
            )
            return 1
        print(f"harness settings: {DOCS} is current")
    else:
        print(text_, end="")
    return 0
