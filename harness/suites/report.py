"""The report of a run: one line per suite, the failing tests with their repro lines, the environment.

`write_reports(run_dir)` writes summary.json (every test, classified), report.txt and report.md into the
run folder (atomically) and returns a `Summary`; `python -m harness report DIR` prints it. A shard's run says
which shard it is; a merged run (harness.suites.merge) adds one line per shard: its status, tests and wall time.

Failed tests that the runner ran again alone (harness.suites.retries) are `flaky` (passed on a retry: listed with
their attempts and the failing attempt's log, not failing the run) or `failing` (failed every attempt); each
comes with its repro line and, when the run's test-history store knows it, "failed K of the last N runs".
Quarantined tests that passed are listed, never as ready to leave: one pass of a flake says little, and only a
flake run of N repetitions (harness.suites.flakes) may say a test can leave the quarantine.

A finished run is never re-judged:
  quarantine in force  the one run.json recorded when the run started (`quarantine`: its file and entries);
                       a run from before that was recorded is judged with today's file, and the report says so.
  kept verdict         summary.json's `ok`, written when the run finished (with run.json's `finished` time):
                       a later `report` keeps it (and `--check` returns what the run returned); when judging
                       again today would differ, the report says both. A run folder finished again (a merge
                       rewritten) is judged afresh.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from harness import conventions
from harness import results as res
from harness.exc import ResultsError
from harness.record import RetryRecord, RunRecord, RunStatus, ShardRecord, TestOutcome
from harness.settings import settings
from harness.suites import retries as retries_mod
from harness.suites.collect import RunResults, latest_run, load_run


@dataclass(frozen=True)
class Summary:
    """Totals of a run. `ok`: complete, every suite finished, no failed or errored test."""

    run_id: str
    backend: str
    mode: str
    status: str
    counts: dict[str, int]
    broken_suites: list[str]
    blocking: list[str]  # failed/errored tests outside the quarantine
    quarantined: list[str]  # failed/errored tests the quarantine covers (reported, not blocking)
    shard: str = ""  # "shard 1/2" for one shard's run, "2 shards" for a merged run
    flaky: list[str] = field(default_factory=list)  # failed, then passed on a retry alone: not blocking
    ready_to_leave: list[str] = field(default_factory=list)  # quarantined tests that passed every run
    quarantine_note: str = ""  # set when the run recorded no quarantine: judged with today's file
    kept: bool | None = None  # the verdict the run finished with, where judging it again now differs
    finished: str | None = None  # run.json's `finished`: the kept verdict belongs to this finish

    @property
    def judged_ok(self) -> bool:
        """The verdict from the results and the quarantine in force, judged now."""
        return self.status == "complete" and not self.broken_suites and not self.blocking

    @property
    def ok(self) -> bool:
        """The run's verdict: the one it finished with (`kept`) when that differs from judging it now."""
        return self.judged_ok if self.kept is None else self.kept

    def verdict_lines(self) -> list[str]:
        """The lines that say what flaky and quarantined tests, and the quarantine in force, did to the verdict
        (empty when nothing)."""
        lines = []
        if self.flaky:
            lines.append(
                f"flaky: {len(self.flaky)} test(s) failed, then passed when run again alone; they do not "
                f"fail the run: {', '.join(self.flaky)}"
            )
        if self.ready_to_leave:
            lines.append(
                f"quarantined tests that passed in this run ({len(self.ready_to_leave)}; one run does not "
                f"show a flake is fixed: `harness flakes` decides): {', '.join(self.ready_to_leave)}"
            )
        if self.quarantine_note:
            lines.append(self.quarantine_note)
        if self.kept is not None:
            lines.append(
                f"verdict kept: the run finished {_word(self.kept)}; judged again now it would be "
                f"{_word(self.judged_ok)} (a report never rewrites a finished run's verdict)"
            )
        return lines

    def headline(self) -> str:
        body = ", ".join(f"{n} {o}" for o, n in self.counts.items() if n) or "no tests"
        if self.quarantined:
            body += f" ({len(self.quarantined)} failing quarantined)"
        verdict = "OK" if self.ok else "FAILED"
        extra = f"; suites not finished: {', '.join(self.broken_suites)}" if self.broken_suites else ""
        status = "" if self.status == "complete" else f" [run {self.status.upper()}]"
        shard = f" {self.shard}" if self.shard else ""
        return f"kiln {self.backend}/{self.mode}{shard} {verdict}{status}: {body}{extra}"


