"""Confirmation of suspects side by side: the baseline build and the candidate measured in turns, now.

Terms:
- *suspect*: a workload+compiler that the comparison with the baseline's stored samples flags as regressed
  (or improved). Stored samples are minutes or days old; on a host whose speed swings 2x in minutes they
  cannot confirm anything, so a stored comparison only ever raises suspects.
- *side by side*: four worker processes (`sbs_worker.py`): two running the baseline run's commit (checked
  out in a scratch `git worktree`: `bisect.Scratch`; the second is the *A/A* arm), two the candidate's tree
  (the second is the *B/B* arm), each compiling the suspects once; then, for `ROUNDS` rounds, every suspect workload is sampled by each
  worker in turn (the order rotating through `ORDERS`, as many samples each), only one measuring at a time.
  All see the same machine.
- *judgement*: `paired.judge_side_by_side` on the rounds' turns (each turn's lower quartile: load only adds
  time; a turn lasts at least `TURN_S`). The round is the independent unit: samples within a turn share a
  burst of load, and so do the turns of one round, which is what pairing by round uses. The candidate's
  processes' per-round log ratios to each baseline process are tested with an exact signed-rank test; the
  A/A and B/B arms' ratios, measured in the same rounds, give the noise floor a change must clear, and tell a
  process that is slower for its whole life (`paired`'s process effect) from a slower build. A host too
  noisy to tell a threshold-sized change gives `inconclusive`, with the noise floor in the comparison.
- Outcomes (`Comparison.verdict`): `regressed`/`improved` with `confirmed=True` when the side-by-side verdict
  repeats the suspect's; `rejected` when it measures the suspect unchanged (or the other way); `inconclusive`
  when the host was too noisy to decide; `unconfirmed` when it could not be measured (the baseline commit is
  not in this checkout, there is no git, a worker failed). Neither of the last two fails the job.
- *same code*: the baseline run's commit is the candidate's and neither tree was dirty: no worktree, all
  four workers run the candidate's tree (arms of the same code; only a planted slowdown can differ).
- A planted slowdown (`--plant`, tests only) goes to the candidate's workers only.
- On a CPU, kiln (`ALWAYS_ON_CPU`) is measured side by side on every compared workload, suspect or not: the
  shared host's speed swings 2x between runs (kiln's interpreter times 6.6 -> 7.1 -> 3.8 ms for one workload in
  three runs minutes apart, eager's steady), so no screen against stored runs finds a 20% slowdown in a run
  made in a fast spell. kiln is the code that changes between commits; inductor and eager come from the
  pinned torch and are measured side by side when screened as suspects only.
- Cost: four process starts (importing torch), compiling each suspect workload once per worker (kiln under
  Triton's interpreter: a few seconds a workload), then per workload, compiler and arm `ROUNDS` turns of at
  least `TURN_S` (about 1.5 s; more when `REPS_SCALE` times the run's planned samples take longer), up to
  `MAX_ROUNDS` for a workload left `inconclusive`; plus a `git worktree add` when the commits differ. On the
  shared 2-core host with a load average of 10-20 (other jobs and a busy loop): 4-11 minutes for one tiny kiln
  workload (with three workers), most of it starting and compiling in the workers.
"""

from __future__ import annotations

import json
import math
import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import arms
from harness.bench.core.records import Result, RunInfo, Verdict
from harness.bench.core.stats import Stats
from harness.bench.judge.compare import BASELINE_COMPILER, CompareConfig, Comparison
from harness.bench.judge.paired import SideBySide, judge_side_by_side

# kiln's arms with kiln's own settings: measured side by side on every compared workload on a CPU (see above)
ALWAYS_ON_CPU = tuple(a.name for a in arms.ARMS.values() if a.kiln and not a.settings)
ROUNDS = 12  # turns per workload and arm ...
MAX_ROUNDS = 36  # ... and, while a key is undecided (`inconclusive`), up to this many, `ROUNDS` at a time
TURN_S = 0.12  # a turn measures at least this long (a scheduler's time slice must not decide a turn) ...
TURN_MAX = 2000  # ... in at most this many samples
REPS_SCALE = 2.0  # of the run's planned samples per workload+compiler, per arm
WORKER = Path(__file__).with_name("sbs_worker.py")
FLAGGED = (Verdict.REGRESSED, Verdict.IMPROVED)


