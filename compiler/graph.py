"""GraphLowering: walks an ATen FX graph and turns every node into kiln IR.

Output of this pass (the *program*): an ordered list of steps, each a ``ComputedBuffer`` (fused later
into kernels), an ``ExternCall`` (ATen run from the wrapper), or a ``SubgraphCall`` (``torch.cond`` and
friends), plus the graph outputs as values. Every fallback carries a ``FallbackReason``.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from . import config, dtypes
from .contract import Lowering, Promotion
from .exc import LoweringError, NotLowered, require
from .ir import (
    Buffer,
    ComputedBuffer,
    ExternBuffer,
    InputBuffer,
    Layout,
    Lazy,
    Opaque,
    Pointwise,
    Strided,
    SymScalar,
    Value,
    contiguous_strides,
    is_dense,
    layout_from_meta,
    prod,
    same,
    sym,
)
from .kexpr import cast, holds_exactly, loads

log = logging.getLogger("kiln")

#: an upcast of an fp16/bf16 value that type holds exactly (``kexpr.holds_exactly``: a selection such as the
#: ReLU gradient ``where(relu <= 0, 0, grad)``) that reads at most this many tensors stays inline in each of
#: its readers however many there are: storing it costs a write and a read of its narrow bytes per reading
#: kernel, recomputing it at most twice those reads, and its readers keep their own kernels (AOTAutograd's
#: BatchNorm backward: the column sums as a reduction, the input gradient as a pointwise kernel, as Inductor
#: has them). The H200 mix sweep over ResNet-50's BatchNorm + ReLU backwards (``bnrelu`` cases; device µs,
#: inline / stored bf16 and mixed at the best of 98 to 1024 programs / Inductor): 6272x256 12.3 / 15.3 / 11.9,
#: 25088x128 16.0 / 20.0 / 17.4, 100352x64 29.8 / 33.1 / 27.8, 1568x512 9.3 / 10.5 / 8.7, 25088x512 62.5 / 61.8
#: / 49.6.
#: Upcasts that read more are stored narrow (``GraphLowering._realize_narrow``).
RECOMPUTE_MAX_READS = 2
aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class FallbackReason:
    """Why an op ran as ATen: ``kind`` (class of reason), ``op`` (overload name), ``detail`` (text)."""

    kind: str
    op: str
    detail: str

    def __str__(self) -> str:
        return f"{self.op}: {self.kind}: {self.detail}"


@dataclasses.dataclass
class ExternCall:
    """An ATen call in the wrapper. ``args``/``kwargs`` hold Values, SymScalars and Python data.

    ``out`` names the buffer passed as ``out=`` (extern kernels such as ``mm.out``); otherwise the
    call's return value is bound to ``outputs`` (a structure of ExternBuffers / Opaque / SymScalar).
    """

    target: Any
    args: tuple
    kwargs: dict
    outputs: Any
    fx_name: str
    reason: FallbackReason | None = None  # None for extern kernels we chose on purpose (mm.out)
    out: Buffer | None = None
    transfer: bool = False  # a copy, not a compute kernel (CPU scalar -> GPU, an input's write-back)
    write_back: bool = False  # the new value of a mutated input copied into it: runs after every kernel


@dataclasses.dataclass
class SubgraphCall:
    """A higher-order op (``cond``/``while_loop``) whose subgraphs are compiled separately."""

    target: Any
    args: tuple
    subgraphs: dict[str, Any]  # attr name -> compiled wrapper GraphModule (or original, on fallback)
    outputs: Any
    fx_name: str
    #: keyword operands (higher-order ops take theirs positionally: kept empty, read like an ``ExternCall``'s)
    kwargs: dict = dataclasses.field(default_factory=dict)


class SubgraphRef:
    """Marks where a compiled subgraph module goes in a higher-order op's arguments."""

    def __init__(self, attr: str) -> None:
        self.attr = attr


Step = ComputedBuffer | ExternCall | SubgraphCall


