"""Typed records of a run folder's manifest (store.py): what a capture writes and compare reads.

Each record is read from its stored JSON object by `from_dict` and written back by `to_dict`, and nowhere else
is the manifest read by key. A reader accepts the keys older harnesses left out (a side without `info`, an entry
without `stored` or `stats`, a program without `structure`, a manifest without `input_order`) and keeps the
keys it does not know (in `extra`, written back unchanged where a record has one). A key missing that every
version writes, or a value outside its fixed set, is a `RecordError` naming it.

Terms (store.py's docstring has the folder layout):
  entry        one stored file: path, bytes, sha256, digest, shape, dtype; an output's also says whether it is
               stored whole or sampled, and its statistics over every element (`OutputStats`).
  side record  one compiler's outputs per repeat, its error and what the capture noted (`SideInfo`).
  program record  what the program was (`Program.describe()`): the keys two runs must share
               (`ProgramRecord.identity`) and what the report needs (structure, reduction lengths, note).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, TypeVar

from .exc import RecordError

E = TypeVar("E", bound=StrEnum)
R = TypeVar("R")


class Structure(StrEnum):
    """How an output element depends on the inputs (program.py's docstring)."""

    ELEMENTWISE = "elementwise"
    ROWS = "rows"
    OPAQUE = "opaque"


class ProgramKind(StrEnum):
    """Where a program came from: a function, a numerics-suite table entry, a `torch.export` file, or a kiln run
    saved by the numerics suite (suite.py)."""

    FUNCTION = "function"
    SUITE = "suite"
    EXPORT = "export"
    SUITE_CASE = "suite-case"


class Storage(StrEnum):
    """How an output is stored: whole, or the values at its sample indices."""

    FULL = "full"
    SAMPLE = "sample"


SAMPLE_RULE = "affine-v1"  # store.sample_indices


def member(cls: type[E], value: Any, what: str) -> E:
    """`cls(value)`, or a `RecordError` naming `what` and the known values."""
    try:
        return cls(value)
    except ValueError:
        known = ", ".join(m.value for m in cls)
        raise RecordError(f"{what} {value!r} is not one of {known}") from None


def read(what: str, d: Any, build: Callable[[Mapping[str, Any]], R]) -> R:
    """`build(d)` for a stored object; a key missing or a value of the wrong type is a `RecordError`."""
    if not isinstance(d, Mapping):
        raise RecordError(f"malformed {what} {d!r}: not a JSON object")
    try:
        return build(d)
    except RecordError:
        raise
    except KeyError as e:
        raise RecordError(f"malformed {what} {dict(d)!r}: no {e}") from None
    except (TypeError, ValueError, AttributeError) as e:
        raise RecordError(f"malformed {what} {dict(d)!r}: {e}") from None


def _extra(d: Mapping[str, Any], cls: type) -> dict[str, Any]:
    known = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k not in known}


@dataclass(frozen=True)
class OutputStats:
    """Statistics of every element of an output, in float64 (store.stats); min..absmax over finite elements only,
    None when it has none."""

    count: int
    nan: int = 0
    posinf: int = 0
    neginf: int = 0
    zeros: int = 0
    min: float | None = None
    max: float | None = None
    mean: float | None = None
    std: float | None = None
    absmax: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> OutputStats:
        return read(
            "output statistics", d, lambda d: cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})
        )


@dataclass(frozen=True)
class Sample:
    """How a sampled output's indices were chosen: how many, by which rule."""

    count: int
    rule: str = SAMPLE_RULE