def _word(ok: bool) -> str:
    return "OK" if ok else "FAILED"


def load_quarantine(root: Path):
    """The project's quarantine (ci/quarantine.toml) or None when there is none; a broken file raises."""
    from harness.suites import quarantine

    path = quarantine.default_path(root)
    return quarantine.load(path) if path.exists() else None


def quarantine_json(q: Any) -> dict[str, Any]:
    """What run.json records of the quarantine in force (`load_quarantine`'s result; None: no file, no
    entries): {"file": path or None, "entries": [...]} (harness.suites.quarantine.Quarantine.to_json)."""
    from harness.suites import quarantine

    return (q or quarantine.Quarantine()).to_json()


def quarantine_in_force(run: RunResults) -> tuple[Any, str]:
    """(the quarantine the run is judged with, a note for the report or ""). The one run.json recorded; for a
    run from before it was recorded, today's file, and a note that says so. None: no quarantine at all."""
    from harness.suites import quarantine

    if run.record.quarantine is not None:
        q = quarantine.Quarantine.from_json(run.record.quarantine, str(run.path / "run.json"))
        return (q if q.entries else None), ""
    root = Path(run.record.src or settings().root)
    q = load_quarantine(root)
    where = quarantine.default_path(root)
    return q, (
        f"quarantine: none recorded in run.json (a run from before it was); judged with today's {where}"
        + ("" if q is not None else " (absent: no quarantine)")
    )


def verdict(run: RunResults):
    """The quarantine's verdict on the run's outcomes (None without a quarantine in force)."""
    from harness.suites import quarantine

    q, _ = quarantine_in_force(run)
    if q is None:
        return None
    # every attempt counts: a quarantined test that failed and then passed alone failed 1 of 2 runs
    return quarantine.apply(retries_mod.outcomes(run), q, run.record.backend)


def kept_verdict(run: RunResults) -> bool | None:
    """The `ok` the run finished with (summary.json written when run.json said `complete`, at the same
    `finished` time; a summary.json from before that time was written counts when its status matches), or None
    when there is none to keep (not complete, never reported, or finished again since)."""
    if not run.record.complete:
        return None
    try:
        previous = res.read_json(run.path / "summary.json")
    except ResultsError:
        return None
    if not isinstance(previous, dict) or not isinstance(previous.get("ok"), bool):
        return None
    if previous.get("status") != "complete":
        return None
    if "finished" in previous and previous["finished"] != run.record.finished:
        return None
    return previous["ok"]


def summarize(run: RunResults) -> Summary:
    all_tests = [t for s in run.suites for t in s.tests]
    status = str(run.record.status)
    if status == RunStatus.RUNNING:
        status = "incomplete"  # nobody finished it: the process died
    failing = sorted({t.id for _, t in run.failing})
    retried = retries_mod.load(run)
    flaky = sorted(i for i in failing if i in retried and retried[i].status == retries_mod.FLAKY)
    _, note = quarantine_in_force(run)
    v = verdict(run)
    blocking = [i for i in (failing if v is None else v.failing) if i not in flaky]
    quarantined = [] if v is None else [r.id for r in v.quarantined_failing]
    ready = [] if v is None else [r.id for r in v.ready_to_leave]
    s = Summary(
        run.path.name,
        run.record.backend,
        run.record.mode or "?",
        status,
        final_counts(all_tests, set(flaky)),
        [s.name for s in run.broken_suites],
        blocking,
        quarantined,
        shard_label(run.record),
        flaky,
        ready,
        note,
        None,
        run.record.finished,
    )
    kept = kept_verdict(run)
    return s if kept is None or kept == s.judged_ok else replace(s, kept=kept)