class BufferNames:
    """Buffer naming and registration, shared by the lowering and its ``Program`` (which goes on numbering
    where the lowering stopped). Needs ``buffers`` (name -> buffer) and ``next_id`` on the instance."""

    buffers: dict[str, Buffer]
    next_id: int

    def new_name(self, prefix: str = "buf") -> str:
        name = f"{prefix}{self.next_id}"
        self.next_id += 1
        return name

    def add_buffer(self, buf: Buffer) -> Buffer:
        self.buffers[buf.name] = buf
        return buf


@dataclasses.dataclass
class Program(BufferNames):
    """The ``lower`` pass's product: the graph as kiln IR, ready to schedule.

    ``inputs``: (placeholder, value) in order (a value: ``Strided`` of an ``InputBuffer``, ``SymScalar`` or
    ``Opaque``); ``steps``: ``ComputedBuffer`` / ``ExternCall`` / ``SubgraphCall`` in program order;
    ``outputs``: the graph's results as values; ``buffers``: every buffer by name (inputs, constants and
    empties included: those have no step); ``constants``: tensor attributes by buffer name; ``attributes``:
    other attributes (subgraphs of ``map``/``scan``) as (value, name, object); ``fallbacks``: why each op
    that runs as ATen does. ``next_id`` continues the lowering's buffer numbering for buffers added later
    (the scheduler's partial sums).
    """

    name: str
    inputs: list[tuple[fx.Node, Any]]
    steps: list[Step]
    outputs: list[Any]
    buffers: dict[str, Buffer]
    constants: dict[str, torch.Tensor]
    attributes: list[tuple[Opaque, str, Any]]
    fallbacks: list[FallbackReason]
    next_id: int = 0
    #: steps whose results may differ run to run (atomic float sums, racing stores): kind ``nondeterministic``
    nondeterministic: list[FallbackReason] = dataclasses.field(default_factory=list)

    def verify(self) -> None:
        """Structural invariants (``InvariantError`` names the first broken one): buffers registered under
        their own names; unique placeholder names; every step's and output's buffers registered; a buffer
        produced by one step only; what an ATen call reads is an input, a constant, an empty or produced by
        an earlier step. Bodies of computed buffers are not evaluated (that stays the scheduler's work)."""
        where = f"program {self.name}"
        for name, buf in self.buffers.items():
            require(
                isinstance(buf, Buffer) and buf.name == name,
                f"{where}: buffer {name!r} registered as {buf!r}",
            )
        names = [ph.name for ph, _ in self.inputs]
        require(len(set(names)) == len(names), f"{where}: duplicate placeholders {names}")
        for ph, value in self.inputs:
            if isinstance(value, Strided):
                require(
                    isinstance(value.buffer, InputBuffer), f"{where}: input {ph.name} is {value.buffer!r}"
                )
                self._registered(value.buffer, f"input {ph.name}")
        for name in self.constants:
            require(
                isinstance(self.buffers.get(name), InputBuffer), f"{where}: constant {name} has no buffer"
            )
        made: dict[str, int] = {}
        for k, step in enumerate(self.steps):
            for buf in _step_buffers(step):
                self._registered(buf, f"step {k} ({_describe(step)})")
                require(
                    buf.name not in made,
                    f"{where}: {buf.name} produced by steps {made.get(buf.name)} and {k}",
                )
                made[buf.name] = k
        for k, step in enumerate(self.steps):
            if isinstance(step, ComputedBuffer):
                continue
            for v in _strided_in((step.args, step.kwargs)):
                self._registered(v.buffer, f"an argument of step {k} ({_describe(step)})")
                require(
                    made.get(v.buffer.name, -1) < k,
                    f"{where}: step {k} ({_describe(step)}) reads {v.buffer.name} before step "
                    f"{made.get(v.buffer.name)} produces it",
                )
        for v in _strided_in(self.outputs):
            self._registered(v.buffer, "a graph output")
        for r in self.fallbacks:
            require(isinstance(r, FallbackReason), f"{where}: fallback {r!r} is not a FallbackReason")

    def _registered(self, buf: Buffer, what: str) -> None:
        require(
            self.buffers.get(buf.name) is buf,
            f"program {self.name}: {what}: {buf!r} is not its registered buffer",
        )


