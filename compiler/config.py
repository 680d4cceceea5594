"""Typed settings for the kiln compiler. The one module that reads environment variables.

Every knob has a field here, an environment variable ``KILN_<FIELD>`` (upper case), a type and a default.
``settings()`` returns the active values; ``patch(**overrides)`` scopes changes (for tests).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, Iterator

from .exc import ConfigError


@dataclasses.dataclass(frozen=True)
class Settings:
    """Compiler settings. Field docs double as the env var reference (``KILN_<NAME>``)."""

    #: "auto" (interpreter when no GPU is present), "1" (always the Triton interpreter), "0" (never).
    interpret: str = "auto"
    #: Folder where every graph's wrapper and every kernel's source and launch specs are written.
    dump_dir: str = ""
    #: Raise internal lowering errors instead of falling back to ATen (tests run strict).
    strict: bool = False
    #: Round to fp16/bf16 after every op whose ATen result is fp16/bf16, as eager does.
    emulate_eager_precision: bool = False
    #: Largest reduction row (elements) computed in registers in one pass on a GPU.
    persistent_rblock_max: int = 8192
    #: Same, under the interpreter (bigger blocks mean fewer, faster interpreted programs).
    interp_persistent_rblock_max: int = 65536
    #: Elements per program for pointwise kernels on a GPU.
    pointwise_xblock: int = 1024
    #: Elements per program for pointwise kernels under the interpreter.
    interp_pointwise_xblock: int = 16384
    #: Reduction chunk for looped (non-persistent) reductions on a GPU.
    looped_rblock: int = 4096
    #: Column (outer) reductions on a GPU: adjacent output columns per program.
    outer_xblock: int = 64
    #: Column (outer) reductions on a GPU: reduced rows per loop step.
    outer_rblock: int = 64
    #: Column (outer) reductions on a GPU: warps per program.
    outer_num_warps: int = 8
    #: Where generated kernel modules are written before import.
    cache_dir: str = ""
    #: Compile threads, as Inductor's: 1 compiles each kernel serially in this process at its first launch
    #: (the test suites set KILN_COMPILE_THREADS=1); more lets kiln compile kernels ahead of time in
    #: ``compile_workers`` worker processes (``runtime/precompile.py``). Default: min(8, CPU count).
    compile_threads: int = dataclasses.field(default_factory=lambda: _default_workers())
    #: Kernel compile worker processes, one pool per process shared by every graph (1: no pool).
    #: Default: min(8, CPU count).
    compile_workers: int = dataclasses.field(default_factory=lambda: _default_workers())
    #: Log every fallback at WARNING instead of INFO.
    log_fallbacks: bool = False
    #: Record each compiled graph into CUDA graphs and replay them (one recording per size key; see
    #: ``runtime/cudagraphs.py``). Also ``torch.compile(..., options={"cudagraphs": True})`` or
    #: ``mode="reduce-overhead"``.
    cudagraphs: bool = False
    #: Misaligned large matmuls (M, K or N not a multiple of 16 bytes): "bench" rewrites them where a timing
    #: on the GPU at compile time shows it pays (zero-padding, or a row-major copy of a transposed operand);
    #: "pad" and "contiguous" apply that rewrite to every one (any device); "off" never
    #: (``fx_passes.matmul_layouts``).
    mm_layout: str = "bench"
    #: Inference graphs with convolutions: "auto" runs them channels-last when all are fp16/bf16 2-D
    #: convolutions on a GPU, "always" whenever they are 2-D floating point (any device), "off" never
    #: (``fx_passes.convs_channels_last``).
    conv_layout: str = "auto"
    #: Convolutions with a bias: "auto" moves the bias out of ATen's convolution on a GPU, where ATen adds it
    #: in an elementwise kernel of its own after cuDNN's, into an add that fuses with the convolution's
    #: consumers (kiln kernels); "split" does so on any device; "keep" never (``fx_passes.split_conv_bias``).
    conv_bias: str = "auto"
    #: Eager attention in inference graphs (``softmax(q @ k^T * scale + mask) @ v`` as bmm, softmax, bmm):
    #: "auto" replaces each by one fused ATen attention call (``_scaled_dot_product_efficient_attention``) on a
    #: GPU, "fuse" on any device (the CPU's ``_scaled_dot_product_flash_attention_for_cpu``), "keep" never
    #: (``fx_attention.fuse_attention``).
    attention: str = "auto"
    #: The graph cache (``runtime/graph_cache.py``), the autotune choices (``runtime/autotune.py``) and the binary
    #: index (``runtime/binary_index.py``) on disk:
    #: "1" read and write, "read" read only (never write: jobs of a lower trust level, such as pull requests,
    #: beside a cache that trusted jobs load), "0" off.
    cache: str = "1"
    #: Authenticate the on-disk caches' entries (graph, front, autotune, binary index): each is signed with an
    #: HMAC-SHA256 keyed by ``cache_key`` (or ``cache_key_file``) and loaded only when the signature matches, so
    #: a job that cannot read the key cannot forge one (a checksum anyone can recompute proves no origin). On
    #: and without a key: those caches are off (nothing is loaded that cannot be authenticated). The harness
    #: turns it on for main's CI jobs (harness/trust.py). Off: entries carry a key's HMAC when a key is set,
    #: else a sha256 checksum, and are loaded when theirs matches.
    cache_auth: bool = False
    #: The secret that signs cache entries (a runner secret of main's jobs; README: Trust).
    cache_key: str = dataclasses.field(default="", repr=False)
    #: A file holding that secret (its bytes, surrounding whitespace dropped); ``cache_key`` wins when both are set.
    cache_key_file: str = ""
    #: Folder of the graph cache; default ``$XDG_CACHE_HOME/kiln/graphs`` (``~/.cache/kiln/graphs``).
    graph_cache_dir: str = ""
    #: Size bound of the graph cache folder in MiB (the least recently used entries go first).
    cache_max_mb: int = 2048
    #: With the graph cache on: inference graphs of static shapes whose AOTAutograd wrapper is trivial (no input
    #: mutation, no aliased output...) are also found by their Dynamo graph, so that a warm process skips
    #: AOTAutograd's tracing for them (``runtime/inference_cache.py``).
    inference_cache: bool = True
    #: With ``inference_cache`` on: training graphs of static shapes (their forward and backward both in the
    #: graph cache, AOTAutograd's wrapper trivial) are found by their Dynamo graph too, and run through kiln's
    #: own ``autograd.Function`` (``runtime/training_cache.py``).
    training_cache: bool = True
    #: Time candidate launch configs of each kernel on the GPU at its first launch and keep the fastest
    #: (cached on disk per kernel, device and size bucket). Also ``mode="max-autotune"``. No-op on the CPU.
    autotune: bool = False
    #: Folder of the autotune choices; default ``$XDG_CACHE_HOME/kiln/autotune``.
    autotune_dir: str = ""
    #: Value tracing for numerics triage (``runtime/value_trace.py``): wrappers built with it on record, after
    #: every kernel launch and extern/fallback call, statistics of its outputs as JSON lines (read by
    #: ``python -m harness numerics trace-diff``). Off: the wrapper holds no trace call at all. Graphs run
    #: without CUDA graphs while it is on (a recorded ``cudagraph`` fallback reason).
    trace_values: bool = False
    #: Where value traces go: a file, or a folder (an existing one, or a path ending in ``/``) that gets
    #: ``kiln-trace-<pid>.jsonl``; ``{pid}`` in the name is replaced. Default: ``kiln-trace-<pid>.jsonl`` in
    #: ``dump_dir`` when set, else in the current folder.
    trace_file: str = ""
    #: Floating-point sums of scatters (``index_put(accumulate=True)``, the embedding backward, ``scatter_add``,
    #: ``scatter_reduce`` sum/mean): "fixed" sums each target element's sources in one fixed order (an
    #: order-fixed kernel without atomics: bitwise identical results run to run) when the scatter has at most
    #: ``ordered_scatter_max`` source elements, and uses atomics above that; "atomic" always uses atomics. Each
    #: atomic float sum is listed in ``CompiledGraph.nondeterministic`` (kiln chose speed over run-to-run identity).
    scatter_order: str = "fixed"
    #: Mutated inputs (optimizer parameters and state) stored into by the kernel that computes their new value,
    #: with no write-back copy after it, where nothing needs their old value later (``inplace.py``).
    write_in_place: bool = True
    #: Combo kernels (``codegen/combo.py``): independent small pointwise kernels adjacent in launch order run as
    #: one launch that dispatches on program id ranges; at its first launch on a GPU a combo is timed against
    #: its parts, which run instead when they are faster (``runtime/combo.py``; cached with the autotune choices).
    combo_kernels: bool = True
    #: Most kernels one combo kernel runs.
    combo_max_parts: int = 8
    #: Most pointer arguments of one combo kernel (all its parts' together).
    combo_max_args: int = 64
    #: Largest kernel (elements) that becomes a part: bigger ones are not launch-bound.
    combo_max_numel: int = 1 << 20
    #: Source elements up to which a float-sum scatter is order-fixed (its kernel compares every source's target
    #: with every other's: quadratic work, cheap only for small scatters).
    ordered_scatter_max: int = 16384

    def cache_secret(self) -> bytes | None:
        """The key that signs cache entries (``cache_key``, else the contents of ``cache_key_file``), or None:
        unset, or a file that cannot be read or is empty (then entries are not signed)."""
        if self.cache_key:
            return self.cache_key.encode()
        if self.cache_key_file:
            try:
                with open(os.path.expanduser(self.cache_key_file), "rb") as f:
                    key = f.read().strip()
            except OSError:
                return None
            return key or None
        return None

    def cache_mode(self) -> str:
        """``cache`` as the on-disk caches apply it: "0" when ``cache_auth`` is on and there is no key."""
        if self.cache_auth and self.cache_secret() is None:
            return "0"
        return self.cache

    def resolved_cache_dir(self) -> str:
        """The kernel cache folder: ``cache_dir`` or ``$XDG_CACHE_HOME/kiln`` (``~/.cache/kiln``)."""
        if self.cache_dir:
            return self.cache_dir
        return os.path.join(_cache_home(), "kernels")

    def resolved_graph_cache_dir(self) -> str:
        """The graph cache folder: ``graph_cache_dir`` or ``$XDG_CACHE_HOME/kiln/graphs``."""
        return self.graph_cache_dir or os.path.join(_cache_home(), "graphs")

    def resolved_autotune_dir(self) -> str:
        """The autotune choices' folder: ``autotune_dir`` or ``$XDG_CACHE_HOME/kiln/autotune``."""
        return self.autotune_dir or os.path.join(_cache_home(), "autotune")

    def resolved_binary_index_dir(self) -> str:
        """The binary index's folder (``runtime/binary_index.py``; on and off with ``cache``): ``binaries`` in
        ``cache_dir`` when set (the harness sets it per trust scope, beside ``TRITON_CACHE_DIR``, whose files
        the index names), else ``$XDG_CACHE_HOME/kiln/binaries``."""
        return os.path.join(self.cache_dir or _cache_home(), "binaries")