def final_counts(tests: list[TestOutcome], flaky: set[str]) -> dict[str, int]:
    """res.counts, with the flaky tests taken out of failed/error and counted as `flaky` (when there are any)."""
    counts = res.counts([t for t in tests if t.id not in flaky])
    n = len({t.id for t in tests if t.id in flaky})
    return {**counts, "flaky": n} if n else counts


def suite_label(suite: Any, flaky: list[str]) -> str:
    """A suite's status for the report: FLAKY when it failed only by flaky tests, COLLECTION ERROR when its
    tests could not be collected (a conftest or import died: `collect_failed`)."""
    if getattr(suite.record, "collect_failed", None):
        return "COLLECTION ERROR"
    failed = {t.id for t in suite.tests if t.failing}
    if suite.status == "failed" and failed and failed <= set(flaky):
        return "FLAKY"
    return suite.status.upper()


def history_counts(run: RunResults, tests: list[str]) -> dict[str, Any]:
    """node id -> harness.suites.history.FailureCount from the run's test-history store ({} without one)."""
    from harness.suites.history import failure_counts_if_any

    if not tests:
        return {}
    return failure_counts_if_any(tests, backend=run.record.backend, db_path=run.record.history)


def shard_label(record: RunRecord) -> str:
    """`shard I/N` for one shard's run, `N shards` for a merged run, else empty."""
    if record.shards is not None:
        return f"{record.shard_count if record.shard_count is not None else len(record.shards)} shards"
    return f"shard {record.shard.index}/{record.shard.count}" if record.shard is not None else ""


@dataclass(frozen=True)
class ShardRow:
    """A merged run's shard in the report: its record and the counts of its tests."""

    shard: ShardRecord
    counts: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {**self.shard.to_json(), "counts": self.counts}


def shard_rows(run: RunResults) -> list[ShardRow]:
    """A merged run's shards: index, count, status, devices, wall seconds, test counts, folder, reason."""
    rows = []
    for shard in run.record.shards or ():
        sub = run.shard_runs.get(shard.index)
        tests = [t for s in sub.suites for t in s.tests] if sub else []
        rows.append(ShardRow(shard, res.counts(tests)))
    return rows


def _shard_line(row: ShardRow) -> str:
    sh = row.shard
    body = ", ".join(f"{n} {o}" for o, n in row.counts.items() if n) or "no tests"
    devices = f" [gpu {','.join(sh.devices)}]" if sh.devices else ""
    wall = f" in {sh.wall_s:.1f}s" if sh.wall_s is not None else ""
    reason = f" ({sh.reason})" if sh.reason else ""
    return (
        f"shard {sh.index}/{sh.count}{devices} {sh.status.upper()}{reason}: {body}{wall} -> {sh.dir or '-'}"
    )


def _env_lines(run: RunResults) -> list[str]:
    env_path = run.path / "env.json"
    if not env_path.exists():
        return ["environment: not captured"]
    try:
        env = res.read_json(env_path)
    except ResultsError as e:
        return [f"environment: {e}"]
    host, dev = env.get("host", {}), env.get("device", {})
    git = host.get("git", {})
    img = host.get("image") or {}
    gpus = dev.get("gpus") or []
    return [
        f"git: {git.get('sha')}{' (dirty)' if git.get('dirty') else ''}",
        f"image: {img.get('tag', '-')} {img.get('id', '')}".rstrip(),
        f"python {dev.get('python')}, torch {dev.get('torch')}, triton {dev.get('triton')}, "
        f"cuda {dev.get('cuda')}, hip {dev.get('hip')}",
        f"gpus: {len(gpus)} {', '.join(sorted(set(gpus)))}".rstrip()
        + (f"; driver {dev.get('driver')}" if dev.get("driver") else ""),
    ]


