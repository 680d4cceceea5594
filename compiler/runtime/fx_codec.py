"""A compiled wrapper ``GraphModule`` as plain data and back, for the graph cache (``runtime/graph_cache.py``).

The wrapper is stored as data that is checked on load, never as a pickle or Python text that runs: each node
is (op, name, target, args, kwargs); a *target* is named, and resolves only to what kiln's wrappers call:
ATen/custom operator overloads (``torch.ops.<ns>.<op>.<overload>``), higher-order ops
(``torch.ops.higher_order.<name>``), functions of ``operator``/``math``, a few builtins, C functions of the
``torch`` namespace, Dynamo's C allocators and kiln's runtime helpers; method calls are limited to
``METHODS``. Submodules are kernels (``TritonKernel``: name, source and launch signature; the source is checked to
be Triton only, ``check_kernel_source``, before it is imported), compiled subgraphs
(wrappers of ``cond``/``while_loop`` branches, recursively) or other FX graphs (``map``'s body); tensor
attributes (constants) are stored with their bytes, dtype, size, strides and offset. Anything else raises
``Unsupported``: that graph is not cached (``graph_cache`` records why) rather than rebuilt wrongly.

The FX ``GraphModule`` is then rebuilt from the data with the same node names, so its code is the same text
the fresh compile printed.
"""

from __future__ import annotations

import builtins
import math
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from .combo import ComboKernel
from .launcher import TritonKernel
from .restride import ensure_strides, reinterpret_tensor

#: tensor methods a wrapper may call (symbol binding reads sizes, strides and offsets off the inputs)
METHODS = frozenset({"size", "stride", "storage_offset", "dim", "numel"})

#: largest total of constant bytes one cached graph may carry
MAX_CONSTANT_BYTES = 64 << 20


class Unsupported(Exception):
    """The graph holds something the codec does not store (the message says what): the graph is not cached."""


def _named_functions() -> dict[str, Callable]:
    table: dict[str, Callable] = {}
    for prefix, mod in (("operator", operator), ("math", math)):
        for n in dir(mod):
            obj = getattr(mod, n)
            if not n.startswith("_") and callable(obj):
                table[f"{prefix}.{n}"] = obj
    for n in ("getattr", "round", "float", "int", "abs", "min", "max", "bool"):
        table[f"builtins.{n}"] = getattr(builtins, n)
    table["kiln.reinterpret_tensor"] = reinterpret_tensor
    table["kiln.ensure_strides"] = ensure_strides
    for n in ("sym_max", "sym_min", "sym_int", "sym_float", "sym_not", "sym_sum"):
        if hasattr(torch, n):
            table[f"torch.{n}"] = getattr(torch, n)
    guards = getattr(torch._C._dynamo, "guards", None)
    for n in ("_empty_strided_cpu", "_empty_strided_cuda", "_empty_strided_xpu", "_reinterpret_tensor"):
        if hasattr(guards, n):
            table[f"dynamo.{n}"] = getattr(guards, n)
    return table


_FUNCTIONS = _named_functions()
_FUNCTION_NAMES = {id(fn): name for name, fn in _FUNCTIONS.items()}


# --------------------------------------------------------------------------------------------- targets
def encode_target(target: Any) -> Any:
    if isinstance(target, torch._ops.OpOverload):
        return {"op": target._schema.name, "ov": target._overloadname or "default"}
    if isinstance(target, torch._ops.HigherOrderOperator):
        return {"hop": target.name()}
    name = _FUNCTION_NAMES.get(id(target))
    if name is not None:
        return {"fn": name}
    tname = getattr(target, "__name__", None)
    if (
        tname
        and getattr(torch, tname, None) is target
        and type(target).__name__ == "builtin_function_or_method"
    ):
        return {"fn": f"torch.{tname}"}
    raise Unsupported(f"call target {target!r}")


def decode_target(data: Any) -> Any:
    if "op" in data:
        ns, _, name = data["op"].partition("::")
        op = getattr(getattr(getattr(torch.ops, ns), name), data["ov"])
        if not isinstance(op, torch._ops.OpOverload):
            raise Unsupported(f"{data['op']}.{data['ov']} is no operator overload")
        return op
    if "hop" in data:
        op = getattr(torch.ops.higher_order, data["hop"])
        if not isinstance(op, torch._ops.HigherOrderOperator):
            raise Unsupported(f"{data['hop']} is no higher-order op")
        return op
    name = data["fn"]
    if name in _FUNCTIONS:
        return _FUNCTIONS[name]
    if name.startswith("torch."):
        fn = getattr(torch, name[len("torch.") :], None)
        if type(fn).__name__ == "builtin_function_or_method":
            return fn
    raise Unsupported(f"function {name}")


