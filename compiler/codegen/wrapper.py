"""Emit the wrapper as an FX ``GraphModule``: allocations, kernel launches, extern and fallback calls.

Printing ``wrapper.code`` is how a person reads what kiln did. Mapping of wrapper steps to FX:
- size symbols -> ``size(d)``/``stride(d)``/``storage_offset()`` of an input (solved for the symbol when
  the input's size is an expression such as ``2*s0 + 1``), or the SymInt placeholder itself;
- size expressions -> integer ``operator`` nodes (``floordiv``, never float division);
- allocations -> ``torch.empty_strided`` (Dynamo's C allocator where there is one); views -> ``reinterpret_tensor``
  (``as_strided`` in C, a fifth of the aten op's host time), called as Dynamo's C helper itself on a buffer the
  wrapper allocated (offset known: no Python frame), one view node per (buffer, geometry) however many read it;
- kernel launches -> ``call_module`` of a ``TritonKernel``; extern kernels -> ``torch.mm(..., out=buf)`` (the
  ``torch`` function of the ``.out`` overload, ``EXTERN_FUNCTIONS``: half the host time of the OpOverload); a
  scatter kernel writes into the allocation of its target (a copy or fill made by the kernel before it);
  fallbacks -> the ATen overload itself, or for the heavy common ones (convolution, attention) the ``torch``
  function of the same schema (``FALLBACK_FUNCTIONS``), multi-output -> ``getitem``; cond/while -> the
  higher-order op with ``get_attr`` subgraphs.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Callable
from typing import Any

import sympy
import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch.utils._sympy.functions import FloorDiv, Mod, ModularIndexing, PythonMod

from .. import config
from ..exc import InvariantError, SymbolResolutionError, require
from ..graph import ExternCall, SubgraphCall, SubgraphRef
from ..ir import Buffer, InputBuffer, Opaque, Scatter, Strided, SymScalar, sym
from ..runtime import value_trace
from ..runtime.combo import ComboKernel
from ..runtime.launcher import TritonKernel
from ..runtime.restride import ensure_strides, reinterpret_c, reinterpret_tensor
from ..scheduler import KernelGroup, Schedule
from .kernels import ComboSource, Kernels
from .printer import MAX_TYPES, MIN_TYPES
from .triton_kernel import KernelSource

aten = torch.ops.aten


@dataclasses.dataclass
class Wrapper:
    """The ``wrap`` pass's product: the wrapper ``GraphModule`` that runs ``schedule`` with its ``kernels``."""

    module: fx.GraphModule
    schedule: Schedule
    kernels: Kernels

    @property
    def code(self) -> str:
        return self.module.code

    def verify(self) -> None:
        """Structural invariants (``InvariantError`` names the first broken one): the FX graph lints
        (nodes defined before use, targets exist); one placeholder per program input; the launches are the
        schedule's kernels in its order, each a ``TritonKernel`` module holding its group's source, and no
        kernel module goes unlaunched; every buffer a launch writes is allocated by this wrapper (kernels
        write a graph input only where the ``in_place`` pass let them; other mutations reach inputs through
        the trailing write-back copies)."""
        where = f"wrapper of {self.schedule.program.name}"
        graph = self.module.graph
        try:
            graph.lint()
        except Exception as e:  # noqa: BLE001 - FX raises plain RuntimeErrors
            raise InvariantError(f"{where}: {e}") from e
        nodes = list(graph.nodes)
        placeholders = [n for n in nodes if n.op == "placeholder"]
        require(
            len(placeholders) == len(self.schedule.program.inputs),
            f"{where}: {len(placeholders)} placeholders for {len(self.schedule.program.inputs)} inputs",
        )
        launches = [
            n
            for n in nodes
            if n.op == "call_module" and isinstance(self.module.get_submodule(n.target), TritonKernel)
        ]
        kernels = self.kernels.launches
        require(
            [n.target for n in launches] == [ks.name for ks in kernels],
            f"{where}: launches {[n.target for n in launches]} are not the schedule's kernels "
            f"{[ks.name for ks in kernels]}",
        )
        modules = {name for name, m in self.module.named_children() if isinstance(m, TritonKernel)}
        require(
            modules == {ks.name for ks in kernels},
            f"{where}: kernel modules {sorted(modules)} never launched",
        )
        for node, ks in zip(launches, kernels):
            require(
                self.module.get_submodule(node.target).source == ks.source,
                f"{where}: module {ks.name} does not hold its kernel's source",
            )
            for (param, name), arg in zip(ks.ptr_args, node.args):
                if param.startswith("out_ptr") and name not in self.schedule.in_place:
                    require(
                        isinstance(arg, fx.Node) and _allocates(arg),
                        f"{where}: {ks.name} writes {name} through {arg}, not an allocation",
                    )


