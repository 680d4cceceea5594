"""Programs: what numerics triage runs, and how a reference string finds it again on another machine.

Terms:
  program ref   the string that names a program; it is stored in the run and resolved again by `compare`:
                  ``module.path:function``  a function declared with `numerics_program` (or given --inputs);
                  ``NAME``                  a built-in program of `harness.numerics.programs` (e.g. attention);
                  ``numerics:NAME[DTYPE]``  a table-driven test of the numerics suite (PROGRAMS in
                                            tests/numerics/test_numerics.py); its pytest node id works too,
                                            e.g. ``tests/numerics/test_numerics.py::test_error_vs_fp64_not_worse_than_eager[softmax-bf16]``;
                  ``PATH.pt2``              a `torch.export` program (forward only; inputs from its example
                                            inputs, or --inputs).
  structure     how an output element depends on the inputs, for the report's worst elements:
                ``elementwise`` (inputs at the same broadcast index), ``rows`` (the row along `row_dim`: a
                reduction or a normalization) or ``opaque`` (e.g. matmuls; `reduction` then names the
                reduction length behind each output, by output-name prefix).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import inputs as inp
from .exc import ProgramError
from .records import ProgramKind, ProgramRecord, Structure

STRUCTURES = tuple(s.value for s in Structure)
_ATTR = "__kiln_numerics__"


@dataclass(frozen=True)
class Declaration:
    """What `numerics_program` attaches to a function: its inputs and what the report needs to know."""

    inputs: list[inp.InputSpec] = field(default_factory=list)
    backward: bool = True
    structure: Structure = Structure.OPAQUE
    row_dim: int = -1
    reduction: dict[str, int] = field(default_factory=dict)
    note: str = ""


@dataclass
class Program:
    """A resolved program: the function, its input specs and what the report needs to know about it."""

    ref: str
    fn: Callable[..., Any]
    inputs: list[inp.InputSpec]
    backward: bool = True
    structure: Structure = Structure.OPAQUE
    row_dim: int = -1
    reduction: dict[str, int] = field(default_factory=dict)
    note: str = ""
    kind: ProgramKind = ProgramKind.FUNCTION
    #: inputs made by the program itself from a seed on the CPU (suite programs); else from the specs
    make_inputs: Callable[[int], dict[str, torch.Tensor]] | None = None
    exported: Any = None  # the ExportedProgram of a .pt2 program
    file_sha256: str | None = None

    @property
    def name(self) -> str:
        return self.ref

    def cpu_inputs(self, seed: int) -> dict[str, torch.Tensor]:
        """The program's inputs on the CPU for `seed`."""
        if self.make_inputs is not None:
            return self.make_inputs(seed)
        return inp.generate_all(self.inputs, seed)

    def grad_inputs(self) -> list[str]:
        """Names of the inputs whose gradients are outputs (none without a backward)."""
        if not self.backward:
            return []
        return [s.name for s in self.inputs if s.wants_grad and s.torch_dtype.is_floating_point]

    def reduction_length(self, output: str) -> int | None:
        """The declared reduction length behind `output` (longest matching name prefix), if any."""
        best = max(
            (k for k in self.reduction if output == k or output.startswith(k + ".") or k == "*"),
            key=len,
            default=None,
        )
        return None if best is None else self.reduction[best]

    def identity(self) -> dict[str, Any]:
        """What two runs must share to be compared: ref, kind, input specs, backward, .pt2 digest."""
        return self.describe().identity()

    def describe(self) -> ProgramRecord:
        """The program as a run records it."""
        return ProgramRecord(
            ref=self.ref,
            kind=self.kind,
            inputs=[s.text() for s in self.inputs],
            backward=self.backward,
            file_sha256=self.file_sha256,
            structure=self.structure,
            row_dim=self.row_dim,
            reduction=dict(self.reduction),
            note=self.note,
        )


