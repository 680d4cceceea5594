"""Typed records of a kiln value trace (``compiler/runtime/value_trace.py`` writes them; trace_diff.py reads them).

Each JSON line is read by `from_dict` once, when the trace is loaded; trace_diff never reads a line by key. A
reader accepts what older traces left out (a graph record without settings, an output without a device) and
refuses a line that lacks a key every trace writes, or a launch kind outside `LaunchKind` (a `RecordError`,
which trace_diff reports as a `TraceError` naming the file and line).

Terms are value_trace's: graph index, call, launch, kind, source hash, statistics (a statistic's value is a
float, ``"nan"``/``"inf"``/``"-inf"`` for a non-finite one, or None where an output has no finite value).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .records import member, read

#: a statistic as traced: a number, "nan"/"inf"/"-inf", or None
Value = float | int | str | None


class LaunchKind(StrEnum):
    """What a launch ran: a generated kernel, an ``out=`` ATen kernel (a matmul) or an ATen op kiln did not lower."""

    TRITON = "triton"
    EXTERN = "extern"
    FALLBACK = "fallback"


@dataclass(frozen=True)
class Header:
    """A trace's first line: its schema, the versions and where kernels ran (the interpreter, or a GPU)."""

    schema: int
    torch: str | None = None
    triton: str | None = None
    interpret: bool = False
    gpu: str | None = None
    gpu_backend: str | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Header:
        return read(
            "trace header",
            d,
            lambda d: cls(
                int(d["schema"]),
                d.get("torch"),
                d.get("triton"),
                bool(d.get("interpret")),
                d.get("gpu"),
                d.get("gpu_backend"),
            ),
        )


@dataclass(frozen=True)
class GraphRecord:
    """A graph's first call in a trace: its name, index and the settings it was compiled with."""

    graph: str
    graph_index: int
    settings: str | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GraphRecord:
        return read(
            "graph record", d, lambda d: cls(str(d["graph"]), int(d["graph_index"]), d.get("settings"))
        )


@dataclass(frozen=True)
class TraceStats:
    """An output's statistics (value_trace.stats). `values` is False for a quantized output (its digest is all
    there is); then every statistic is None."""

    numel: int
    digest: str | None = None
    values: bool = True
    nan: int | None = None
    inf: int | None = None
    min: Value = None
    max: Value = None
    mean: Value = None
    sum: Value = None
    sumsq: Value = None
    abs_sum: Value = None
    samples: list[tuple[int, Value]] = field(default_factory=list)

    def stat(self, name: str) -> Value:
        """One of min, max, mean, sum, sumsq, abs_sum by name (trace_diff.STATS)."""
        value: Value = getattr(self, name)
        return value

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TraceStats:
        def build(d: Mapping[str, Any]) -> TraceStats:
            return cls(
                numel=int(d["numel"]),
                digest=d.get("digest"),
                values="min" in d,
                nan=d.get("nan"),
                inf=d.get("inf"),
                min=d.get("min"),
                max=d.get("max"),
                mean=d.get("mean"),
                sum=d.get("sum"),
                sumsq=d.get("sumsq"),
                abs_sum=d.get("abs_sum"),
                samples=[(int(p), v) for p, v in d.get("samples") or []],
            )

        return read("output statistics", d, build)


@dataclass(frozen=True)
class TraceOutput:
    """One output a launch wrote: its name in the wrapper, shape, dtype and statistics."""

    name: str
    shape: list[int]
    dtype: str
    stats: TraceStats

    @property
    def typed_shape(self) -> str:
        """``float32[16, 48]``."""
        return f"{self.dtype}{list(self.shape)}"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TraceOutput:
        return read(
            "launch output",
            d,
            lambda d: cls(
                str(d["name"]),
                [int(n) for n in d["shape"]],
                str(d["dtype"]),
                TraceStats.from_dict(d["stats"]),
            ),
        )


@dataclass(frozen=True)
class Launch:
    """One launch: its position (seq in the file; graph index, graph name, call, launch in the call), what it ran
    (kind, kernel, source hash) and what it wrote."""

    seq: int
    graph: str
    graph_index: int
    call: int
    launch: int
    kind: LaunchKind
    kernel: str
    source_hash: str
    outputs: list[TraceOutput]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Launch:
        return read(
            "launch record",
            d,
            lambda d: cls(
                seq=int(d["seq"]),
                graph=str(d["graph"]),
                graph_index=int(d["graph_index"]),
                call=int(d["call"]),
                launch=int(d["launch"]),
                kind=member(LaunchKind, d["kind"], "launch kind"),
                kernel=str(d["kernel"]),
                source_hash=str(d["source_hash"]),
                outputs=[TraceOutput.from_dict(o) for o in d["outputs"]],
            ),
        )
