"""Measure the retry policy's false-failure rate: how often a flaky test is called failing.

A planted project holds one test that fails with probability P on every run, drawn from a seeded generator
(`random.Random("<trial>:<k>")` for its k-th run in trial <trial>, a counter file next to it counting the runs),
so every trial is random yet reproducible. A trial is what the runner does after a suite run in which the test
failed: the real `harness.suites.runner.retry_failed` (a fresh pytest process per rerun, its JUnit read back,
`harness.suites.retries.classify`) with `attempts` reruns. The trial's status is compared with the one predicted from
the same draws (failing iff the first `attempts` draws are all failures), and the rate over the trials with
the policy's formula: P(called failing | failed the suite run) = p ** attempts.

    python tests/harness/planted/retry_rate.py --p 0.3 --attempts 4 --trials 200 [--first 0]

Measured (16 such processes side by side, one H100 host's CPUs): attempts 2: 199 of 2000 trials called failing
(9.95%, formula 9%); attempts 4: 13 of 1440 (0.90%, Wilson 95% interval 0.5%..1.5%, formula 0.81%); no trial's
call differed from the prediction of its draws.

(run from the repository root, with the harness importable). tests/harness/test_retry_rate.py runs a few trials.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

TEST_ID = "tests/rate/test_rate.py::test_flake"
PLANTED = """
import json
import random
from pathlib import Path

STATE = Path(__file__).with_name("state.json")


def test_flake():
    s = json.loads(STATE.read_text())
    k = s["runs"]
    STATE.write_text(json.dumps({**s, "runs": k + 1}))
    draw = random.Random(f"{s['trial']}:{k}").random()
    assert draw >= s["p"], f"planted flake: run {k} of trial {s['trial']} drew {draw:.3f} < p = {s['p']}"
"""


def fails(trial: int, k: int, p: float) -> bool:
    """Whether the planted test fails on its k-th run of trial `trial` (the draw it makes)."""
    return random.Random(f"{trial}:{k}").random() < p


def predicted_failing(trial: int, p: float, attempts: int) -> bool:
    """The policy's call from the draws: failing when every one of the `attempts` reruns fails."""
    return all(fails(trial, k, p) for k in range(attempts))


def formula(p: float, attempts: int) -> float:
    """P(a flake of failure rate p is called failing | it failed the suite run): harness.suites.retries's formula."""
    from harness.suites.retries import called_failing_rate

    return called_failing_rate(p, attempts)


@dataclass(frozen=True)
class Measured:
    """Trials run through the real retry path: how many were called failing, and whether each call matched
    the prediction from its draws."""

    trials: int
    failing: int
    mismatches: list[int]
    reruns: int

    @property
    def rate(self) -> float:
        return self.failing / self.trials if self.trials else math.nan

    def interval(self, z: float = 1.96) -> tuple[float, float]:
        """Wilson score interval of the rate (95% by default)."""
        n, r = self.trials, self.rate
        centre = (r + z * z / (2 * n)) / (1 + z * z / n)
        half = z * math.sqrt(r * (1 - r) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        return max(0.0, centre - half), min(1.0, centre + half)


def make_project(root: Path) -> Path:
    """A project with the planted suite `rate` and the repository's matrix (its `rate` suite only)."""
    repo = Path(__file__).resolve().parents[3]
    (root / "ci").mkdir(parents=True, exist_ok=True)
    data = json.loads((repo / "ci" / "matrix.json").read_text())
    data["suites"] = ["rate"]
    (root / "ci" / "matrix.json").write_text(json.dumps(data))
    (root / "tests" / "rate").mkdir(parents=True, exist_ok=True)
    (root / "tests" / "rate" / "test_rate.py").write_text(PLANTED)
    return root


def measure(p: float, attempts: int, trials: int, first: int = 0, root: Path | None = None) -> Measured:
    """Trials `first`..`first + trials - 1` through `harness.suites.runner.retry_failed` (natively, cpu backend)."""
    with tempfile.TemporaryDirectory(prefix="kiln-retry-rate-") as tmp:
        root = make_project(root or Path(tmp) / "proj")
        os.environ["KILN_ROOT"] = str(root)
        from harness import matrix
        from harness.commands import suite_env
        from harness.record import TestOutcome
        from harness.suites import runner
        from harness.suites.place import NativePlace

        m = matrix.load(root / "ci" / "matrix.json")
        b = m.backend("cpu")
        policy = matrix.Retries(attempts=attempts, max_tests=1)
        state = root / "tests" / "rate" / "state.json"
        failing, mismatches, reruns = 0, [], 0
        for trial in range(first, first + trials):
            run_dir = Path(tmp) / f"trial-{trial}"
            state.write_text(json.dumps({"trial": trial, "runs": 0, "p": p}))
            first_failure = TestOutcome(TEST_ID, "failed", "the suite run failed (planted)", 0.0)
            found = runner.retry_failed(
                NativePlace(),
                b,
                "rate",
                [first_failure],
                policy,
                run_dir=run_dir,
                junit=run_dir / "suites" / "rate.xml",
                env=suite_env(m, b),
            )
            (test,) = found.tests
            called_failing = test.status == "failing"
            failing += called_failing
            reruns += len(test.attempts) - 1
            if called_failing != predicted_failing(trial, p, attempts):
                mismatches.append(trial)
        return Measured(trials, failing, mismatches, reruns)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--p", type=float, default=0.3, help="failure probability of the planted flake per run")
    ap.add_argument("--attempts", type=int, default=4, help="reruns per failed test (the matrix's `retries`)")
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--first", type=int, default=0, help="first trial number (the seed of its draws)")
    args = ap.parse_args(argv)
    got = measure(args.p, args.attempts, args.trials, args.first)
    low, high = got.interval()
    print(
        f"p={args.p} attempts={args.attempts}: called failing in {got.failing} of {got.trials} trials "
        f"({got.rate:.2%}, 95% interval {low:.2%}..{high:.2%}); formula p^attempts = "
        f"{formula(args.p, args.attempts):.2%}; {got.reruns} reruns; "
        f"{len(got.mismatches)} trial(s) differ from the prediction of their draws"
    )
    return 1 if got.mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