def wrap(schedule: Schedule, kernels: Kernels) -> Wrapper:
    """The ``wrap`` pass: the wrapper that runs ``schedule``, launching ``kernels`` (the ``render`` pass's)."""
    return WrapperBuilder(schedule, kernels).build()


class WrapperBuilder:
    def __init__(self, schedule: Schedule, kernels: Kernels) -> None:
        require(
            kernels.schedule is schedule,
            f"schedule of {schedule.program.name} wrapped with the kernels of "
            f"another schedule ({kernels.schedule.program.name})",
        )
        self.g = schedule.program
        self.schedule = schedule
        self.kernels = kernels
        self.kernel_of: dict[int, KernelSource] = {
            id(g): ks for g, ks in kernels.pairs()
        }  # group -> its kernel
        self.graph = fx.Graph()
        self.root = torch.nn.Module()
        self.nodes: dict[str, Any] = {}  # buffer name -> fx node
        self.syms: dict[sympy.Symbol, Any] = {}  # symbol -> fx node (or int)
        self.exprs: dict[sympy.Expr, Any] = {}
        self.opaque: dict[int, Any] = {}
        self.views: dict[tuple, fx.Node] = {}  # (base node, dtype, size, stride, offset) -> its view node
        self.placeholders: list[tuple[fx.Node, Any]] = []
        # value tracing (``trace_values``): the steps whose outputs the trace records; None: no trace calls
        self.trace_sites: list[value_trace.TraceSite] | None = [] if config.settings().trace_values else None

    # ------------------------------------------------------------------ symbols and expressions
    def bind_symbol(self, s: sympy.Symbol) -> Any:
        if s in self.syms:
            return self.syms[s]
        for ph, value in self.placeholders:
            if isinstance(value, Strided) and isinstance(value.buffer, InputBuffer):
                meta = ph.meta.get("val") if hasattr(ph, "meta") else None
                found = self._bind_from_tensor(s, ph, meta) if isinstance(meta, torch.Tensor) else None
                if found is not None:
                    return found
        raise SymbolResolutionError(f"size symbol {s} cannot be computed from the graph inputs")

    def _bind_from_tensor(self, s: sympy.Symbol, ph: fx.Node, meta: torch.Tensor) -> Any:
        sources = [("size", d, sym(v)) for d, v in enumerate(meta.shape)]
        sources += [("stride", d, sym(v)) for d, v in enumerate(meta.stride())]
        for fn, d, e in sources:
            if e == s:
                node = self.graph.call_method(fn, (ph, d))
                self.syms[s] = node
                return node
        for fn, d, e in sources:  # linear forms a*s + b: solve for s
            if s in e.free_symbols and e.free_symbols == {s}:
                poly = sympy.Poly(e, s)
                if poly.degree() == 1:
                    a, b = (int(c) for c in poly.all_coeffs())
                    node = self.graph.call_method(fn, (ph, d))
                    if b:
                        node = self.graph.call_function(operator.sub, (node, b))
                    if a != 1:
                        node = self.graph.call_function(operator.floordiv, (node, a))
                    self.syms[s] = node
                    return node
        if sym(meta.storage_offset()) == s:
            node = self.graph.call_method("storage_offset", (ph,))
            self.syms[s] = node
            return node
        return None

    def expr(self, e: Any) -> Any:
        """An integer expression over size symbols as FX nodes (or a plain int)."""
        e = sympy.sympify(e)
        if e in (sympy.true, sympy.false):
            return bool(e)
        if e.is_number:
            return int(e) if e.is_Integer else float(e)
        if e in self.exprs:
            return self.exprs[e]
        unary = _FLOAT_FUNCTIONS.get(type(e).__name__)
        if unary is not None:  # float sizes: arange(0, n, 0.5) has CeilToInt(FloatTrueDiv(ToFloat(n), 0.5))
            out = self.graph.call_function(unary, tuple(self.expr(a) for a in e.args))
        elif isinstance(e, sympy.Symbol):
            out = self.bind_symbol(e)
        elif isinstance(e, sympy.Add):
            terms = sorted(e.args, key=sympy.default_sort_key)
            out = self.expr(terms[0])
            for t in terms[1:]:
                out = self.graph.call_function(operator.add, (out, self.expr(t)))
        elif isinstance(e, sympy.Mul):
            factors = sorted(e.args, key=sympy.default_sort_key)
            out = self.expr(factors[0])
            for f in factors[1:]:
                out = self.graph.call_function(operator.mul, (out, self.expr(f)))
        elif isinstance(e, FloorDiv):
            out = self.graph.call_function(operator.floordiv, (self.expr(e.args[0]), self.expr(e.args[1])))
        elif isinstance(e, ModularIndexing):
            q = self.graph.call_function(operator.floordiv, (self.expr(e.args[0]), self.expr(e.args[1])))
            out = self.graph.call_function(operator.mod, (q, self.expr(e.args[2])))
        elif isinstance(e, (sympy.Mod, Mod, PythonMod)):
            out = self.graph.call_function(operator.mod, (self.expr(e.args[0]), self.expr(e.args[1])))
        elif isinstance(e, sympy.Pow) and e.exp.is_Integer and e.exp > 0:
            base = self.expr(e.base)
            out = base
            for _ in range(int(e.exp) - 1):
                out = self.graph.call_function(operator.mul, (out, base))
        elif isinstance(e, sympy.Rel) or e in (sympy.true, sympy.false):
            if e in (sympy.true, sympy.false):
                return bool(e)
            fn = _RELATIONS[type(e)]
            out = self.graph.call_function(fn, (self.expr(e.lhs), self.expr(e.rhs)))
        elif isinstance(e, MAX_TYPES + MIN_TYPES):
            fn = torch.sym_max if isinstance(e, MAX_TYPES) else torch.sym_min
            args = sorted(e.args, key=sympy.default_sort_key)
            out = self.expr(args[0])
            for a in args[1:]:
                out = self.graph.call_function(fn, (out, self.expr(a)))
        else:
            raise SymbolResolutionError(f"cannot emit size expression {e} ({type(e).__name__})")
        self.exprs[e] = out
        return out

    # ------------------------------------------------------------------ values
    def buffer_node(self, buf: Buffer) -> Any:
        node = self.nodes.get(buf.name)
        if node is None:
            node = self.allocate(buf)
        return node

    def allocate(self, buf: Buffer) -> fx.Node:
        lay = buf.layout
        size = tuple(self.expr(s) for s in lay.size)
        stride = tuple(self.expr(s) for s in lay.stride)
        fast = fast_allocator(lay.device)
        if fast is not None:
            node = self.graph.create_node("call_function", fast, (size, stride, lay.dtype), name=buf.name)
        else:
            node = self.graph.create_node(
                "call_function",
                torch.empty_strided,
                (size, stride),
                {"dtype": lay.dtype, "device": lay.device},
                name=buf.name,
            )
        self.nodes[buf.name] = node
        return node

    def value(self, v: Any) -> Any:
        """``v`` as a wrapper graph argument; lists, tuples and dicts are mapped leaf by leaf, in order."""
        return pytree.tree_map(self._leaf_value, v)

    def _leaf_value(self, v: Any) -> Any:
        if isinstance(v, Strided):
            base = self.buffer_node(v.buffer)
            if v.is_whole_buffer():
                return base
            size = [self.expr(s) for s in v.layout.size]
            stride = [self.expr(s) for s in v.layout.stride]
            offset = self.expr(v.buffer.base_offset + v.layout.offset)
            key = (base, v.dtype, tuple(size), tuple(stride), offset)
            view = self.views.get(key)
            if view is None:  # one view node per geometry of a buffer, whatever reads it
                allocated = _allocates(base)
                if v.dtype != v.buffer.dtype:
                    base = self.graph.call_function(aten.view.dtype, (base, v.dtype))
                # a buffer this wrapper allocated starts its storage: Dynamo's C helper takes the offset as is
                target = reinterpret_c if allocated and reinterpret_c is not None else reinterpret_tensor
                view = self.views[key] = self.graph.call_function(target, (base, size, stride, offset))
            return view
        if isinstance(v, SymScalar):
            return self.expr(v.expr) if not v.expr.is_number else v.py_type(v.expr)
        if isinstance(v, Opaque):
            if id(v) not in self.opaque:
                self.opaque[id(v)] = self.attribute(v)
            return self.opaque[id(v)]
        if isinstance(v, SubgraphRef):
            return self.graph.get_attr(v.attr)
        return v

    def attribute(self, v: Opaque) -> fx.Node:
        """A graph attribute passed to a fallback as is (the subgraph of ``map`` or ``scan``), registered on
        the wrapper under a fresh name (compiled ``cond`` subgraphs keep the original names)."""
        name, obj = next((n, o) for val, n, o in self.g.attributes if val is v)
        attr = f"{name}_attr"
        while hasattr(self.root, attr):
            attr += "_"
        if isinstance(obj, torch.nn.Module):
            self.root.add_module(attr, obj)
        else:
            setattr(self.root, attr, obj)
        return self.graph.get_attr(attr)

    def bind_outputs(self, outputs: Any, node: Any) -> None:
        """Name the results of an extern call: buffers, unbacked symbols and opaque values.

        A tensor result with two or more dims goes through ``ensure_strides``: kernels downstream were compiled
        for the strides of its FakeTensor, and a real ATen kernel may pick others.
        """
        items: dict[tuple, Any] = {(): node}  # key path -> the getitem node of that element, made once

        def item(path: tuple) -> Any:
            if path not in items:
                key, parent = path[-1], item(path[:-1])
                if isinstance(key, pytree.GetAttrKey):  # a named tuple's field
                    items[path] = self.graph.call_function(getattr, (parent, key.name))
                else:
                    index = key.idx if isinstance(key, pytree.SequenceKey) else key.key
                    items[path] = self.graph.call_function(operator.getitem, (parent, index))
            return items[path]

        for path, out in pytree.tree_flatten_with_path(outputs)[0]:  # None elements are no leaves
            if isinstance(out, (Buffer, SymScalar, Opaque)):
                self._bind_output(out, item(tuple(path)))

    def _bind_output(self, out: Any, node: Any) -> None:
        if isinstance(out, Buffer):
            for d, s in enumerate(out.layout.size):  # data-dependent sizes are read off the result
                if isinstance(s, sympy.Symbol) and s not in self.syms and _unbound(self, s):
                    self.syms[s] = self.graph.call_method("size", (node, d))
            if sum(1 for s in out.layout.size if s != 1) >= 2:
                stride = tuple(self.expr(s) for s in out.layout.stride)
                node = self.graph.call_function(ensure_strides, (node, stride))
            self.nodes[out.name] = node
        elif isinstance(out, SymScalar):
            if isinstance(out.expr, sympy.Symbol) and out.expr not in self.syms:
                self.syms[out.expr] = node
        else:
            self.opaque[id(out)] = node

    # ------------------------------------------------------------------ steps
    def build(self) -> Wrapper:
        for ph, value in self.g.inputs:
            node = self.graph.placeholder(ph.name)
            node.meta["val"] = ph.meta.get("val")
            self.placeholders.append((node, value))
            if isinstance(value, Strided):
                self.nodes[value.buffer.name] = node
            elif isinstance(value, SymScalar) and isinstance(value.expr, sympy.Symbol):
                self.syms.setdefault(value.expr, node)
            elif isinstance(value, Opaque):
                self.opaque[id(value)] = node
        for name, tensor in self.g.constants.items():
            self.root.register_buffer(name, tensor)
            self.nodes[name] = self.graph.get_attr(name)
        for name, target in self.schedule.in_place.items():  # stored into the input itself (``inplace.py``)
            self.nodes[name] = self.nodes[target]
        items = self.schedule.items
        tail = len(items)  # the trailing write-backs into mutated inputs, emitted together
        while tail and isinstance(last := items[tail - 1], ExternCall) and last.write_back:
            tail -= 1
        groups = {id(g): k for k, g in enumerate(self.schedule.groups)}
        for item in items[:tail]:
            if isinstance(item, KernelGroup):
                combo = self.kernels.combo_of(groups[id(item)]) if self.kernels.combos else None
                if combo is None:
                    self.emit_kernel(item, self.kernel_of[id(item)])
                elif combo.indices[0] == groups[id(item)]:  # launched at its first part's place
                    self.emit_combo(combo)
            elif isinstance(item, ExternCall):
                self.emit_extern(item)
            elif isinstance(item, SubgraphCall):
                self.emit_subgraph(item)
        if tail < len(items):
            self.emit_write_backs([it for it in items[tail:] if isinstance(it, ExternCall)])  # every one is
        outs = [self.value(v) if v is not None else None for v in self.g.outputs]
        self.graph.output(tuple(outs))
        reuse_buffers(self.graph)
        if self.trace_sites is not None:
            value_trace.add_trace_calls(self.graph, self.trace_sites, self.g.name)
        gm = fx.GraphModule(self.root, self.graph, class_name="KilnWrapper")
        for name, module in gm.named_children():
            if isinstance(module, TritonKernel):
                # found by plain attribute lookup: `self.<kernel>` in the wrapper skips nn.Module.__getattr__
                # (a microsecond per launch); the kernel stays a submodule for printing and state
                gm.__dict__[name] = module
        return Wrapper(gm, self.schedule, self.kernels)

    def emit_kernel(self, group: KernelGroup, ks: KernelSource) -> None:
        if group.kind == "scatter":  # writes into its target's memory, which becomes the scattered buffer
            m = group.members[0]
            d = m.buf.definition
            assert isinstance(d, Scatter), f"a scatter group's member is a scatter: {m.buf.name}"
            self.nodes[m.buf.name] = self.nodes[d.target]
        for m in group.members + group.partials:
            if m.store and m.buf.name not in self.nodes:
                self.allocate(m.buf)
        attr = ks.name
        if not hasattr(self.root, attr):
            self.root.add_module(
                attr,
                TritonKernel(
                    ks.name,
                    ks.source,
                    [p for p, _ in ks.ptr_args],
                    [s.name for s in ks.size_args],
                    ks.reduction,
                    ks.hint,
                    ks.programs,
                ),
            )
        args = [
            self.nodes[b] if b in self.nodes else self.buffer_node(self.g.buffers[b]) for _, b in ks.ptr_args
        ]
        args += [self.expr(s) for s in ks.size_args]
        args.append(self.expr(ks.xnumel))
        if ks.reduction:
            args.append(self.expr(ks.rnumel))
        node = self.graph.call_module(attr, tuple(args))
        if self.trace_sites is not None:
            outs = [i for i, (param, _) in enumerate(ks.ptr_args) if param.startswith("out_ptr")]
            self.trace_sites.append(
                value_trace.TraceSite(
                    node,
                    "triton",
                    attr,
                    tuple(ks.ptr_args[i][1] for i in outs),
                    lambda: [node.args[i] for i in outs],
                )
            )  # read after buffer reuse renamed allocations

    def emit_combo(self, combo: ComboSource) -> None:
        """One launch of a combo kernel: its parts' stored buffers allocated, then ``self.<combo>(pointers of
        every part..., xnumel of each part...)``."""
        groups = self.schedule.groups
        for k in combo.indices:
            for m in groups[k].members:
                if m.store and m.buf.name not in self.nodes:
                    self.allocate(m.buf)
        if not hasattr(self.root, combo.name):
            parts = [
                TritonKernel(ks.name, ks.source, [p for p, _ in ks.ptr_args], [], False, ks.hint, 0)
                for ks in combo.parts
            ]
            self.root.add_module(
                combo.name, ComboKernel(combo.name, combo.source, [p for p, _ in combo.ptr_args], parts)
            )
        args = [
            self.nodes[b] if b in self.nodes else self.buffer_node(self.g.buffers[b])
            for _, b in combo.ptr_args
        ]
        args += [self.expr(ks.xnumel) for ks in combo.parts]
        node = self.graph.call_module(combo.name, tuple(args))
        if self.trace_sites is not None:
            outs = [i for i, (param, _) in enumerate(combo.ptr_args) if param.startswith("out_ptr")]
            self.trace_sites.append(
                value_trace.TraceSite(
                    node,
                    "triton",
                    combo.name,
                    tuple(combo.ptr_args[i][1] for i in outs),
                    lambda: [node.args[i] for i in outs],
                )
            )

    def emit_extern(self, call: ExternCall) -> None:
        args = self.value(call.args)
        kwargs = self.value(call.kwargs)
        if call.out is not None:
            kwargs["out"] = self.allocate(call.out)
            node = self.graph.call_function(
                EXTERN_FUNCTIONS.get(call.target, call.target), tuple(args), kwargs
            )
            if self.trace_sites is not None:
                self.trace_sites.append(
                    value_trace.TraceSite(
                        node, "extern", str(call.target), (call.out.name,), lambda: [node.kwargs["out"]]
                    )
                )
            return
        target = FALLBACK_FUNCTIONS.get(call.target, call.target) if not kwargs else call.target
        node = self.graph.call_function(target, tuple(args), kwargs)
        self.bind_outputs(call.outputs, node)
        if self.trace_sites is not None and not call.write_back:
            self.trace_fallback(call)

    def trace_fallback(self, call: ExternCall) -> None:
        """Record a fallback's tensor results (after the nodes that name them, the graph's last ones now)."""
        assert self.trace_sites is not None, "fallbacks are traced only where value tracing is on"
        bufs = [b for b in pytree.tree_leaves(call.outputs) if isinstance(b, Buffer)]
        if bufs:
            nodes = [self.nodes[b.name] for b in bufs]
            self.trace_sites.append(
                value_trace.TraceSite(
                    next(iter(reversed(self.graph.nodes))),
                    "fallback",
                    str(call.target),
                    tuple(b.name for b in bufs),
                    lambda: nodes,
                )
            )

    def emit_write_backs(self, calls: list[ExternCall]) -> None:
        """The new values of the mutated inputs copied into them (the schedule's last items): one
        ``torch._foreach_copy_`` per dtype, where a ``copy_`` each was a launch each (ResNet-50's training
        forward updates 159 BatchNorm buffers: 160 memcpy nodes, 0.18 ms a CUDA-graph replay). One dtype per
        call: a list of mixed dtypes takes ATen's slow path, a ``copy_`` per tensor again. AOTAutograd gives
        mutated inputs that alias each other one base, so the targets are disjoint."""
        by_dtype: dict[torch.dtype, list[ExternCall]] = {}
        for c in calls:
            by_dtype.setdefault(c.args[0].dtype, []).append(c)
        for group in by_dtype.values():
            if len(group) == 1:
                self.emit_extern(group[0])
                continue
            dsts = [self.value(c.args[0]) for c in group]
            srcs = [self.value(c.args[1]) for c in group]
            self.graph.call_function(torch._foreach_copy_, (dsts, srcs))

    def emit_subgraph(self, call: SubgraphCall) -> None:
        for attr, module in call.subgraphs.items():
            if not hasattr(self.root, attr):
                self.root.add_module(attr, module)
        node = self.graph.call_function(call.target, tuple(self.value(call.args)), {})
        self.bind_outputs(call.outputs, node)


