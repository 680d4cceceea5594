"""Typed settings of the benchmark package; the one place that reads its environment variables.

- `KILN_BENCH_DB`: the SQLite store (default `results/bench.sqlite`).
- `KILN_BENCH_PLANT`: a planted slowdown, `PATTERN[@COMPILER][=FRACTION]` (default fraction 0.2): extra
  time equal to FRACTION of the measured time is added after every call of the matching workload (on a
  GPU as device-side sleep), so CI can prove that a slowdown is flagged. Never set it for real results.
- `KILN_BENCH_THRESHOLD`, `KILN_BENCH_ALPHA`: regression threshold (fraction slower; default by device kind,
  see compare.py) and Mann-Whitney test level (default 0.01).
- `KILN_BENCH_GIT_REF`: the git ref recorded for a run (else `GITHUB_REF_NAME`, else `git` itself).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from .exc import UsageError

DEFAULT_DB = Path("results") / "bench.sqlite"
DEFAULT_ALPHA = 0.01
DEFAULT_PLANT_FRACTION = 0.2


@dataclass(frozen=True)
class Plant:
    """A planted slowdown: workloads matching `pattern` (and `compiler`, if set) get `fraction` extra time."""

    pattern: str
    compiler: str | None
    fraction: float

    @classmethod
    def parse(cls, spec: str) -> "Plant":
        body, _, frac = spec.partition("=")
        pattern, _, compiler = body.partition("@")
        try:
            fraction = float(frac) if frac else DEFAULT_PLANT_FRACTION
        except ValueError:
            raise UsageError(f"bad plant {spec!r}: fraction {frac!r} is not a number") from None
        if not pattern or fraction <= 0:
            raise UsageError(f"bad plant {spec!r}: expected PATTERN[@COMPILER][=FRACTION>0]")
        return cls(pattern, compiler or None, fraction)

    def applies(self, workload: str, compiler: str) -> bool:
        return fnmatchcase(workload, self.pattern) and (self.compiler is None or self.compiler == compiler)

    def spec(self) -> str:
        return f"{self.pattern}{'@' + self.compiler if self.compiler else ''}={self.fraction:g}"


def _float(name: str, default: float | None) -> float | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not a number") from None


@dataclass(frozen=True)
class Settings:
    """Environment-derived defaults; command-line flags override them."""

    db: Path
    plant: Plant | None
    threshold: float | None
    alpha: float
    git_ref: str | None


def settings() -> Settings:
    """Read the environment now (cheap; call it where needed rather than caching it at import)."""
    plant = os.environ.get("KILN_BENCH_PLANT")
    return Settings(
        db=Path(os.environ.get("KILN_BENCH_DB") or DEFAULT_DB),
        plant=Plant.parse(plant) if plant else None,
        threshold=_float("KILN_BENCH_THRESHOLD", None),
        alpha=_float("KILN_BENCH_ALPHA", DEFAULT_ALPHA) or DEFAULT_ALPHA,
        git_ref=os.environ.get("KILN_BENCH_GIT_REF") or os.environ.get("GITHUB_REF_NAME") or None,
    )
