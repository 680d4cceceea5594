"""Graph rewrites on the ATen FX graph before lowering: layouts that make ATen's extern kernels fast.

Terms:
- *misaligned matmul*: an ``mm``/``addmm``/``bmm`` whose M, K or N is not a multiple of 16 bytes' worth of
  elements. cuBLAS then picks kernels that load one element at a time (``..._align1``): GPT-2's tied LM
  head (N = 50257, B transposed) ran 1.65 ms in such a kernel on the H100, 0.24 ms once N was padded.
- *padding a matmul*: zero-pad the operands (zeros in K add nothing), multiply, slice the result back to
  M x N. The slice is a view, so consumers read it in place. A graph output gets a copy in eager's layout
  (the backward graph and the caller were traced against those strides), except in inference graphs, whose
  outputs reach the caller as they are (AOTAutograd regenerates no views there): those keep the padded row
  stride, as Inductor's padded matmuls do (BERT's LM head on the H100: 0.24 ms, 0.41 ms with the copy back,
  0.45 ms unpadded). The other rewrite, *contiguous*,
  copies a transposed operand (``w.t()`` of a tied embedding) to row-major, after which cuBLAS picks
  aligned kernels for the odd N itself and the output needs no slicing. Under ``mm_layout=bench`` the
  rewrite is chosen by timing both against the plain matmul on the GPU at compile time.
- *channels-last*: NHWC strides for 4-D activations. cuDNN runs fp16/bf16 convolutions in NHWC; given NCHW
  tensors it transposes in and out around every convolution (ResNet-50: 67 transposes, 0.6 ms a step).
  Converting the graph's convolution inputs and weights once makes every activation NHWC, since ATen's
  convolutions and kiln's kernels keep the layout of their inputs. In training, the forward's saved
  activations stay NHWC: the forward reports their strides to AOTAutograd (``moved_output_strides``), the
  backward adopts them (``adopt_input_strides``) and runs its ``convolution_backward`` ops NHWC too.

Both rewrites recompute the FX metadata (FakeTensors) of what they change, and keep every graph output in
the layout eager gave it (a training forward's saved activations excepted).
"""

from __future__ import annotations

import functools
import logging
import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.fx as fx

from . import config, dtypes

if TYPE_CHECKING:
    from torch._subclasses.fake_tensor import FakeTensor

log = logging.getLogger("kiln")
aten = torch.ops.aten

ALIGN_BYTES = 16
#: below this many multiply-adds a misaligned matmul is not worth a second look (pad copies cost more)
PAD_MIN_MACS = 1 << 26
#: under KILN_MM_LAYOUT=bench, rewrite a matmul only when the rewrite (copies and slices included) is this much faster
PAD_MIN_SPEEDUP = 1.1
#: matmul ops -> (index of the first operand, index of the second operand)
MATMULS: dict[Any, tuple[int, int]] = {
    aten.mm.default: (0, 1),
    aten.bmm.default: (0, 1),
    aten.addmm.default: (1, 2),
}
#: dtypes whose matmuls the layout rewrites consider (fp64 has no tensor-core kernels to reach)
FLOAT_DTYPES = tuple(d for d in dtypes.FLOAT if d != torch.float64)


# ---------------------------------------------------------------------------------------- helpers
def meta_val(n: Any) -> Any:
    return n.meta.get("val") if isinstance(n, fx.Node) else n


def fake_mode_of(gm: fx.GraphModule) -> Any:
    """The FakeTensorMode the graph was traced in (the active tracing context's, else its FakeTensors')."""
    from torch._guards import detect_fake_mode

    return detect_fake_mode([n.meta.get("val") for n in gm.graph.nodes])


def _static(*sizes: Any) -> bool:
    return all(isinstance(s, int) for s in sizes)


