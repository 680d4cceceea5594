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

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .exc import NotComparable
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
        return len(self.run.side(self.compiler)["repeats"])


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
    keys = ("ref", "kind", "inputs", "backward", "file_sha256")
    p0 = {k: first.run.manifest["program"].get(k) for k in keys}
    for s in sides[1:]:
        p = {k: s.run.manifest["program"].get(k) for k in keys}
        if p != p0:
            diff = next(k for k in keys if p[k] != p0[k])
            raise NotComparable(
                f"{s.label} ran another program than {first.label}: {diff} {p[diff]!r} vs {p0[diff]!r}"
            )
        for group in ("inputs", "cotangents"):
            a, b = first.run.manifest.get(group, {}), s.run.manifest.get(group, {})
            for n in sorted(set(a) | set(b)):
                if group == "cotangents" and (n not in a or n not in b):
                    continue
                if n not in a or n not in b or a[n]["digest"] != b[n]["digest"]:
                    raise NotComparable(
                        f"{group[:-1]} {n!r} differs between {first.label} and {s.label} "
                        f"(digest {a.get(n, {}).get('digest', 'missing')[:12]} vs "
                        f"{b.get(n, {}).get('digest', 'missing')[:12]}): not the same inputs"
                    )
    outs = None
    for s in sides:
        side = s.run.side(s.compiler)
        if side.get("error") or not side["repeats"]:
            raise NotComparable(f"{s.label} ({s.name}) has no outputs: {side.get('error') or 'no repeats'}")
        here = side["repeats"][0]
        if outs is None:
            outs = here
            continue
        if set(here) != set(outs):
            raise NotComparable(f"{s.label} has outputs {sorted(here)}, {first.label} has {sorted(outs)}")
        for n, e in here.items():
            if (e["shape"], e["dtype"]) != (outs[n]["shape"], outs[n]["dtype"]):
                raise NotComparable(
                    f"output {n}: {outs[n]['dtype']}{outs[n]['shape']} in {first.label} vs "
                    f"{e['dtype']}{e['shape']} in {s.label}"
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
    prog: dict[str, Any],
    name: str,
    shape: tuple[int, ...],
    where: list[int],
    inputs: dict[str, torch.Tensor],
    cots: dict[str, torch.Tensor],
) -> dict[str, Any]:
    """What produced one output element: input values (elementwise), the rows' summaries (rows)."""
    structure = prog.get("structure", "opaque")
    out: dict[str, Any] = {}
    tensors = dict(inputs)
    if name.startswith("grad."):
        tensors.update({f"cotangent.{k}": v for k, v in cots.items()})
    for n, t in tensors.items():
        if structure == "elementwise":
            try:
                if torch.broadcast_shapes(t.shape, shape) == torch.Size(shape):
                    out[n] = float(torch.broadcast_to(t, shape)[tuple(where)].double())
            except RuntimeError:
                continue
        elif structure == "rows" and t.ndim:
            row = _row(t, shape, where, prog.get("row_dim", -1))
            if row is not None:
                r = row.double()
                fin = r[torch.isfinite(r)]
                out[n] = {
                    "length": r.numel(),
                    "nonfinite": int(r.numel() - fin.numel()),
                    **(
                        {"min": fin.min().item(), "max": fin.max().item(), "mean": fin.mean().item()}
                        if fin.numel()
                        else {}
                    ),
                }
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
    prog: dict[str, Any],
    inputs: dict[str, torch.Tensor],
    cots: dict[str, torch.Tensor],
    baseline: int = 0,
    rtol: float | None = None,
    atol: float | None = None,
    top: int = 8,
) -> dict[str, Any]:
    """The comparison of one output (see the module docstring); a JSON-ready dict."""
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
    out: dict[str, Any] = {
        "name": name,
        "shape": list(shape),
        "dtype": str(dtype).removeprefix("torch."),
        "numel": stored[0].numel,
        "compared": int(ref64.size),
        "sampled": common is not None,
        "rtol": rtol,
        "atol": atol,
        "reduction_length": _reduction_length(prog, name),
        "sides": [],
        "pairs": [],
        "ref_absmax": float(np.abs(ref64[np.isfinite(ref64)]).max()) if np.isfinite(ref64).any() else 0.0,
    }
    for s, st, e, u in zip(sides, stored, errs, ulps):
        fin = e[np.isfinite(e)]
        i = _argmax(np.where(np.isfinite(e), e, np.inf))
        out["sides"].append(
            {
                "label": s.label,
                "max_abs": float(e.max()) if e.size else 0.0,
                "max_abs_at": _where(flat[i], shape),
                "mean_abs": float(fin.mean()) if fin.size else 0.0,
                "max_ulp": float(u.max()) if u.size else 0.0,
                "mean_ulp": float(u[np.isfinite(u)].mean()) if np.isfinite(u).any() else 0.0,
                "nonfinite_errors": int((~np.isfinite(e)).sum()),
                "histogram": histogram(u),
                "digest": st.digest,
                "nondeterminism": nondeterminism(s, name),
            }
        )
    bits = [_bits(v) for v in vals]
    for j in range(len(sides)):
        if j != baseline:
            out["pairs"].append(
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
    return out


def _reduction_length(prog: dict[str, Any], name: str) -> int | None:
    table = prog.get("reduction") or {}
    best = max((k for k in table if name == k or name.startswith(k + ".")), key=len, default=None)
    return None if best is None else int(table[best])


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
    prog: dict[str, Any],
    name: str,
    inputs: dict[str, torch.Tensor],
    cots: dict[str, torch.Tensor],
) -> dict[str, Any]:
    both_nan = np.isnan(xa) & np.isnan(xb)
    differ = (ba != bb) & ~both_nan
    mismatch = ~np.isclose(xa, xb, rtol=rtol, atol=atol, equal_nan=True)
    d = abs_error(xa, xb)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(d == 0, 0.0, d / np.abs(xb))
    rel = np.where(np.isnan(rel), np.inf, rel)

    def closer(mask: np.ndarray) -> dict[str, int]:
        return {
            a.label: int((ea[mask] < eb[mask]).sum()),
            b.label: int((eb[mask] < ea[mask]).sum()),
            "tie": int((ea[mask] == eb[mask]).sum()),
        }

    n_mis, n_diff = int(mismatch.sum()), int(differ.sum())
    chosen = np.flatnonzero(mismatch if n_mis else differ)
    order = chosen[np.lexsort((chosen, -np.where(np.isfinite(d[chosen]), d[chosen], np.inf)))][:top]
    worst = []
    for k in order.tolist():
        where = _where(flat[k], shape)
        worst.append(
            {
                "at": where,
                a.label: float(xa[k]),
                b.label: float(xb[k]),
                "fp64": float(ref[k]),
                f"err_{a.label}": float(ea[k]),
                f"err_{b.label}": float(eb[k]),
                f"ulp_{a.label}": float(ua[k]),
                f"ulp_{b.label}": float(ub[k]),
                "closer": a.label if ea[k] < eb[k] else b.label if eb[k] < ea[k] else "tie",
                "inputs": _context(prog, name, shape, where, inputs, cots),
            }
        )
    pair = {
        "a": a.label,
        "b": b.label,
        "differing": n_diff,
        "mismatched": n_mis,
        "differing_at": [_where(flat[k], shape) for k in np.flatnonzero(differ)[:LIST_MAX]],
        "mismatched_at": [_where(flat[k], shape) for k in np.flatnonzero(mismatch)[:LIST_MAX]],
        "max_abs_diff": float(d.max()) if d.size else 0.0,
        "max_abs_diff_at": _where(flat[_argmax(d)], shape),
        "max_rel_diff": float(rel.max()) if rel.size else 0.0,
        "max_rel_diff_at": _where(flat[_argmax(rel)], shape),
        "closer_mismatched": closer(mismatch),
        "closer_differing": closer(differ),
        "worst": worst,
        "max_err": {
            a.label: float(ea.max()) if ea.size else 0.0,
            b.label: float(eb.max()) if eb.size else 0.0,
        },
        "max_ulp": {
            a.label: float(ua.max()) if ua.size else 0.0,
            b.label: float(ub.max()) if ub.size else 0.0,
        },
        "max_err_mismatched": {a.label: _max(ea[mismatch]), b.label: _max(eb[mismatch])},
        "max_ulp_mismatched": {a.label: _max(ua[mismatch]), b.label: _max(ub[mismatch])},
    }
    pair["verdict"] = verdict(pair, xa.size, rtol, atol)
    return pair