class SideBySideError(Exception):
    """A side-by-side measurement could not be made (the suspects stay unconfirmed, with this reason)."""


@dataclass
class Plan:
    """How the suspects are measured: `base_tree` None means the baseline commit's tree is checked out in a
    scratch worktree (`base_commit`); `same_code`: both arms run the candidate's tree; `reason`: why nothing
    can be measured (the suspects stay unconfirmed)."""

    candidate_tree: Path
    base_commit: str | None = None
    same_code: bool = False
    reason: str = ""
    notes: list[str] = field(default_factory=list)


def source_root() -> Path:
    """The tree the running harness (the candidate's code) was imported from."""
    import harness

    return Path(harness.__file__).resolve().parent.parent


def plan_for(run: RunInfo, base_runs: list[RunInfo], root: Path | None = None) -> Plan:
    """Which code measures the baseline arm (module docstring); git is asked only when the commits differ."""
    root = root or source_root()
    plan = Plan(root)
    if not base_runs:
        plan.reason = "no baseline run"
        return plan
    base = base_runs[0]
    plan.base_commit = base.git_commit
    if len({b.git_commit for b in base_runs}) > 1:
        plan.notes.append(
            f"baseline runs of several commits: the newest ({(base.git_commit or '-')[:10]}) stands for them"
        )
    if not base.git_commit:
        plan.reason = f"baseline run {base.id} recorded no git commit"
        return plan
    dirty = bool(run.config.get("git_dirty")) or bool(base.config.get("git_dirty"))
    if base.git_commit == run.git_commit and not dirty:
        plan.same_code = True
        return plan
    if base.config.get("git_dirty"):
        plan.notes.append(
            f"baseline run {base.id} was made on a tree with uncommitted changes: its commit's "
            "code stands for it"
        )
    from harness.bench.kernels.bisect import git

    try:
        ok = git(root, "cat-file", "-e", f"{base.git_commit}^{{commit}}", check=False).returncode == 0
    except OSError:
        ok = False
    if not ok:
        plan.reason = (
            f"the baseline commit {base.git_commit[:10]} is not available in {root} (no git "
            "checkout, a shallow clone, or another repository)"
        )
    return plan


class Worker:
    """One `sbs_worker.py` process over the code of `tree` (see that module for the protocol)."""

    def __init__(self, name: str, tree: Path, hello: dict[str, Any], log: Path, timeout_s: float):
        from harness.commands import with_pythonpath

        env = {k: v for k, v in os.environ.items() if k not in ("KILN_BENCH_PLANT", "GITHUB_STEP_SUMMARY")}
        env = with_pythonpath(env, tree)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        self.name, self.log_path, self.timeout_s = name, log, timeout_s
        self.log = open(log, "w")  # noqa: SIM115 - open while the worker lives; closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
            cwd=tree,
            text=True,
        )
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
        first = self.ask(hello)
        self.ready, self.reps, self.est = first["ready"], first.get("reps", {}), first.get("est", {})

    def ask(self, obj: dict[str, Any]) -> dict[str, Any]:
        try:
            self.proc.stdin.write(json.dumps(obj) + "\n")  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
        except OSError:
            raise SideBySideError(f"{self.name} worker exited: {self._last()}") from None
        if not self.sel.select(self.timeout_s):
            raise SideBySideError(f"{self.name} worker gave no answer in {self.timeout_s:.0f}s")
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise SideBySideError(f"{self.name} worker exited: {self._last()}")
        return json.loads(line)

    def _last(self) -> str:
        self.log.flush()
        self.proc.wait(timeout=30)
        from harness.bench.kernels.bisect import last_line

        return f"exit {self.proc.returncode}: {last_line(self.log_path)}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.log.close()