def _numerics_lines(run: RunResults) -> list[str]:
    """Saved numerics outputs (`harness run --save-numerics`) and the comparison written next to them, if any."""
    saved, compared = run.path / "suites" / "numerics-outputs", run.path / "numerics-compare" / "report.md"
    lines = []
    if saved.is_dir():
        cases = len(list(saved.glob("*/manifest.json")))
        lines.append(
            f"numerics outputs: {saved} ({cases} cases); compare: python -m harness numerics compare "
            f"OTHER_RUN:kiln {run.path}:kiln --out {compared.parent}"
        )
    if compared.is_file():
        lines.append(f"numerics comparison: {compared}")
    return lines


def render_text(run: RunResults) -> str:
    """Plain-text report."""
    from harness.suites.repro import image_hint, repro_line

    s = summarize(run)
    label = f"{s.backend}/{s.mode}"
    lines = [s.headline(), *s.verdict_lines(), f"run: {run.path}"]
    if run.record.reason:
        lines.append(f"reason: {run.record.reason}")
    lines += _env_lines(run) + _numerics_lines(run)
    lines.append("")
    for one in run.suites:
        lines.append(
            res.summary_line(one.name, label, one.tests, one.record.duration_s, suite_label(one, s.flaky))
        )
    rows = shard_rows(run)
    if rows:
        lines += ["", *map(_shard_line, rows)]
    broken = broken_suite_lines(run)
    if broken:
        lines += ["", f"suites that did not run their tests ({len(broken)}):"]
        for suite, why, log, line in broken:
            lines += [f"- [{suite}] {why}", f"    log: {log}", f"    {line}"]
    retried = retries_mod.load(run)
    past = history_counts(run, sorted({t.id for _, t in run.failing}))
    failing = [(suite, t) for suite, t in run.failing if t.id not in s.flaky]
    flaky = [(suite, t) for suite, t in run.failing if t.id in s.flaky]
    hint = image_hint(run.record_for(run.failing[0][1].id)) if run.failing else None
    for title, group in (
        (f"failing tests ({len(failing)}):", failing),
        (
            f"flaky tests ({len(flaky)}): failed, then passed when run again alone; they do not fail the run",
            flaky,
        ),
    ):
        if not group:
            continue
        lines += ["", title]
        if hint:
            lines.append(f"  (image: {hint})")
            hint = None
        for suite, t in group:
            mark = " (quarantined)" if t.id in s.quarantined else ""
            lines.append(f"- [{suite}] {t.id}{mark}: {t.outcome}: {t.headline[:200]}")
            lines += [f"    {line}" for line in _attempt_lines(run, retried.get(t.id), past.get(t.id))]
            lines.append(f"    {repro_line(run.record_for(t.id), t.id)}")
    v = verdict(run)
    if v is not None and v.ready_to_leave:
        lines += [
            "",
            f"quarantined tests that passed in this run ({len(v.ready_to_leave)}); only `harness flakes` "
            "with N runs says whether they may leave the quarantine:",
        ]
        lines += [f"- {r.id}: passed {r.runs}/{r.runs}" for r in v.ready_to_leave]
    return "\n".join(lines) + "\n"


def broken_suite_lines(run: RunResults) -> list[tuple[str, str, str, str]]:
    """(suite, why, log, repro line) for every suite that died before or after its tests (a collection error:
    a conftest or an import failed; or an abnormal end no test is to blame for). The repro line reruns the
    suite's folder as the run did; the log is the run folder's path of the suite's output."""
    from harness.suites.repro import suite_repro_line

    out = []
    for suite in run.suites:
        rec = suite.record
        why = (
            f"collection error: {rec.collect_failed}"
            if getattr(rec, "collect_failed", None)
            else f"ended badly: {rec.ended_badly}"
            if getattr(rec, "ended_badly", None)
            else ""
        )
        if not why:
            continue
        log = run.path / rec.log if rec.log else run.path / "suites" / f"{suite.name}.log"
        try:
            line = suite_repro_line(run.record, suite.name)
        except ResultsError as e:
            line = f"(no repro line: {e})"
        out.append((suite.name, why, str(log), line))
    return out