def _describe(step: Any) -> str:
    if isinstance(step, ComputedBuffer):
        return step.name
    return f"{_op_name(step.target)} of {step.fx_name}"


def _step_buffers(step: Step) -> list[Buffer]:
    """The buffers a step produces: a computed buffer itself, an ATen call's results and ``out=`` buffer."""
    if isinstance(step, ComputedBuffer):
        return [step]
    out = [o for o in pytree.tree_leaves(step.outputs) if isinstance(o, Buffer)]
    if isinstance(step, ExternCall) and step.out is not None and step.out not in out:
        out.append(step.out)
    return out


def _strided_in(obj: Any) -> list[Strided]:
    return [v for v in pytree.tree_leaves(obj) if isinstance(v, Strided)]


#: op overload -> lowering(g, node, *args, **kwargs), the contract around it; filled by compiler.lowering
LOWERINGS: dict[Any, Lowering] = {}


def register_lowering(
    *ops: Any,
    promote: Promotion | None = None,
    operands: Sequence[int] | None = None,
    same_device: bool = True,
    exact: bool = False,
) -> Callable:
    """Decorator: register one lowering for several op overloads, inside the lowering contract
    (``compiler.contract``: device check, output dtype, rounding points under ``emulate_eager_precision``).

    ``promote``: an elementwise op's type-promotion kind (or a function of the node choosing one), over the
    node's ``operands`` (positions; all by default); the lowering is then called as
    ``fn(Elementwise, *args, **kwargs)`` instead of ``fn(g, node, *args, **kwargs)``. ``same_device=False``:
    the op may read operands on another device than its result's (factories, device copies). ``exact``: the
    results are elements of an operand, so narrowing them needs no rounding point.
    The function is returned unwrapped, for lowerings that call one another.
    """
    positions = None if operands is None else tuple(operands)

    def deco(fn: Callable) -> Callable:
        wrapped = Lowering(fn, promote, positions, same_device, exact)
        for op in ops:
            LOWERINGS[op] = wrapped
        return fn

    return deco


