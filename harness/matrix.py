"""The test matrix: ci/matrix.json parsed into typed, validated records.

Terms:
  backend   a column of the matrix (cpu, cuda, rocm): its image, base image, pins, container options,
            runner labels and timeouts.
  suite     a folder under tests/ that the harness runs as one pytest invocation (tests/<suite>).
  suite_env environment every suite runs with (one process, one compile thread, fixed hash seed).
  retries   how a failing suite test is run again alone in a fresh process (harness.suites.retries): `attempts`
            (reruns per test, 0: none) and `max_tests` (tests retried per suite); top-level `retries`,
            a backend's own `retries` replaces it. Without the key: DEFAULT_RETRIES.
  bench_store the lasting bench store of the CI bench jobs on the backend's runner (`bench ... --lasting B`):
            a backend's own `bench_store`, else the top-level one with `{backend}` replaced; absolute or
            starting with `~` (a runner's home), never inside the checkout (refused when used). The
            environment variable KILN_BENCH_STORE overrides it; neither: ~/.local/share/kiln/bench/B.sqlite.
  base      `base_image` names the FROM image by tag (for people; never `latest`), `base_digest` pins it by
            content (`sha256:<64 hex>`, or null while unpinned: `python -m harness image --pin` fills it on a
            machine that reaches the registry). Builds use `tag@digest` when pinned (Backend.base_ref).
  torch_index where the lock (`nox -s lock`) resolves torch's wheels (TORCH_INDEXES): "pip" (default) pip as the host
            configures it, local wheel folders included (the cpu image's `+cpu` wheels); "index" the package index
            alone, without the configuration's local wheel folders and extra indexes (PyPI's Linux x86-64 torch is
            the CUDA build, its runtime in `nvidia-*` wheels); "variant" plus KILN_TORCH_INDEX_URL/<torch_variant>
            (PyTorch's per-variant index: ROCm).

Every consumer (nox sessions, runner, repro lines, CI workflows) reads this file; nothing else
repeats these values.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.exc import MatrixError, UnknownBackend
from harness.settings import settings

SCHEMA = 1
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")
TORCH_INDEXES = ("pip", "index", "variant")  # the matrix's `torch_index` (module docstring)
_DEVICES = ("cpu", "cuda")  # torch device type the suites use; ROCm shows up as "cuda" in torch


@dataclass(frozen=True)
class Timeouts:
    """Seconds per test (pytest-timeout), per suite (container/process kill), per health check; CI job minutes."""

    test_s: int
    suite_s: int
    health_s: int
    job_min: int


@dataclass(frozen=True)
class Retries:
    """Reruns of a failing suite test, each alone in a fresh process (harness.suites.retries)."""

    attempts: int = (
        4  # reruns per failing test (0: no reruns); 4: a 30% flake is called failing < 1% (retries.py)
    )
    max_tests: int = 10  # failing tests retried per suite; the rest are reported failing without a rerun


DEFAULT_RETRIES = Retries()


@dataclass(frozen=True)
class Bootstrap:
    """How to make the base image with debootstrap when no registry serves it."""

    suite: str
    variant: str
    image: str  # the mirror comes from KILN_DEBIAN_MIRROR or apt's sources (image.debian_mirror)


@dataclass(frozen=True)
class Backend:
    """One column of the matrix."""

    name: str
    description: str
    device: str
    image: str
    dockerfile: str
    base_image: str
    bootstrap: Bootstrap | None
    python: str
    torch: str
    triton: str
    torch_variant: str  # PyTorch's wheel variant (cpu, cu130, rocm7.0); the index URL is not in the repo
    wheelhouse: bool
    container_options: tuple[str, ...]
    host_devices: tuple[str, ...]
    env: dict[str, str]
    runner_labels: tuple[str, ...]
    timeouts: Timeouts
    compile_targets: tuple[dict[str, Any], ...] = ()
    retries: Retries | None = None  # None: the matrix's top-level `retries`
    bench_store: str | None = (
        None  # the lasting bench store's path, `{backend}` replaced (None: not in the matrix)
    )
    base_digest: str | None = None  # `sha256:...` of the base image's manifest (None: pinned by tag only)
    torch_index: str = "pip"  # where the lock resolves torch (TORCH_INDEXES, module docstring)

    @property
    def base_ref(self) -> str:
        """The FROM reference: `tag@sha256:...` when the base is pinned by digest, else the tag."""
        return f"{self.base_image}@{self.base_digest}" if self.base_digest else self.base_image

    @property
    def is_gpu(self) -> bool:
        """True for backends that need a GPU on the host (cuda, rocm)."""
        return bool(self.host_devices)

    def build_args(self, base_image: str | None = None) -> dict[str, str]:
        """Docker build arguments that determine the image (hashed into its tag), in a fixed order; the
        Dockerfile's ARG defaults equal these."""
        return {
            "BASE_IMAGE": base_image or self.base_ref,
            "TORCH_SPEC": self.torch,
            "TRITON_SPEC": self.triton,
            "TORCH_VARIANT": self.torch_variant,
        }

    def index_args(self, s: Any = None) -> str:
        """pip's index arguments for the build: where packages come from, which does not change what is
        installed (not hashed). A wheelhouse build needs no index; otherwise pip's own variables and, for
        the PyTorch variant, ``KILN_TORCH_INDEX_URL``/<variant>; nothing set: pip's defaults."""
        from .settings import settings

        if self.wheelhouse:
            return "--no-index"
        s = s or settings()
        args = []
        if s.pip_index_url:
            args += ["--index-url", s.pip_index_url]
        for url in s.pip_extra_index_url.split():
            args += ["--extra-index-url", url]
        if s.torch_index_url and self.torch_index != "index":
            args += ["--extra-index-url", f"{s.torch_index_url}/{self.torch_variant}"]
        return " ".join(args)