def verdict(p: dict[str, Any], n: int, rtol: float, atol: float) -> str:
    """One sentence: which side of the pair is further from fp64 on the mismatched elements, and by how much."""
    a, b = p["a"], p["b"]
    if not p["differing"]:
        return f"run {a} and run {b} are bitwise identical on {n} compared elements"
    if not p["mismatched"]:
        c = p["closer_differing"]
        return (
            f"run {a} and run {b} agree within rtol={rtol:g}, atol={atol:g}; {p['differing']} of {n} elements "
            f"differ in bits (closer to fp64: {a} on {c[a]}, {b} on {c[b]}, tie {c['tie']})"
        )
    c, m = p["closer_mismatched"], p["mismatched"]
    if c[a] == c[b]:
        return (
            f"neither run is consistently further from fp64 on the {m} mismatched elements ({a} closer on "
            f"{c[a]}, {b} on {c[b]}, tie {c['tie']})"
        )
    worse, better = (b, a) if c[a] > c[b] else (a, b)
    e, u = p["max_err_mismatched"], p["max_ulp_mismatched"]
    return (
        f"run {worse} is further from fp64 on {c[better]} of {m} mismatched elements; its max error there is "
        f"{fmt(e[worse])} vs {fmt(e[better])} for {better} ({fmt(u[worse])} vs {fmt(u[better])} ULP)"
    )