ARMS = ("baseline", "baseline-aa", "candidate", "candidate-bb")  # the workers, in the order results come back


def arm_orders(n: int) -> tuple[tuple[int, ...], ...]:
    """Orders of `n` arms used in turn over rounds and workloads: every rotation and its reverse, so each arm
    takes every place equally often and follows every other arm equally often; a place that is slower (the
    first turn after the other processes ran) favours none of them."""
    rotations = [tuple((i + k) % n for i in range(n)) for k in range(n)]
    return tuple(rotations + [r[::-1] for r in rotations])


ORDERS = arm_orders(len(ARMS))


def measure_pair(
    cfg: dict[str, Any],
    cases: list[str],
    compilers: list[str],
    base_tree: Path,
    cand_tree: Path,
    plant: str | None,
    workdir: Path,
    *,
    threads: int = 1,
    rounds: int = ROUNDS,
    max_rounds: int = MAX_ROUNDS,
    undecided: Callable[..., bool] | None = None,
    timeout_s: float = 900.0,
) -> tuple[list[Result], ...]:
    """The results of `cases` under `compilers` of each arm of `ARMS` (baseline, its A/A arm, candidate, its
    B/B arm), measured in turns: each build's code runs in two processes, so that the same rounds measure how
    far identical code lies apart on this host (the noise floor, a process effect). Each result's
    `meta.rounds` holds its turns' lower quartiles in round order. After every `rounds` rounds, the workloads
    for which `undecided(*turns of each arm)` holds under some compiler get `rounds` more, up to
    `max_rounds`."""
    hello = {
        "cfg": {**cfg, "rounds": 1, "passes": 1},
        "cases": cases,
        "compilers": compilers,
        "threads": threads,
        "clock": "process" if str(cfg.get("device", "cpu")) == "cpu" else None,
    }
    workers: list[Worker] = []
    try:
        for name in ARMS:
            tree, arm_plant = (cand_tree, plant) if name.startswith("candidate") else (base_tree, None)
            workers.append(
                Worker(name, tree, {**hello, "plant": arm_plant}, workdir / f"{name}.log", timeout_s)
            )

        def turn(name: str, c: str) -> int:
            planned = max(w.reps.get(name, {}).get(c, 1) for w in workers) * REPS_SCALE / rounds
            est = max(w.est.get(name, {}).get(c, 0.0) or 0.0 for w in workers)
            return min(TURN_MAX, math.ceil(max(planned, TURN_S * 1e9 / est if est > 0 else 1.0)))

        n = {name: {c: turn(name, c) for c in compilers} for name in cases}
        blocks: dict[tuple[str, str, str], list[float]] = {}
        todo, done = list(cases), 0
        while todo:
            _rounds(workers, todo, n, blocks, done, rounds)
            done += rounds
            if undecided is None or done + rounds > max_rounds:
                break
            todo = [
                name
                for name in todo
                if any(undecided(*(blocks.get((w.name, name, c), []) for w in workers)) for c in compilers)
            ]
        got = [[Result.from_dict(d) for d in w.ask({"op": "finish"})["results"]] for w in workers]
        for w, rs in zip(workers, got):
            for x in rs:
                x.meta.rounds = blocks.get((w.name, x.workload, x.compiler), [])
        return tuple(got)
    finally:
        for w in workers:
            w.close()


def _rounds(
    workers: list[Worker],
    cases: list[str],
    n: dict[str, dict[str, int]],
    blocks: dict[tuple[str, str, str], list[float]],
    start: int,
    rounds: int,
) -> None:
    """Rounds `start` .. `start + rounds - 1`: every case sampled by every worker in turn, in rotating order."""
    for r in range(start, start + rounds):
        for i, name in enumerate(cases):
            for k in ORDERS[(r + i) % len(ORDERS)]:
                w = workers[k]
                for c, med in w.ask({"op": "sample", "case": name, "n": n[name]})["block"].items():
                    blocks.setdefault((w.name, name, c), []).append(med)


