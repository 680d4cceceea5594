"""Compare: per output, how sides differ from each other and from the float64 reference.

Terms:
  side label   A, B, C... in the order given on the command line; its name is ``FOLDER:COMPILER``.
  pair         (baseline, other side): the baseline is the first side unless --baseline names another.
  differing    elements whose bits differ between the two sides (two NaNs count as equal).
  mismatched   differing beyond tolerance: ``|a - b| > atol + rtol * |b|`` (b: the pair's second side); the
               default rtol/atol per dtype are DEFAULT_TOL.
  relative difference  ``|a - b| / |b|`` (infinite where b is 0 and a is not).
  error        ``|side - reference|``; *ULP error* divides it by the spacing of the output dtype at the
               reference (`ulp_error`). Matching non-finite values have error 0, others error inf.
  closer       per element, the side with the smaller error (equal errors: a tie).
  compared elements  all of them, or (an output stored as a sample) the sample indices the sides share.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np
import torch

from .comparison import (
    Both,
    Closer,
    Comparison,
    Context,
    InputSummary,
    Nondeterminism,
    OutputComparison,
    Pair,
    RowSummary,
    SideDescription,
    SideErrors,
    WorstElement,
)
from .exc import NotComparable
from .records import ProgramRecord, RunEnv, Structure
from .store import RunFolder, Stored

DEFAULT_TOL: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-9, 1e-9),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}
#: (mantissa bits, smallest normal exponent) of each float dtype
FORMATS = {
    torch.float64: (52, -1022),
    torch.float32: (23, -126),
    torch.float16: (10, -14),
    torch.bfloat16: (7, -126),
}
ULP_EDGES = (0.0, 0.5, 1.0, 2.0, 4.0, 16.0, 256.0)
ULP_BUCKETS = ("0", "(0, 0.5]", "(0.5, 1]", "(1, 2]", "(2, 4]", "(4, 16]", "(16, 256]", "> 256", "non-finite")
LIST_MAX = 100


@dataclass(frozen=True)
class Side:
    """One side of a comparison: a compiler's outputs in a run folder."""

    label: str
    run: RunFolder
    compiler: str

    @property
    def name(self) -> str:
        return f"{self.run.path}:{self.compiler}"

    @property
    def repeats(self) -> int:
        return len(self.run.side(self.compiler).repeats)


