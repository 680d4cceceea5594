"""Typed settings for the kiln compiler. The one module that reads environment variables.

Every knob is declared once, as a field of ``Settings`` (``compiler/envvars.py``): its variable ``KILN_<FIELD>``
(upper case), type, default, accepted values and help text. ``settings()`` returns the active values;
``patch(**overrides)`` scopes changes (for tests). ``python -m harness settings --md`` prints the table.
``select_interpreter()`` applies the ``interpret`` setting: ``compiler.register()`` calls it before Dynamo imports
Triton, and compiling calls it again at its start (a no-op by then).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

from .envvars import FALSE_WORDS, TRUE_WORDS, count, power_of_two, read, replace, setting
from .exc import ConfigError

PREFIX = "KILN_"


#: the most compile workers by default: Inductor's cap on its compile threads, so that side by side both compilers
#: may use the same share of a large host's CPUs
MAX_DEFAULT_WORKERS = 32


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: a container's cpuset, ``taskset``), else the CPU count."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _default_workers() -> int:
    return max(1, min(MAX_DEFAULT_WORKERS, usable_cpus()))


def _cache_mode(raw: str) -> str:
    """KILN_CACHE: 1, read or 0; a boolean word (on, off, ...) is 1 or 0, empty is 0."""
    low = raw.strip().lower()
    if low in TRUE_WORDS:
        return "1"
    if low in FALSE_WORDS or not low:
        return "0"
    return raw.strip()


@dataclasses.dataclass(frozen=True)
class Settings:
    """Compiler settings, each declared once (variable ``KILN_<NAME>``, type, default, help)."""

    interpret: str = setting(
        "auto",
        choices=("auto", "0", "1"),
        help=(
            '"auto" (interpreter when no GPU is present), "1" (always the Triton interpreter), "0" (never).'
        ),
    )
    dump_dir: str = setting(
        "",
        help="Folder where every graph's wrapper and every kernel's source and launch specs are written.",
    )
    strict: bool = setting(
        False,
        help="Raise internal lowering errors instead of falling back to ATen (tests run strict).",
    )
    emulate_eager_precision: bool = setting(
        False,
        help="Round to fp16/bf16 after every op whose ATen result is fp16/bf16, as eager does.",
    )
    persistent_rblock_max: int = setting(
        8192,
        check=power_of_two,
        help="Largest reduction row (elements) computed in registers in one pass on a GPU.",
    )
    interp_persistent_rblock_max: int = setting(
        65536,
        check=power_of_two,
        help="Same, under the interpreter (bigger blocks mean fewer, faster interpreted programs).",
    )
    pointwise_xblock: int = setting(
        1024,
        check=power_of_two,
        help="Elements per program for pointwise kernels on a GPU.",
    )
    interp_pointwise_xblock: int = setting(
        16384,
        check=power_of_two,
        help="Elements per program for pointwise kernels under the interpreter.",
    )
    looped_rblock: int = setting(
        4096,
        check=power_of_two,
        help="Reduction chunk for looped (non-persistent) reductions on a GPU.",
    )
    outer_xblock: int = setting(
        64,
        check=power_of_two,
        help="Column (outer) reductions on a GPU: adjacent output columns per program.",
    )
    outer_rblock: int = setting(
        64,
        check=power_of_two,
        help="Column (outer) reductions on a GPU: reduced rows per loop step.",
    )
    outer_num_warps: int = setting(
        8,
        check=power_of_two,
        help="Column (outer) reductions on a GPU: warps per program.",
    )
    mix_programs: int = setting(
        0,
        parse=count,
        help=(
            "Programs of every mixed row/column kernel (a norm backward's row kernel that also sums columns), "
            "rounded to chunks of at least 8 rows; 0: the scheduler's rule per shape (``scheduler.mix_programs``). "
            "For A/B runs of the rule on whole models."
        ),
    )
    mix_tile_acc_cols: int = setting(
        512,
        parse=count,
        help=(
            "Mixed row/column kernels (a norm backward's row kernel that also sums columns) whose rows fit a "
            "block of at most this many elements keep each column partial sum in a full XBLOCK x RBLOCK tile "
            "and reduce it once after the loop, not each step's rows (a reduction across warps every step); 0: "
            "never. Rows of 1024 (a LayerNorm backward's two partials at 4 rows x 1024) made ptxas spill on sm_90. "
            "``python -m compiler.tools.mix_sweep --tile-acc-cols`` measures it."
        ),
    )
    cache_dir: str = setting("", help="Where generated kernel modules are written before import.")
    compile_threads: int = setting(
        default_factory=_default_workers,
        default_doc="min(32, usable CPUs)",
        help=(
            "Compile threads, as Inductor's: 1 compiles each kernel serially in this process at its first "
            "launch (the test suites set KILN_COMPILE_THREADS=1); more lets kiln compile kernels ahead of "
            "time in ``compile_workers`` worker processes (``runtime/precompile.py``). Default: min(32, usable "
            "CPUs), Inductor's rule."
        ),
    )
    compile_workers: int = setting(
        default_factory=_default_workers,
        default_doc="min(32, usable CPUs)",
        help=(
            "Kernel compile worker processes, one pool per process shared by every graph (1: no pool). "
            "Default: min(32, usable CPUs: the process's affinity), Inductor's rule."
        ),
    )
    log_fallbacks: bool = setting(False, help="Log every fallback at WARNING instead of INFO.")
    cudagraphs: bool = setting(
        False,
        help=(
            "Record each compiled graph into CUDA graphs and replay them (one recording per size key; see "
            '``runtime/cudagraphs.py``). Also ``torch.compile(..., options={"cudagraphs": True})`` or '
            '``mode="reduce-overhead"``.'
        ),
    )
    mm_layout: str = setting(
        "bench",
        choices=("bench", "pad", "contiguous", "off"),
        help=(
            'Misaligned large matmuls (M, K or N not a multiple of 16 bytes): "bench" rewrites them where a '
            "timing on the GPU at compile time shows it pays (zero-padding, or a row-major copy of a "
            'transposed operand); "pad" and "contiguous" apply that rewrite to every one (any device); "off" '
            "never (``fx_passes.matmul_layouts``)."
        ),
    )
    addmm_bias: str = setting(
        "bench",
        choices=("bench", "lt", "expand", "mm"),
        help=(
            'The form of each linear layer\'s ``addmm`` (a 1-D bias): "bench" times the forms on the GPU at '
            'compile time and keeps the fastest; "lt" keeps the 1-D bias (cuBLASLt, the bias in the GEMM\'s '
            "epilogue), \"expand\" passes it expanded to the output's shape (cuBLAS with beta 1, Inductor's "
            'form), "mm" multiplies without it and adds it in kiln\'s consumer kernel where every consumer is '
            "pointwise (any device) (``fx_addmm``)."
        ),
    )
    conv_layout: str = setting(
        "auto",
        choices=("auto", "always", "off"),
        help=(
            'Inference graphs with convolutions: "auto" runs them channels-last when all are fp16/bf16 2-D '
            'convolutions on a GPU, "always" whenever they are 2-D floating point (any device), "off" never '
            "(``fx_passes.convs_channels_last``)."
        ),
    )
    conv_bias: str = setting(
        "auto",
        choices=("auto", "split", "keep"),
        help=(
            'Convolutions with a bias: "auto" moves the bias out of ATen\'s convolution on a GPU, where ATen '
            "adds it in an elementwise kernel of its own after cuDNN's, into an add that fuses with the "
            'convolution\'s consumers (kiln kernels); "split" does so on any device; "keep" never '
            "(``fx_passes.split_conv_bias``)."
        ),
    )
    attention: str = setting(
        "auto",
        choices=("auto", "fuse", "keep"),
        help=(
            "Eager attention in inference graphs (``softmax(q @ k^T * scale + mask) @ v`` as bmm, softmax, "
            'bmm): "auto" replaces each by one fused ATen attention call '
            '(``_scaled_dot_product_efficient_attention``) on a GPU, "fuse" on any device (the CPU\'s '
            '``_scaled_dot_product_flash_attention_for_cpu``), "keep" never '
            "(``fx_attention.fuse_attention``)."
        ),
    )
    cache: str = setting(
        "1",
        choices=("1", "read", "0"),
        parse=_cache_mode,
        help=(
            "The graph cache (``runtime/graph_cache.py``), the autotune choices (``runtime/autotune.py``) and "
            'the binary index (``runtime/binary_index.py``) on disk: "1" read and write, "read" read only '
            "(never write: jobs of a lower trust level, such as pull requests, beside a cache that trusted "
            'jobs load), "0" off.'
        ),
    )
    cache_auth: bool = setting(
        False,
        help=(
            "Authenticate the on-disk caches' entries (graph, front, autotune, binary index): each is signed "
            "with an HMAC-SHA256 keyed by ``cache_key`` (or ``cache_key_file``) and loaded only when the "
            "signature matches, so a job that cannot read the key cannot forge one (a checksum anyone can "
            "recompute proves no origin). On and without a key: those caches are off (nothing is loaded that "
            "cannot be authenticated). The harness turns it on for main's CI jobs (harness/trust.py). Off: "
            "entries carry a key's HMAC when a key is set, else a sha256 checksum, and are loaded when theirs "
            "matches."
        ),
    )
    cache_key: str = setting(
        "",
        secret=True,
        help="The secret that signs cache entries (a runner secret of main's jobs; README: Trust).",
    )
    cache_key_file: str = setting(
        "",
        help=(
            "A file holding that secret (its bytes, surrounding whitespace dropped); ``cache_key`` wins when "
            "both are set."
        ),
    )
    graph_cache_dir: str = setting(
        "",
        help="Folder of the graph cache; default ``$XDG_CACHE_HOME/kiln/graphs`` (``~/.cache/kiln/graphs``).",
    )
    cache_max_mb: int = setting(
        2048,
        help="Size bound of the graph cache folder in MiB (the least recently used entries go first).",
    )
    inference_cache: bool = setting(
        True,
        help=(
            "With the graph cache on: inference graphs of static shapes whose AOTAutograd wrapper is trivial "
            "(no input mutation, no aliased output...) are also found by their Dynamo graph, so that a warm "
            "process skips AOTAutograd's tracing for them (``runtime/inference_cache.py``)."
        ),
    )
    training_cache: bool = setting(
        True,
        help=(
            "With ``inference_cache`` on: training graphs of static shapes (their forward and backward both "
            "in the graph cache, AOTAutograd's wrapper trivial) are found by their Dynamo graph too, and run "
            "through kiln's own ``autograd.Function`` (``runtime/training_cache.py``)."
        ),
    )
    autotune: bool = setting(
        False,
        help=(
            "Time candidate launch configs of each kernel on the GPU at its first launch and keep the fastest "
            '(cached on disk per kernel, device and size bucket). Also ``mode="max-autotune"``. No-op on the '
            "CPU."
        ),
    )
    autotune_dir: str = setting(
        "",
        help="Folder of the autotune choices; default ``$XDG_CACHE_HOME/kiln/autotune``.",
    )
    trace_values: bool = setting(
        False,
        help=(
            "Value tracing for numerics triage (``runtime/value_trace.py``): wrappers built with it on "
            "record, after every kernel launch and extern/fallback call, statistics of its outputs as JSON "
            "lines (read by ``python -m harness numerics trace-diff``). Off: the wrapper holds no trace call "
            "at all. Graphs run without CUDA graphs while it is on (a recorded ``cudagraph`` fallback "
            "reason)."
        ),
    )
    trace_file: str = setting(
        "",
        help=(
            "Where value traces go: a file, or a folder (an existing one, or a path ending in ``/``) that "
            "gets ``kiln-trace-<pid>.jsonl``; ``{pid}`` in the name is replaced. Default: "
            "``kiln-trace-<pid>.jsonl`` in ``dump_dir`` when set, else in the current folder."
        ),
    )
    scatter_order: str = setting(
        "fixed",
        choices=("fixed", "atomic"),
        help=(
            "Floating-point sums of scatters (``index_put(accumulate=True)``, the embedding backward, "
            '``scatter_add``, ``scatter_reduce`` sum/mean): "fixed" sums each target element\'s sources in one '
            "fixed order (an order-fixed kernel without atomics: bitwise identical results run to run) when "
            "the scatter has at most ``ordered_scatter_max`` source elements, and uses atomics above that; "
            '"atomic" always uses atomics. Each atomic float sum is listed in '
            "``CompiledGraph.nondeterministic`` (kiln chose speed over run-to-run identity)."
        ),
    )
    ordered_scatter_max: int = setting(
        16384,
        help=(
            "Source elements up to which a float-sum scatter is order-fixed (its kernel compares every "
            "source's target with every other's: quadratic work, cheap only for small scatters)."
        ),
    )
    write_in_place: bool = setting(
        True,
        help=(
            "Mutated inputs (optimizer parameters and state) stored into by the kernel that computes their new "
            "value, with no write-back copy after it, where nothing needs their old value later (``inplace.py``)."
        ),
    )
    combo_kernels: bool = setting(
        True,
        help=(
            "Combo kernels (``codegen/combo.py``): independent small pointwise kernels (a small pointwise "
            "kernel's independent parts split apart first: ``split.py``) run as one launch that dispatches on "
            "program id ranges; at its first launch on a GPU a combo is timed against its parts, which run "
            "instead when they are faster (``runtime/combo.py``; cached with the autotune choices)."
        ),
    )
    combo_max_parts: int = setting(64, help="Most kernels one combo kernel runs.")
    combo_max_args: int = setting(
        240,
        help=(
            "Most arguments of one combo kernel: its parts' pointers and one size per part (a kernel's "
            "parameters share a few kilobytes of launch memory, and its compile time grows with its parts)."
        ),
    )
    combo_max_numel: int = setting(
        1 << 20,
        help="Largest kernel (elements) that becomes a combo part: bigger ones are not launch-bound.",
    )

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


def interpreting() -> bool:
    """True when kernels run through Triton's interpreter in this process (``TRITON_INTERPRET=1``, set by
    ``select_interpreter`` when the ``interpret`` setting asks for it). The one place kiln reads that variable;
    Triton reads it when a function is decorated with ``@triton.jit``, its own library's included."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