def confirm_side_by_side(
    cmps: list[Comparison],
    run: RunInfo,
    base_runs: list[RunInfo],
    bench_cfg: dict[str, Any],
    cmp_cfg: CompareConfig,
    *,
    plant: str | None = None,
    threads: int = 1,
    root: Path | None = None,
    log: Callable[[str], None] | None = None,
    always: Sequence[str] = (),
    measure: Callable[..., tuple[list[Result], ...]] = measure_pair,
) -> list[Comparison]:
    """Decide every suspect of `cmps` (flagged regressed/improved) side by side (module docstring), and measure
    every comparable key of the `always` compilers too (`ALWAYS_ON_CPU`: a key the screen missed); the others
    are left as they are. Returns `cmps`. `measure` replaces `measure_pair` in tests."""
    say = log or (lambda m: print(m, file=sys.stderr, flush=True))
    wanted = FLAGGED if cmp_cfg.confirm_improved else (Verdict.REGRESSED,)
    suspects = [c for c in cmps if c.verdict in wanted]
    for c in cmps:
        if c.verdict == Verdict.IMPROVED and c not in suspects:
            c.verdict, c.note = Verdict.SUSPECT, _join(c.note, "faster against stored samples; not confirmed")
    for c in suspects:
        c.suspect = c.verdict
    suspects += [
        c for c in cmps if c.compiler in always and c.verdict == Verdict.UNCHANGED and c.ratio is not None
    ]
    if not suspects:
        return cmps
    plan = plan_for(run, base_runs, root)
    for c in suspects:
        c.note = _join(c.note, "; ".join(plan.notes))
    if plan.reason:
        _unconfirmed([c for c in suspects if c.suspect], plan.reason, say)
        return cmps
    cases = list(dict.fromkeys(c.workload for c in suspects))
    compilers = list(
        dict.fromkeys([c.compiler for c in suspects if c.compiler != BASELINE_COMPILER] + [BASELINE_COMPILER])
    )
    what = (
        "same code (baseline run of this very commit)"
        if plan.same_code
        else f"baseline commit {(plan.base_commit or '')[:10]} in a scratch worktree"
    )
    n_sus = sum(1 for c in suspects if c.suspect)
    say(
        f"[confirm] {n_sus} suspect(s) and {len(suspects) - n_sus} other key(s) of {', '.join(always) or '-'} in "
        f"{len(cases)} workload(s): measuring side by side, {what} against this tree, {ROUNDS} rounds"
    )
    undecided = undecided_at(cmp_cfg)
    t0 = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="kiln-sbs-") as tmp:
            if plan.same_code:
                arm_results = measure(
                    bench_cfg,
                    cases,
                    compilers,
                    plan.candidate_tree,
                    plan.candidate_tree,
                    plant,
                    Path(tmp),
                    threads=threads,
                    undecided=undecided,
                )
            else:
                from harness.bench.kernels.bisect import BisectError, Scratch

                try:
                    with Scratch(plan.candidate_tree, plan.base_commit or "") as scratch:
                        arm_results = measure(
                            bench_cfg,
                            cases,
                            compilers,
                            scratch.tree,
                            plan.candidate_tree,
                            plant,
                            Path(tmp),
                            threads=threads,
                            undecided=undecided,
                        )
                except BisectError as e:
                    raise SideBySideError(str(e)) from None
    except (SideBySideError, OSError, ValueError, KeyError) as e:
        _unconfirmed([c for c in suspects if c.suspect], f"side-by-side measurement failed: {e}", say)
        return cmps
    seconds = time.monotonic() - t0
    of = [{(r.workload, r.compiler): r for r in rs} for rs in arm_results]
    for c in suspects:
        got = [m.get((c.workload, c.compiler)) for m in of]
        if not all(x and x.status == "ok" and x.samples for x in got):
            why = next((x.error for x in got if x is not None and x.error), "no samples")
            _unconfirmed([c] if c.suspect else [], f"side-by-side measurement failed: {why}", say)
            continue
        arms_of = [x for x in got if x is not None]
        b, n = arms_of[0], arms_of[2]
        if b.source_hash != n.source_hash:
            _unconfirmed([c] if c.suspect else [], "workload definition differs at the baseline commit", say)
            continue
        j = judge_rounds(*arms_of, cfg=cmp_cfg)
        c.sbs_ratio, c.sbs_p, c.sbs_noise = j.ratio, j.p, j.noise
        c.sbs_aa_ratio, c.sbs_bb_ratio = j.aa_ratio, j.bb_ratio
        c.sbs_base_ns, c.sbs_new_ns = Stats.of(b.samples).median, Stats.of(n.samples).median
        c.sbs_seconds = round(seconds, 1)
        if not c.suspect:  # not flagged by the stored comparison: measured because its compiler always is
            if j.verdict in wanted:
                c.suspect, c.verdict, c.confirmed = j.verdict, j.verdict, True
                c.note = _join(c.note, f"missed against stored samples; side by side {j.why}")
            elif j.verdict is Verdict.INCONCLUSIVE:
                c.verdict = Verdict.INCONCLUSIVE
                c.note = _join(c.note, f"inconclusive side by side: {j.why}")
            say(f"[confirm] {c.workload}@{c.compiler}: side by side {j.why}: {c.verdict}")
            continue
        if j.verdict == c.suspect:
            c.verdict, c.confirmed = Verdict(c.suspect), True
            c.note = _join(c.note, f"confirmed side by side: {j.why}")
        elif j.verdict is Verdict.INCONCLUSIVE:
            c.verdict, c.confirmed = Verdict.INCONCLUSIVE, None
            c.note = _join(c.note, f"inconclusive side by side: {j.why}")
        elif j.verdict in wanted:  # the other direction, beyond the noise floor: the measurement decides
            c.note = _join(c.note, f"the stored comparison said {c.suspect}; side by side {j.why}")
            c.suspect, c.verdict, c.confirmed = j.verdict, j.verdict, True
        else:
            c.verdict, c.confirmed = Verdict.REJECTED, False
            c.note = _join(c.note, f"rejected side by side ({j.verdict}): {j.why}")
        say(
            f"[confirm] {c.workload}@{c.compiler}: stored ratio {c.ratio:.3f} -> side by side {j.why}: {c.verdict}"
        )
    say(f"[confirm] side-by-side confirmation took {seconds:.0f}s")
    return cmps


