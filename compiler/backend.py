"""The ``torch.compile`` entry point and kiln's pass pipeline.

Dynamo hands an FX graph of torch ops to ``kiln_backend``; AOTAutograd decomposes it to core ATen (plus
``decompositions.EXTRA``), functionalizes it and splits forward/backward; each ATen graph then runs
through ``PASSES`` in order. Subgraphs of higher-order ops (``torch.cond``) go through the same pipeline.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import torch.fx as fx

from . import (
    config,
    fx_addmm,
    fx_attention,
    fx_passes,
    lowering,  # noqa: F401  (fills graph.LOWERINGS)
    phase_times,
)
from .capture import CompiledGraph, record
from .codegen.combo import combine
from .codegen.kernels import Kernels, render
from .codegen.triton_kernel import KernelSource
from .codegen.wrapper import Wrapper, wrap, written_inputs
from .decompositions import decomposition_table
from .exc import InvariantError, KernelLaunchError, KilnError
from .graph import FallbackReason, GraphLowering, Program
from .inplace import write_in_place
from .runtime import cache, graph_cache, inference_cache, precompile, value_trace
from .runtime.cudagraphs import CudaGraphRunner, GraphFacts
from .scheduler import Schedule, schedule
from .split import split_independent

log = logging.getLogger("kiln")


@dataclasses.dataclass
class GraphJob:
    """One ATen graph going through ``PASSES``, and what the passes know of it. Not a product: the products
    (``program``, ``schedule``, ``kernels``, ``wrapper``) are what the passes return (``run_passes``).

    The FX passes rewrite ``gm`` in place; ``lower`` appends to ``subgraphs`` the records of the ``torch.cond``
    branches it compiles.
    """

    gm: fx.GraphModule
    name: str
    role: str = (
        "inference"  # AOTAutograd's: inference, forward or backward; "subgraph" for torch.cond branches
    )
    example_inputs: list | None = None  # what AOTAutograd passed (FakeTensors with the inputs' real strides)
    #: outputs may leave in a layout the passes chose (Dynamo's inference graphs: AOTAutograd hands them to the
    #: caller as they are); else each keeps the strides eager gave it
    free_output_layouts: bool = False
    subgraphs: list[CompiledGraph] = dataclasses.field(default_factory=list)


def input_strides_pass(job: GraphJob) -> None:
    if job.example_inputs is not None:
        fx_passes.adopt_input_strides(job.gm, job.example_inputs)


def attention_pass(job: GraphJob) -> None:
    if job.role == "inference":  # a training forward would have to save the probabilities for its backward
        fx_attention.fuse_attention(job.gm)


def conv_layout_pass(job: GraphJob) -> None:
    fx_passes.split_conv_bias(job.gm)  # before the layout: the bias add follows the convolution's layout
    if job.role in ("inference", "backward"):
        fx_passes.convs_channels_last(job.gm)
    elif job.role == "forward":  # saved activations may stay NHWC: the backward adopts their strides
        saved = _saved_outputs(len(fx_passes.graph_outputs(job.gm)))
        if saved is not None:
            fx_passes.convs_channels_last(job.gm, free_outputs=saved)


def _saved_outputs(n_outputs: int) -> frozenset[int] | None:
    """Positions among the ``n_outputs`` outputs of the training forward being compiled that only its backward
    reads (AOTAutograd's ``tensors_saved_for_backwards_slice``), or None when its metadata is not at hand."""
    import torch

    ctx = torch._guards.TracingContext.try_get()
    if ctx is None or ctx.fw_metadata is None:  # no context or metadata
        return None
    try:
        saved = ctx.fw_metadata.tensors_saved_for_backwards_slice
    except (AttributeError, AssertionError, TypeError):  # counts not set yet
        return None
    return frozenset(range(n_outputs)[saved]) if isinstance(saved, slice) else None


def mm_layout_pass(job: GraphJob) -> None:
    fx_passes.matmul_layouts(job.gm, free_outputs=job.free_output_layouts)


def addmm_bias_pass(job: GraphJob) -> None:
    fx_addmm.choose_forms(job.gm)


def lower_pass(job: GraphJob) -> Program:
    def compile_sub(sub: fx.GraphModule, name: str) -> fx.GraphModule:
        cg = compile_graph(sub, name, role="subgraph")
        job.subgraphs.append(cg)
        return cg.wrapper

    return GraphLowering(job.gm, job.name, subgraph_compiler=compile_sub).run()


def precompile_pass(kernels: Kernels, wrapper: Wrapper) -> None:
    precompile.precompile_graph(kernels.schedule.program, kernels.launches, wrapper.module)


def dump_pass(job: GraphJob, kernels: Kernels, wrapper: Wrapper) -> None:
    _dump(job.name, wrapper.code, {ks.name: ks.source for ks in kernels.launches})


def _dump(name: str, code: str, sources: dict[str, str]) -> None:
    """The ``dump`` pass's writes (also for a graph rebuilt from the graph cache)."""
    folder = config.settings().dump_dir
    if not folder:
        return
    cache.write_atomic(
        os.path.join(folder, "graphs", f"{_safe(name)}.py"), f"# kiln wrapper for {name}\n" + code
    )
    for kname, source in sources.items():
        path = os.path.join(folder, "kernels", f"{kname}.py")
        if not os.path.exists(path):
            cache.write_atomic(path, source)


class Pass(NamedTuple):
    """One step of the pipeline: a function of the products named by ``needs`` (``"job"``: the ``GraphJob``)
    that returns the product named by ``makes`` (None: it makes none), whose ``verify()`` runs right after it
    under ``strict``."""

    name: str
    why: str
    run: Callable[..., Any]
    needs: tuple[str, ...] = ("job",)
    makes: str | None = None


#: the pipeline, in order: job -> program -> schedule -> kernels -> wrapper
PASSES: list[Pass] = [
    Pass(
        "input_strides",
        "inputs laid out otherwise than traced (a backward's channels-last saved activations) "
        "are traced again with their real strides: kernels index inputs by them",
        input_strides_pass,
    ),
    Pass(
        "attention",
        "eager attention of inference graphs (bmm, scale, mask, softmax, bmm) becomes one fused ATen "
        "attention call on a GPU: the scores are never written",
        attention_pass,
    ),
    Pass(
        "conv_layout",
        "fp16/bf16 GPU convolutions, forward and backward, run channels-last (cuDNN's NHWC "
        "kernels, no transposes around each convolution)",
        conv_layout_pass,
    ),
    Pass(
        "mm_layout",
        "misaligned large matmuls padded (or transposed operands made row-major) where a GPU timing "
        "says it pays: cuBLAS's aligned kernels",
        mm_layout_pass,
    ),
    Pass(
        "addmm_bias",
        "each linear layer's addmm takes the fastest of its forms (cuBLASLt's bias epilogue, cuBLAS with an "
        "expanded bias, or mm with the add fused into kiln's consumer) by a GPU timing at compile time",
        addmm_bias_pass,
    ),
    Pass(
        "lower",
        "ATen nodes -> kiln IR; ops without a lowering become ATen fallbacks with a reason",
        lower_pass,
        ("job",),
        "program",
    ),
    Pass(
        "schedule",
        "drop dead buffers, fuse buffers that share an iteration space into kernel groups",
        schedule,
        ("program",),
        "schedule",
    ),
    Pass(
        "in_place",
        "a mutated input's new value is stored into the input by its kernel where nothing reads the "
        "old value later: no write-back copy (an optimizer step's parameters and state)",
        write_in_place,
        ("schedule",),
        "schedule",
    ),
    Pass(
        "split",
        "a small pointwise group of independent parts (an optimizer step's updates of same-size "
        "parameters) becomes one group per part: the combo pass runs them side by side, not one after another",
        split_independent,
        ("schedule",),
        "schedule",
    ),
    Pass(
        "render", "render each kernel group to deterministic Triton source", render, ("schedule",), "kernels"
    ),
    Pass(
        "combo",
        "independent small pointwise kernels adjacent in launch order become one combo launch (a "
        "launch-bound step, such as an optimizer's per-parameter updates, pays per launch)",
        combine,
        ("schedule", "kernels"),
        "kernels",
    ),
    Pass(
        "wrap",
        "emit allocations, launches and ATen calls as the wrapper FX GraphModule",
        wrap,
        ("schedule", "kernels"),
        "wrapper",
    ),
    Pass(
        "precompile",
        "send each kernel's expected GPU specialization to the compile workers (parallel compile)",
        precompile_pass,
        ("kernels", "wrapper"),
    ),
    Pass(
        "dump",
        "write wrapper and kernel sources to KILN_DUMP_DIR when it is set",
        dump_pass,
        ("job", "kernels", "wrapper"),
    ),
]


def run_pass(job: GraphJob, p: Pass, products: dict[str, Any]) -> None:
    """Run one pass on the products it needs (errors other than kiln's own reraised as ``KilnError`` naming the
    pass and graph) and add the product it makes to ``products``; under ``strict``, verify that product
    (``InvariantError``)."""
    try:
        with phase_times.phase(f"pass.{p.name}"):
            made = p.run(*(products[n] for n in p.needs))
    except KilnError:
        raise
    except Exception as e:
        raise KilnError(f"kiln pass '{p.name}' failed on {job.name}: {type(e).__name__}: {e}") from e
    if p.makes is None:
        return
    products[p.makes] = made
    if not config.settings().strict:
        return
    try:
        if made is None:
            raise InvariantError(f"no {p.makes} was made")
        made.verify()
    except Exception as e:  # a product broken enough to trip verify() itself is broken all the same
        detail = str(e) if isinstance(e, InvariantError) else f"{type(e).__name__}: {e}"
        raise InvariantError(f"after kiln pass '{p.name}' on {job.name}: {detail}") from e


def run_passes(job: GraphJob) -> dict[str, Any]:
    """Run ``PASSES`` in order on ``job``; the products made, by name (``"job"`` included)."""
    products: dict[str, Any] = {"job": job}
    for p in PASSES:
        run_pass(job, p, products)
    return products


def compile_graph(
    gm: fx.GraphModule,
    name: str,
    role: str = "inference",
    example_inputs: list | None = None,
    free_output_layouts: bool = False,
) -> CompiledGraph:
    """Run every pass on one ATen graph and return its record (wrapper, kernels, fallbacks)."""
    config.select_interpreter()  # before the graph's first kernel is decorated (Triton reads it then)
    job = GraphJob(
        gm,
        name,
        role,
        list(example_inputs) if example_inputs is not None else None,
        free_output_layouts=free_output_layouts,
    )
    products = run_passes(job)
    program: Program = products["program"]
    schedule_: Schedule = products["schedule"]
    kernels: list[KernelSource] = products["kernels"].launches
    wrapper: Wrapper = products["wrapper"]
    return CompiledGraph(
        name,
        wrapper.module,
        {ks.name: ks.source for ks in kernels},
        len(kernels),
        schedule_.extern_count(),
        list(program.fallbacks),
        job.subgraphs,
        aten_graph=gm,
        nondeterministic=list(program.nondeterministic),
    )


_graph_ids = itertools.count()


def compile_fx_graph(
    gm: fx.GraphModule,
    example_inputs: Any,
    role: str = "inference",
    front: inference_cache.Front | None = None,
) -> Callable:
    """AOTAutograd's forward/backward/inference compiler (``role``: ``forward`` of a training graph,
    ``backward``, or ``inference``): ``compile_one_graph`` timed as phase ``graph`` (exclusive of its passes:
    the graph cache's key, load or store, CUDA-graph facts, the runner)."""
    with phase_times.phase("graph"):
        return compile_one_graph(gm, example_inputs, role, front)


def compile_one_graph(
    gm: fx.GraphModule,
    example_inputs: Any,
    role: str = "inference",
    front: inference_cache.Front | None = None,
) -> Callable:
    """AOTAutograd's forward/backward/inference compiler (``role``: ``forward`` of a training graph,
    ``backward``, or ``inference``).

    Two safety nets keep a program running when kiln has a bug (both are off under ``strict``): a graph
    whose compilation fails runs as its ATen graph, and a wrapper whose first launch fails switches to the
    ATen graph for good (safe: the only writes to inputs are the trailing write-back copies, after every
    kernel, and the in-place stores of kernels, whose inputs are restored first). Both are recorded as
    fallbacks. With the ``cudagraphs`` setting, graphs on a GPU run through
    ``runtime.cudagraphs.CudaGraphRunner``. ``front``: the inference front cache's view of the Dynamo graph
    (an inference graph stored in the graph cache is noted there).
    """
    name = f"graph_{next(_graph_ids)}"
    strict = config.settings().strict
    facts = _cudagraph_facts(gm, example_inputs, role) if config.settings().cudagraphs else None
    # a training forward's outputs before the passes: those whose layout the passes change are reported below
    outputs_before = (
        [n.meta.get("val") if isinstance(n, fx.Node) else n for n in fx_passes.graph_outputs(gm)]
        if role == "forward"
        else []
    )

    def compile_fresh() -> tuple[CompiledGraph, list | None]:
        cg = compile_graph(gm, name, role, example_inputs, free_output_layouts=role == "inference")
        return cg, fx_passes.moved_output_strides(outputs_before, gm) if role == "forward" else None

    try:  # through the graph cache (runtime/graph_cache.py): a hit rebuilds the stored graph, no pass runs
        cg, moved = graph_cache.compile_cached(
            gm, example_inputs, role, name, _cache_extra(gm, role), compile_fresh
        )
    except Exception as e:
        if strict:
            raise
        log.warning(
            "kiln: compiling %s failed (%s: %s); running its ATen graph instead", name, type(e).__name__, e
        )
        reason = FallbackReason("graph_compile_error", name, f"{type(e).__name__}: {e}")
        cg = CompiledGraph(name, gm, {}, 0, 0, [reason])
        moved = fx_passes.moved_output_strides(outputs_before, gm) if role == "forward" else None
    if role == "forward":
        _report_output_strides(moved)
    if front is not None:  # the front cache (runtime/inference_cache.py) notes what the graph cache now holds
        if role == "inference":
            front.note(cg, gm)
        elif role == "forward":
            front.note_forward(cg, gm)
        else:
            front.note_backward(cg, gm, example_inputs)
    return _finish(cg, gm, facts)


def _finish(cg: CompiledGraph, fallback: Callable, facts: GraphFacts | None) -> Callable:
    """The boxed runner of a compiled graph (recorded; dumped when rebuilt from the cache): its wrapper, with
    ``fallback`` (the ATen graph, or the Dynamo graph for a front cache hit) as the safety net of a failed
    first launch and, with ``facts``, CUDA graphs."""
    name, strict = cg.name, config.settings().strict
    if cg.cache == "hit":  # the passes did not run: dump and log what they would have
        for sub in [cg, *cg.subgraphs]:
            _dump(sub.name, sub.code, sub.kernel_sources)
        for reason in cg.fallbacks:
            (log.warning if config.settings().log_fallbacks else log.info)(
                "kiln fallback: %s (graph cache)", reason
            )
    if (
        facts is not None and config.settings().trace_values
    ):  # tracing reads outputs on the host at each launch
        cg.fallbacks.append(FallbackReason("cudagraph", name, value_trace.CUDAGRAPH_REASON))
        facts = None
    record(cg)
    log.debug("kiln compiled %s:\n%s", name, cg.code)
    gm = fallback
    # call forward directly: a wrapper has no module hooks, and nn.Module.__call__ costs microseconds a call
    state = cg.entry
    state.update(fn=cg.wrapper.forward, verified=cg.wrapper is fallback)

    def run(args: list) -> Any:  # boxed calling convention: AOTAutograd passes one list
        if state["verified"]:
            return state["fn"](*args)
        # inputs the kernels write in place: kept, so that the ATen graph starts from them after a failed launch
        saved = [] if strict else [(args[i], args[i].clone()) for i in written_inputs(cg.wrapper)]
        try:
            out = state["fn"](*args)
        except KernelLaunchError as e:
            if strict:
                raise
            for t, old in saved:
                t.copy_(old)
            log.warning("kiln: %s failed at its first run (%s); running its ATen graph instead", name, e)
            cg.fallbacks.append(FallbackReason("graph_launch_error", name, str(e)))
            state["fn"] = gm
            out = gm(*args)
        state["verified"] = True
        return out

    run._boxed_call = True  # type: ignore[attr-defined]  # AOTAutograd's mark of the boxed calling convention
    if facts is None:
        return run
    runner = CudaGraphRunner(run, name, facts, cg.fallbacks)
    cg.cudagraphs = runner

    def run_graphs(args: list) -> Any:
        return runner(args)

    run_graphs._boxed_call = True  # type: ignore[attr-defined]
    return run_graphs


def _cache_extra(gm: fx.GraphModule, role: str) -> Any:
    """What the passes read besides the graph, its inputs and the settings: a training forward's saved slice."""
    if role != "forward":
        return None
    saved = _saved_outputs(len(fx_passes.graph_outputs(gm)))
    return sorted(saved) if saved is not None else None


def _report_output_strides(strides: list | None) -> None:
    """Tell AOTAutograd the strides of a forward's outputs whose layout the passes changed (its saved
    activations, channels-last): it compiles the backward with example inputs of those strides, as it does for
    Inductor's layout optimization."""
    import torch

    ctx = torch._guards.TracingContext.try_get()
    known = getattr(ctx, "output_strides", None) if ctx is not None else None
    if strides is None or known is None:
        return
    known.extend(strides)


def _cudagraph_facts(gm: fx.GraphModule, example_inputs: Any, role: str) -> GraphFacts | None:
    """The graph's facts for CUDA graphs, or None where they cannot apply (no CUDA tensor among the inputs:
    CPU graphs, the interpreter). *Kept outputs* (``saved_from`` on) may still be held when the graph runs
    again: a training forward's outputs from AOTAutograd's ``num_forward`` on (saved for backward), and every
    output of a backward (AccumulateGrad keeps a gradient as ``.grad`` itself, so a replay would overwrite the
    ``.grad`` of the previous call: gradient accumulation, ``zero_grad(set_to_none=False)``)."""
    import torch

    if config.interpreting() or not any(
        isinstance(a, torch.Tensor) and a.device.type == "cuda" for a in example_inputs
    ):
        return None
    saved_from = None
    if role == "forward":
        ctx = torch._guards.TracingContext.try_get()
        meta = getattr(ctx, "fw_metadata", None)
        saved_from = getattr(meta, "num_forward", None) or 0  # unknown: treat every output as saved (safe)
    elif role == "backward":
        saved_from = 0
    return GraphFacts.of(gm, saved_from)


#: ``torch.compile`` modes -> the settings they stand for (Inductor's names)
MODES: dict[str, dict[str, Any]] = {
    "default": {},
    "reduce-overhead": {"cudagraphs": True},
    "max-autotune": {"cudagraphs": True, "autotune": True},
    "max-autotune-no-cudagraphs": {"autotune": True},
}


def backend_overrides(options: dict | None = None, mode: str | None = None) -> dict[str, Any]:
    """Settings for one ``torch.compile`` call from its ``mode`` and ``options`` (setting names of
    ``config.Settings``; unknown names and bad values raise ``ConfigError``)."""
    from .exc import ConfigError

    if mode is not None and mode not in MODES:
        raise ConfigError(f"torch.compile mode {mode!r} is not one of kiln's: {', '.join(MODES)}")
    overrides = dict(MODES.get(mode or "default", {}))
    overrides.update(options or {})
    with config.patch(**overrides):  # validates names and values now, not at the first backward
        pass
    return overrides


def kiln_backend(gm: fx.GraphModule, example_inputs: list, **kwargs: Any) -> Callable:
    """The Dynamo backend registered as ``"kiln"``. ``torch.compile(..., mode=..., options={...})`` reach it as
    keyword arguments: they override settings for this compiled function only (its backward included)."""
    from torch._functorch.aot_autograd import aot_module_simplified

    from . import joint_cse

    config.select_interpreter()  # compiling starts here: Triton's interpreter without a GPU (config.interpret)
    overrides = backend_overrides(kwargs.get("options"), kwargs.get("mode"))
    with config.patch(**overrides):
        # a graph found by its Dynamo graph: AOTAutograd does not run (runtime/inference_cache.py, training_cache.py)
        with phase_times.phase("front_cache"):
            front = inference_cache.Front(gm, example_inputs)
            hit = front.lookup(f"graph_{next(_graph_ids)}", lambda cg, fallback: _finish(cg, fallback, None))
        if hit is not None:  # nothing to compile: the compile workers are not started for it
            return hit
        precompile.warm_up(example_inputs)  # GPU graphs: compile workers start while AOTAutograd traces

    def with_settings(role: str, compile_fn: Callable = compile_fx_graph) -> Callable:
        def compile_in_scope(g: fx.GraphModule, inputs: Any) -> Callable:
            with config.patch(**overrides):
                return compile_fn(g, inputs, role, front=front)

        return compile_in_scope

    # the min-cut partitioner (its CSE done by kiln, without importing Inductor: joint_cse.py) saves the
    # cheapest set of tensors for backward and recomputes fusible pointwise work there (the default one saves
    # every forward intermediate the backward reads: e.g. an fp32 copy of an RMSNorm input, a full extra
    # write + read)
    # (Dynamo already runs the returned forward without tracing it; backwards run from autograd, see below).
    # Input mutations stay in the graph as trailing copy_ write-backs, as with Inductor: returned as outputs
    # instead, parameters updated under no_grad got gradients (zeros) where eager leaves None.
    with phase_times.phase("aot_autograd"):  # exclusive: kiln's graph compiles inside are their own phases
        return aot_module_simplified(
            gm,
            example_inputs,
            fw_compiler=with_settings("forward"),
            bw_compiler=_compile_backward(with_settings("backward")),
            inference_compiler=with_settings("inference"),
            partition_fn=joint_cse.partition,  # min-cut, after kiln's CSE of the joint graph (joint_cse.py)
            keep_inference_input_mutations=True,
            decompositions=decomposition_table(),
        )


def _no_trace(fn: Callable) -> Callable:
    """``fn`` with Dynamo off while it runs (attributes such as ``_boxed_call`` kept).

    A backward runs wherever ``loss.backward()`` is called, possibly inside another compiled frame (a
    compiled train step); Dynamo would then trace kiln's wrapper and the Triton interpreter as user code.
    Dynamo's own ``aot_autograd`` helper wraps backward compilers and backwards the same way."""
    import torch._dynamo

    return torch._dynamo.disable(fn, reason="kiln: do not trace a compiled graph")


def _compile_backward(compile_fn: Callable) -> Callable:
    """The backward compiler around ``compile_fn``: compiled without Dynamo, and run without it."""

    def compile_backward(gm: fx.GraphModule, example_inputs: Any) -> Callable:
        return _no_trace(_no_trace(compile_fn)(gm, example_inputs))

    return compile_backward


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