@dataclass(frozen=True)
class Matrix:
    """The whole matrix file."""

    path: Path
    suites: tuple[str, ...]
    suite_env: dict[str, str]
    backends: dict[str, Backend] = field(default_factory=dict)
    retries: Retries = DEFAULT_RETRIES

    def retries_for(self, b: Backend) -> Retries:
        """The retry settings of backend `b`: its own `retries`, else the matrix's."""
        return b.retries or self.retries

    def backend(self, name: str) -> Backend:
        """The backend called `name`, or a clear error naming the known ones."""
        try:
            return self.backends[name]
        except KeyError:
            known = ", ".join(self.backends)
            raise UnknownBackend(f"unknown backend {name!r}: {self.path} defines {known}") from None


class _Reader:
    """Typed access to one JSON object, with errors that name the file and the key path."""

    def __init__(self, path: Path, where: str, obj: Any):
        self.path, self.where, self.obj = path, where, obj
        if not isinstance(obj, dict):
            self.fail(f"expected an object, got {type(obj).__name__}")
        self.used: set[str] = set()

    def fail(self, msg: str, key: str | None = None) -> None:
        loc = f"{self.where}.{key}" if key else self.where
        raise MatrixError(f"{self.path}: {loc or '<top>'}: {msg}")

    def get(self, key: str, kind: type | tuple[type, ...], *, optional: bool = False) -> Any:
        self.used.add(key)
        if key not in self.obj:
            if optional:
                return None
            self.fail("missing", key)
        value = self.obj[key]
        if value is None and optional:
            return None
        # bool is an int in Python; keep them apart so `true` is not accepted as a timeout
        if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
            names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
            self.fail(f"expected {names}, got {type(value).__name__} {value!r}", key)
        return value

    def str_list(self, key: str) -> tuple[str, ...]:
        value = self.get(key, list)
        if not all(isinstance(v, str) for v in value):
            self.fail("expected a list of strings", key)
        return tuple(value)

    def str_dict(self, key: str) -> dict[str, str]:
        value = self.get(key, dict)
        if not all(isinstance(v, str) for v in value.values()):
            self.fail("expected string values", key)
        return dict(value)

    def sub(self, key: str, *, optional: bool = False) -> _Reader | None:
        value = self.get(key, dict, optional=optional)
        return None if value is None else _Reader(self.path, f"{self.where}.{key}".lstrip("."), value)

    def done(self) -> None:
        extra = sorted(set(self.obj) - self.used)
        if extra:
            self.fail(f"unknown key(s) {', '.join(extra)}")