def _cache_home() -> str:
    """``$XDG_CACHE_HOME/kiln`` (``~/.cache/kiln`` without it)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "kiln")


def _default_workers() -> int:
    return max(1, min(8, os.cpu_count() or 1))


#: the values a string setting accepts
CHOICES: dict[str, tuple[str, ...]] = {
    "interpret": ("auto", "0", "1"),
    "mm_layout": ("bench", "pad", "contiguous", "off"),
    "conv_layout": ("auto", "always", "off"),
    "conv_bias": ("auto", "split", "keep"),
    "attention": ("auto", "fuse", "keep"),
    "cache": ("1", "read", "0"),
    "scatter_order": ("fixed", "atomic"),
}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _parse(field: dataclasses.Field, raw: str) -> Any:
    name = f"KILN_{field.name.upper()}"
    if field.type in ("bool", bool):
        low = raw.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ConfigError(f"{name}={raw!r}: expected one of 1/0/true/false/yes/no/on/off")
    if field.type in ("int", int):
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(f"{name}={raw!r}: expected an integer") from None
        if value <= 0:
            raise ConfigError(f"{name}={raw!r}: expected a positive integer")
        return value
    if field.name == "cache" and raw.strip().lower() in _TRUE | _FALSE:  # KILN_CACHE=off is 0, =on is 1
        raw = "1" if raw.strip().lower() in _TRUE else "0"
    choices = CHOICES.get(field.name)
    if choices is not None and raw not in choices:
        raise ConfigError(f"{name}={raw!r}: expected {', '.join(choices[:-1])} or {choices[-1]}")
    return raw


def _validate(s: Settings) -> Settings:
    for f, choices in CHOICES.items():
        if getattr(s, f) not in choices:
            raise ConfigError(f"kiln setting {f}={getattr(s, f)!r}: expected one of {', '.join(choices)}")
    for f in ("persistent_rblock_max", "interp_persistent_rblock_max", "pointwise_xblock",
              "interp_pointwise_xblock", "looped_rblock", "outer_xblock", "outer_rblock", "outer_num_warps"):
        v = getattr(s, f)
        if v & (v - 1):
            raise ConfigError(f"KILN_{f.upper()}={v}: expected a power of two")
    return s


def interpreting() -> bool:
    """True when kernels run through Triton's interpreter in this process (``TRITON_INTERPRET=1``, which
    ``import compiler`` sets before Triton is imported when the ``interpret`` setting asks for it). The one
    place kiln reads that variable; Triton reads it once, at import."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def from_env(environ: dict[str, str] | None = None) -> Settings:
    """Build settings from ``KILN_*`` environment variables, with clear errors for bad values."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for field in dataclasses.fields(Settings):
        raw = env.get(f"KILN_{field.name.upper()}")
        if raw is not None:
            values[field.name] = _parse(field, raw)
    return _validate(Settings(**values))


_active: Settings | None = None


def settings() -> Settings:
    """The active settings (read from the environment once, then cached; ``patch`` overrides)."""
    global _active
    if _active is None:
        _active = from_env()
    return _active


def reload() -> Settings:
    """Re-read the environment (drops any state cached by ``settings()``)."""
    global _active
    _active = None
    return settings()


@contextlib.contextmanager
def patch(**overrides: Any) -> Iterator[Settings]:
    """Temporarily override fields: ``with config.patch(strict=True): ...``."""
    global _active
    old = settings()
    names = {f.name for f in dataclasses.fields(Settings)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ConfigError(f"unknown kiln setting(s): {', '.join(unknown)}")
    _active = _validate(dataclasses.replace(old, **overrides))
    try:
        yield _active
    finally:
        _active = old
