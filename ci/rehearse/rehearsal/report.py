"""Judging a pair's act run against its expected end, and the tables a rehearsal prints: the steps act ran, and
the job x event pairs with their result and time."""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

from rehearsal.act import JobRun, StepRun
from rehearsal.plan import JobSpec, preflight_step, step_names

PREFLIGHT_LINE = re.compile(
    r"error: pre-flight [\w-]+: .+"
)  # harness.checks.preflight's one line, as the CLI prints it


def error_line(step: StepRun) -> str:
    """The step's last output line that reads as an error, else its last non-empty line."""
    lines = [ln.strip() for ln in step.output if ln.strip()]
    for ln in reversed(lines):
        if re.search(r"\berror\b|::error::", ln, re.IGNORECASE):
            return ln
    return lines[-1] if lines else ""


@dataclass
class Verdict:
    """A rehearsal job's outcome against its expectation: ok, and the one line that says what happened."""

    ok: bool
    line: str


def judge(spec: JobSpec, workflow_job: dict, runs: list[JobRun], exit_code: int) -> Verdict:
    """Whether act's run of `spec` ended as expected (module docstring: `expected`). A job that its guard skips
    runs no step (act exits 0); a sharded GPU job runs one act job per shard, each must stop at its pre-flight; a
    job that needs GPU jobs (a merge) runs them first: they stop at their pre-flight, and it fails at its merge
    (no shard results) or is skipped."""
    if spec.expect == "skipped":
        ran = [r for r in runs if r.steps]
        if not ran and exit_code == 0:
            return Verdict(True, "skipped by its guard")
        return Verdict(
            False,
            f"ran ({', '.join(r.prefix for r in ran) or 'no job'}, act exit {exit_code}): its "
            "guard should skip it",
        )
    if spec.expect == "preflight" and len(runs) > 1:
        verdicts, merged = [], []
        for run in runs:
            v = judge(spec, workflow_job, [run], 1 if run.result == "failed" else 0)
            if v.ok:
                verdicts.append(v)
                continue
            failed = [s for s in run.steps if s.result == "failure" and s.depth == 0]
            if failed and "ci-merge" in failed[0].name:
                merged.append(f"{run.prefix} failed at its merge (no shard results): {error_line(failed[0])}")
                continue
            return Verdict(False, f"{run.prefix}: {v.line}")
        if not verdicts:
            return Verdict(False, "no job stopped at its pre-flight")
        return Verdict(
            True,
            f"{len(verdicts)} job(s) stopped at pre-flight ({verdicts[0].line})"
            + (f"; {merged[0]}" if merged else ""),
        )
    if len(runs) != 1:
        return Verdict(False, f"act ran {len(runs)} jobs for {spec.job} (exit {exit_code}); expected one")
    run = runs[0]
    failed = [s for s in run.steps if s.result == "failure" and s.depth == 0]
    if spec.expect == "success":
        if run.result == "succeeded" and exit_code == 0:
            return Verdict(True, "succeeded")
        where = f" at step {failed[0].name!r}: {error_line(failed[0])}" if failed else ""
        return Verdict(False, f"{run.result} (act exit {exit_code}){where}")
    # preflight: a GPU job on a machine without a GPU
    if run.result != "failed":
        return Verdict(
            False, f"{run.result}: a GPU job must stop at its pre-flight on a machine without a GPU"
        )
    if not failed:
        return Verdict(False, "failed, but no step failed (act could not run it?)")
    step = failed[0]
    wanted = preflight_step(workflow_job)
    if wanted is not None and step.name != wanted:
        return Verdict(
            False, f"failed at {step.name!r}, not at its pre-flight step {wanted!r}: {error_line(step)}"
        )
    lines = [m.group(0) for ln in step.output if (m := PREFLIGHT_LINE.search(ln))]
    if not lines:
        return Verdict(False, f"failed at {step.name!r} before or without its pre-flight: {error_line(step)}")
    return Verdict(True, f"stopped at pre-flight (step {step.name!r}) with message: {lines[0]}")