def _positive(r: _Reader, key: str) -> int:
    value = r.get(key, int)
    if value <= 0:
        r.fail(f"must be > 0, got {value}", key)
    return value


def _retries(r: _Reader, key: str = "retries") -> Retries | None:
    """An optional `retries` object: {"attempts": N >= 0, "max_tests": M >= 1} (either key may be left out)."""
    sub = r.sub(key, optional=True)
    if sub is None:
        return None
    values: dict[str, int] = {}
    for name, least in (("attempts", 0), ("max_tests", 1)):
        value = sub.get(name, int, optional=True)
        if value is not None:
            if value < least:
                sub.fail(f"must be >= {least}, got {value}", name)
            values[name] = value
    sub.done()
    return Retries(**values)


def _bench_store(r: _Reader, backend: str | None = None) -> str | None:
    """An optional `bench_store` path: absolute or `~`-relative (a path on the runner, outside the checkout);
    `{backend}` replaced when `backend` is given."""
    value = r.get("bench_store", str, optional=True)
    if value is None:
        return None
    if not value.strip() or not (value.startswith("/") or value.startswith("~")):
        r.fail(
            f"must be an absolute path or start with ~ (a path on the runner outside the checkout), "
            f"got {value!r}",
            "bench_store",
        )
    return value.replace("{backend}", backend) if backend else value


def _backend(name: str, r: _Reader, bench_store: str | None = None) -> Backend:
    t = r.sub("timeouts")
    assert t is not None
    timeouts = Timeouts(*(_positive(t, k) for k in ("test_s", "suite_s", "health_s", "job_min")))
    t.done()
    if timeouts.suite_s < timeouts.test_s:
        t.fail(f"suite_s ({timeouts.suite_s}) must be >= test_s ({timeouts.test_s})")
    b = r.sub("bootstrap", optional=True)
    bootstrap = None
    if b is not None:
        bootstrap = Bootstrap(*(b.get(k, str) for k in ("suite", "variant", "image")))
        b.done()
    device = r.get("device", str)
    if device not in _DEVICES:
        r.fail(f"must be one of {', '.join(_DEVICES)}, got {device!r}", "device")
    targets = r.get("compile_targets", list)
    if not all(isinstance(t, dict) for t in targets):
        r.fail("expected a list of objects", "compile_targets")
    backend = Backend(
        name=name,
        description=r.get("description", str),
        device=device,
        image=r.get("image", str),
        dockerfile=r.get("dockerfile", str),
        base_image=r.get("base_image", str),
        bootstrap=bootstrap,
        python=r.get("python", str),
        torch=r.get("torch", str),
        triton=r.get("triton", str),
        torch_variant=r.get("torch_variant", str),
        wheelhouse=r.get("wheelhouse", bool),
        container_options=r.str_list("container_options"),
        host_devices=r.str_list("host_devices"),
        env=r.str_dict("env"),
        runner_labels=r.str_list("runner_labels"),
        timeouts=timeouts,
        compile_targets=tuple(targets),
        retries=_retries(r),
        bench_store=_bench_store(r, name)
        or (bench_store.replace("{backend}", name) if bench_store else None),
        base_digest=r.get("base_digest", str, optional=True),
        torch_index=r.get("torch_index", str, optional=True) or "pip",
    )
    r.done()
    for key, value in (("torch", backend.torch), ("triton", backend.triton)):
        if "==" not in value:
            r.fail(f"must be an exact pin like 'pkg==1.2.3', got {value!r}", key)
    if backend.torch_index not in TORCH_INDEXES:
        r.fail(f"must be one of {', '.join(TORCH_INDEXES)}, got {backend.torch_index!r}", "torch_index")
    if ":" not in backend.base_image or backend.base_image.endswith(":latest"):
        r.fail(f"must be pinned to a tag, got {backend.base_image!r}", "base_image")
    if "@" in backend.base_image:
        r.fail(
            f"must be the tag alone; the digest goes into base_digest, got {backend.base_image!r}",
            "base_image",
        )
    if backend.base_digest is not None and not DIGEST_RE.fullmatch(backend.base_digest):
        r.fail(
            f"must be 'sha256:' and 64 hex digits (or null: not pinned), got {backend.base_digest!r}",
            "base_digest",
        )
    return backend


