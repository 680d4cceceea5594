"""The history site (harness/site) builds from a SQLite store and from the fleet store (PostgreSQL) alike: the
planted history (harness/site/fixture.py) written through the stores' own writers into each engine, both stores at
one URL, and the site built with `--db URL --history URL` marks the same regression and lists the same tests."""

from __future__ import annotations

import re

from harness.__main__ import main
from harness.site import fixture
from harness.site.pages import workload_page


def _marks(text: str, verdict: str) -> list[str]:
    """The data-run of every mark of `verdict` on a page."""
    return re.findall(rf'<g id="[^"]*" class="mark {verdict}"[^>]*data-run="(\d+)"', text)


def test_the_site_builds_from_either_engine(store_url, tmp_path, capsys):
    ids = fixture.write_bench(store_url, runs=24, models=0)
    fixture.write_history(store_url, tmp_path / "runs", runs=26)
    out = tmp_path / "site"
    assert main(["site", "--out", str(out), "--db", store_url, "--history", store_url, "--jobs", "1"]) == 0
    assert "page(s) written" in capsys.readouterr().out
    step = (out / workload_page(fixture.STEP_WORKLOAD)).read_text()
    bump = (out / workload_page(fixture.BUMP_WORKLOAD)).read_text()
    assert _marks(step, "regressed") == [str(ids[fixture.STEP_RUN])] and not _marks(step, "rejected")
    assert _marks(bump, "rejected") == [str(ids[fixture.BUMP_RUN])] and not _marks(bump, "regressed")
    tests = (out / "tests.html").read_text()
    rows = dict(re.findall(r'<tr class="test-row (\w+)" data-node-id="([^"]+)"', tests))
    assert {v: k for k, v in rows.items()} == {fixture.FAILING_TEST: "failing", fixture.FLAKY_TEST: "flaky"}
    # the same URL through KILN_STORE_URL (`--store`): nothing to rebuild, every page as it was
    assert main(["site", "--out", str(out), "--store", store_url, "--jobs", "1"]) == 0
    assert " 0 page(s) written" in capsys.readouterr().out