def undecided_at(cfg: CompareConfig) -> Callable[..., bool]:
    """Whether turns measured so far (baseline, A/A, candidate and, when measured, B/B arms) leave a key
    `inconclusive` at `cfg`'s threshold and alpha (more rounds may decide it)."""
    assert cfg.threshold is not None
    thr, alpha = cfg.threshold, cfg.alpha

    def undecided(a: list[float], a2: list[float], c: list[float], c2: list[float] | None = None) -> bool:
        return judge_side_by_side(a, a2, c, thr, alpha, c2).verdict is Verdict.INCONCLUSIVE

    return undecided


def judge_rounds(*arms: Result, cfg: CompareConfig) -> SideBySide:
    """`paired.judge_side_by_side` on the arms' turns (`meta.rounds`: baseline, A/A, candidate and, when
    measured, B/B), at `cfg`'s threshold and alpha."""
    assert cfg.threshold is not None and len(arms) in (3, 4)
    turns = [a.meta.rounds or [] for a in arms]
    cand2 = turns[3] if len(arms) == 4 else None
    return judge_side_by_side(turns[0], turns[1], turns[2], cfg.threshold, cfg.alpha, cand2)


def _unconfirmed(cs: list[Comparison], why: str, say: Callable[[str], None]) -> list[Comparison]:
    for c in cs:
        c.verdict, c.confirmed = Verdict.UNCONFIRMED, None
        c.note = _join(c.note, f"unconfirmed ({c.suspect} against stored samples): {why}")
        say(f"[confirm] {c.workload}@{c.compiler}: unconfirmed: {why}")
    return cs


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a and b else (a or b)
