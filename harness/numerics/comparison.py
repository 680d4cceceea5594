"""Typed records of a comparison (compare.py makes them, report.py and cli.py read them).

A report is written as JSON by `to_dict` and read back by `from_dict` (report.read_json); nowhere else is it read
by key. Values keyed by a side's label in the JSON (a pair's counts and maxima per side, a worst element's
values) are fields `a` and `b` here, written under the pair's labels. Readers accept what older reports left
out (`ref_absmax`, `case`, `left_out`, `check`); a key missing that every version writes is a `RecordError`.

Terms are compare.py's: side label, pair, differing, mismatched, error, ULP error, closer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .records import ProgramRecord, SideInfo, read


def _floats(d: Mapping[str, Any], a: str, b: str) -> tuple[float, float]:
    return float(d[a]), float(d[b])


@dataclass(frozen=True)
class Both:
    """One number for each side of a pair (`a`: the baseline, `b`: the other side)."""

    a: float
    b: float

    def to_dict(self, a: str, b: str) -> dict[str, float]:
        return {a: self.a, b: self.b}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], a: str, b: str) -> Both:
        return read("per-side values", d, lambda d: cls(*_floats(d, a, b)))

    def of(self, label: str, a: str) -> float:
        """The value of the side labelled `label` (`a`: the pair's baseline label)."""
        return self.a if label == a else self.b


@dataclass(frozen=True)
class Closer:
    """On how many elements each side of a pair is closer to fp64, and on how many they tie."""

    a: int
    b: int
    tie: int

    def to_dict(self, a: str, b: str) -> dict[str, int]:
        return {a: self.a, b: self.b, "tie": self.tie}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], a: str, b: str) -> Closer:
        return read("closer counts", d, lambda d: cls(int(d[a]), int(d[b]), int(d["tie"])))


@dataclass(frozen=True)
class RowSummary:
    """An input's row behind an output element (a `rows` program): its length, non-finite count and, when it has
    finite values, their min, max and mean."""

    length: int
    nonfinite: int
    min: float | None = None
    max: float | None = None
    mean: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"length": self.length, "nonfinite": self.nonfinite}
        if self.min is not None:
            out.update(min=self.min, max=self.max, mean=self.mean)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RowSummary:
        return read(
            "row summary",
            d,
            lambda d: cls(int(d["length"]), int(d["nonfinite"]), d.get("min"), d.get("max"), d.get("mean")),
        )


#: what produced an output element, by input name: its value (elementwise) or its row (rows)
Context = dict[str, float | RowSummary]


def _context_dict(ctx: Context) -> dict[str, Any]:
    return {n: v.to_dict() if isinstance(v, RowSummary) else v for n, v in ctx.items()}


def _context(d: Mapping[str, Any]) -> Context:
    return {n: RowSummary.from_dict(v) if isinstance(v, Mapping) else float(v) for n, v in d.items()}


@dataclass(frozen=True)
class WorstElement:
    """One of a pair's worst elements: where, both sides' values, fp64, errors (absolute and ULP), which side is
    closer (a label or `tie`) and the inputs behind it."""

    at: list[int]
    value: Both
    fp64: float
    err: Both
    ulp: Both
    closer: str
    inputs: Context

    def to_dict(self, a: str, b: str) -> dict[str, Any]:
        return {
            "at": list(self.at),
            a: self.value.a,
            b: self.value.b,
            "fp64": self.fp64,
            f"err_{a}": self.err.a,
            f"err_{b}": self.err.b,
            f"ulp_{a}": self.ulp.a,
            f"ulp_{b}": self.ulp.b,
            "closer": self.closer,
            "inputs": _context_dict(self.inputs),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], a: str, b: str) -> WorstElement:
        def build(d: Mapping[str, Any]) -> WorstElement:
            return cls(
                at=[int(i) for i in d["at"]],
                value=Both(*_floats(d, a, b)),
                fp64=float(d["fp64"]),
                err=Both(*_floats(d, f"err_{a}", f"err_{b}")),
                ulp=Both(*_floats(d, f"ulp_{a}", f"ulp_{b}")),
                closer=str(d["closer"]),
                inputs=_context(d.get("inputs") or {}),
            )

        return read("worst element", d, build)


