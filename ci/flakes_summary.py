"""Classify tests from the JUnit files of several repeated pytest runs (pytest-flakefinder copies, several
processes): every test passing in every run, failing in every run, or flaky (both). Exit 1 when any test is
flaky or failing.

Usage: python3 ci/flakes_summary.py RESULT.xml...
"""

from __future__ import annotations

import collections
import re
import sys
import xml.etree.ElementTree as ET

#: pytest-flakefinder's copies of a test differ only in a copy number leading its brackets: ``[N]``, ``[N-params]``
_COPY = re.compile(r"\[(\d+)(?:-(.*))?\]$")


def test_id(case: ET.Element) -> str:
    """The test's id without its flakefinder copy number."""
    name = _COPY.sub(lambda m: f"[{m.group(2)}]" if m.group(2) else "", case.get("name", ""))
    return f"{case.get('classname', '')}::{name}"


def classify(paths: list[str]) -> dict[str, collections.Counter]:
    """Per test id: counts of ``passed``, ``failed`` and ``skipped`` runs."""
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for path in paths:
        for case in ET.parse(path).getroot().iter("testcase"):
            kinds = {child.tag for child in case}
            state = (
                "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
            )
            out[test_id(case)][state] += 1
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python3 ci/flakes_summary.py RESULT.xml...", file=sys.stderr)
        return 2
    try:
        counts = classify(argv)
    except (OSError, ET.ParseError) as e:
        print(f"flakes_summary: cannot read the results: {e}", file=sys.stderr)
        return 2
    flaky = sorted(t for t, c in counts.items() if c["passed"] and c["failed"])
    failing = sorted(t for t, c in counts.items() if c["failed"] and not c["passed"])
    for t in flaky:
        print(f"FLAKY {t}: {counts[t]['passed']} passed, {counts[t]['failed']} failed")
    for t in failing:
        print(f"FAILING {t}: {counts[t]['failed']} failed")
    runs = sum(sum(c.values()) for c in counts.values())
    print(
        f"{len(counts)} tests, {runs} runs: {len(counts) - len(flaky) - len(failing)} passing, "
        f"{len(failing)} failing, {len(flaky)} flaky"
    )
    return 1 if flaky or failing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