@dataclass(frozen=True)
class Entry:
    """One stored tensor (see the module docstring). `stored` is None for inputs and cotangents (whole)."""

    file: str
    bytes: int
    sha256: str
    digest: str
    shape: tuple[int, ...]
    dtype: str
    stored: Storage | None = None
    sample: Sample | None = None
    stats: OutputStats | None = None

    @property
    def sampled(self) -> bool:
        return self.stored is Storage.SAMPLE

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "file": self.file,
            "bytes": self.bytes,
            "sha256": self.sha256,
            "digest": self.digest,
            "shape": list(self.shape),
            "dtype": self.dtype,
        }
        if self.stored is not None:
            out["stored"] = self.stored.value
        if self.sample is not None:
            out["sample"] = {"count": self.sample.count, "rule": self.sample.rule}
        if self.stats is not None:
            out["stats"] = self.stats.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Entry:
        def build(d: Mapping[str, Any]) -> Entry:
            stored = d.get("stored")
            sample = d.get("sample")
            stats = d.get("stats")
            return cls(
                file=str(d["file"]),
                bytes=int(d["bytes"]),
                sha256=str(d["sha256"]),
                digest=str(d["digest"]),
                shape=tuple(int(n) for n in d["shape"]),
                dtype=str(d["dtype"]),
                stored=None if stored is None else member(Storage, stored, "stored"),
                sample=None if sample is None else Sample(int(sample["count"]), str(sample["rule"])),
                stats=None if stats is None else OutputStats.from_dict(stats),
            )

        return read("entry", d, build)


def _entries(d: Mapping[str, Any] | None) -> dict[str, Entry]:
    return {n: Entry.from_dict(e) for n, e in (d or {}).items()}