@dataclass(frozen=True)
class Pair:
    """The comparison of one output between the baseline side `a` and side `b` (compare.py's terms), with its
    one-sentence `verdict`."""

    a: str
    b: str
    differing: int
    mismatched: int
    differing_at: list[list[int]]
    mismatched_at: list[list[int]]
    max_abs_diff: float
    max_abs_diff_at: list[int]
    max_rel_diff: float
    max_rel_diff_at: list[int]
    closer_mismatched: Closer
    closer_differing: Closer
    worst: list[WorstElement]
    max_err: Both
    max_ulp: Both
    max_err_mismatched: Both
    max_ulp_mismatched: Both
    verdict: str = ""

    _BOTH = ("max_err", "max_ulp", "max_err_mismatched", "max_ulp_mismatched")
    _PLAIN = ("differing", "mismatched", "differing_at", "mismatched_at", "max_abs_diff", "max_abs_diff_at")
    _PLAIN2 = ("max_rel_diff", "max_rel_diff_at", "verdict")

    def to_dict(self) -> dict[str, Any]:
        a, b = self.a, self.b
        return {
            "a": a,
            "b": b,
            **{k: getattr(self, k) for k in (*self._PLAIN, *self._PLAIN2)},
            "closer_mismatched": self.closer_mismatched.to_dict(a, b),
            "closer_differing": self.closer_differing.to_dict(a, b),
            "worst": [w.to_dict(a, b) for w in self.worst],
            **{k: getattr(self, k).to_dict(a, b) for k in self._BOTH},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Pair:
        def build(d: Mapping[str, Any]) -> Pair:
            a, b = str(d["a"]), str(d["b"])
            return cls(
                a=a,
                b=b,
                differing=int(d["differing"]),
                mismatched=int(d["mismatched"]),
                differing_at=[list(w) for w in d["differing_at"]],
                mismatched_at=[list(w) for w in d["mismatched_at"]],
                max_abs_diff=float(d["max_abs_diff"]),
                max_abs_diff_at=list(d["max_abs_diff_at"]),
                max_rel_diff=float(d["max_rel_diff"]),
                max_rel_diff_at=list(d["max_rel_diff_at"]),
                closer_mismatched=Closer.from_dict(d["closer_mismatched"], a, b),
                closer_differing=Closer.from_dict(d["closer_differing"], a, b),
                worst=[WorstElement.from_dict(w, a, b) for w in d["worst"]],
                verdict=str(d.get("verdict", "")),
                **{k: Both.from_dict(d[k], a, b) for k in cls._BOTH},
            )

        return read("pair", d, build)


@dataclass(frozen=True)
class Nondeterminism:
    """Repeats of one side against its first: identical, or how many elements differ and by how much at most
    (`note`: the counts are over a stored sample)."""

    repeats: int
    identical: bool = True
    differing: int = 0
    max_abs_diff: float = 0.0
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "repeats": self.repeats,
            "identical": self.identical,
            "differing": self.differing,
            "max_abs_diff": self.max_abs_diff,
        }
        if self.note is not None:
            out["note"] = self.note
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Nondeterminism:
        return read(
            "run-to-run record",
            d,
            lambda d: cls(
                int(d["repeats"]),
                bool(d["identical"]),
                int(d["differing"]),
                float(d["max_abs_diff"]),
                d.get("note"),
            ),
        )


@dataclass(frozen=True)
class SideErrors:
    """One side's error against fp64 on one output: maxima (and where), means, ULP histogram (compare.ULP_BUCKETS),
    its digest and run-to-run differences (None: ran once)."""

    label: str
    max_abs: float
    max_abs_at: list[int]
    mean_abs: float
    max_ulp: float
    mean_ulp: float
    nonfinite_errors: int
    histogram: list[int]
    digest: str
    nondeterminism: Nondeterminism | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "max_abs": self.max_abs,
            "max_abs_at": list(self.max_abs_at),
            "mean_abs": self.mean_abs,
            "max_ulp": self.max_ulp,
            "mean_ulp": self.mean_ulp,
            "nonfinite_errors": self.nonfinite_errors,
            "histogram": list(self.histogram),
            "digest": self.digest,
            "nondeterminism": None if self.nondeterminism is None else self.nondeterminism.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SideErrors:
        def build(d: Mapping[str, Any]) -> SideErrors:
            nd = d.get("nondeterminism")
            return cls(
                label=str(d["label"]),
                max_abs=float(d["max_abs"]),
                max_abs_at=list(d["max_abs_at"]),
                mean_abs=float(d["mean_abs"]),
                max_ulp=float(d["max_ulp"]),
                mean_ulp=float(d["mean_ulp"]),
                nonfinite_errors=int(d["nonfinite_errors"]),
                histogram=[int(c) for c in d["histogram"]],
                digest=str(d["digest"]),
                nondeterminism=None if nd is None else Nondeterminism.from_dict(nd),
            )

        return read("side errors", d, build)