def _attempt_lines(run: RunResults, r: RetryRecord | None, past: Any) -> list[str]:
    """Under a failed test: its attempts and the failing attempt's log, then its history (if known). A run
    written before retries existed (no `retries` in run.json) says nothing of attempts."""
    lines = []
    if r is not None:
        what = "failing attempt's log" if r.status == retries_mod.FLAKY else "log"
        lines.append(f"attempts: {r.describe()}; {what}: {r.failing_log}")
    elif run.record.retries is not None:
        lines.append(
            "attempts: failed the suite run; not run again (retries off, or past the suite's max_tests)"
        )
    if past is not None:
        lines.append(f"history: {past.phrase()}")
    return lines


def render_markdown(run: RunResults) -> str:
    """Markdown report (for a CI job summary)."""
    from harness.suites.repro import repro_line

    s = summarize(run)
    lines = [
        f"### {s.headline()}",
        "",
        *res.markdown_table(
            ["suite", "status", *res.OUTCOMES, "seconds"],
            [
                [
                    suite.name,
                    suite_label(suite, s.flaky).lower(),
                    *res.counts(suite.tests).values(),
                    f"{suite.record.duration_s:.1f}",
                ]
                for suite in run.suites
            ],
        ),
    ]
    rows = shard_rows(run)
    if rows:
        lines += [
            "",
            *res.markdown_table(
                ["shard", "gpus", "status", *res.OUTCOMES, "wall seconds", "folder"],
                [
                    [
                        f"{r.shard.index}/{r.shard.count}",
                        ",".join(r.shard.devices) or "-",
                        r.shard.status + (f" ({r.shard.reason})" if r.shard.reason else ""),
                        *(r.counts[o] for o in res.OUTCOMES),
                        f"{r.shard.wall_s:.1f}" if r.shard.wall_s is not None else "-",
                        r.shard.dir or "-",
                    ]
                    for r in rows
                ],
            ),
        ]
    lines += ["", *(f"- {line}" for line in s.verdict_lines() + _env_lines(run) + _numerics_lines(run))]
    for suite, why, log, line in broken_suite_lines(run):
        lines += ["", f"#### Suite {suite}: {why}", "", f"log: `{log}`", "", "```sh", line, "```"]
    retried = retries_mod.load(run)
    past = history_counts(run, sorted({t.id for _, t in run.failing}))
    for title, flaky in (
        ("#### Failing tests", False),
        ("#### Flaky tests (failed, then passed when run again alone; not failing the run)", True),
    ):
        group = [(suite, t) for suite, t in run.failing if (t.id in s.flaky) == flaky]
        if not group:
            continue
        lines += ["", title, ""]
        for suite, t in group:
            mark = ", quarantined" if t.id in s.quarantined else ""
            lines.append(f"- `{t.id}` ({suite}, {t.outcome}{mark})")
            lines += [f"  {line}" for line in _attempt_lines(run, retried.get(t.id), past.get(t.id))]
            lines += ["  ```sh", f"  {repro_line(run.record_for(t.id), t.id)}", "  ```"]
            r = retried.get(t.id)
            text = _log_excerpt(run.path / r.failing_log) if r is not None and r.failing_log else ""
            if text:
                lines += [
                    "  <details><summary>failing attempt's log</summary>",
                    "",
                    "  ```",
                    *(f"  {ln}" for ln in text.splitlines()),
                    "  ```",
                    "  </details>",
                ]
    v = verdict(run)
    if v is not None and v.markdown(leave_advice=False):
        lines += ["", v.markdown(leave_advice=False)]
    return "\n".join(lines) + "\n"