# --------------------------------------------------------------------------------------------- arguments
def encode_arg(v: Any, index: dict[fx.Node, int]) -> Any:
    """``v`` (an FX argument) as JSON-able data; node references by their position in the graph."""
    if isinstance(v, fx.Node):
        return {"n": index[v]}
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return {"f": v.hex()}
    if isinstance(v, (list, tuple)):
        return {"l" if isinstance(v, list) else "t": [encode_arg(a, index) for a in v]}
    if isinstance(v, dict):
        if not all(isinstance(k, str) for k in v):
            raise Unsupported("a dict argument with non-string keys")
        return {"d": [[k, encode_arg(a, index)] for k, a in v.items()]}
    if isinstance(v, torch.dtype):
        return {"dt": str(v).removeprefix("torch.")}
    if isinstance(v, torch.device):
        return {"dev": str(v)}
    if isinstance(v, (torch.memory_format, torch.layout)):
        return {"tc": str(v).removeprefix("torch.")}
    if isinstance(v, slice):
        return {"sl": [encode_arg(v.start, index), encode_arg(v.stop, index), encode_arg(v.step, index)]}
    if v is Ellipsis:
        return {"el": 1}
    raise Unsupported(f"an argument of type {type(v).__name__}")


def decode_arg(v: Any, nodes: list[fx.Node]) -> Any:
    if not isinstance(v, dict):
        if v is None or isinstance(v, (bool, int, str)):
            return v
        raise Unsupported(f"argument data {v!r}")
    if "n" in v:
        return nodes[v["n"]]
    if "f" in v:
        return float.fromhex(v["f"])
    if "l" in v:
        return [decode_arg(a, nodes) for a in v["l"]]
    if "t" in v:
        return tuple(decode_arg(a, nodes) for a in v["t"])
    if "d" in v:
        return {k: decode_arg(a, nodes) for k, a in v["d"]}
    if "dt" in v:
        dt = getattr(torch, v["dt"])
        if not isinstance(dt, torch.dtype):
            raise Unsupported(f"dtype {v['dt']}")
        return dt
    if "dev" in v:
        return torch.device(v["dev"])
    if "tc" in v:
        obj = getattr(torch, v["tc"])
        if not isinstance(obj, (torch.memory_format, torch.layout)):
            raise Unsupported(f"torch constant {v['tc']}")
        return obj
    if "sl" in v:
        return slice(*(decode_arg(a, nodes) for a in v["sl"]))
    if "el" in v:
        return Ellipsis
    raise Unsupported(f"argument data {v!r}")


# --------------------------------------------------------------------------------------------- kernels
#: what a kernel module may import at its top level
KERNEL_IMPORTS = frozenset(
    {"import triton", "import triton.language as tl", "from triton.language.extra import libdevice"}
)
#: builtins a kernel body may name (everything else: its module's names, its parameters and locals)
KERNEL_BUILTINS = frozenset({"range", "min", "max", "int", "float", "bool", "len", "True", "False", "None"})


#: sha256 digests of kernel sources this process found Triton only (a source is checked once per process)
_checked: set[bytes] = set()


def check_kernel_source(source: str) -> None:
    """``Unsupported`` unless ``source`` is a kernel module as kiln renders it: the three Triton imports and
    ``@triton.jit`` functions whose bodies name only Triton (``tl``, ``libdevice``, ``triton``), the module's
    own functions, their parameters and locals, and a few builtins; no attribute starting with ``_``. A kernel
    source from the graph cache is imported (and, under the interpreter, run as Python): it is checked first.
    A source that passed is remembered by its digest (a warm process loads the same kernel for several graphs).
    A source identical, byte for byte, to its file in kiln's kernel folder (``cache.source_path``) is taken as
    checked: kiln imports that file as it is whenever the source is launched, so the check would add nothing to
    what the folder is already trusted with (a warm process finds every kernel there: no parse)."""
    import hashlib

    raw = source.encode()
    digest = hashlib.sha256(raw).digest()
    if digest in _checked:
        return
    if not _in_kernel_folder(source, raw):
        _check_module(source)
    _checked.add(digest)


def _in_kernel_folder(source: str, raw: bytes) -> bool:
    from . import cache

    try:
        with open(cache.source_path(source), "rb") as f:
            return f.read() == raw
    except OSError:
        return False