@dataclass(frozen=True)
class OutputComparison:
    """The comparison of one output across every side (compare.compare_output)."""

    name: str
    shape: list[int]
    dtype: str
    numel: int
    compared: int
    sampled: bool
    rtol: float
    atol: float
    reduction_length: int | None
    sides: list[SideErrors]
    pairs: list[Pair]
    ref_absmax: float = 0.0

    _PLAIN = ("name", "shape", "dtype", "numel", "compared", "sampled", "rtol", "atol", "reduction_length")

    def to_dict(self) -> dict[str, Any]:
        return {
            **{k: getattr(self, k) for k in self._PLAIN},
            "sides": [s.to_dict() for s in self.sides],
            "pairs": [p.to_dict() for p in self.pairs],
            "ref_absmax": self.ref_absmax,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> OutputComparison:
        def build(d: Mapping[str, Any]) -> OutputComparison:
            red = d.get("reduction_length")
            return cls(
                name=str(d["name"]),
                shape=[int(n) for n in d["shape"]],
                dtype=str(d["dtype"]),
                numel=int(d["numel"]),
                compared=int(d["compared"]),
                sampled=bool(d["sampled"]),
                rtol=float(d["rtol"]),
                atol=float(d["atol"]),
                reduction_length=None if red is None else int(red),
                sides=[SideErrors.from_dict(s) for s in d["sides"]],
                pairs=[Pair.from_dict(p) for p in d["pairs"]],
                ref_absmax=float(d.get("ref_absmax", 0.0)),
            )

        return read("output comparison", d, build)


@dataclass(frozen=True)
class SideDescription:
    """A side as the report names it: label, run folder, compiler, and where it ran (device, GPUs, versions, git
    commit) as far as the run's env.json says."""

    label: str
    name: str
    run: str
    compiler: str
    device: str | None = None
    gpus: list[str] = field(default_factory=list)
    torch: str | None = None
    triton: str | None = None
    hip: str | None = None
    cuda: str | None = None
    git: str | None = None
    dirty: bool | None = None
    repeats: int = 0
    info: SideInfo = field(default_factory=SideInfo)

    _PLAIN = ("label", "name", "run", "compiler", "device", "gpus", "torch", "triton", "hip", "cuda", "git")

    def to_dict(self) -> dict[str, Any]:
        return {
            **{k: getattr(self, k) for k in self._PLAIN},
            "dirty": self.dirty,
            "repeats": self.repeats,
            "info": self.info.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SideDescription:
        def build(d: Mapping[str, Any]) -> SideDescription:
            return cls(
                **{k: d.get(k) for k in cls._PLAIN if k not in ("label", "name", "run", "compiler", "gpus")},
                label=str(d["label"]),
                name=str(d["name"]),
                run=str(d["run"]),
                compiler=str(d["compiler"]),
                gpus=list(d.get("gpus") or []),
                dirty=d.get("dirty"),
                repeats=int(d.get("repeats", 0)),
                info=SideInfo.from_dict(d.get("info")),
            )

        return read("side description", d, build)


@dataclass(frozen=True)
class InputSummary:
    """An input as a report lists it: shape, dtype and digest (identical on every side)."""

    shape: list[int]
    dtype: str
    digest: str


@dataclass(frozen=True)
class Check:
    """`compare --check`: the bound (max error <= ratio x the closest side's + 1 ULP; max ULP) and what broke it."""

    ratio: float
    max_ulp: float | None
    failures: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"ratio": self.ratio, "max_ulp": self.max_ulp, "failures": list(self.failures)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Check:
        return read(
            "check",
            d,
            lambda d: cls(float(d["ratio"]), d.get("max_ulp"), [str(f) for f in d.get("failures") or []]),
        )


@dataclass(frozen=True)
class Comparison:
    """The comparison of the sides of one program (compare.compare): the program, how fp64 was obtained, seed and
    inputs, the sides, the baseline label and every output; `case` (a suite case's name), `left_out` (sides
    left out, why) and `check` are set by the command line."""

    program: ProgramRecord
    reference: str
    seed: int
    inputs: dict[str, InputSummary]
    sides: list[SideDescription]
    baseline: str
    outputs: list[OutputComparison]
    case: str = ""
    left_out: list[str] = field(default_factory=list)
    check: Check | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "program": self.program.to_dict(),
            "reference": self.reference,
            "seed": self.seed,
            "inputs": {
                n: {"shape": i.shape, "dtype": i.dtype, "digest": i.digest} for n, i in self.inputs.items()
            },
            "sides": [s.to_dict() for s in self.sides],
            "baseline": self.baseline,
            "outputs": [o.to_dict() for o in self.outputs],
            "case": self.case,
            "left_out": list(self.left_out),
            "check": None if self.check is None else self.check.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Comparison:
        def build(d: Mapping[str, Any]) -> Comparison:
            check = d.get("check")
            return cls(
                program=ProgramRecord.from_dict(d["program"]),
                reference=str(d["reference"]),
                seed=int(d["seed"]),
                inputs={
                    n: InputSummary(list(i["shape"]), str(i["dtype"]), str(i["digest"]))
                    for n, i in d["inputs"].items()
                },
                sides=[SideDescription.from_dict(s) for s in d["sides"]],
                baseline=str(d["baseline"]),
                outputs=[OutputComparison.from_dict(o) for o in d["outputs"]],
                case=str(d.get("case") or ""),
                left_out=[str(n) for n in d.get("left_out") or []],
                check=None if check is None else Check.from_dict(check),
            )

        return read("comparison", d, build)
