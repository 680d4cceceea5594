"""CUDA graphs for compiled wrappers: record a wrapper's launches once per size key, then replay them.

With ``cudagraphs`` on (setting ``KILN_CUDAGRAPHS=1``, or ``torch.compile(..., options={"cudagraphs": True})``,
or ``mode="reduce-overhead"``), each compiled graph runs through a ``CudaGraphRunner``:

- *key*: the values that fix every size in a call: the integer arguments (size symbols) and the shapes of the
  tensor arguments whose sizes are symbolic. A static graph has one key, ``()``. One recording per key.
- The first call of a key runs the wrapper as usual (*warm-up*: kernels compile, libraries allocate their
  workspaces) and notes every tensor argument's address. The second call records the wrapper into a
  ``torch.cuda.CUDAGraph`` with a private memory pool and replays it; later calls only replay.
- *static input*: a tensor argument whose address did not change between warm-up and recording (parameters,
  buffers), or that lies in memory another recording owns (*recorded output*: its pool-owned outputs and its
  placeholders, e.g. a training forward's saved activations and inputs, read by its backward; they sit at the
  same address at every replay of the forward, though not at the backward's warm-up, when the forward still
  ran unrecorded): the recording reads it in place. Every replay checks that each static input is still where
  it was recorded, so a static input is only a guess that saves a copy, never a correctness assumption. Every
  other tensor argument is *copied in* to a placeholder that the recording reads, and copied back after the
  replay when the graph writes to it (an in-place update must reach the caller's tensor). When a static input
  moves later, it becomes copied-in and the key is recorded again (at most ``MAX_RECORDINGS`` times, then it
  runs unrecorded).
- *pool-owned output*: an output allocated during recording. Every replay hands them out as fresh tensors over
  the same memory, which the next replay of the same recording overwrites: as with Inductor's
  ``reduce-overhead``, a user-visible output is valid until the same graph runs again (clone it to keep it).
- *saved outputs* (kept outputs): the outputs of a training forward that AOTAutograd saves for backward, and
  every output of a backward (AccumulateGrad adopts a gradient tensor as ``.grad`` without copying it). A
  replay would overwrite them under a backward still waiting to run (two forwards before their backwards, as
  in gradient accumulation) or under last call's ``.grad`` (accumulation, ``zero_grad(set_to_none=False)``),
  so while any of them is still referenced the graph runs unrecorded, into fresh memory. A training loop that
  sets gradients to None before its next backward replays every step.

A graph that cannot be recorded runs as before, and the reason is recorded on the compiled graph as
``FallbackReason("cudagraph", <graph name>, detail)``: CPU tensors, host synchronization (data-dependent ops,
control flow), inputs that overlap themselves, a failed capture, or too many re-recordings.

- *CPU scalar input*: a 0-d CPU tensor among the inputs does not make a key unrecordable for good: ATen's
  memory-efficient attention returns its (unused without dropout) RNG seed and offset as 0-d CPU tensors when
  it runs outside a capture and as GPU tensors inside one, so a training backward sees CPU tensors at its
  warm-up (its forward ran unrecorded) and GPU tensors once the forward replays. A later call that still has
  one runs unrecorded (its reason recorded as a fallback), and the key records at the first call whose tensor
  inputs are all on the GPU (a recording never reads a CPU tensor: its value would be frozen into the graph).
  (Before, the backward's warm-up made its key unrecordable for good.)

Every call that runs unrecorded after its key's warm-up is counted per reason (``RunnerStats.unrecorded_why``);
``CudaGraphRunner.summary()`` reports them with the graph's role, for the model tier's report.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from ..graph import FallbackReason
from .restride import alias

log = logging.getLogger("kiln")

#: re-recordings of one key (a static input moved) before the key runs unrecorded for good
MAX_RECORDINGS = 8

#: storage address -> how many live recordings own memory starting there: their pool-owned outputs and
#: placeholders (*recorded outputs*, static inputs of later recordings)
_RECORDED_OUTPUTS: dict[int, int] = {}


def _note_outputs(storages: list[int], delta: int) -> None:
    for ptr in storages:
        n = _RECORDED_OUTPUTS.get(ptr, 0) + delta
        if n > 0:
            _RECORDED_OUTPUTS[ptr] = n
        else:
            _RECORDED_OUTPUTS.pop(ptr, None)


#: ATen ops that read device values on the host (or make sizes depend on them): never recordable
HOST_SYNC_OPS = frozenset(
    {
        "_local_scalar_dense",
        "item",
        "nonzero",
        "nonzero_static",
        "masked_select",
        "unique",
        "_unique",
        "_unique2",
        "unique_consecutive",
        "unique_dim",
        "is_nonzero",
        "equal",
        "bincount",
        "histc",
        "repeat_interleave",
        "allclose",
    }
)


@dataclasses.dataclass
class GraphFacts:
    """What the runner needs to know of an ATen graph, read once at compile time.

    ``int_args``/``symbolic_tensor_args``: argument positions that make up the key; ``mutated_args``: tensor
    arguments the graph writes to; ``saved_from``: index of the first kept output (a training forward's saved
    tensors; 0 for a backward, all of whose outputs are gradients; ``None`` for inference graphs);
    ``host_sync``: the first op found that syncs with the host, or "".
    """

    int_args: tuple[int, ...]
    symbolic_tensor_args: tuple[int, ...]
    mutated_args: frozenset[int]
    saved_from: int | None
    host_sync: str

    @staticmethod
    def of(gm: fx.GraphModule, saved_from: int | None = None) -> GraphFacts:
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        position = {n: i for i, n in enumerate(placeholders)}
        ints, symbolic = [], []
        for i, ph in enumerate(placeholders):
            val = ph.meta.get("val")
            if isinstance(val, (int, torch.SymInt)):
                ints.append(i)
            elif isinstance(val, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in val.shape):
                symbolic.append(i)
        mutated: set[int] = set()
        host_sync = ""
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            target = node.target
            name = getattr(getattr(target, "_schema", None), "name", "") or getattr(target, "__name__", "")
            short = name.split("::")[-1]
            if not host_sync and (
                short in HOST_SYNC_OPS
                or isinstance(target, torch._ops.HigherOrderOperator)
                or free_unbacked_symbols(node.meta.get("val"))
            ):
                host_sync = (
                    name  # a boolean-mask index or .item(): its result's size or value is read on the host
                )
            schema = getattr(target, "_schema", None)
            if schema is None:
                continue
            for arg, value in zip(schema.arguments, node.args):
                if arg.alias_info is not None and arg.alias_info.is_write and value in position:
                    mutated.add(position[value])
            for arg in schema.arguments:
                if arg.kwarg_only and arg.alias_info is not None and arg.alias_info.is_write:
                    value = node.kwargs.get(arg.name)
                    if value in position:
                        mutated.add(position[value])
        return GraphFacts(tuple(ints), tuple(symbolic), frozenset(mutated), saved_from, host_sync)


def input_devices(args: list) -> tuple[str, str]:
    """(why the inputs can never be recorded, why not now) — each "" when nothing stands in the way. Never: a
    CPU tensor with elements, several GPUs, no GPU tensor; not now: 0-d CPU tensors (module docstring)."""
    devices, cpu_scalars, cpu_tensors = set(), [], []
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor):
            continue
        if a.device.type == "cuda":
            devices.add(a.device)
        elif a.device.type == "cpu" and a.dim() == 0:
            cpu_scalars.append(i)
        else:
            cpu_tensors.append(f"{i} ({a.device})")
    if cpu_tensors:
        return "inputs not on a CUDA device: " + ", ".join(cpu_tensors), ""
    if len(devices) > 1:
        return "inputs on several devices: " + ", ".join(sorted(str(d) for d in devices)), ""
    if not devices:
        return "no tensor inputs on a CUDA device", ""
    if cpu_scalars:
        return "", (
            "0-d CPU tensor input(s) "
            + ", ".join(map(str, cpu_scalars))
            + ": recorded once every tensor input is on the GPU"
        )
    return "", ""


#: reasons of unrecorded calls (``RunnerStats.unrecorded_why``) that are no fallback of their own
SAVED_ALIVE = "saved outputs of the previous call still referenced (a backward still to run, or kept .grad)"


@dataclasses.dataclass
class _Recording:
    """One recorded graph: what to copy in and out, and how to hand out its outputs."""

    graph: Any  # torch.cuda.CUDAGraph
    static_args: list[int]
    static_ptrs: list  # per argument position: the address of a static input, else None
    placeholders: dict[int, torch.Tensor]  # copied-in argument position -> placeholder
    copy_back: list[int]  # copied-in arguments the graph writes to
    outputs: tuple  # the wrapper's outputs as recorded
    owned: list[int]  # positions of the pool-owned outputs (handed out as fresh aliases)
    saved_storages: list[tuple[int, int]]  # (storage handle, use count with no output handed out)
    output_storages: list[int]  # storages of the pool-owned outputs and placeholders (``_RECORDED_OUTPUTS``)

    def drop(self) -> None:
        """Forget this recording's outputs as recorded outputs (it is being replaced)."""
        _note_outputs(self.output_storages, -1)
        self.output_storages = []

    def __del__(self) -> None:  # a runner that is garbage-collected takes its recordings along
        try:
            self.drop()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the module's globals may be gone
            pass