class GraphLowering(BufferNames):
    """Lowers one FX graph. ``name`` prefixes buffer and kernel names to keep them unique and stable."""

    def __init__(self, gm: fx.GraphModule, name: str = "graph", subgraph_compiler: Any = None) -> None:
        self.gm = gm
        self.name = name
        self.settings = config.settings()
        self.env: dict[fx.Node, Any] = {}
        self.steps: list[Step] = []
        self.buffers: dict[str, Buffer] = {}
        self.inputs: list[tuple[fx.Node, Any]] = []  # placeholder -> InputBuffer | SymScalar | Opaque
        self.outputs: list[Any] = []
        self.fallbacks: list[FallbackReason] = []
        self.nondeterministic: list[FallbackReason] = []  # where kiln chose speed over run-to-run identity
        self.subgraph_compiler = subgraph_compiler
        self.constants: dict[
            str, torch.Tensor
        ] = {}  # buffer name -> tensor constant (get_attr in the wrapper)
        self.attributes: list[tuple[Opaque, str, Any]] = []  # other get_attr values (subgraphs of map/scan)
        self.next_id = 0  # buffer numbering (BufferNames)
        self.current_node: fx.Node | None = None
        self.interpret = config.interpreting()
        self._moved: dict[tuple, Strided] = {}  # CPU scalar -> its GPU copy
        self._realized: dict[tuple[Lazy, tuple], Strided] = {}  # (Lazy, strides) -> its buffer (by identity)

    # ------------------------------------------------------------------ realization
    def realize(self, value: Value, meta: torch.Tensor | None = None) -> Strided:
        """Make ``value`` live in memory. Strided values are returned as they are.

        A Lazy value becomes a ComputedBuffer laid out like ``meta`` (the eager result's strides) when
        those are dense, else contiguous; where ``meta`` broadcasts (an ``expand``: stride 0), as
        ``realize_exact`` does: each distinct element computed once and read through the stride-0 view, as
        eager passes it (an attention bias expanded over the heads is not materialized per head). The same
        Lazy realized again in the same layout is the same buffer (a value kept inline for several users, such
        as an index-only mask, computed once for every extern kernel that reads it from memory).
        """
        if isinstance(value, Strided):
            return value
        if not isinstance(value, Lazy):
            raise LoweringError(f"cannot realize {value!r}")
        stride = contiguous_strides(value.size)
        if meta is not None and isinstance(meta, torch.Tensor) and len(meta.shape) == len(value.size):
            if _broadcast(meta):  # an expand's result: each distinct element computed once, read via stride 0
                return self.realize_exact(value, meta)
            cand = Layout(
                tuple(value.size),
                tuple(sym(s) for s in meta.stride()),
                sympy.Integer(0),
                value.dtype,
                value.device,
            )
            if is_dense(cand):
                stride = cand.stride
        layout = Layout(tuple(value.size), tuple(stride), sympy.Integer(0), value.dtype, value.device)
        done = self._realized.get((value, layout.stride))
        if done is not None:
            return done
        origin = self.current_node.name if self.current_node is not None else ""
        buf = ComputedBuffer(
            self.new_name(), layout, Pointwise(tuple(value.size), value.fn, value.dtype), origin=origin
        )
        self.add_buffer(buf)
        self.steps.append(buf)
        out = Strided(buf, layout)
        self._realized[(value, layout.stride)] = out
        return out

    def add_computed(self, buf: ComputedBuffer) -> Strided:
        """Register a ComputedBuffer built by a lowering (reductions) and return a view of it."""
        if self.current_node is not None and not buf.origin:
            buf.origin = self.current_node.name
        self.add_buffer(buf)
        self.steps.append(buf)
        return Strided(buf, buf.layout)

    # ------------------------------------------------------------------ running
    def run(self) -> Program:
        for node in self.gm.graph.nodes:
            self.current_node = node
            if node.op == "placeholder":
                self.env[node] = self._placeholder(node)
            elif node.op == "call_function":
                self.env[node] = self._call(node)
            elif node.op == "get_attr":
                self.env[node] = self._get_attr(node)
            elif node.op == "output":
                args = _flatten_output(node.args[0])
                self.outputs = _alias_outputs(args, [self._output_value(a) for a in args])
            else:
                raise LoweringError(f"unsupported FX node kind {node.op} ({node.name})")
        self.current_node = None
        return Program(
            self.name,
            self.inputs,
            self.steps,
            self.outputs,
            self.buffers,
            self.constants,
            self.attributes,
            self.fallbacks,
            self.next_id,
            self.nondeterministic,
        )

    def _placeholder(self, node: fx.Node) -> Any:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            base = sym(val.storage_offset())
            layout = layout_from_meta(val, base_offset=base)
            buf = InputBuffer(node.name, layout, base)
            self.add_buffer(buf)
            value: Strided | SymScalar | Opaque = Strided(buf, layout)
        elif isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)):
            value = SymScalar(sym(val), type(val))
        else:
            value = Opaque(node.name)
        self.inputs.append((node, value))
        return value

    def _get_attr(self, node: fx.Node) -> Any:
        assert isinstance(node.target, str)  # a get_attr node names its attribute
        obj = getattr(self.gm, node.target)
        if isinstance(
            obj, torch.Tensor
        ):  # a constant (``torch.tensor([...])`` in user code): read like an input
            base = sym(obj.storage_offset())
            buf = InputBuffer(node.name, layout_from_meta(obj, base_offset=base), base)
            self.add_buffer(buf)
            self.constants[node.name] = obj
            return Strided(buf, buf.layout)
        value = Opaque(node.name)  # subgraph modules: control-flow lowerings read them via the node, and a
        self.attributes.append((value, node.name, obj))  # fallback (map, scan) gets them from the wrapper
        return value

    def _output_value(self, arg: Any) -> Any:
        """A graph output, laid out exactly as eager's result (its FakeTensor's strides).

        The backward graph (and any caller) was traced against those strides: a saved ``expand`` is read
        with stride 0, a saved slice with its parent's row stride. Kernel outputs are stored in that layout;
        a computed view whose strides differ is copied into it.
        """
        if arg is None:
            return None
        value = self.env[arg] if isinstance(arg, fx.Node) else arg
        meta = arg.meta.get("val") if isinstance(arg, fx.Node) else None
        if isinstance(value, Strided) and isinstance(meta, torch.Tensor) and _restride_output(value, meta):
            value = Lazy(value.size, value.dtype, value.device, value.load)
        if isinstance(value, Lazy):
            self.current_node = arg
            value = self.realize_exact(value, meta) if isinstance(meta, torch.Tensor) else self.realize(value)
            self.env[arg] = value
        return value

    def realize_exact(self, value: Lazy, meta: torch.Tensor) -> Strided:
        """Realize ``value`` with ``meta``'s strides, dense or not. Broadcast dims (stride 0) are computed
        once and returned as an expanded view."""
        if len(meta.shape) != len(value.size):
            return self.realize(value, meta)
        stride = tuple(sym(s) for s in meta.stride())
        size = tuple(sympy.Integer(1) if st == 0 else sz for sz, st in zip(value.size, stride))
        layout = Layout(size, stride, sympy.Integer(0), value.dtype, value.device)
        if is_dense(layout) and size == tuple(value.size):
            return self.realize(value, meta)
        done = self._realized.get((value, stride))
        if done is not None:
            return done
        origin = self.current_node.name if self.current_node is not None else ""
        buf = ComputedBuffer(self.new_name(), layout, Pointwise(size, value.fn, value.dtype), origin=origin)
        self.add_buffer(buf)
        self.steps.append(buf)
        out = Strided(buf, Layout(tuple(value.size), stride, sympy.Integer(0), value.dtype, value.device))
        self._realized[(value, stride)] = out
        return out

    def fetch(self, a: Any) -> Any:
        """Map FX args to lowered values (through nested lists, tuples and dicts)."""
        return pytree.tree_map_only(fx.Node, self.env.__getitem__, a)

    def _call(self, node: fx.Node) -> Any:
        target = node.target
        val = node.meta.get("val")
        if target is operator.getitem:
            assert isinstance(node.args[0], fx.Node)
            src = self.env[node.args[0]]
            if isinstance(src, Opaque):
                return self.fallback(
                    node, FallbackReason("opaque_getitem", "getitem", "item of an opaque value")
                )
            return self._maybe_realize(node, src[node.args[1]])  # an item is a value like any other
        if _is_symbolic_scalar(val) and target is not aten._local_scalar_dense.default:
            return SymScalar(sym(val), type(val))
        op_name = _op_name(target)
        lowering = LOWERINGS.get(target) or LOWERINGS.get(op_name)  # prims are registered by name
        if lowering is None:
            return self.fallback(
                node, FallbackReason("unsupported_op", op_name, "no kiln lowering for this op")
            )
        bad = [str(v.dtype) for v in _tensor_metas(node) if v.dtype not in dtypes.SUPPORTED]
        if bad:
            return self.fallback(
                node, FallbackReason("dtype", op_name, f"kiln kernels do not handle {bad[0]}")
            )
        if self._needs_device_fallback(node):
            return self.fallback(
                node,
                FallbackReason(
                    "device",
                    op_name,
                    "CPU tensors run through Triton's interpreter, which this process did not "
                    "enable (set KILN_INTERPRET=1 before importing triton)",
                ),
            )
        args, kwargs = self._move_cpu_scalars(node, self.fetch(node.args), self.fetch(node.kwargs))
        try:
            out = lowering(self, node, *args, **kwargs)
        except NotLowered as e:
            return self.fallback(node, FallbackReason(e.kind, op_name, e.detail))
        except Exception as e:  # an internal error: strict mode raises, otherwise fall back and say so
            if self.settings.strict:
                raise LoweringError(f"lowering {op_name} ({node.name}) failed: {e}") from e
            log.warning("kiln: lowering %s failed (%s); falling back to ATen", op_name, e)
            return self.fallback(node, FallbackReason("lowering_error", op_name, f"{type(e).__name__}: {e}"))
        return self._maybe_realize(node, out)

    def _needs_device_fallback(self, node: fx.Node) -> bool:
        if self.interpret:
            return False
        out = node.meta.get("val")
        on_gpu = isinstance(out, torch.Tensor) and out.device.type != "cpu"
        for v in _tensor_metas(node):
            if v.device.type == "cpu" and not (on_gpu and v.dim() == 0):  # CPU scalars move (below)
                return True
        return False

    def _move_cpu_scalars(self, node: fx.Node, args: Any, kwargs: Any) -> tuple:
        """0-d CPU tensors (``torch.tensor(0.5)``, ``x[i] = 0``) used by a GPU op are copied to the GPU
        once in the wrapper, so the op still lowers into a fused kernel instead of falling back."""
        out = node.meta.get("val")
        if not isinstance(out, torch.Tensor) or out.device.type == "cpu":
            return args, kwargs

        def move(v: Value) -> Value:
            if v.device.type != "cpu" or len(v.size) != 0:
                return v
            src = self.realize(v)
            key = (src.buffer.name, str(src.layout.offset), str(out.device))
            if key not in self._moved:
                layout = Layout((), (), sympy.Integer(0), v.dtype, out.device)
                buf = ExternBuffer(self.new_name(), layout)
                self.add_buffer(buf)
                self.steps.append(
                    ExternCall(
                        aten._to_copy.default,
                        (src,),
                        {"device": out.device},
                        buf,
                        node.name,
                        None,
                        transfer=True,
                    )
                )
                self._moved[key] = Strided(buf, layout)
            return self._moved[key]

        return map_values(args, move), map_values(kwargs, move)

    def _maybe_realize(self, node: fx.Node, out: Any) -> Any:
        """Realize a Lazy result read by several users when inlining it everywhere would cost too much. A value
        that reads no memory (a function of its index alone: an iota, a mask, position ids) stays inline up to
        the cost limit whatever its users: recomputing it is integer arithmetic, storing it a kernel and a round
        trip through memory."""
        if not isinstance(out, Lazy):
            return out
        users = len(node.users)
        if out.cost > 64 or (users > 1 and out.cost > 3 and _reads_memory(out)):
            narrow = out.widens
            if narrow is not None:
                expr = narrow.load(_probe_index(narrow))
                if holds_exactly(expr, narrow.dtype):
                    if out.cost <= 64 and len({ld.buffer for ld in loads(expr)}) <= RECOMPUTE_MAX_READS:
                        return out
                    return self._realize_narrow(out, narrow, node.meta.get("val"))
            return self.realize(out, node.meta.get("val"))
        return out

    def _realize_narrow(self, out: Lazy, narrow: Lazy, meta: Any) -> Lazy:
        """Realize the upcast ``out`` by storing the fp16/bf16 value it widens (``narrow``, whose every
        value that type holds exactly) and widening each read: the same values at half the bytes written and
        read."""
        stored = self.realize(narrow, meta)
        dtype = out.dtype
        return Lazy(out.size, dtype, out.device, lambda idx: cast(stored.load(idx), dtype, explicit=True), 2)

    # ------------------------------------------------------------------ fallback
    def fallback(
        self,
        node: fx.Node,
        reason: FallbackReason | None,
        target: Any = None,
        args: tuple | None = None,
        kwargs: dict | None = None,
    ) -> Any:
        """Run ``node`` as an ATen call from the wrapper. Tensor inputs are realized first."""
        if reason is not None:
            self.fallbacks.append(reason)
            (log.warning if self.settings.log_fallbacks else log.info)("kiln fallback: %s", reason)
        args = self.fetch(node.args) if args is None else args
        kwargs = self.fetch(node.kwargs) if kwargs is None else kwargs
        # inputs are laid out as eager had them: ATen kernels pick output strides from input strides
        args = _realize_like(args, node.args, self.realize)
        kwargs = _realize_like(kwargs, node.kwargs, self.realize)
        outputs = self._extern_outputs(node.meta.get("val"))
        call = ExternCall(target or node.target, tuple(args), dict(kwargs), outputs, node.name, reason)
        self.steps.append(call)
        return values_of(outputs)

    def extern_out(self, node: fx.Node, target: Any, args: tuple, kwargs: dict) -> Strided:
        """An extern kernel called with ``out=``: the output buffer is allocated by the wrapper."""
        val = node.meta["val"]
        # computed operands are stored as eager laid them out (a transposed operand column-major: no
        # transposing copy, and the copy that makes it reads and writes in order)
        args = _realize_like(args, node.args, self.realize)
        layout = layout_from_meta(val, sym(val.storage_offset()))
        buf = ExternBuffer(self.new_name(), layout, sym(val.storage_offset()))
        self.add_buffer(buf)
        self.steps.append(ExternCall(target, tuple(args), dict(kwargs), buf, node.name, None, out=buf))
        return Strided(buf, layout)

    def _extern_outputs(self, val: Any) -> Any:
        """The buffers (and symbolic scalars) an ATen call's results become, in the results' structure."""
        return pytree.tree_map(self._extern_output, val)

    def _extern_output(self, val: Any) -> Any:
        if isinstance(val, torch.Tensor):
            base = sym(val.storage_offset())
            return self.add_buffer(
                ExternBuffer(self.new_name(), layout_from_meta(val, base_offset=base), base)
            )
        if _is_symbolic_scalar(val):
            return SymScalar(sym(val), type(val))
        return Opaque("") if val is not None else None


