"""Plain records passed between measure, store, compare and report.

Terms:
- *run*: one invocation of the bench over a profile and a list of compilers; `status` is `running` until
  the very end, when it becomes `complete` (an interrupted run stays `running`/`aborted`: never a baseline).
- *result*: one workload under one compiler in one run and phase (`main`, `confirm` for re-measurements
  of flagged workloads, or `compile` for a model's compile times alone), with every sample in nanoseconds.
- *stored verdict*: what comparing a run with its baseline concluded for one workload under one compiler
  (a `Verdict`, stored as its string value), kept with the run (store revision 2).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any

from harness.bench.core.stats import Stats

#: how a kiln timing under Triton's interpreter (CPU) is labelled: it checks the pipeline, not kernel speed
INTERPRETER_LABEL = "(interpreter: pipeline check, not kernel speed)"
COMPILE_PHASE = "compile"  # phase of compile-time-only results (`bench models --compile-only`): no samples


class Verdict(StrEnum):
    """What comparing one workload under one compiler with its baseline concluded. A `str` whose value is what
    the stores, JSON reports and the site hold (`Verdict("regressed")` reads it back).

    - `regressed` / `improved`: slower / faster beyond the threshold; from `bench run` only when confirmed
      side by side (harness/bench/kernels/sidebyside.py);
    - `unchanged`: measured, within the threshold, on a host quiet enough to tell;
    - `inconclusive`: measured side by side on a host too noisy to tell a threshold-sized change (the noise
      floor is in the comparison): neither a pass nor a failure;
    - `rejected`: a suspect the side-by-side measurement did not confirm;
    - `unconfirmed`: a suspect that could not be measured side by side (no baseline build);
    - `suspect`: flagged against stored samples only, never measured side by side;
    - `new` (no baseline result), `missing` (no new result), `not comparable` (definition, timer or device
      differs, or a side failed).
    """

    REGRESSED = "regressed"
    IMPROVED = "improved"
    UNCHANGED = "unchanged"
    INCONCLUSIVE = "inconclusive"
    REJECTED = "rejected"
    UNCONFIRMED = "unconfirmed"
    SUSPECT = "suspect"
    NEW = "new"
    MISSING = "missing"
    NOT_COMPARABLE = "not comparable"

    __hash__ = str.__hash__  # a member and its value are one dict key (Enum hashes the name otherwise)

    def __str__(self) -> str:
        return self.value

    @classmethod
    def read(cls, value: str) -> Verdict | str:
        """A stored or reported verdict as a member; a string no member has (written by an older harness, e.g.
        `ok`) is kept as it is, so that old stores still read."""
        try:
            return cls(value)
        except ValueError:
            return value

    @property
    def flagged(self) -> bool:
        """regressed or improved: a change beyond the threshold."""
        return self in (Verdict.REGRESSED, Verdict.IMPROVED)


@dataclass
class AutotuneTimes:
    """A model case's autotuned compile times (`bench models --autotune-times`, models/compile_times.py):
    cold and warm compile s with autotuning, and the probes' steady step s with heuristic and autotuned
    configs; `error` when an autotuned probe failed."""

    cold_s: float | None = None
    warm_s: float | None = None
    step_s: float | None = None
    autotune_step_s: float | None = None
    error: str = ""

    #: the stored keys (a result's flat `meta` JSON) of each field
    KEYS = {
        "cold_s": "compile_autotune_s",
        "warm_s": "compile_autotune_warm_s",
        "step_s": "probe_step_s",
        "autotune_step_s": "probe_autotune_step_s",
        "error": "compile_autotune_error",
    }


@dataclass
class Meta:
    """What a result carries besides its samples: the case's description and the model tier's extra
    measurements. Stored as one flat JSON object (the `results` table's `meta` column, `Result.as_dict()`):
    a field is stored under its own name when it is set, `autotune` under `AutotuneTimes.KEYS`, and keys this
    harness does not know (written by another version) stay in `extra` and are written back unchanged.

    Case (both tiers): `family`, `mode`, `dtype`, `shape` (kernel tier: a list of sizes; model tier: named
    sizes). Model tier: `tier`, `kind`, `package`, `package_version`, `optimizer`, `config` (the model's
    configuration); `accuracy` (`{"pass": bool, "note": why not, "reference": ..., check name: check}`);
    `memory` (models/memory.py's window) and `peak_mem_bytes` (its peak, also the only figure of results
    older than the window); `kernel` and `host` (models/step_facts.py); `kiln_graphs` (kiln's graphs and
    kernels of a step); `first_call_s`; `steps_per_sample`; `compile_warm_s`, `compile_probe_error` and
    `compile_cpus` (the compile-time probes; the last: how many CPUs each probe could run on);
    `compile_breakdown` (the cold probe's seconds per compile phase, `models/compile_times.phase_breakdown`)
    and `compile_counts` (kiln's compile counters in it, `compile_times.compile_counts`); `combo_guard` (kiln
    arms: the combo-kernel guard's decisions of the compile and first steps, `models/step_facts.combo_guard`); `addmm_forms` (kiln arms: the form each timed linear
    layer's addmm took, `models/step_facts.addmm_forms`); `host_load` (both tiers: other processes' CPU use
    while the arm was sampled, `core/host_load.py`); `run_id` and `compile_run_id` (set by the model report: the run a result and its
    compile times came from). Side by side: `rounds` (one time a turn, kernels/sidebyside.py)."""

    family: str | None = None
    mode: str | None = None
    dtype: str | None = None
    shape: list[int] | dict[str, int] | None = None
    tier: str | None = None
    kind: str | None = None
    package: str | None = None
    package_version: str | None = None
    optimizer: str | None = None
    config: dict[str, Any] | None = None
    accuracy: dict[str, Any] | None = None
    memory: dict[str, Any] | None = None
    peak_mem_bytes: int | None = None
    kernel: dict[str, Any] | None = None
    host: dict[str, Any] | None = None
    kiln_graphs: dict[str, Any] | None = None
    first_call_s: float | None = None
    steps_per_sample: int | None = None
    compile_warm_s: float | None = None
    compile_probe_error: str | None = None
    compile_cpus: int | None = None
    compile_breakdown: dict[str, float] | None = None
    compile_counts: dict[str, float] | None = None
    combo_guard: dict[str, Any] | None = None
    host_load: dict[str, Any] | None = None
    addmm_forms: list[dict[str, Any]] | None = None
    autotune: AutotuneTimes | None = None
    run_id: int | None = None
    compile_run_id: int | None = None
    rounds: list[float] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def accuracy_passed(self) -> bool | None:
        """The accuracy check's verdict; None when no check ran."""
        return None if self.accuracy is None else bool(self.accuracy.get("pass", False))

    @property
    def accuracy_note(self) -> str | None:
        return None if self.accuracy is None else self.accuracy.get("note")

    def as_dict(self) -> dict[str, Any]:
        """The stored flat JSON object (see the class docstring)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "extra" or value is None:
                continue
            if f.name == "autotune":
                for name, key in AutotuneTimes.KEYS.items():
                    v = getattr(value, name)
                    if name != "error" or v:
                        out[key] = v
            else:
                out[f.name] = value
        return {**self.extra, **out}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Meta:
        """From `as_dict()` output or any stored `meta` object (unknown keys go to `extra`)."""
        d = dict(d or {})
        names = {f.name for f in fields(cls)} - {"autotune", "extra"}
        kw: dict[str, Any] = {k: d.pop(k) for k in list(d) if k in names}
        if AutotuneTimes.KEYS["cold_s"] in d:
            kw["autotune"] = AutotuneTimes(
                **{name: d.pop(key) for name, key in AutotuneTimes.KEYS.items() if key in d}
            )
        return cls(**kw, extra=d)


SCHEMA_VERSION = 3  # the bench store's head revision (harness/store/migrations/bench), also of JSON exports


@dataclass
class RunInfo:
    """One bench run (the row of the `runs` table)."""

    id: int | None
    uid: str
    created_at: str
    status: str = "running"
    finished_at: str | None = None
    profile: str = "tiny"
    device: str = "cpu"
    device_name: str = ""
    compilers: list[str] = field(default_factory=list)
    git_ref: str | None = None
    git_commit: str | None = None
    label: str | None = None
    ceiling_gbps: float | None = None
    config: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)
    runner: str | None = None  # who recorded it (revision 3; harness/store/runner.py): name, GPU, driver,
    gpu_model: str | None = None  # the matrix's GPU label and the hardware class baselines stay within
    driver: str | None = None
    gpu_label: str | None = None
    hw_class: str | None = None

    @property
    def rid(self) -> int:
        """The id of a stored run (read from a store or started in one); a run not stored yet has none."""
        if self.id is None:
            raise ValueError(f"run {self.uid} is not stored yet: it has no id")
        return self.id

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Result:
    """One workload under one compiler (see module docstring); `status` is `ok` or `error`."""

    workload: str
    compiler: str
    source_hash: str
    status: str = "ok"
    phase: str = "main"
    error: str | None = None
    samples: list[float] = field(default_factory=list)
    bytes: int | None = None
    flops: int | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    compile_s: float | None = None
    timer: str = ""
    planted: float | None = None
    ceiling_gbps: float | None = None
    meta: Meta = field(default_factory=Meta)

    def __post_init__(self) -> None:
        if not isinstance(self.meta, Meta):  # a stored or older harness's plain `meta` object
            self.meta = Meta.from_dict(self.meta)

    @property
    def stats(self) -> Stats | None:
        return Stats.of(self.samples) if self.samples else None

    @property
    def median_ns(self) -> float | None:
        s = self.stats
        return s.median if s else None

    @property
    def median(self) -> float:
        """The median of a result known to have samples (`median_ns` where it may have none)."""
        m = self.median_ns
        if m is None:
            raise ValueError(f"{self.workload} under {self.compiler} has no samples")
        return m

    @property
    def gbps(self) -> float | None:
        m = self.median_ns
        return self.bytes / m if (m and self.bytes) else None  # bytes per ns == GB/s

    @property
    def tflops(self) -> float | None:
        m = self.median_ns
        return self.flops / m / 1e3 if (m and self.flops) else None

    @property
    def frac_ceiling(self) -> float | None:
        g = self.gbps
        return g / self.ceiling_gbps if (g and self.ceiling_gbps) else None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["meta"] = self.meta.as_dict()
        s = self.stats
        d["stats"] = s.as_dict() if s else None
        d["gbps"], d["tflops"], d["frac_ceiling"] = self.gbps, self.tflops, self.frac_ceiling
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Result:
        names = cls.__dataclass_fields__.keys()
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass
class Comparison:
    """The one verdict record: what comparing one workload under one compiler with its baseline concluded, as
    `bench run` gives it, stores it with the run (`Store.save_verdicts`) and `bench history`, `bench show`,
    `bench verdict`, the reports and the site read it back.

    `verdict`: a `Verdict` (a plain string only when read from a store an older harness wrote); `ratio`/`p`:
    the stored comparison's statistic; `baseline`: the baseline run(s) it was judged against (set when it is
    stored); `confirmed`: None when no confirmation was attempted or it could not decide; `suspect`: the stored
    comparison's flag that asked for a side-by-side confirmation; `sbs_*`: the side-by-side numbers
    (harness/bench/kernels/sidebyside.py, harness/bench/judge/paired.py)."""

    workload: str
    compiler: str
    verdict: Verdict | str
    ratio: float | None = None
    p: float | None = None
    base_ns: float | None = None
    new_ns: float | None = None
    norm_ratio: float | None = None  # ratio divided by the baseline compiler's ratio (confirmation only)
    confirmed: bool | None = None
    note: str = ""
    suspect: Verdict | str = (
        ""  # the stored comparison's flag (regressed/improved) that asked for a confirmation
    )
    sbs_ratio: float | None = (
        None  # side by side (harness/bench/kernels/sidebyside.py): candidate / baseline build
    )
    sbs_p: float | None = None
    sbs_noise: float | None = None  # side by side: the noise floor the A/A pair measured (a fraction)
    sbs_aa_ratio: float | None = None  # side by side: the A/A pair's ratio (identical code in two processes)
    sbs_bb_ratio: float | None = (
        None  # side by side: the B/B pair's ratio (the candidate's code in two processes)
    )
    sbs_base_ns: float | None = None
    sbs_new_ns: float | None = None
    sbs_seconds: float | None = None
    interpreter: bool = False  # kiln under Triton's interpreter: a pipeline check, not kernel speed
    recomputed: bool = False  # recomputed from stored samples (an older run that stored no verdicts)
    baseline: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Comparison:
        """From `as_dict()` output or a stored row (unknown keys ignored; `confirmed` may be 0/1 as stored;
        `p_value` and a `detail` dict, the stored row's shape, are read too)."""
        names = cls.__dataclass_fields__.keys()
        merged = {**dict(d.get("detail") or {}), **{k: v for k, v in d.items() if k != "detail"}}
        if "p_value" in d:
            merged["p"] = d["p_value"]
        kw = {k: v for k, v in merged.items() if k in names}
        if kw.get("confirmed") is not None:
            kw["confirmed"] = bool(kw["confirmed"])
        for k in ("verdict", "suspect"):
            if isinstance(kw.get(k), str) and kw[k]:
                kw[k] = Verdict.read(kw[k])
        return cls(**kw)

    @property
    def confirmed_regression(self) -> bool:
        """Regressed and confirmed side by side: what fails a bench job."""
        return self.verdict == Verdict.REGRESSED and self.confirmed is True

    def stored(self) -> dict[str, Any]:
        """The stored row's shape (the `verdicts` table, JSON exports): the table's columns and the whole
        record in `detail`."""
        return {
            "workload": self.workload,
            "compiler": self.compiler,
            "verdict": str(self.verdict),
            "ratio": self.ratio,
            "p_value": self.p,
            "baseline": self.baseline,
            "confirmed": self.confirmed,
            "detail": self.as_dict(),
        }


def comparisons_of(report: Mapping[str, Any] | None) -> list[Comparison] | None:
    """The comparisons of a bench step's JSON report (`bench run --json`, `bench models`' report.json); None
    when there is no report or it compared nothing (no baseline run)."""
    cmps = report.get("comparisons") if report else None
    return None if cmps is None else [Comparison.from_dict(c) for c in cmps]


def passed(r: Result | None) -> bool:
    """Whether ``r`` ran, has a median and passed its accuracy check (the model tier's pass)."""
    return bool(r and r.status == "ok" and r.median_ns and r.meta.accuracy_passed)


def by_case(results: Iterable[Result]) -> dict[str, dict[str, Result]]:
    """``results`` as {workload: {compiler: result}} (a later result of a pair replaces an earlier one)."""
    by: dict[str, dict[str, Result]] = {}
    for r in results:
        by.setdefault(r.workload, {})[r.compiler] = r
    return by