@dataclasses.dataclass
class _Entry:
    """The state of one key: addresses seen at warm-up, then the recording (or why there is none)."""

    warm_ptrs: dict[int, int]
    recording: _Recording | None = None
    recordings: int = 0
    dynamic: set[int] = dataclasses.field(default_factory=set)  # arguments that must be copied in
    unrecordable: str = ""


@dataclasses.dataclass
class RunnerStats:
    """Counters of one runner: ``replays``, ``recordings``, ``warmups``, ``unrecorded`` (calls run without a
    graph after warm-up: saved outputs still alive, or a fallback) and ``unrecorded_why`` (those calls per
    reason), ``copied_in`` (argument copies)."""

    replays: int = 0
    recordings: int = 0
    warmups: int = 0
    unrecorded: int = 0
    copied_in: int = 0
    unrecorded_why: dict[str, int] = dataclasses.field(default_factory=dict)

    def note_unrecorded(self, why: str) -> None:
        self.unrecorded += 1
        self.unrecorded_why[why] = self.unrecorded_why.get(why, 0) + 1


class CudaGraphRunner:
    """Runs a boxed wrapper ``fn(args)`` through CUDA graphs, one recording per key (see module docstring)."""

    def __init__(
        self, fn: Callable[[list], Any], name: str, facts: GraphFacts, fallbacks: list[FallbackReason]
    ) -> None:
        self.fn = fn
        self.name = name
        self.facts = facts
        self.fallbacks = fallbacks
        self.entries: dict[tuple, _Entry] = {}
        self.stats = RunnerStats()
        self.disabled = ""
        if facts.host_sync:
            self._disable(
                f"the graph syncs with the host ({facts.host_sync}): its sizes or control flow depend "
                "on device values"
            )

    # ------------------------------------------------------------------ calling
    def __call__(self, args: list) -> Any:
        if self.disabled:
            self.stats.note_unrecorded(self.disabled)
            return self.fn(args)
        key = self._key(args)
        entry = self.entries.get(key)
        if entry is None:
            return self._warm_up(key, args)
        if entry.unrecordable:
            self.stats.note_unrecorded(entry.unrecordable)
            return self.fn(args)
        rec = entry.recording
        if rec is not None and not self._static_inputs_in_place(rec, args):
            entry.dynamic.update(i for i in rec.static_args if args[i].data_ptr() != rec.static_ptrs[i])
            rec.drop()
            rec = entry.recording = None
        if rec is not None and self._saved_outputs_alive(rec):
            self.stats.note_unrecorded(SAVED_ALIVE)
            return self.fn(args)
        if rec is None:
            rec, why = self._record(entry, args)
            if rec is None:
                self.stats.note_unrecorded(why)
                return self.fn(args)
        return self._replay(rec, args)

    @property
    def role(self) -> str:
        """``inference``, ``forward`` (of a training graph) or ``backward``, from the facts' kept outputs."""
        saved = self.facts.saved_from
        return "inference" if saved is None else "backward" if saved == 0 else "forward"

    def summary(self) -> dict[str, Any]:
        """What the model tier reports of this graph: role, counters, and why calls ran unrecorded."""
        st = self.stats
        return {
            "graph": self.name,
            "role": self.role,
            "warmups": st.warmups,
            "recordings": st.recordings,
            "replays": st.replays,
            "unrecorded": st.unrecorded,
            "copied_in": st.copied_in,
            "unrecorded_why": dict(st.unrecorded_why),
        }

    def _key(self, args: list) -> tuple:
        f = self.facts
        if not f.int_args and not f.symbolic_tensor_args:
            return ()
        return tuple(args[i] for i in f.int_args) + tuple(
            tuple(args[i].shape) for i in f.symbolic_tensor_args
        )

    def _warm_up(self, key: tuple, args: list) -> Any:
        ptrs = {i: a.data_ptr() for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
        reason = input_devices(args)[0]
        entry = _Entry(ptrs, unrecordable=reason)
        self.entries[key] = entry
        if reason:
            self._record_reason(reason)
        self.stats.warmups += 1
        return self.fn(args)

    def _replay(self, rec: _Recording, args: list) -> Any:
        for i, ph in rec.placeholders.items():
            ph.copy_(args[i])
        self.stats.copied_in += len(rec.placeholders)
        rec.graph.replay()
        for i in rec.copy_back:
            args[i].copy_(rec.placeholders[i])
        self.stats.replays += 1
        out = list(rec.outputs)
        for pos in rec.owned:
            out[pos] = alias(rec.outputs[pos])
        return type(rec.outputs)(out) if isinstance(rec.outputs, tuple) else out

    # ------------------------------------------------------------------ checks
    @staticmethod
    def _static_inputs_in_place(rec: _Recording, args: list) -> bool:
        check = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)
        if check is not None:
            return check(args, rec.static_ptrs, rec.static_args)
        return all(args[i].data_ptr() == rec.static_ptrs[i] for i in rec.static_args)

    @staticmethod
    def _saved_outputs_alive(rec: _Recording) -> bool:
        use_count = torch._C._storage_Use_Count
        return any(use_count(handle) > base for handle, base in rec.saved_storages)

    # ------------------------------------------------------------------ recording
    def _record(self, entry: _Entry, args: list) -> tuple[_Recording | None, str]:
        """The new recording, or (None, why this call runs unrecorded)."""
        if entry.recordings >= MAX_RECORDINGS:
            entry.unrecordable = f"recorded {MAX_RECORDINGS} times: static inputs keep moving"
            self._record_reason(entry.unrecordable)
            return None, entry.unrecordable
        never, not_now = input_devices(args)
        if never or not_now:  # a reason either way: a caller learns why a graph that ran never replayed
            entry.unrecordable = never
            self._record_reason(never or not_now)
            return None, never or not_now
        tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        static = [
            i
            for i in tensors
            if i not in entry.dynamic
            and (
                args[i].data_ptr() == entry.warm_ptrs.get(i)
                or args[i].untyped_storage().data_ptr() in _RECORDED_OUTPUTS
            )
        ]
        copied = [i for i in tensors if i not in static]
        for i in copied:
            if torch._debug_has_internal_overlap(args[i]) == 1:
                entry.unrecordable = f"input {i} overlaps itself (an expanded view) and its address changes"
                self._record_reason(entry.unrecordable)
                return None, entry.unrecordable
        device = args[tensors[0]].device
        placeholders = {i: _placeholder(args[i]) for i in copied}
        rec_args = [placeholders.get(i, a) for i, a in enumerate(args)]
        for i, ph in placeholders.items():
            ph.copy_(args[i])
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.device(device):
                pool = torch.cuda.graph_pool_handle()
                with torch.cuda.graph(graph, pool=pool):
                    outputs = self.fn(list(rec_args))
        except Exception as e:  # a capture error leaves the stream usable; run unrecorded from now on
            _reset_rng_after_failed_capture(device)
            entry.unrecordable = (
                f"capture failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            )
            self._record_reason(entry.unrecordable)
            return None, entry.unrecordable
        entry.recordings += 1
        self.stats.recordings += 1
        inputs = {a.untyped_storage().data_ptr() for a in rec_args if isinstance(a, torch.Tensor)}
        owned, saved = [], []
        seq = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
        for pos, o in enumerate(seq):
            if not isinstance(o, torch.Tensor) or o.device.type != "cuda":
                continue
            if o.untyped_storage().data_ptr() in inputs:
                continue
            owned.append(pos)
            if self.facts.saved_from is not None and pos >= self.facts.saved_from:
                saved.append(o.untyped_storage()._cdata)
        # memory that also backs a user-visible output follows the user-output rule (valid until the next
        # replay): a caller keeping last step's outputs (an HF model's logits) must not turn graphs off
        user = {
            seq[p].untyped_storage()._cdata
            for p in owned
            if self.facts.saved_from is None or p < self.facts.saved_from
        }
        saved = list(dict.fromkeys(h for h in saved if h not in user))
        use_count = torch._C._storage_Use_Count  # measured with no output handed out: the baseline
        ptrs: list = [None] * len(args)
        for i in static:
            ptrs[i] = args[i].data_ptr()
        # memory the recording owns at fixed addresses: its pool-owned outputs and its copied-in placeholders
        # (a training forward returns a copied-in input that backward saves as that placeholder itself)
        storages = list(
            dict.fromkeys(
                [seq[p].untyped_storage().data_ptr() for p in owned]
                + [ph.untyped_storage().data_ptr() for ph in placeholders.values()]
            )
        )
        _note_outputs(storages, +1)
        rec = _Recording(
            graph,
            static,
            ptrs,
            placeholders,
            [i for i in copied if i in self.facts.mutated_args],
            tuple(seq),
            owned,
            [(h, use_count(h)) for h in saved],
            storages,
        )
        entry.recording = rec
        log.debug(
            "kiln: recorded %s as a CUDA graph (%d static inputs, %d copied in, %d pool-owned outputs)",
            self.name,
            len(static),
            len(copied),
            len(owned),
        )
        return rec, ""

    def _disable(self, reason: str) -> None:
        self.disabled = reason
        self._record_reason(reason)

    def _record_reason(self, detail: str) -> None:
        reason = FallbackReason("cudagraph", self.name, detail)
        if reason not in self.fallbacks:
            self.fallbacks.append(reason)
            log.info("kiln: %s runs without CUDA graphs: %s", self.name, detail)


def _placeholder(t: torch.Tensor) -> torch.Tensor:
    """A tensor of ``t``'s size, strides and dtype on its device, in memory the recording owns."""
    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)


def _reset_rng_after_failed_capture(device: torch.device) -> None:
    """A capture that fails inside ``cudaStreamEndCapture`` never runs the generator's capture epilogue, and
    every later random op on the device fails ("Offset increment outside graph capture"). A clone of the
    generator's state (seed and offset, not the capturing flag) put back repairs it."""
    gen = torch.cuda.default_generators[
        device.index if device.index is not None else torch.cuda.current_device()
    ]
    try:
        gen.graphsafe_set_state(gen.clone_state())
    except Exception as e:  # older torch without graph-safe states: nothing to repair
        log.debug("kiln: could not reset the CUDA generator after a failed capture: %s", e)