#: extern ``.out`` overloads -> the ``torch`` function with the same schema (``out=`` included), which binds its
#: arguments in C: about half the host time of calling the OpOverload
EXTERN_FUNCTIONS: dict[Any, Callable] = {
    aten.mm.out: torch.mm,
    aten.bmm.out: torch.bmm,
    aten.addmm.out: torch.addmm,
    aten.baddbmm.out: torch.baddbmm,
    aten.addbmm.out: torch.addbmm,
}

#: ATen fallbacks -> the ``torch`` function generated from the same native schema (positional arguments
#: only are passed through it): a ResNet-50 step makes 53 convolution calls, each cheaper in C-bound binding
FALLBACK_FUNCTIONS: dict[Any, Callable] = {
    aten.convolution.default: torch.convolution,
    aten._scaled_dot_product_cudnn_attention.default: torch._scaled_dot_product_cudnn_attention,
    aten._scaled_dot_product_efficient_attention.default: torch._scaled_dot_product_efficient_attention,
    aten._scaled_dot_product_flash_attention.default: torch._scaled_dot_product_flash_attention,
    aten.cumsum.default: torch.cumsum,
}

#: torch's sympy functions of float size arithmetic -> the Python function that computes them
_FLOAT_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "CeilToInt": math.ceil,
    "FloorToInt": math.floor,
    "TruncToInt": math.trunc,
    "RoundToInt": round,
    "ToFloat": float,
    "FloatTrueDiv": operator.truediv,
    "IntTrueDiv": operator.truediv,
}