def _log_excerpt(path: Path, lines: int = 40) -> str:
    """The last `lines` lines of a log (the traceback's end), or empty when it cannot be read."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.replace("```", "` ``").splitlines()[-lines:])


def write_reports(run: RunResults | Path) -> Summary:
    """summary.json, report.txt and report.md into the run folder; returns the Summary. `run`: the results in
    memory (the runner's, the merge's), or a folder to read them from."""
    if not isinstance(run, RunResults):
        run = load_run(run)
    run_dir = run.path
    s = summarize(run)
    res.atomic_write_json(run_dir / "summary.json", summary_json(run, s))
    res.atomic_write_text(run_dir / "report.txt", render_text(run))
    res.atomic_write_text(run_dir / "report.md", render_markdown(run))
    return s


def summary_json(run: RunResults, s: Summary | None = None) -> dict[str, Any]:
    """What summary.json (and `report --json`) holds: the verdict, counts, suites, shards and every test."""
    s = s or summarize(run)
    return {
        "run_id": s.run_id,
        "backend": s.backend,
        "mode": s.mode,
        "status": s.status,
        "ok": s.ok,
        "finished": s.finished,
        "judged_ok": s.judged_ok,
        "quarantine_note": s.quarantine_note,
        "counts": s.counts,
        "broken_suites": s.broken_suites,
        "blocking": s.blocking,
        "quarantined_failing": s.quarantined,
        "shard": asdict(run.record.shard) if run.record.shard else None,
        "shards": [r.to_json() for r in shard_rows(run)] or None,
        "flaky": s.flaky,
        "quarantined_passed_all_runs": s.ready_to_leave,
        "retried": {i: r.to_json() for i, r in sorted(retries_mod.load(run).items())},
        "suites": [
            {
                "name": suite.name,
                "status": str(suite.status),
                "label": suite_label(suite, s.flaky),
                "counts": res.counts(suite.tests),
                "duration_s": suite.record.duration_s,
            }
            for suite in run.suites
        ],
        "broken_suite_details": [
            {"suite": n, "why": w, "log": lg, "repro": ln} for n, w, lg, ln in broken_suite_lines(run)
        ],
        "tests": [
            {"suite": suite.name, **res.to_json([t])[0], **_final(t, s)}
            for suite in run.suites
            for t in suite.tests
        ],
    }


def _final(t: TestOutcome, s: Summary) -> dict[str, str]:
    """A failed test's classification in summary.json: flaky or failing."""
    if not t.failing:
        return {}
    return {"status": retries_mod.FLAKY if t.id in s.flaky else retries_mod.FAILING}


# ---- CLI: `python -m harness report [RESULTS_DIR]` -----------------------------------------------------


def cli_add_arguments(p: Any) -> None:
    p.add_argument("results_dir", nargs="?", help="a run folder (default: the latest under results/)")
    from harness.store.cli import add_store_flags

    add_store_flags(p)  # the failure counts' history
    p.add_argument("--markdown", action="store_true", help="print markdown instead of text")
    p.add_argument(
        "--check",
        action="store_true",
        help="exit 1 unless the run is complete and green (a finished run: the verdict it finished with)",
    )
    p.add_argument(
        "--github-summary",
        action="store_true",
        help="also append the markdown report to $GITHUB_STEP_SUMMARY when it is set",
    )
    conventions.add_json(p, "the report (summary.json's content)")


def cli_main(args: Any) -> int:
    """Print the report of a results folder (and rewrite its report files)."""
    run = load_run(Path(args.results_dir) if args.results_dir else latest_run())
    summary = write_reports(run)
    with conventions.human_to_stderr(conventions.to_stdout(args.json)):
        print(render_markdown(run) if args.markdown else render_text(run), end="")
    if args.json:
        conventions.write_json(args.json, summary_json(run, summary))
    if args.github_summary:
        res.append_job_summary(render_markdown(run), force=True)
    return 1 if args.check and not summary.ok else 0