def ulp(ref: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """The spacing of `dtype` at each reference value (1 for integer dtypes)."""
    if dtype not in FORMATS:
        return np.ones_like(ref)
    mant, emin = FORMATS[dtype]
    _, e = np.frexp(np.where(np.isfinite(ref), ref, 0.0))
    return np.ldexp(1.0, np.maximum(e - 1, emin) - mant)


def abs_error(x: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|x - ref|, 0 where both are the same non-finite value, inf where only one is finite or NaN."""
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(x - ref)
    same = (np.isnan(x) & np.isnan(ref)) | (np.isinf(x) & (x == ref))
    return np.where(same, 0.0, np.where(np.isnan(d), np.inf, d))


def ulp_error(x: np.ndarray, ref: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    return abs_error(x, ref) / ulp(ref, dtype)


def histogram(ulps: np.ndarray) -> list[int]:
    """Counts per ULP_BUCKETS."""
    finite = ulps[np.isfinite(ulps)]
    zero = int((finite == 0).sum())
    rest = np.histogram(finite[finite > 0], bins=[*ULP_EDGES, np.inf])[0].tolist()
    return [zero, *rest, int((~np.isfinite(ulps)).sum())]


def _where(flat: int, shape: tuple[int, ...]) -> list[int]:
    return [int(i) for i in np.unravel_index(flat, shape)] if shape else []


def _max(a: np.ndarray) -> float:
    return float(a.max()) if a.size else 0.0


def _argmax(a: np.ndarray) -> int:
    return int(np.argmax(a)) if a.size else 0


def _bits(t: torch.Tensor) -> np.ndarray:
    size = t.element_size()
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]
    return (t.to(torch.uint8) if t.dtype == torch.bool else t.contiguous().view(view)).numpy()


def check_comparable(sides: list[Side]) -> list[str]:
    """The output names every side has, after checking program, inputs and outputs agree (else NotComparable)."""
    first = sides[0]
    p0 = first.run.program.identity()
    for s in sides[1:]:
        p = s.run.program.identity()
        if p != p0:
            diff = next(k for k in p if p[k] != p0[k])
            raise NotComparable(
                f"{s.label} ran another program than {first.label}: {diff} {p[diff]!r} vs {p0[diff]!r}"
            )
        for group in ("inputs", "cotangents"):
            ma, mb = first.run.manifest, s.run.manifest
            a, b = (ma.inputs, mb.inputs) if group == "inputs" else (ma.cotangents, mb.cotangents)
            for n in sorted(set(a) | set(b)):
                if group == "cotangents" and (n not in a or n not in b):
                    continue
                if n not in a or n not in b or a[n].digest != b[n].digest:
                    da = a[n].digest if n in a else "missing"
                    db = b[n].digest if n in b else "missing"
                    raise NotComparable(
                        f"{group[:-1]} {n!r} differs between {first.label} and {s.label} "
                        f"(digest {da[:12]} vs {db[:12]}): not the same inputs"
                    )
    outs = None
    for s in sides:
        side = s.run.side(s.compiler)
        if side.error or not side.repeats:
            raise NotComparable(f"{s.label} ({s.name}) has no outputs: {side.error or 'no repeats'}")
        here = side.repeats[0]
        if outs is None:
            outs = here
            continue
        if set(here) != set(outs):
            raise NotComparable(f"{s.label} has outputs {sorted(here)}, {first.label} has {sorted(outs)}")
        for n, e in here.items():
            o = outs[n]
            if (e.shape, e.dtype) != (o.shape, o.dtype):
                raise NotComparable(
                    f"output {n}: {o.dtype}{list(o.shape)} in {first.label} vs {e.dtype}{list(e.shape)} in {s.label}"
                )
    return sorted(outs or {}, key=lambda n: (n.startswith("grad."), n))


def _common(stored: list[Stored]) -> np.ndarray | None:
    """Flat indices every side stored (None: all elements)."""
    sampled = [s.indices for s in stored if s.indices is not None]
    if not sampled:
        return None
    common = sampled[0]
    for idx in sampled[1:]:
        common = np.intersect1d(common, idx)
    if common.size == 0:
        raise NotComparable(
            "sampled outputs share no element: save the runs with the same --full-max/--sample"
        )
    return common


def _at(s: Stored, common: np.ndarray | None) -> torch.Tensor:
    if common is None:
        return s.values
    if s.indices is None:
        return s.values[torch.from_numpy(common)]
    return s.values[torch.from_numpy(np.searchsorted(s.indices, common))]


def _context(
    prog: ProgramRecord,
    name: str,
    shape: tuple[int, ...],
    where: list[int],
    inputs: dict[str, torch.Tensor],
    cots: dict[str, torch.Tensor],
) -> Context:
    """What produced one output element: input values (elementwise), the rows' summaries (rows)."""
    structure = prog.structure
    out: Context = {}
    tensors = dict(inputs)
    if name.startswith("grad."):
        tensors.update({f"cotangent.{k}": v for k, v in cots.items()})
    for n, t in tensors.items():
        if structure is Structure.ELEMENTWISE:
            try:
                if torch.broadcast_shapes(t.shape, shape) == torch.Size(shape):
                    out[n] = float(torch.broadcast_to(t, shape)[tuple(where)].double())
            except RuntimeError:
                continue
        elif structure is Structure.ROWS and t.ndim:
            row = _row(t, shape, where, prog.row_dim)
            if row is not None:
                r = row.double()
                fin = r[torch.isfinite(r)]
                nonfinite = int(r.numel() - fin.numel())
                out[n] = (
                    RowSummary(r.numel(), nonfinite, fin.min().item(), fin.max().item(), fin.mean().item())
                    if fin.numel()
                    else RowSummary(r.numel(), nonfinite)
                )
    return out


def _row(t: torch.Tensor, shape: tuple[int, ...], where: list[int], row_dim: int) -> torch.Tensor | None:
    d = row_dim % t.ndim
    if (
        t.ndim == len(shape)
        and all(a == b for i, (a, b) in enumerate(zip(t.shape, shape)) if i != d)
        and shape[d] in (1, t.shape[d])
    ):
        row: tuple[int | slice, ...] = (*where[:d], slice(None), *where[d + 1 :])
        return t[row]
    if t.ndim == len(shape) + 1 and tuple(t.shape[:d]) + tuple(t.shape[d + 1 :]) == tuple(shape):
        row = (*where[:d], slice(None), *where[d:])
        return t[row]
    return None


def fmt(x: float) -> str:
    """A number at 3 significant digits, always with a decimal point or exponent: 1.0, 0.00391, 1.2e+03."""
    s = f"{x:.3g}"
    return s if any(c in s for c in ".enai") else s + ".0"


def compare_output(
    name: str,
    sides: list[Side],
    ref: torch.Tensor,
    prog: ProgramRecord,
    inputs: dict[str, torch.Tensor],
    cots: dict[str, torch.Tensor],
    baseline: int = 0,
    rtol: float | None = None,
    atol: float | None = None,
    top: int = 8,
) -> OutputComparison:
    """The comparison of one output (see the module docstring)."""
    stored = [s.run.output(s.compiler, 0, name) for s in sides]
    shape, dtype = stored[0].shape, stored[0].dtype
    if tuple(ref.shape) != shape:
        raise NotComparable(
            f"output {name}: the fp64 reference has shape {list(ref.shape)}, the runs {list(shape)}"
        )
    r_def, a_def = DEFAULT_TOL.get(dtype, (0.0, 0.0))
    rtol, atol = (r_def if rtol is None else rtol), (a_def if atol is None else atol)
    common = _common(stored)
    ref64 = ref.reshape(-1).double().numpy()
    ref64 = ref64 if common is None else ref64[common]
    flat = np.arange(ref64.size) if common is None else common
    vals = [_at(s, common) for s in stored]
    x64 = [v.double().numpy() for v in vals]
    errs = [abs_error(x, ref64) for x in x64]
    ulps = [e / ulp(ref64, dtype) for e in errs]
    side_errors = []
    for s, st, e, u in zip(sides, stored, errs, ulps):
        fin = e[np.isfinite(e)]
        i = _argmax(np.where(np.isfinite(e), e, np.inf))
        side_errors.append(
            SideErrors(
                label=s.label,
                max_abs=float(e.max()) if e.size else 0.0,
                max_abs_at=_where(flat[i], shape),
                mean_abs=float(fin.mean()) if fin.size else 0.0,
                max_ulp=float(u.max()) if u.size else 0.0,
                mean_ulp=float(u[np.isfinite(u)].mean()) if np.isfinite(u).any() else 0.0,
                nonfinite_errors=int((~np.isfinite(e)).sum()),
                histogram=histogram(u),
                digest=st.digest,
                nondeterminism=nondeterminism(s, name),
            )
        )
    bits = [_bits(v) for v in vals]
    pairs = []
    for j in range(len(sides)):
        if j != baseline:
            pairs.append(
                _pair(
                    sides[baseline],
                    sides[j],
                    x64[baseline],
                    x64[j],
                    bits[baseline],
                    bits[j],
                    errs[baseline],
                    errs[j],
                    ulps[baseline],
                    ulps[j],
                    ref64,
                    flat,
                    shape,
                    rtol,
                    atol,
                    top,
                    prog,
                    name,
                    inputs,
                    cots,
                )
            )
    return OutputComparison(
        name=name,
        shape=list(shape),
        dtype=str(dtype).removeprefix("torch."),
        numel=stored[0].numel,
        compared=int(ref64.size),
        sampled=common is not None,
        rtol=rtol,
        atol=atol,
        reduction_length=prog.reduction_length(name),
        sides=side_errors,
        pairs=pairs,
        ref_absmax=float(np.abs(ref64[np.isfinite(ref64)]).max()) if np.isfinite(ref64).any() else 0.0,
    )


def _pair(
    a: Side,
    b: Side,
    xa: np.ndarray,
    xb: np.ndarray,
    ba: np.ndarray,
    bb: np.ndarray,
    ea: np.ndarray,
    eb: np.ndarray,
    ua: np.ndarray,
    ub: np.ndarray,
    ref: np.ndarray,
    flat: np.ndarray,
    shape: tuple[int, ...],
    rtol: float,
    atol: float,
    top: int,
    prog: ProgramRecord,
    name: str,
    inputs: dict[str, torch.Tensor],
    cots: dict[str, torch.Tensor],
) -> Pair:
    both_nan = np.isnan(xa) & np.isnan(xb)
    differ = (ba != bb) & ~both_nan
    mismatch = ~np.isclose(xa, xb, rtol=rtol, atol=atol, equal_nan=True)
    d = abs_error(xa, xb)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(d == 0, 0.0, d / np.abs(xb))
    rel = np.where(np.isnan(rel), np.inf, rel)

    def closer(mask: np.ndarray) -> Closer:
        return Closer(
            int((ea[mask] < eb[mask]).sum()),
            int((eb[mask] < ea[mask]).sum()),
            int((ea[mask] == eb[mask]).sum()),
        )

    def maxima(x: np.ndarray, y: np.ndarray) -> Both:
        return Both(float(x.max()) if x.size else 0.0, float(y.max()) if y.size else 0.0)

    n_mis, n_diff = int(mismatch.sum()), int(differ.sum())
    chosen = np.flatnonzero(mismatch if n_mis else differ)
    order = chosen[np.lexsort((chosen, -np.where(np.isfinite(d[chosen]), d[chosen], np.inf)))][:top]
    worst = []
    for k in order.tolist():
        where = _where(flat[k], shape)
        worst.append(
            WorstElement(
                at=where,
                value=Both(float(xa[k]), float(xb[k])),
                fp64=float(ref[k]),
                err=Both(float(ea[k]), float(eb[k])),
                ulp=Both(float(ua[k]), float(ub[k])),
                closer=a.label if ea[k] < eb[k] else b.label if eb[k] < ea[k] else "tie",
                inputs=_context(prog, name, shape, where, inputs, cots),
            )
        )
    pair = Pair(
        a=a.label,
        b=b.label,
        differing=n_diff,
        mismatched=n_mis,
        differing_at=[_where(flat[k], shape) for k in np.flatnonzero(differ)[:LIST_MAX]],
        mismatched_at=[_where(flat[k], shape) for k in np.flatnonzero(mismatch)[:LIST_MAX]],
        max_abs_diff=float(d.max()) if d.size else 0.0,
        max_abs_diff_at=_where(flat[_argmax(d)], shape),
        max_rel_diff=float(rel.max()) if rel.size else 0.0,
        max_rel_diff_at=_where(flat[_argmax(rel)], shape),
        closer_mismatched=closer(mismatch),
        closer_differing=closer(differ),
        worst=worst,
        max_err=maxima(ea, eb),
        max_ulp=maxima(ua, ub),
        max_err_mismatched=Both(_max(ea[mismatch]), _max(eb[mismatch])),
        max_ulp_mismatched=Both(_max(ua[mismatch]), _max(ub[mismatch])),
    )
    return replace(pair, verdict=verdict(pair, xa.size, rtol, atol))


def verdict(p: Pair, n: int, rtol: float, atol: float) -> str:
    """One sentence: which side of the pair is further from fp64 on the mismatched elements, and by how much."""
    a, b = p.a, p.b
    if not p.differing:
        return f"run {a} and run {b} are bitwise identical on {n} compared elements"
    if not p.mismatched:
        c = p.closer_differing
        return (
            f"run {a} and run {b} agree within rtol={rtol:g}, atol={atol:g}; {p.differing} of {n} elements "
            f"differ in bits (closer to fp64: {a} on {c.a}, {b} on {c.b}, tie {c.tie})"
        )
    c, m = p.closer_mismatched, p.mismatched
    if c.a == c.b:
        return (
            f"neither run is consistently further from fp64 on the {m} mismatched elements ({a} closer on "
            f"{c.a}, {b} on {c.b}, tie {c.tie})"
        )
    e, u = p.max_err_mismatched, p.max_ulp_mismatched
    if c.a > c.b:  # b is further
        worse, better, closer_on, ew, eb, uw, ub = b, a, c.a, e.b, e.a, u.b, u.a
    else:
        worse, better, closer_on, ew, eb, uw, ub = a, b, c.b, e.a, e.b, u.a, u.b
    return (
        f"run {worse} is further from fp64 on {closer_on} of {m} mismatched elements; its max error there is "
        f"{fmt(ew)} vs {fmt(eb)} for {better} ({fmt(uw)} vs {fmt(ub)} ULP)"
    )


def nondeterminism(s: Side, name: str) -> Nondeterminism | None:
    """Repeat k against repeat 0 of one side: bitwise identical or how many elements differ and by how much."""
    reps = s.run.side(s.compiler).repeats
    if len(reps) < 2:
        return None
    first = s.run.output(s.compiler, 0, name)
    out = Nondeterminism(len(reps))
    for k in range(1, len(reps)):
        if reps[k][name].digest == first.digest:
            continue
        other = s.run.output(s.compiler, k, name)
        x0, x1 = first.values.double().numpy(), other.values.double().numpy()
        diff = (_bits(first.values) != _bits(other.values)) & ~(np.isnan(x0) & np.isnan(x1))
        d = abs_error(x1, x0)
        out = replace(
            out,
            identical=False,
            differing=max(out.differing, int(diff.sum())),
            max_abs_diff=max(out.max_abs_diff, float(d.max()) if d.size else 0.0),
        )
        if first.indices is not None:
            out = replace(out, note="digests differ; counts are over the stored sample")
    return out


def check(report: Comparison, ratio: float, max_ulp: float | None) -> list[str]:
    """Sides further from fp64 than the bound, one line each: an output's max error above
    ``ratio x (the closest side's max error) + one ULP at the largest reference value``, or above `max_ulp` ULPs."""
    failures = []
    for o in report.outputs:
        best = min(s.max_abs for s in o.sides)
        floor = float(ulp(np.array([o.ref_absmax]), _dtype(o.dtype))[0])
        for s in o.sides:
            bound = ratio * best + floor
            if s.max_abs > bound:
                failures.append(
                    f"{o.name}: run {s.label} max error {fmt(s.max_abs)} > {ratio:g} x {fmt(best)} + {fmt(floor)}"
                )
            elif max_ulp is not None and s.max_ulp > max_ulp:
                failures.append(f"{o.name}: run {s.label} max ULP error {fmt(s.max_ulp)} > {max_ulp:g}")
    return failures


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def compare(
    sides: list[Side],
    baseline: int = 0,
    rtol: float | None = None,
    atol: float | None = None,
    top: int = 8,
    reference: str = "compute",
) -> Comparison:
    """The whole comparison of sides of one program: checks, the fp64 reference, every output."""
    from . import reference as reference_mod

    if len(sides) < 2 and not any(s.repeats > 1 for s in sides):
        raise NotComparable("compare needs two sides (or one side run with --repeat 2)")
    names = check_comparable(sides)
    ref, how = reference_mod.for_run(sides[0].run, reference)
    missing = [n for n in names if n not in ref]
    if missing:
        raise NotComparable(f"the fp64 reference has no output {missing[0]!r} (it has {sorted(ref)})")
    run = sides[0].run
    prog = run.program
    inputs, cots = run.tensors("inputs"), run.tensors("cotangents")
    return Comparison(
        program=prog,
        reference=how,
        seed=run.manifest.seed,
        inputs={n: InputSummary(list(e.shape), e.dtype, e.digest) for n, e in run.manifest.inputs.items()},
        sides=[_describe(s) for s in sides],
        baseline=sides[baseline].label,
        outputs=[
            compare_output(n, sides, ref[n], prog, inputs, cots, baseline, rtol, atol, top) for n in names
        ],
    )


def _describe(s: Side) -> SideDescription:
    env = RunEnv.from_dict(s.run.env())
    side = s.run.side(s.compiler)
    return SideDescription(
        label=s.label,
        name=s.name,
        run=str(s.run.path),
        compiler=s.compiler,
        device=s.run.manifest.device,
        **asdict(env),  # the run's GPUs, versions and commit: SideDescription's fields of the same names
        repeats=len(side.repeats),
        info=side.info,
    )