_RELATIONS = {
    sympy.StrictGreaterThan: operator.gt,
    sympy.StrictLessThan: operator.lt,
    sympy.GreaterThan: operator.ge,
    sympy.LessThan: operator.le,
    sympy.Equality: operator.eq,
    sympy.Unequality: operator.ne,
}


def written_inputs(gm: fx.GraphModule) -> list[int]:
    """Positions of the wrapper's inputs that its kernels write (in place: ``Schedule.in_place``)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    written: set[fx.Node] = set()
    for n in gm.graph.nodes:
        if n.op != "call_module":
            continue
        kernel = gm.get_submodule(n.target)
        if isinstance(kernel, TritonKernel):
            for param, arg in zip(kernel.ptr_args, n.args):
                if param.startswith("out_ptr") and isinstance(arg, fx.Node) and arg.op == "placeholder":
                    written.add(arg)
    return [i for i, p in enumerate(placeholders) if p in written]


def fast_allocator(device: torch.device) -> Callable | None:
    """Dynamo's C allocator for ``device`` (a few microseconds less than ``torch.empty_strided`` per buffer),
    or None. It allocates on the current device, so CUDA uses it only when one GPU is visible."""
    guards = getattr(torch._C._dynamo, "guards", None)
    if device.type == "cpu":
        return getattr(guards, "_empty_strided_cpu", None)
    if device.type == "cuda" and torch.cuda.device_count() == 1 and device.index in (None, 0):
        return getattr(guards, "_empty_strided_cuda", None)
    return None


def _allocates(node: fx.Node) -> bool:
    """``node`` allocates a buffer: ``torch.empty_strided`` or one of Dynamo's C allocators."""
    return node.op == "call_function" and (
        node.target is torch.empty_strided
        or getattr(node.target, "__name__", "").startswith("_empty_strided_")
    )