@dataclass
class SideInfo:
    """What a capture noted about a side: seconds per execution and, for kiln, graphs, kernels and fallbacks
    (keys it does not know stay in `extra`). Filled while the side runs (capture.run_side)."""

    seconds: list[float] = field(default_factory=list)
    graphs: int | None = None
    kernels: int | None = None
    fallbacks: list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.extra)
        if self.seconds:
            out["seconds"] = list(self.seconds)
        for name in ("graphs", "kernels", "fallbacks"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> SideInfo:
        def build(d: Mapping[str, Any]) -> SideInfo:
            return cls(
                seconds=[float(s) for s in d.get("seconds") or []],
                graphs=d.get("graphs"),
                kernels=d.get("kernels"),
                fallbacks=d.get("fallbacks"),
                extra=_extra(d, cls),
            )

        return read("side info", d or {}, build)


@dataclass(frozen=True)
class SideRecord:
    """One compiler's outputs in a run folder: an entry per output per repeat, or an error and no repeats."""

    compiler: str
    repeats: list[dict[str, Entry]]
    error: str | None = None
    info: SideInfo = field(default_factory=SideInfo)

    def to_dict(self) -> dict[str, Any]:
        return {
            "compiler": self.compiler,
            "error": self.error,
            "info": self.info.to_dict(),
            "repeats": [{n: e.to_dict() for n, e in r.items()} for r in self.repeats],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SideRecord:
        def build(d: Mapping[str, Any]) -> SideRecord:
            return cls(
                compiler=str(d["compiler"]),
                repeats=[_entries(r) for r in d.get("repeats") or []],
                error=d.get("error"),
                info=SideInfo.from_dict(d.get("info")),
            )

        return read("side", d, build)


@dataclass(frozen=True)
class ProgramRecord:
    """A program as a run records it (program.Program.describe)."""

    ref: str
    kind: ProgramKind = ProgramKind.FUNCTION
    inputs: list[str] = field(default_factory=list)
    backward: bool = True
    file_sha256: str | None = None
    structure: Structure = Structure.OPAQUE
    row_dim: int = -1
    reduction: dict[str, int] = field(default_factory=dict)
    note: str = ""

    IDENTITY = ("ref", "kind", "inputs", "backward", "file_sha256")

    def identity(self) -> dict[str, Any]:
        """What two runs must share to be compared (plain JSON values, in `IDENTITY` order)."""
        d = self.to_dict()
        return {k: d[k] for k in self.IDENTITY}

    def to_dict(self) -> dict[str, Any]:
        return {
            "ref": self.ref,
            "kind": self.kind.value,
            "inputs": list(self.inputs),
            "backward": self.backward,
            "file_sha256": self.file_sha256,
            "structure": self.structure.value,
            "row_dim": self.row_dim,
            "reduction": dict(self.reduction),
            "note": self.note,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProgramRecord:
        def build(d: Mapping[str, Any]) -> ProgramRecord:
            return cls(
                ref=str(d["ref"]),
                kind=member(ProgramKind, d.get("kind", "function"), "program kind"),
                inputs=[str(s) for s in d.get("inputs") or []],
                backward=bool(d.get("backward", True)),
                file_sha256=d.get("file_sha256"),
                structure=member(Structure, d.get("structure", "opaque"), "program structure"),
                row_dim=int(d.get("row_dim", -1)),
                reduction={str(k): int(v) for k, v in (d.get("reduction") or {}).items()},
                note=str(d.get("note") or ""),
            )

        return read("program", d, build)

    def reduction_length(self, output: str) -> int | None:
        """The recorded reduction length behind `output` (longest matching name prefix), if any."""
        best = max(
            (k for k in self.reduction if output == k or output.startswith(k + ".")), key=len, default=None
        )
        return None if best is None else self.reduction[best]


@dataclass(frozen=True)
class StorageRule:
    """How a run stored its outputs: whole up to `full_max` elements, else `sample` of them."""

    full_max: int
    sample: int
    byteorder: str = "little"


@dataclass(frozen=True)
class Manifest:
    """A run folder's manifest.json (written last: the folder is complete). Keys it does not know stay in
    `extra` (e.g. what `save_run(extra=...)` added) and are written back unchanged."""

    schema: int
    kind: str
    created: str
    storage: StorageRule | None
    program: ProgramRecord
    seed: int
    device: str | None
    inputs: dict[str, Entry]
    input_order: list[str]
    cotangents: dict[str, Entry] = field(default_factory=dict)
    sides: list[SideRecord] = field(default_factory=list)
    reference: dict[str, Entry] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            **self.extra,
            "schema": self.schema,
            "kind": self.kind,
            "created": self.created,
            "program": self.program.to_dict(),
            "seed": self.seed,
            "device": self.device,
            "inputs": {n: e.to_dict() for n, e in self.inputs.items()},
            "input_order": list(self.input_order),
            "cotangents": {n: e.to_dict() for n, e in self.cotangents.items()},
            "sides": [s.to_dict() for s in self.sides],
        }
        if self.storage is not None:
            out["storage"] = {
                "full_max": self.storage.full_max,
                "sample": self.storage.sample,
                "byteorder": self.storage.byteorder,
            }
        if self.reference is not None:
            out["reference"] = {n: e.to_dict() for n, e in self.reference.items()}
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Manifest:
        def build(d: Mapping[str, Any]) -> Manifest:
            storage = d.get("storage")
            inputs = _entries(d["inputs"])
            reference = d.get("reference")
            return cls(
                schema=int(d["schema"]),
                kind=str(d["kind"]),
                created=str(d.get("created", "")),
                storage=None
                if storage is None
                else StorageRule(int(storage["full_max"]), int(storage["sample"]), str(storage["byteorder"])),
                program=ProgramRecord.from_dict(d["program"]),
                seed=int(d["seed"]),
                device=d.get("device"),
                inputs=inputs,
                input_order=[str(n) for n in d.get("input_order", list(inputs))],
                cotangents=_entries(d.get("cotangents")),
                sides=[SideRecord.from_dict(s) for s in d["sides"]],
                reference=None if reference is None else _entries(reference),
                extra=_extra(d, cls),
            )

        return read("manifest", d, build)


@dataclass(frozen=True)
class RunEnv:
    """What a report shows of a run's env.json (`harness.envinfo.capture`; any of it may be missing): the GPUs,
    torch, Triton, HIP and CUDA versions, and the git commit (and whether the tree was dirty)."""

    gpus: list[str] = field(default_factory=list)
    torch: str | None = None
    triton: str | None = None
    hip: str | None = None
    cuda: str | None = None
    git: str | None = None
    dirty: bool | None = None

    @classmethod
    def from_dict(cls, env: Any) -> RunEnv:
        """From env.json's object; anything that is not one (an unreadable file) gives an empty record."""
        if not isinstance(env, Mapping):
            return cls()
        dev = env.get("device") or {}
        git = (env.get("host") or {}).get("git") or {}
        return cls(
            gpus=sorted(set(dev.get("gpus") or [])),
            torch=dev.get("torch"),
            triton=dev.get("triton"),
            hip=dev.get("hip"),
            cuda=dev.get("cuda"),
            git=git.get("sha"),
            dirty=git.get("dirty"),
        )