def _same_strides(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same layout: strides provably equal in every dim longer than 1 (symbolic ones compared without
    adding guards)."""
    return a.dim() == b.dim() and all(
        _known_equal(size, 1) or _known_equal(x, y) for size, x, y in zip(a.shape, a.stride(), b.stride())
    )


def _known_equal(x: Any, y: Any) -> bool:
    """Whether two sizes are provably equal (symbolic ones compared without adding guards)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return x == y if isinstance(x, int) and isinstance(y, int) else statically_known_true(x == y)


def _same_geometry(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, strides (every dim) and storage offset, provably."""
    return (
        a.dim() == b.dim()
        and all(_known_equal(x, y) for x, y in zip(a.shape, b.shape))
        and all(_known_equal(x, y) for x, y in zip(a.stride(), b.stride()))
        and _known_equal(a.storage_offset(), b.storage_offset())
    )


def _tensors(val: Any) -> list[torch.Tensor]:
    """The tensors of a node's value: itself, or the tensors of a tuple or list of results."""
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (tuple, list)):
        return [t for v in val for t in _tensors(v)]
    return []


def _same_values(a: Any, b: Any) -> bool:
    """Whether two node values have the same structure and, tensor by tensor, the same shape, strides,
    storage offset, dtype and device (other values: the same object, or equal plain values)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        return a.dtype == b.dtype and a.device == b.device and _same_geometry(a, b)
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same_values(x, y) for x, y in zip(a, b))
    if a is b:
        return True
    return type(a) is type(b) and isinstance(a, (int, float, bool, str, type(None))) and a == b


def _aliases(val: Any, inputs: list[torch.Tensor]) -> bool:
    """Whether a tensor of ``val`` shares storage with one of ``inputs`` (a view or an in-place result)."""
    storages = {t.untyped_storage()._cdata for t in inputs}
    return any(t.untyped_storage()._cdata in storages for t in _tensors(val))


def _mode(val: torch.Tensor) -> Any:
    """The fake mode of ``val``, a node's ``meta["val"]`` (a FakeTensor, typed as the tensor it stands for)."""
    return cast("FakeTensor", val).fake_mode


def _like(val: torch.Tensor, fmt: torch.memory_format) -> torch.Tensor:
    """An empty FakeTensor of ``val``'s size in memory format ``fmt`` (``val`` itself where ``fmt`` does not
    apply to its rank)."""
    if fmt is torch.channels_last and val.dim() != 4:
        return val
    with _mode(val):
        return torch.empty(val.shape, dtype=val.dtype, device=val.device, memory_format=fmt)


def graph_outputs(gm: fx.GraphModule) -> list[Any]:
    """The graph's outputs in order (nodes, or constants such as None), as a new list."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0]
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _set_graph_outputs(gm: fx.GraphModule, outs: list[Any]) -> None:
    node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    old = node.args[0]
    node.args = (type(old)(outs) if isinstance(old, (list, tuple)) else outs[0],) + tuple(node.args[1:])


def moved_output_strides(before: list[Any], gm: fx.GraphModule) -> list[tuple[int, ...] | None] | None:
    """Per graph output, its new strides where a rewrite changed its layout from ``before`` (the outputs'
    FakeTensors before the passes), else None; None when no output moved. This is what a forward reports to
    AOTAutograd (``TracingContext.output_strides``), which then compiles the backward against the saved
    activations' real layout."""
    strides: list[tuple[int, ...] | None] = []
    for old, node in zip(before, graph_outputs(gm)):
        new = meta_val(node)
        moved = (
            isinstance(old, torch.Tensor)
            and isinstance(new, torch.Tensor)
            and _static(*new.stride())
            and not _same_strides(old, new)
        )
        strides.append(tuple(int(s) for s in new.stride()) if moved else None)
    return strides if any(s is not None for s in strides) else None


def adopt_input_strides(gm: fx.GraphModule, example_inputs: list[Any]) -> int:
    """Trace the graph against the strides its inputs really have, where they differ from the traced ones.

    A backward's saved activations arrive laid out as its forward made them (channels-last, see
    ``convs_channels_last``), and AOTAutograd hands the backward compiler example inputs with those strides
    while the graph's placeholders still carry the traced ones. Kernels index inputs by the placeholders'
    strides, so they are replaced and every FakeTensor downstream recomputed (graph outputs keep their
    layout). Where an op rejects the new layout, the graph instead copies each such input into its traced
    layout first (always correct, one copy each). Returns the number of placeholders whose strides changed.
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    moved: list[tuple[fx.Node, torch.Tensor, torch.Tensor]] = []
    for ph, ex in zip(placeholders, example_inputs):
        val = ph.meta.get("val")
        if not (isinstance(val, torch.Tensor) and isinstance(ex, torch.Tensor)) or val.dim() != ex.dim():
            continue
        if _static(*val.shape, *val.stride(), *ex.stride()) and tuple(val.stride()) != tuple(ex.stride()):
            with _mode(val):
                real = torch.empty_strided(
                    val.shape, tuple(int(s) for s in ex.stride()), dtype=val.dtype, device=val.device
                )
            moved.append((ph, val, real))
    if not moved:
        return 0
    rw = Rewrite(gm, _mode(moved[0][1]))
    for ph, _, real in moved:
        ph.meta["val"] = real
    if rw.commit(changed=True):
        return len(moved)
    for ph, traced, real in moved:  # rolled back: every consumer reads a copy in the traced layout
        ph.meta["val"] = real
        users = list(ph.users)
        with gm.graph.inserting_after(ph):
            empty = gm.graph.call_function(
                aten.empty_strided.default,
                (list(traced.shape), list(traced.stride())),
                {"dtype": traced.dtype, "device": traced.device},
            )
        with gm.graph.inserting_after(empty):
            copy = gm.graph.call_function(aten.copy.default, (empty, ph))
        with _mode(traced):
            empty.meta["val"] = torch.empty_strided(
                traced.shape, traced.stride(), dtype=traced.dtype, device=traced.device
            )
        copy.meta["val"] = traced
        for u in users:
            u.replace_input_with(ph, copy)
    gm.graph.lint()
    gm.recompile()
    return len(moved)


class Rewrite:
    """One pass's edits of a graph, made whole or not at all.

    ``node(...)`` inserts a node (its FakeTensor comes with the propagation in ``commit()``), ``replace(old,
    new)`` moves ``old``'s users to ``new``. ``commit()`` recomputes the FakeTensors the edits reach
    (``_propagate``: a new layout changes the strides of every view and op downstream), gives each graph
    output whose strides moved a copy laid out as before (the caller and the backward graph were traced
    against those strides), and drops the replaced nodes.
    When an op rejects the new layout (a ``view`` that cannot be expressed on it) the graph is restored.
    """

    def __init__(self, gm: fx.GraphModule, mode: Any, free_outputs: frozenset[int] = frozenset()):
        self.gm, self.graph, self.mode = gm, gm.graph, mode
        self.free_outputs = (
            free_outputs  # output positions whose layout may change (saved for a backward, or inference)
        )
        self.out_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
        self.saved = {n: n.meta.get("val") for n in gm.graph.nodes}
        self.added: list[fx.Node] = []
        self.replaced: list[tuple[fx.Node, fx.Node]] = []

    def node(self, target: Any, args: tuple, kwargs: dict | None = None) -> fx.Node:
        n = self.graph.call_function(target, args, kwargs or {})
        self.added.append(n)
        return n

    def replace(self, old: fx.Node, new: fx.Node) -> None:
        old.replace_all_uses_with(new)
        self.replaced.append((old, new))

    def commit(self, changed: bool = False) -> bool:
        """Apply the edits (``changed``: placeholders' FakeTensors were replaced, even with no node added);
        False when there was nothing to do or the graph was rolled back."""
        if not self.added and not changed:
            return False
        try:
            self._propagate()
        except Exception as e:  # noqa: BLE001 - an op rejects the new layout: keep the graph as it was
            log.info(
                "kiln: a layout rewrite failed to propagate (%s: %s); graph left as it was",
                type(e).__name__,
                e,
            )
            self.rollback()
            return False
        before = dict(self.saved)
        for old, new in self.replaced:
            before[new] = self.saved[old]
            self.graph.erase_node(old)
        outs = graph_outputs(self.gm)
        restored: dict[fx.Node, fx.Node] = {}
        for i, arg in enumerate(outs):
            if i in self.free_outputs or not isinstance(arg, fx.Node) or arg not in before:
                continue
            if arg not in restored:
                restored[arg] = self._keep_layout(arg, before[arg])
            outs[i] = restored[arg]
        _set_graph_outputs(self.gm, outs)
        self.graph.lint()
        self.gm.recompile()
        return True

    def _propagate(self) -> None:
        """Recompute the FakeTensors the edits can change, in graph order: the added nodes', and those of every
        node reading a node whose FakeTensor is new (a placeholder given one, an added node, a replacement, and
        onward). A recomputed value equal to the one it had (shape, strides, offset, dtype, device) that does
        not alias its inputs keeps its old FakeTensor, and its readers are not visited: the nodes downstream
        of an edit that changes no layout (a bias moved out of a convolution) keep theirs, and storage
        identity, which tells views from copies, stays consistent. A full propagation over a MobileNet-sized
        graph costs about as much as the rest of the layout pass, once per rewrite."""
        from torch.fx.passes.fake_tensor_prop import FakeTensorProp

        dirty: set[fx.Node] = set(self.added)
        for n in self.added:
            dirty.update(n.users)
        for _, new in self.replaced:
            dirty.update(new.users)
        for n, val in self.saved.items():
            if n.meta.get("val") is not val:  # a placeholder given a new FakeTensor by the caller
                dirty.update(n.users)
        if not dirty:
            return
        prop = FakeTensorProp(self.gm, mode=self.mode)
        with self.mode:
            for n in self.graph.nodes:
                if n not in dirty or n.op in ("placeholder", "output", "get_attr"):
                    continue
                old = n.meta.get("val")
                prop.env = {a: a.meta.get("val") for a in n.all_input_nodes}
                prop.run_node(n)
                new = n.meta.get("val")
                if (
                    old is not None
                    and _same_values(old, new)
                    and not _aliases(new, [v for a in n.all_input_nodes for v in _tensors(a.meta.get("val"))])
                ):
                    n.meta["val"] = old
                else:
                    dirty.update(n.users)

    def _keep_layout(self, arg: fx.Node, old_val: Any) -> fx.Node:
        """``arg`` itself when its layout did not move, else a copy of it laid out as ``old_val``."""
        new_val = meta_val(arg)
        if not (isinstance(old_val, torch.Tensor) and isinstance(new_val, torch.Tensor)):
            return arg
        if _same_strides(old_val, new_val):
            return arg
        kwargs: dict[str, Any] = {}
        for fmt in (torch.contiguous_format, torch.channels_last):  # so that ATen running the graph agrees
            if _same_strides(old_val, _like(old_val, fmt)):
                kwargs = {"memory_format": fmt}
                break
        with self.graph.inserting_before(self.out_node):
            copy = self.graph.call_function(aten.clone.default, (arg,), kwargs)
        copy.meta["val"] = old_val  # kiln realizes a graph output with its FakeTensor's strides, dense or not
        return copy

    def rollback(self) -> None:
        for old, new in reversed(self.replaced):
            new.replace_all_uses_with(old)
        for n in reversed(self.added):
            if n.users:  # a copy put in front of a user (channels-last): the user reads the original again
                original = n.args[0]
                assert isinstance(original, fx.Node)  # the copies this rewrite adds read a node
                n.replace_all_uses_with(original)
            self.graph.erase_node(n)
        for n, v in self.saved.items():
            n.meta["val"] = v
        self.gm.recompile()


# ---------------------------------------------------------------------------------------- mm_layout
def _misaligned(node: fx.Node) -> tuple[int, int, int] | None:
    """(pad M, pad K, pad N) of a misaligned, large matmul on floats; None when it is aligned or small."""
    ia, ib = MATMULS[node.target]
    if node.target is aten.addmm.default and (
        node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1
    ):
        return None
    out, a, b = meta_val(node), meta_val(node.args[ia]), meta_val(node.args[ib])
    if not all(isinstance(t, torch.Tensor) for t in (out, a, b)) or out.dtype not in FLOAT_DTYPES:
        return None
    (m, k), n = a.shape[-2:], b.shape[-1]
    batch = a.shape[0] if a.dim() == 3 else 1
    if not _static(m, k, n, batch, *a.stride(), *b.stride()) or batch * m * n * k < PAD_MIN_MACS:
        return None
    align = ALIGN_BYTES // out.element_size()
    pads = ((-m) % align, (-k) % align, (-n) % align)
    return pads if any(pads) else None


def _column_major(t: Any) -> bool:
    """A matrix (or batch of them) stored transposed: unit stride down its rows (``w.t()`` of a weight)."""
    return t.dim() >= 2 and t.stride(-2) == 1 and t.stride(-1) != 1 and t.shape[-1] > 1


def _candidates(a: Any, b: Any) -> list[str]:
    """Rewrites that apply: ``pad`` always; ``contiguous`` (copy transposed operands to row-major, which
    lets cuBLAS pick aligned kernels for an odd N on the H100) when an operand is column-major."""
    return ["pad"] + (["contiguous"] if _column_major(a) or _column_major(b) else [])


#: a sleep kernel this long (GPU cycles, about a millisecond) queued before each timing lets the host enqueue
#: every call before the GPU reaches them: the timing is device time, not the host's launch latency
SLEEP_CYCLES = 2_000_000


#: a call at least this long (ms) is timed alone, in LONG_REPS timings: its spread is far below the margins the
#: timings decide on (PAD_MIN_SPEEDUP, fx_addmm's), and GPT-2's misaligned LM-head products (2-3 ms each in fp32)
#: took 7 x 5 calls a form, 0.76 s of a training graph's compile on an H200
LONG_CALL_MS = 0.25
LONG_REPS = 3


def timing_plan(first_ms: float, reps: int, inner: int) -> tuple[int, int]:
    """(timings, calls per timing) for a call that took ``first_ms`` once: the requested ``reps`` x ``inner``,
    or ``LONG_REPS`` timings of one call for a call of ``LONG_CALL_MS`` or more."""
    return (min(reps, LONG_REPS), 1) if first_ms >= LONG_CALL_MS else (reps, inner)


def _timed_ms(fn: Callable[[], Any], inner: int) -> float:
    """One timing: ``inner`` calls queued behind a sleep kernel, ms per call."""
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(SLEEP_CYCLES)
    s.record()
    for _ in range(inner):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / inner


def bench_ms(fn: Callable[[], Any], reps: int = 7, inner: int = 5) -> float:
    """Device milliseconds of one call of ``fn`` on the current CUDA device: the median over ``reps`` timings
    of ``inner`` calls back to back, each timing queued behind a sleep kernel, so that what is measured is the
    kernels' time as a CUDA-graph replay runs them (timed one call at a time, small matmuls read the host's
    dispatch latency: 50-180 us for products of 10-30 us). A long call is timed fewer times (``timing_plan``;
    the first timing, of one call, counts among them)."""
    for _ in range(2):
        fn()
    first = _timed_ms(fn, 1)
    reps, inner = timing_plan(first, reps, inner)
    times = [first] if inner == 1 else []
    times += [_timed_ms(fn, inner) for _ in range(reps - len(times))]
    return statistics.median(times)


def random_strided(geom: tuple, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Random data of a (size, stride) geometry on ``gen``'s device: the operand a compile-time timing runs on."""
    size, stride = geom
    span = 1 + sum((s - 1) * st for s, st in zip(size, stride))
    flat = torch.randn(span, generator=gen, device=gen.device, dtype=torch.float32).to(dtype)
    return flat.as_strided(size, stride)


def _padded(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Eager twin of ``_pad``: zero-padded in its own layout."""
    if not rows and not cols:
        return x
    if _column_major(x):
        return torch.nn.functional.pad(x.mT, (0, rows, 0, cols)).mT
    return torch.nn.functional.pad(x, (0, cols, 0, rows))


@functools.lru_cache(maxsize=256)
def _fastest(
    target: Any,
    a_geom: tuple,
    b_geom: tuple,
    dtype: torch.dtype,
    device: str,
    pads: tuple[int, int, int],
    copy_out: bool,
) -> str | None:
    """The fastest rewrite of a matmul, timed on random data of its sizes and strides against the matmul as
    it is (copies and slices included, and for a graph output the copy back to eager's layout); None
    unless one is ``PAD_MIN_SPEEDUP`` faster. Cached per geometry for the process."""
    from torch.utils._mode_utils import no_dispatch

    with no_dispatch(), torch.no_grad():  # real tensors, even when called under a FakeTensorMode
        gen = torch.Generator(device=device).manual_seed(0)
        a, b = random_strided(a_geom, dtype, gen), random_strided(b_geom, dtype, gen)
        mm = torch.bmm if target is aten.bmm.default else torch.mm
        pm, pk, pn = pads

        def padded() -> torch.Tensor:
            r = mm(_padded(a, pm, pk), _padded(b, pk, pn))[..., : a.shape[-2], : b.shape[-1]]
            return r.contiguous() if copy_out else r

        def contiguous() -> torch.Tensor:
            return mm(a.contiguous(), b.contiguous())

        runs = {"pad": padded, "contiguous": contiguous}
        plain = bench_ms(lambda: mm(a, b))
        times = {name: bench_ms(runs[name]) for name in _candidates(a, b)}
    best = min(times, key=times.__getitem__)
    log.debug(
        "kiln mm_layout %s x %s %s: plain %.3f ms, %s",
        a_geom,
        b_geom,
        dtype,
        plain,
        ", ".join(f"{k} {v:.3f} ms" for k, v in times.items()),
    )
    return best if plain > PAD_MIN_SPEEDUP * times[best] else None


def _choose(node: fx.Node, pads: tuple[int, int, int], free_outputs: bool = False) -> str | None:
    """The rewrite for a misaligned matmul under the ``mm_layout`` setting, or None (``free_outputs``: a
    graph output may keep the padded layout, no copy back timed)."""
    mode = config.settings().mm_layout
    ia, ib = MATMULS[node.target]
    out, a, b = meta_val(node), meta_val(node.args[ia]), meta_val(node.args[ib])
    if mode in ("pad", "contiguous"):
        return mode if mode in _candidates(a, b) else None
    if mode == "off" or out.device.type != "cuda" or config.interpreting() or not torch.cuda.is_available():
        return None
    target = aten.bmm.default if node.target is aten.bmm.default else aten.mm.default
    copy_out = not free_outputs and any(u.op == "output" for u in through_views(node))
    try:
        return _fastest(
            target,
            (tuple(a.shape), tuple(a.stride())),
            (tuple(b.shape), tuple(b.stride())),
            out.dtype,
            str(out.device),
            pads,
            copy_out,
        )
    except Exception as e:  # noqa: BLE001 - a failed measurement (out of memory) means: leave it alone
        log.info("kiln mm_layout: timing %s failed (%s: %s); left as it is", node.name, type(e).__name__, e)
        return None


def _pad(rw: Rewrite, x: fx.Node, rows: int, cols: int) -> fx.Node:
    """``x`` zero-padded by ``rows`` in its second-to-last dim and ``cols`` in its last, in its own layout:
    a column-major operand is padded through its transpose, so the copy reads and writes in order."""
    if not rows and not cols:
        return x
    if meta_val(x).dim() == 1:  # a 1-D bias has no rows
        return rw.node(aten.constant_pad_nd.default, (x, [0, cols], 0.0))
    if _column_major(meta_val(x)):
        dims = list(range(meta_val(x).dim()))
        dims[-2], dims[-1] = dims[-1], dims[-2]
        t = rw.node(aten.permute.default, (x, dims))
        return rw.node(
            aten.permute.default, (rw.node(aten.constant_pad_nd.default, (t, [0, rows, 0, cols], 0.0)), dims)
        )
    return rw.node(aten.constant_pad_nd.default, (x, [0, cols, 0, rows], 0.0))


def _row_major(rw: Rewrite, x: fx.Node) -> fx.Node:
    if not _column_major(meta_val(x)):
        return x
    return rw.node(aten.clone.default, (x,), {"memory_format": torch.contiguous_format})


#: ops whose result is a view of their first argument: a graph output reached through them shows the
#: matmul's layout (HF models return ``addmm(...).view(batch, seq, vocab)``)
VIEW_OPS = (
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.slice.Tensor,
    aten.unsqueeze.default,
    aten.squeeze.dim,
    aten.expand.default,
)


def through_views(node: fx.Node) -> list[fx.Node]:
    """``node``'s users and, through the views of it, their users (breadth first, without repeats)."""
    seen: dict[fx.Node, None] = {}
    todo = list(node.users)
    while todo:
        u = todo.pop(0)
        if u in seen:
            continue
        seen[u] = None
        if u.op == "call_function" and u.target in VIEW_OPS and u.args and u.args[0] in seen | {node: None}:
            todo.extend(u.users)
    return list(seen)


def matmul_layouts(gm: fx.GraphModule, free_outputs: bool = False) -> int:
    """Rewrite misaligned large matmuls (module docstring) where that pays; returns how many changed.
    ``free_outputs``: the graph's outputs may leave in the layout the rewrite gives them (an inference
    graph's: see the module docstring), else they are copied back to the layout eager gave them."""
    mode = fake_mode_of(gm)
    if mode is None:
        return 0
    rw = Rewrite(gm, mode, frozenset(range(len(graph_outputs(gm)))) if free_outputs else frozenset())
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in MATMULS:
            continue
        pads = _misaligned(node)
        how = _choose(node, pads, free_outputs) if pads is not None else None
        if how is None:
            continue
        ia, ib = MATMULS[node.target]
        a, b, val = node.args[ia], node.args[ib], meta_val(node)
        with gm.graph.inserting_before(node):
            if how == "contiguous":
                args = list(node.args)
                args[ia], args[ib] = _row_major(rw, a), _row_major(rw, b)
                rw.replace(node, rw.node(node.target, tuple(args), dict(node.kwargs)))
                continue
            assert pads is not None  # a layout was chosen for the misaligned operands
            pm, pk, pn = pads
            m, n = val.shape[-2], val.shape[-1]
            ap, bp = _pad(rw, a, pm, pk), _pad(rw, b, pk, pn)
            if node.target is aten.addmm.default:
                bias = node.args[0]
                bv = meta_val(bias)
                brows = pm if bv.dim() == 2 and bv.shape[0] == m and m > 1 else 0
                bcols = pn if bv.dim() >= 1 and bv.shape[-1] == n and n > 1 else 0
                res = rw.node(aten.addmm.default, (_pad(rw, bias, brows, bcols), ap, bp))
            else:
                res = rw.node(node.target, (ap, bp))
            if pn:
                res = rw.node(aten.slice.Tensor, (res, -1, 0, n))
            if pm:
                res = rw.node(aten.slice.Tensor, (res, -2, 0, m))
        rw.replace(node, res)
    return len(rw.replaced) if rw.commit() else 0


# ---------------------------------------------------------------------------------------- channels-last
#: convolution ops -> positions of their 4-D tensor operands that run channels-last (activation, weight and, for
#: the backward, the output gradient)
CONV_OPERANDS: dict[Any, tuple[int, ...]] = {
    aten.convolution.default: (0, 1),
    aten.convolution_backward.default: (0, 1, 2),
}


def _wants_channels_last(gm: fx.GraphModule, anywhere: bool) -> list[fx.Node]:
    """The convolutions (forward and backward) of a graph that should run channels-last: all 2-D, floating
    point and, unless ``anywhere``, fp16/bf16 on a GPU (where cuDNN prefers NHWC). [] when any is not."""
    convs = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in CONV_OPERANDS]
    for c in convs:
        for i in CONV_OPERANDS[c.target]:
            x = meta_val(c.args[i])
            if not isinstance(x, torch.Tensor) or x.dim() != 4 or not _static(*x.shape):
                return []  # layouts of symbolic shapes would need guards
            if not x.dtype.is_floating_point:
                return []
            if not anywhere and (x.dtype not in dtypes.LOW_PRECISION or x.device.type != "cuda"):
                return []
    return convs


def convs_channels_last(gm: fx.GraphModule, free_outputs: frozenset[int] = frozenset()) -> int:
    """Run a graph's convolutions channels-last (module docstring); returns the copies inserted (0: the graph
    is unchanged). Graph outputs keep their layout, except those at ``free_outputs`` (a training forward's
    saved activations: its backward is compiled against the layout they get, see ``moved_output_strides``)."""
    mode = config.settings().conv_layout
    if mode == "off" or (mode == "auto" and config.interpreting()):
        return 0
    convs = _wants_channels_last(gm, anywhere=mode == "always")
    fake = fake_mode_of(gm)
    if not convs or fake is None:
        return 0
    rw = Rewrite(gm, fake, free_outputs)
    for conv in convs:
        for i in CONV_OPERANDS[conv.target]:
            arg = conv.args[i]
            if _same_strides(meta_val(arg), _like(meta_val(arg), torch.channels_last)):
                continue
            with gm.graph.inserting_before(conv):
                cl = rw.node(aten.clone.default, (arg,), {"memory_format": torch.channels_last})
            conv.update_arg(i, cl)
    if not rw.commit():
        return 0
    kept = 0
    for cl in rw.added:  # a copy of what already became channels-last (a later conv's input) does nothing
        original = cl.args[0]
        if isinstance(original, fx.Node) and _same_strides(meta_val(original), meta_val(cl)):
            cl.replace_all_uses_with(original)
            gm.graph.erase_node(cl)
        else:
            kept += 1
    gm.recompile()
    return kept


# ---------------------------------------------------------------------------------------- conv_bias
def split_conv_bias(gm: fx.GraphModule) -> int:
    """Move the bias of each ``aten.convolution`` out of it: ``convolution(x, w, None) + b.view(C, 1, ...)``.

    ATen's GPU convolutions add their bias after cuDNN's kernel in an elementwise kernel of its own (one more
    read and write of the output); as a graph op the add is a kiln value that fuses into the convolution's
    consumers (a LayerNorm's or an activation's kernel) at no cost. Under ``conv_bias=auto`` only GPU
    convolutions outside the interpreter are split (CPU convolutions add the bias in their own kernel).
    Returns the convolutions split (0: the graph is unchanged, or the rewrite was rolled back)."""
    mode = config.settings().conv_bias
    if mode == "keep" or (mode == "auto" and config.interpreting()):
        return 0
    fake = fake_mode_of(gm)
    if fake is None:
        return 0
    rw = Rewrite(gm, fake)
    split = 0
    for conv in list(gm.graph.nodes):
        if conv.op != "call_function" or conv.target is not aten.convolution.default or len(conv.args) < 9:
            continue
        bias, out = conv.args[2], meta_val(conv)
        if not isinstance(bias, fx.Node) or not isinstance(out, torch.Tensor) or out.dim() < 3:
            continue
        if mode == "auto" and out.device.type != "cuda":
            continue
        with gm.graph.inserting_after(conv):
            bare = rw.node(
                aten.convolution.default, (conv.args[0], conv.args[1], None) + tuple(conv.args[3:])
            )
        with gm.graph.inserting_after(bare):
            b = rw.node(aten.view.default, (bias, [out.shape[1]] + [1] * (out.dim() - 2)))
        with gm.graph.inserting_after(b):
            add = rw.node(aten.add.Tensor, (bare, b))
        rw.replace(conv, add)
        split += 1
    return split if rw.commit() else 0