#: wrapper nodes that alias their first argument's memory (views of a buffer)
_ALIASES = tuple(f for f in (reinterpret_tensor, reinterpret_c, aten.view.dtype) if f is not None)


def _pooled_last_use(alloc: fx.Node, pos: dict[fx.Node, int]) -> int | None:
    """Position of the last node that uses ``alloc``'s memory, when every use is one that lets the memory go
    at that point: a kernel launch, an ``out=`` extern call whose result is unused, or a view (followed to its
    own uses). None when the memory escapes: a graph output, a fallback or subgraph (whose result may alias
    it), anything else."""
    last, todo, seen = pos[alloc], [alloc], {alloc}
    while todo:
        node = todo.pop()
        for u in node.users:
            if u.op == "call_function" and u.target in _ALIASES and u.args[0] is node:
                if u not in seen:
                    seen.add(u)
                    todo.append(u)
            elif u.op == "call_module" or (u.op == "call_function" and "out" in u.kwargs and not u.users):
                last = max(last, pos[u])
            else:
                return None
    return last


def reuse_buffers(graph: fx.Graph) -> int:
    """Give an allocation the memory of an earlier buffer that is dead by then (Inductor's buffer reuse): one
    of the same sizes, strides, dtype and device (the same allocator call), whose every use (``_pooled_last_use``)
    comes before it. The later allocation node is replaced by the earlier one, so FX frees the buffer after
    its new last use. A chain of 5 softmaxes allocates 4 buffers instead of 10, and the 50-kernel chain of
    ``harness bench overhead`` 4 instead of 76 a call (each allocation cost the H100 box about a microsecond of
    host time). Returns the allocations removed."""
    nodes = list(graph.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    free: dict[tuple, list[fx.Node]] = {}
    pending: list[tuple[int, tuple, fx.Node]] = []  # (last use, key, allocation) of buffers still in use
    removed = 0
    for n in nodes:
        if not _allocates(n):
            continue
        still = []
        for last_use, key, a in pending:
            if last_use < pos[n]:
                free.setdefault(key, []).append(a)
            else:
                still.append((last_use, key, a))
        pending = still
        key = (n.target, n.args, tuple(sorted(n.kwargs.items(), key=lambda kv: kv[0])))
        last = _pooled_last_use(n, pos)
        reuse = free.get(key)
        if reuse:
            donor = reuse.pop()
            n.replace_all_uses_with(donor)
            graph.erase_node(n)
            removed += 1
            n = donor
        if last is not None:
            pending.append((last, key, n))
    return removed


def _unbound(builder: WrapperBuilder, s: sympy.Symbol) -> bool:
    try:
        builder.bind_symbol(s)
        return False
    except SymbolResolutionError:
        return True