def _check_module(source: str) -> None:
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise Unsupported(f"kernel source does not parse: {e}") from None
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if ast.unparse(node) not in KERNEL_IMPORTS:
                raise Unsupported(f"kernel import {ast.unparse(node)!r}")
        elif isinstance(node, ast.FunctionDef):
            if [ast.unparse(d) for d in node.decorator_list] != ["triton.jit"]:
                raise Unsupported(f"kernel function {node.name} not a plain @triton.jit")
            _check_body(node, functions)
        elif not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):  # a docstring
            raise Unsupported(f"kernel module statement {type(node).__name__}")


def _check_body(fn: Any, functions: set[str]) -> None:
    """One walk over the body: refused nodes raise at once; names read are checked after the walk against
    parameters, every name the body stores, the module's functions and ``KERNEL_BUILTINS``."""
    import ast

    refused = (
        ast.Import,
        ast.ImportFrom,
        ast.Global,
        ast.Nonlocal,
        ast.Lambda,
        ast.ClassDef,
        ast.AsyncFunctionDef,
        ast.Await,
        ast.Yield,
        ast.YieldFrom,
        ast.With,
        ast.Try,
        ast.Delete,
    )
    local = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
    loads: list[str] = []
    for node in ast.walk(fn):
        t = type(node)
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Store):
                local.add(node.id)
            elif isinstance(node.ctx, ast.Load):
                loads.append(node.id)
        elif isinstance(node, ast.Attribute):
            if node.attr.startswith("_"):
                raise Unsupported(f"kernel {fn.name}: attribute {node.attr}")
        elif isinstance(node, refused):
            raise Unsupported(f"kernel {fn.name}: {t.__name__} statement")
        elif t is ast.FunctionDef and node is not fn:
            raise Unsupported(f"kernel {fn.name}: nested function")
    allowed = local | functions | KERNEL_BUILTINS | {"tl", "libdevice", "triton"}
    for name in loads:
        if name not in allowed:
            raise Unsupported(f"kernel {fn.name}: name {name}")


# --------------------------------------------------------------------------------------------- tensors
def encode_tensor(t: torch.Tensor, blobs: list[bytes]) -> dict:
    """A constant tensor: its whole storage's bytes go to ``blobs``; size, strides and offset are kept."""
    if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.is_quantized or t.is_sparse:
        raise Unsupported(f"a constant of type {type(t).__name__}")
    storage = t.untyped_storage()
    if storage.nbytes() + sum(len(b) for b in blobs) > MAX_CONSTANT_BYTES:
        raise Unsupported(f"constants above {MAX_CONSTANT_BYTES >> 20} MiB")
    raw = torch.empty(0, dtype=torch.uint8).set_(storage.cpu() if storage.device.type != "cpu" else storage)
    blobs.append(raw.numpy().tobytes())
    return {
        "blob": len(blobs) - 1,
        "dtype": str(t.dtype).removeprefix("torch."),
        "size": list(t.shape),
        "stride": list(t.stride()),
        "offset": t.storage_offset(),
        "device": str(t.device),
        "grad": bool(t.requires_grad),
    }


def decode_tensor(data: dict, blobs: list[bytes]) -> torch.Tensor:
    dtype = getattr(torch, data["dtype"])
    if not isinstance(dtype, torch.dtype):
        raise Unsupported(f"dtype {data['dtype']}")
    raw = (
        torch.frombuffer(bytearray(blobs[data["blob"]]), dtype=torch.uint8)
        if blobs[data["blob"]]
        else torch.empty(0, dtype=torch.uint8)
    )
    raw = raw.to(torch.device(data["device"]))
    t = torch.empty(0, dtype=dtype, device=raw.device).set_(
        raw.untyped_storage(), data["offset"], data["size"], data["stride"]
    )
    return t.requires_grad_(data["grad"]) if data["grad"] else t