def numerics_program(
    *inputs: str | inp.InputSpec,
    backward: bool = True,
    structure: str = "opaque",
    row_dim: int = -1,
    reduction: dict[str, int] | None = None,
    note: str = "",
):
    """Declare a function as a program: ``@numerics_program("x:bf16[64,64]", "w:bf16[64]", structure="rows")``."""
    specs = [inp.parse(s) if isinstance(s, str) else s for s in inputs]
    if structure not in STRUCTURES:
        raise ProgramError(f"structure {structure!r}; known: {', '.join(STRUCTURES)}")
    decl = Declaration(specs, backward, Structure(structure), row_dim, dict(reduction or {}), note)

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        setattr(fn, _ATTR, decl)
        return fn

    return wrap


#: where the built-in programs live (`python -m harness numerics run attention`)
BUILTIN_MODULE = "harness.numerics.programs"


def variant(
    fn: Callable[..., Any], name: str, *inputs: str | inp.InputSpec, **decl: Any
) -> Callable[..., Any]:
    """A copy of `fn` (same code, no wrapper frame) declared with other inputs: sizes for CPU and GPU."""
    copy = types.FunctionType(fn.__code__, fn.__globals__, name, fn.__defaults__, fn.__closure__)
    copy.__qualname__, copy.__doc__, copy.__module__ = name, fn.__doc__, fn.__module__
    return numerics_program(*inputs, **decl)(copy)


def resolve(ref: str, inputs_override: list[str] | None = None, root: Path | None = None) -> Program:
    """The program a ref names (see the module docstring); `inputs_override` replaces declared inputs."""
    ref = ref.strip()
    if ref.endswith(".pt2"):
        prog = _resolve_export(ref)
    elif "::" in ref or ref.startswith("numerics:"):
        prog = _resolve_suite(ref, root)
    elif ":" in ref:
        prog = _resolve_function(ref)
    else:
        # the built-ins are a module of programs like any `module:function` one (declared with this module's
        # decorator), found by name as those are
        builtin = importlib.import_module(BUILTIN_MODULE).BUILTIN
        if ref not in builtin:
            raise ProgramError(
                f"unknown program {ref!r}: not module.path:function, numerics:NAME[DTYPE], a .pt2 "
                f"file, or a built-in ({', '.join(builtin)})"
            )
        prog = _from_function(ref, builtin[ref])
    if inputs_override:
        if prog.make_inputs is not None:
            raise ProgramError(f"{ref}: a suite program makes its own inputs; --inputs does not apply")
        prog.inputs = [inp.parse(s) for s in inputs_override]
    if not prog.inputs and prog.make_inputs is None:
        raise ProgramError(
            f"{ref} declares no inputs: decorate it with harness.numerics.program.numerics_program "
            "or pass --inputs 'x:bf16[8,64]' ..."
        )
    return prog


def _from_function(ref: str, fn: Callable[..., Any]) -> Program:
    decl = getattr(fn, _ATTR, None) or Declaration()
    return Program(
        ref,
        fn,
        list(decl.inputs),
        backward=decl.backward,
        structure=decl.structure,
        row_dim=decl.row_dim,
        reduction=dict(decl.reduction),
        note=decl.note,
    )