def summary_rows(spec: JobSpec, workflow_job: dict, runs: list[JobRun]) -> list[tuple[str, str, str]]:
    """(job, step, result) rows: every step act ran, in order (steps inside a composite action indented),
    then the workflow's steps act never started, as `skipped`."""
    rows, seen = [], set()
    for run in runs:
        for s in run.steps:
            seen.add(s.name)
            label = ("  " * s.depth) + (s.name if s.stage == "Main" else f"{s.stage} {s.name}")
            rows.append((spec.job, label, s.result + (f" [{s.took}]" if s.took else "")))
    rows += [(spec.job, name, "skipped") for name in step_names(workflow_job) if name not in seen]
    return rows


def table(rows: list[tuple[str, str, str]]) -> str:
    """A plain-text table with the header job / step / result."""
    head = ("job", "step", "result")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(3)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(
        [fmt.format(*head), fmt.format(*("-" * w for w in widths)), *(fmt.format(*r) for r in rows)]
    )


def pairs_table(
    verdicts: list[tuple[JobSpec, Verdict, float]], cancel: tuple[JobSpec, Verdict, float] | None = None
) -> str:
    """The job x event table: workflow, job, event, expected end, result (`ok` or `FAIL`, then the verdict's line)
    and seconds, one row a pair, then the cancel check's row (`cancel`) and a count of what ended as expected."""
    rows = [
        (s.workflow, s.job, s.label, s.expect, "ok" if v.ok else "FAIL", f"{took:.0f}", v.line)
        for s, v, took in verdicts
    ]
    if cancel is not None:
        s, v, took = cancel
        rows.append(
            (s.workflow, s.job, "cancel check", "cancelled", "ok" if v.ok else "FAIL", f"{took:.0f}", v.line)
        )
    head = ("workflow", "job", "event", "expected", "result", "s", "what happened")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(6)]
    fmt = "  ".join([*(f"{{:<{w}}}" for w in widths[:5]), f"{{:>{widths[5]}}}", "{}"])
    ok = sum(1 for r in rows if r[4] == "ok")
    return "\n".join(
        [
            "job x event:",
            fmt.format(*head),
            *(fmt.format(*r) for r in rows),
            f"{ok} of {len(rows)} ended as expected",
        ]
    )


# what a job that runs to its end must have uploaded: artifact name -> paths (in the artifact) it must hold
EXPECTED_UPLOADS = {
    "unit-tests": {"results-unit-tests": ("unit-tests/compiler.xml", "unit-tests/harness.xml")},
    "tests-cpu": {"results-cpu": ("ci-cpu/", "compile-check/")},
}


def uploaded(artifacts: Path) -> dict[str, list[str]]:
    """The artifacts of run 1 in act's artifact server folder (`artifacts`/1/NAME/NAME.zip): name -> their paths."""
    found = {}
    for archive in sorted((artifacts / "1").glob("*/*.zip")):
        try:
            with zipfile.ZipFile(archive) as z:
                found[archive.parent.name] = sorted(z.namelist())
        except (OSError, zipfile.BadZipFile):
            found[archive.parent.name] = []
    return found


def judge_uploads(spec: JobSpec, verdict: Verdict, artifacts: Path) -> Verdict:
    """`verdict` with what the pair uploaded added to its line; a pair that ended as expected with `success` but
    lacks an upload of EXPECTED_UPLOADS (or a path in it) is not ok."""
    if not verdict.ok or spec.expect != "success":
        return verdict
    got = uploaded(artifacts)
    for name, paths in EXPECTED_UPLOADS.get(spec.job, {}).items():
        if name not in got:
            return Verdict(
                False,
                f"{verdict.line}, but no artifact {name} was uploaded (artifacts: "
                f"{', '.join(got) or 'none'})",
            )
        missing = [
            p for p in paths if not any(f == p or (p.endswith("/") and f.startswith(p)) for f in got[name])
        ]
        if missing:
            return Verdict(False, f"{verdict.line}, but the artifact {name} lacks {', '.join(missing)}")
    if not got:
        return verdict
    return Verdict(
        True, f"{verdict.line}; uploaded " + ", ".join(f"{n} ({len(f)} files)" for n, f in got.items())
    )