def parse(data: Any, path: Path) -> Matrix:
    """Validate already-decoded JSON `data` (from `path`, for messages) and build the Matrix."""
    r = _Reader(path, "", data)
    schema = r.get("schema", int)
    if schema != SCHEMA:
        r.fail(f"schema {schema} is not supported (this harness reads schema {SCHEMA})", "schema")
    suites = r.str_list("suites")
    suite_env = r.str_dict("suite_env")
    retries = _retries(r) or DEFAULT_RETRIES
    bench_store = _bench_store(r)
    raw = r.sub("backends")
    assert raw is not None
    backends = {}
    for name in raw.obj:
        sub = raw.sub(name)
        assert sub is not None
        backends[name] = _backend(name, sub, bench_store)
    r.done()
    if not backends:
        r.fail("no backends defined", "backends")
    return Matrix(path=path, suites=suites, suite_env=suite_env, backends=backends, retries=retries)


def load(path: Path | str | None = None) -> Matrix:
    """Read and validate the matrix file (default: settings().matrix_path)."""
    path = Path(path) if path else settings().matrix_path
    try:
        text = path.read_text()
    except OSError as e:
        raise MatrixError(f"cannot read matrix file {path}: {e.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise MatrixError(f"{path}: not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    return parse(data, path)


# ---- CLI: `python -m harness matrix` -------------------------------------------------------------------


def cli_add_arguments(p: Any) -> None:
    p.add_argument("--backend", help="print only this backend")
    p.add_argument("--field", help="print one field of the backend (e.g. runner_labels), as JSON")


def cli_main(args: Any) -> int:
    """Validate ci/matrix.json and print it (or one backend / field) as JSON."""
    m = load()
    if not args.backend:
        print(json.dumps({n: _as_json(b) for n, b in m.backends.items()}, indent=2))
        return 0
    data = _as_json(m.backend(args.backend))
    if args.field:
        if args.field not in data:
            raise MatrixError(f"backend {args.backend} has no field {args.field!r}")
        data = data[args.field]
    print(json.dumps(data, indent=None if args.field else 2))
    return 0


def _as_json(b: Backend) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(b)


def resolve_test_paths(root: Path, given: Sequence[str]) -> tuple[list[str], list[str]]:
    """(existing, missing) test paths: `given` paths or node ids, else the matrix's suite folders."""
    paths = list(given) if given else [f"tests/{suite}" for suite in load().suites]
    exists = [p for p in paths if (root / p.split("::", 1)[0]).exists()]
    return exists, [p for p in paths if p not in exists]


def detect_backend(m: Matrix | None = None) -> str:
    """The first GPU backend (matrix order) whose host devices all exist, else `cpu`."""
    m = m or load()
    for name, b in m.backends.items():
        if b.host_devices and all(Path(p).exists() for p in b.host_devices):
            return name
    return "cpu"