def _resolve_function(ref: str) -> Program:
    module_name, _, attr = ref.partition(":")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's to fix
        raise ProgramError(f"cannot import {module_name!r} for {ref}: {type(e).__name__}: {e}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ProgramError(f"{module_name} has no function {attr!r}")
    return _from_function(ref, fn)


# ---- the numerics suite's table-driven tests ------------------------------------------------------------
#: structure of each PROGRAMS entry of tests/numerics/test_numerics.py (rows: reduced along row_dim)
SUITE_STRUCTURE: dict[str, tuple[Structure, int]] = {
    "softmax": (Structure.ROWS, -1),
    "log_softmax": (Structure.ROWS, -1),
    "layer_norm": (Structure.ROWS, -1),
    "rmsnorm": (Structure.ROWS, -1),
    "gelu_epilogue": (Structure.ELEMENTWISE, -1),
    "row_sum_long": (Structure.ROWS, -1),
    "mean_var": (Structure.ROWS, 0),
    "causal_softmax": (Structure.ROWS, -1),
    "mse_loss": (Structure.OPAQUE, -1),
}
SUITE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def suite_module(root: Path | None = None) -> types.ModuleType:
    """tests/numerics/test_numerics.py, imported once (its helpers come from tests/kiln_testing.py)."""
    name = "kiln_numerics_suite"
    if name in sys.modules:
        return sys.modules[name]
    if root is None:
        from harness.settings import settings

        root = settings().root
    path = root / "tests" / "numerics" / "test_numerics.py"
    if not path.is_file():
        raise ProgramError(f"{path} not found: suite programs need the kiln checkout")
    if str(root / "tests") not in sys.path:
        sys.path.insert(0, str(root / "tests"))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except Exception as e:  # noqa: BLE001
        del sys.modules[name]
        raise ProgramError(f"cannot import {path}: {type(e).__name__}: {e}") from None
    return module


def _resolve_suite(ref: str, root: Path | None) -> Program:
    m = re.search(r"\[([^\]]+)\]$", ref)
    if not m:
        raise ProgramError(f"{ref}: expected numerics:NAME[DTYPE] or a test id ending in [NAME-DTYPE]")
    tokens = m.group(1).split("-")
    table = suite_module(root).PROGRAMS
    dtype_tok = next((t for t in tokens if t in SUITE_DTYPES), None)
    name = next((t for t in tokens if t in table), None)
    if ref.startswith("numerics:"):
        name = ref[len("numerics:") : m.start()]
    if "::" in ref and "test_error_vs_fp64_not_worse_than_eager" not in ref:
        raise ProgramError(
            f"{ref}: only test_error_vs_fp64_not_worse_than_eager[NAME-DTYPE] (the PROGRAMS table) "
            "names a program of the numerics suite"
        )
    if name is None or name not in table or dtype_tok is None:
        raise ProgramError(
            f"{ref}: unknown suite program; known names {', '.join(sorted(table))}, "
            f"dtypes {', '.join(SUITE_DTYPES)}"
        )
    fn, make = table[name]
    dtype = SUITE_DTYPES[dtype_tok]

    def make_inputs(seed: int) -> dict[str, torch.Tensor]:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            args = make(dtype, "cpu")
        return {f"arg{i}": a.contiguous() for i, a in enumerate(args)}

    example = make_inputs(0)
    specs = [
        inp.InputSpec(n, tuple(t.shape), inp.dtype_name(t.dtype), grad=False) for n, t in example.items()
    ]
    structure, row_dim = SUITE_STRUCTURE.get(name, (Structure.OPAQUE, -1))
    return Program(
        f"numerics:{name}[{dtype_tok}]",
        fn,
        specs,
        backward=False,
        structure=structure,
        row_dim=row_dim,
        kind=ProgramKind.SUITE,
        make_inputs=make_inputs,
        note=f"PROGRAMS[{name!r}] of tests/numerics/test_numerics.py, inputs made on the CPU",
    )


# ---- torch.export programs --------------------------------------------------------------------------------
def _resolve_export(ref: str) -> Program:
    path = Path(ref)
    if not path.is_file():
        raise ProgramError(f"{path} not found")
    data = path.read_bytes()
    try:
        ep = torch.export.load(str(path))
    except Exception as e:  # noqa: BLE001
        raise ProgramError(f"{path} is not a torch.export program: {type(e).__name__}: {e}") from None
    specs: list[inp.InputSpec] = []
    example = getattr(ep, "example_inputs", None)
    args = list(example[0]) if example else []
    user = [s for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    for i, s in enumerate(user):
        name = re.sub(r"[^A-Za-z0-9_]", "_", s.arg.name) or f"arg{i}"
        val = args[i] if i < len(args) else placeholders[s.arg.name].meta.get("val")
        try:
            shape = tuple(int(d) for d in val.shape)
        except Exception:  # noqa: BLE001 - symbolic sizes without a hint
            raise ProgramError(f"{path}: input {name} has no concrete example shape; pass --inputs") from None
        specs.append(inp.InputSpec(name, shape, inp.dtype_name(val.dtype), grad=False))
    return Program(
        str(path),
        ep.module(),
        specs,
        backward=False,
        kind=ProgramKind.EXPORT,
        exported=ep,
        file_sha256=hashlib.sha256(data).hexdigest(),
        note="torch.export program (forward only)",
    )