# --------------------------------------------------------------------------------------------- modules
def encode_module(gm: fx.GraphModule, blobs: list[bytes]) -> dict:
    """``gm`` (a kiln wrapper or another FX graph) as data; tensors' bytes appended to ``blobs``."""
    nodes = list(gm.graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    out_nodes = []
    attrs: dict[str, Any] = {}
    for n in nodes:
        item: dict[str, Any] = {"op": n.op, "name": n.name}
        if n.op in ("call_function",):
            item["target"] = encode_target(n.target)
        elif n.op == "call_method":
            if n.target not in METHODS:
                raise Unsupported(f"method call .{n.target}()")
            item["target"] = n.target
        elif n.op in ("call_module", "get_attr"):
            if "." in n.target:
                raise Unsupported(f"a nested attribute {n.target}")
            item["target"] = n.target
            if n.target not in attrs:
                attrs[n.target] = encode_attr(getattr(gm, n.target), blobs)
        elif n.op == "placeholder":
            item["target"] = n.target
        item["args"] = encode_arg(n.args, index)
        item["kwargs"] = encode_arg(dict(n.kwargs), index)
        out_nodes.append(item)
    return {"nodes": out_nodes, "attrs": attrs, "class": type(gm).__name__}


def encode_attr(obj: Any, blobs: list[bytes]) -> dict:
    if isinstance(obj, ComboKernel):  # a combo holds its parts' kernels (the guard may run them instead)
        check_kernel_source(obj.source)
        return {
            "kind": "combo",
            "name": obj.name,
            "source": obj.source,
            "ptr_args": list(obj.ptr_args),
            "parts": [encode_attr(p, blobs) for p in obj.parts],
        }
    if isinstance(obj, TritonKernel):
        check_kernel_source(obj.source)  # what the load checks: never store a kernel that would not load
        return {
            "kind": "kernel",
            "name": obj.name,
            "source": obj.source,
            "ptr_args": list(obj.ptr_args),
            "size_args": list(obj.size_args),
            "reduction": bool(obj.reduction),
            "hint": obj.hint,
            "programs": int(obj.programs),
        }
    if isinstance(obj, fx.GraphModule):
        return {"kind": "graph", "graph": encode_module(obj, blobs)}
    if isinstance(obj, torch.Tensor):
        return {"kind": "tensor", "tensor": encode_tensor(obj, blobs)}
    from ..lowering.control_flow import SingleOutput

    if type(obj) is SingleOutput and isinstance(obj.wrapper, fx.GraphModule):
        return {"kind": "single", "graph": encode_module(obj.wrapper, blobs)}
    raise Unsupported(f"an attribute of type {type(obj).__name__}")


def decode_attr(data: dict, blobs: list[bytes]) -> Any:
    kind = data["kind"]
    if kind == "kernel":
        check_kernel_source(data["source"])
        return TritonKernel(
            data["name"],
            data["source"],
            list(data["ptr_args"]),
            list(data["size_args"]),
            bool(data["reduction"]),
            data["hint"],
            int(data["programs"]),
        )
    if kind == "combo":
        check_kernel_source(data["source"])
        parts = [decode_attr(p, blobs) for p in data["parts"]]
        if not all(type(p) is TritonKernel for p in parts):
            raise Unsupported("a combo kernel whose parts are not kernels")
        return ComboKernel(data["name"], data["source"], list(data["ptr_args"]), parts)
    if kind == "graph":
        return decode_module(data["graph"], blobs)
    if kind == "tensor":
        return decode_tensor(data["tensor"], blobs)
    if kind == "single":
        from ..lowering.control_flow import SingleOutput

        return SingleOutput(decode_module(data["graph"], blobs))
    raise Unsupported(f"attribute kind {kind!r}")


def decode_module(data: dict, blobs: list[bytes]) -> fx.GraphModule:
    """Rebuild the ``GraphModule`` that ``encode_module`` stored (``Unsupported`` on anything unexpected)."""
    root = torch.nn.Module()
    for name, attr in data["attrs"].items():
        if not name.isidentifier():
            raise Unsupported(f"attribute name {name!r}")
        obj = decode_attr(attr, blobs)
        if isinstance(obj, torch.nn.Module):
            root.add_module(name, obj)
        else:
            root.register_buffer(name, obj)
    graph = fx.Graph()
    nodes: list[fx.Node] = []
    for item in data["nodes"]:
        op = item["op"]
        args = decode_arg(item["args"], nodes)
        kwargs = decode_arg(item["kwargs"], nodes)
        if op == "call_function":
            target = decode_target(item["target"])
        elif op == "call_method":
            target = item["target"]
            if target not in METHODS:
                raise Unsupported(f"method call .{target}()")
        elif op in ("call_module", "get_attr"):
            target = item["target"]
            if target not in data["attrs"]:
                raise Unsupported(f"attribute {target!r} not stored")
        elif op == "placeholder":
            target = item["target"]
        elif op == "output":
            target = "output"
        else:
            raise Unsupported(f"node op {op!r}")
        nodes.append(graph.create_node(op, target, args, kwargs, name=item["name"]))
    cls = data.get("class") or "GraphModule"
    if not cls.isidentifier():
        raise Unsupported(f"class name {cls!r}")
    gm = fx.GraphModule(root, graph, class_name=cls)
    for name, module in gm.named_children():
        if isinstance(module, TritonKernel):
            gm.__dict__[name] = module  # as ``codegen.wrapper`` does: plain attribute lookup at each launch
    return gm