# ---------------------------------------------------------------------------------------- helpers
def _op_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"aten.{target.__name__}" if target.namespace == "aten" else str(target)
    return getattr(target, "__name__", str(target))


def _probe_index(value: Lazy) -> list[sympy.Symbol]:
    """A symbolic index of ``value`` (one nonnegative integer symbol per dimension), to inspect its expression."""
    return [sympy.Symbol(f"p{i}", integer=True, nonnegative=True) for i in range(len(value.size))]


def _reads_memory(value: Lazy) -> bool:
    """Whether ``value``'s expression loads anything (a buffer, an input) at a symbolic index."""
    return bool(loads(value.fn(_probe_index(value))))


def _is_symbolic_scalar(val: Any) -> bool:
    return isinstance(
        val, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)
    ) and not isinstance(val, torch.Tensor)


def _tensor_metas(node: fx.Node) -> list[torch.Tensor]:
    out = []
    for a in node.all_input_nodes:
        v = a.meta.get("val")
        if isinstance(v, torch.Tensor):
            out.append(v)
    v = node.meta.get("val")
    if isinstance(v, torch.Tensor):
        out.append(v)
    return out


def _broadcast(meta: torch.Tensor) -> bool:
    """Whether ``meta`` has a broadcast dim: stride 0 along a dim longer than 1 (an ``expand``'s result)."""
    return any(
        isinstance(st, int) and st == 0 and not (isinstance(sz, int) and sz <= 1)
        for sz, st in zip(meta.shape, meta.stride())
    )