_selected = False


def select_interpreter() -> bool:
    """Apply the ``interpret`` setting once per process: "1" (or "auto" without a CUDA/ROCm device) sets
    ``TRITON_INTERPRET=1`` so that kernels run on CPU tensors through Triton's interpreter; "0" leaves it.
    Called by ``compiler.register()`` (before Dynamo imports ``triton.language``, whose own ``@jit`` helpers
    must be built as interpreted functions) and at the start of every compile; never by ``import compiler``
    alone. Returns ``interpreting()``. A bad setting raises ConfigError."""
    global _selected
    if _selected:
        return interpreting()
    mode = settings().interpret
    _selected = True
    if not interpreting() and mode != "0" and not (mode == "auto" and _has_gpu()):
        if "triton.language" in sys.modules:  # its @jit helpers are compiled functions already: too late
            logging.getLogger("kiln").warning(
                "kiln: triton was imported before kiln chose Triton's interpreter; CPU graphs will fail and fall "
                "back to ATen. Call compiler.register() (or `import compiler` after torch) before torch.compile, "
                "or set TRITON_INTERPRET=1."
            )
            return False
        os.environ["TRITON_INTERPRET"] = "1"
    if interpreting():
        # triton imports gluon lazily at its first launch; do it now, outside the interpreter's patched scope
        try:
            import triton.experimental.gluon  # noqa: F401
        except Exception:  # older tritons have no gluon
            pass
    return interpreting()


def _has_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def from_env(environ: dict[str, str] | None = None) -> Settings:
    """Build settings from ``KILN_*`` environment variables, with clear errors for bad values."""
    env = os.environ if environ is None else environ
    return read(Settings, env, prefix=PREFIX, error=ConfigError, empty_is_unset=False)


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
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(Settings)})
    if unknown:
        raise ConfigError(f"unknown kiln setting(s): {', '.join(unknown)}")
    _active = replace(old, overrides, prefix=PREFIX, error=ConfigError)
    try:
        yield _active
    finally:
        _active = old