def nondeterminism(s: Side, name: str) -> dict[str, Any] | None:
    """Repeat k against repeat 0 of one side: bitwise identical or how many elements differ and by how much."""
    reps = s.run.side(s.compiler)["repeats"]
    if len(reps) < 2:
        return None
    first = s.run.output(s.compiler, 0, name)
    out: dict[str, Any] = {"repeats": len(reps), "identical": True, "differing": 0, "max_abs_diff": 0.0}
    for k in range(1, len(reps)):
        if reps[k][name]["digest"] == first.digest:
            continue
        other = s.run.output(s.compiler, k, name)
        x0, x1 = first.values.double().numpy(), other.values.double().numpy()
        diff = (_bits(first.values) != _bits(other.values)) & ~(np.isnan(x0) & np.isnan(x1))
        d = abs_error(x1, x0)
        out.update(
            identical=False,
            differing=max(out["differing"], int(diff.sum())),
            max_abs_diff=max(out["max_abs_diff"], float(d.max()) if d.size else 0.0),
        )
        if first.indices is not None:
            out["note"] = "digests differ; counts are over the stored sample"
    return out


def check(report: dict[str, Any], ratio: float, max_ulp: float | None) -> list[str]:
    """Sides further from fp64 than the bound, one line each: an output's max error above
    ``ratio x (the closest side's max error) + one ULP at the largest reference value``, or above `max_ulp` ULPs."""
    failures = []
    for o in report["outputs"]:
        best = min(s["max_abs"] for s in o["sides"])
        floor = float(ulp(np.array([o.get("ref_absmax", 0.0)]), _dtype(o["dtype"]))[0])
        for s in o["sides"]:
            bound = ratio * best + floor
            if s["max_abs"] > bound:
                failures.append(
                    f"{o['name']}: run {s['label']} max error {fmt(s['max_abs'])} > {ratio:g} x "
                    f"{fmt(best)} + {fmt(floor)}"
                )
            elif max_ulp is not None and s["max_ulp"] > max_ulp:
                failures.append(
                    f"{o['name']}: run {s['label']} max ULP error {fmt(s['max_ulp'])} > {max_ulp:g}"
                )
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
) -> dict[str, Any]:
    """The whole comparison of sides of one program: checks, the fp64 reference, every output."""
    from . import reference as reference_mod

    if len(sides) < 2 and not any(s.repeats > 1 for s in sides):
        raise NotComparable("compare needs two sides (or one side run with --repeat 2)")
    names = check_comparable(sides)
    ref, how = reference_mod.for_run(sides[0].run, reference)
    missing = [n for n in names if n not in ref]
    if missing:
        raise NotComparable(f"the fp64 reference has no output {missing[0]!r} (it has {sorted(ref)})")
    prog = sides[0].run.manifest["program"]
    inputs, cots = sides[0].run.tensors("inputs"), sides[0].run.tensors("cotangents")
    report: dict[str, Any] = {
        "program": prog,
        "reference": how,
        "seed": sides[0].run.manifest["seed"],
        "inputs": {
            n: {k: e[k] for k in ("shape", "dtype", "digest")}
            for n, e in sides[0].run.manifest["inputs"].items()
        },
        "sides": [_describe(s) for s in sides],
        "baseline": sides[baseline].label,
        "outputs": [
            compare_output(n, sides, ref[n], prog, inputs, cots, baseline, rtol, atol, top) for n in names
        ],
    }
    return report


def _describe(s: Side) -> dict[str, Any]:
    env, side = s.run.env(), s.run.side(s.compiler)
    dev = env.get("device", {}) if isinstance(env, dict) else {}
    git = (env.get("host", {}) or {}).get("git", {}) if isinstance(env, dict) else {}
    return {
        "label": s.label,
        "name": s.name,
        "run": str(s.run.path),
        "compiler": s.compiler,
        "device": s.run.manifest.get("device"),
        "gpus": sorted(set(dev.get("gpus") or [])),
        "torch": dev.get("torch"),
        "triton": dev.get("triton"),
        "hip": dev.get("hip"),
        "cuda": dev.get("cuda"),
        "git": git.get("sha"),
        "dirty": git.get("dirty"),
        "repeats": len(side["repeats"]),
        "info": side.get("info", {}),
    }