def map_values(obj: Any, fn: Callable[[Value], Any]) -> Any:
    return pytree.tree_map_only(Value, fn, obj)


def _realize_like(values: Any, fx_args: Any, realize: Callable) -> Any:
    """Realize every Value in ``values`` with the FakeTensor of the matching FX argument as its layout."""

    def one(path: tuple, value: Any) -> Any:
        node = _fx_arg_at(values, fx_args, path)
        meta = node.meta.get("val") if isinstance(node, fx.Node) else None
        return realize(value, meta if isinstance(meta, torch.Tensor) else None)

    return pytree.tree_map_with_path(lambda path, v: one(path, v) if isinstance(v, Value) else v, values)


def _fx_arg_at(values: Any, fx_args: Any, path: tuple) -> Any:
    """The FX argument at a value's pytree key path: lists of equal length and dicts are followed in step, any
    other shape of ``fx_args`` has no argument to match (None)."""
    for key in path:
        if isinstance(key, pytree.SequenceKey):
            if not (isinstance(fx_args, (list, tuple)) and len(fx_args) == len(values)):
                return None
            values, fx_args = values[key.idx], fx_args[key.idx]
        elif isinstance(key, pytree.MappingKey):
            if not isinstance(fx_args, dict):
                return None
            values, fx_args = values[key.key], fx_args.get(key.key)
        else:
            return None
    return fx_args


def values_of(outputs: Any) -> Any:
    return pytree.tree_map_only(Buffer, lambda b: Strided(b, b.layout), outputs)


def _alias_outputs(args: list, values: list) -> list:
    """Outputs that share one storage in eager (``h`` and ``h[:, 0]``) share one kiln buffer.

    AOTAutograd rebuilds such an output from the other one with ``as_strided`` and the storage offset the
    graph returned, so a separate buffer (offset 0) read the wrong elements. The output covering the most
    elements is the root when its buffer is dense with eager's layout; every other output of that storage
    whose elements lie inside the root's becomes a view of the root's buffer.
    """
    from torch.multiprocessing.reductions import StorageWeakRef

    groups: dict[Any, list[int]] = {}
    for i, a in enumerate(args):
        meta = a.meta.get("val") if isinstance(a, fx.Node) else None
        if (
            isinstance(meta, torch.Tensor)
            and isinstance(values[i], Strided)
            and not isinstance(values[i].buffer, InputBuffer)
            and all(sym(d) != 0 for d in meta.shape)
        ):
            groups.setdefault(StorageWeakRef(meta.untyped_storage()), []).append(i)
    out = list(values)
    for idxs in groups.values():
        roots = [
            i
            for i in idxs
            if values[i].is_whole_buffer()
            and is_dense(values[i].layout)
            and sympy.expand(_span(values[i].layout.size, values[i].layout.stride) - prod(values[i].size))
            == 0
        ]
        if len(idxs) < 2 or not roots:
            continue
        root = max(roots, key=lambda i: int(sympy.sympify(prod(values[i].size)).subs(_hints(values[i].size))))
        rmeta, rval = args[root].meta["val"], values[root]
        for i in idxs:
            meta = args[i].meta["val"]
            if i == root or meta.dtype != rmeta.dtype:
                continue
            size, stride = tuple(sym(v) for v in meta.shape), tuple(sym(v) for v in meta.stride())
            offset = sym(meta.storage_offset()) - sym(rmeta.storage_offset())
            room = _span(rval.layout.size, rval.layout.stride) - offset - _span(size, stride)
            if sympy.expand(offset).is_nonnegative and sympy.expand(room).is_nonnegative:
                out[i] = Strided(rval.buffer, Layout(size, stride, offset, meta.dtype, meta.device))
    return out


def _span(size: Sequence, stride: Sequence) -> sympy.Expr:
    """Elements from the first to the last one a (non-empty) strided view touches."""
    return 1 + sum(((sz - 1) * st for sz, st in zip(size, stride)), sympy.Integer(0))


def _hints(exprs: Sequence) -> dict:
    from .ir import size_hints

    hints = size_hints()
    return {s: hints.get(s, 8) for e in exprs for s in sympy.sympify(e).free_symbols}


def _restride_output(value: Strided, meta: torch.Tensor) -> bool:
    """True when a computed view's strides differ from eager's in some dim longer than 1 (inputs and
    their views keep their own layout: they may alias the caller's tensors)."""
    if isinstance(value.buffer, InputBuffer) or len(meta.shape) != len(value.size):
        return False
    return any(
        sz != 1 and not same(have, sym(want))
        for sz, have, want in zip(value.size, value.layout.stride, meta.stride())
    )


def _flatten_output(arg: Any) -> list:
    if isinstance(arg, (list, tuple)):
        return list(arg)
    return [arg]
