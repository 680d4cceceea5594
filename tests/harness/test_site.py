"""The history site (harness/site): a planted history written through the stores' own writers
(harness/site/fixture.py) builds a site that headless Chromium opens from disk; its DOM marks the confirmed
regression on the right workload's chart and not the rejected bump, and lists the failing and the flaky test in
the right rows. Also: the quartiles match `Stats.of`, builds are incremental, bad input is one line."""

from __future__ import annotations

import html
import os
import random
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from harness.__main__ import main
from harness.bench.core.stats import Stats
from harness.site import build, fixture
from harness.site.data import quartiles
from harness.site.pages import workload_page

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "results" / "site-screenshots"  # beside the sites nox -s site writes into results/site


def chromium() -> str:
    """The headless browser; a skip with the reason where there is none, a failure in CI (`.ci/run` installs it)."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        why = "chromium is not installed (Debian: apt-get install -y chromium; .ci/run installs it)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but {why}")
        pytest.skip(why)
    return exe


def browse(exe: str, page: Path, tmp: Path, *args: str) -> str:
    """Chromium's output for `page` opened from disk (file://) with `args` (--dump-dom, --screenshot=...)."""
    proc = subprocess.run(
        [
            exe,
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            "--disable-dev-shm-usage",
            f"--user-data-dir={tmp / 'profile'}",
            "--allow-file-access-from-files",
            *args,
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


class Elements(HTMLParser):
    """Every start tag of a document with its attributes, and under the key `svg` the id of the chart (inline
    <svg>) it lies in."""

    def __init__(self, text: str):
        super().__init__()
        self.found: list[tuple[str, dict[str, str]]] = []
        self.svgs: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        if tag == "svg":
            self.svgs.append(a.get("id", ""))
        self.found.append((tag, {**a, "svg": self.svgs[-1] if self.svgs else ""}))

    def handle_endtag(self, tag):
        if tag == "svg" and self.svgs:
            self.svgs.pop()

    def with_class(self, *names: str) -> list[dict[str, str]]:
        return [a for _, a in self.found if set(names) <= set(a.get("class", "").split())]


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """The planted stores (fixture.py) and the site built from them: (site folder, bench run ids, stores)."""
    tmp = tmp_path_factory.mktemp("site")
    db, hist = tmp / "bench.sqlite", tmp / "history.sqlite"
    ids = fixture.write_bench(db)
    fixture.write_history(hist, tmp / "runs")
    fixture.write_bisection(tmp / "bisect")
    quarantine = tmp / "quarantine.toml"
    quarantine.write_text(f'[[test]]\nid = "{fixture.FLAKY_TEST}"\nreason = "planted: flaky on purpose"\n')
    out = tmp / "site"
    built = build.build(
        out, db=str(db), history=str(hist), bisections=[tmp / "bisect"], quarantine=quarantine, jobs=2
    )
    assert built.written and not built.unchanged
    return out, ids, db, hist, tmp


def test_the_browser_finds_the_confirmed_regression_and_not_the_rejected_bump(planted, tmp_path):
    exe = chromium()
    out, ids, *_ = planted
    step = Elements(browse(exe, out / workload_page(fixture.STEP_WORKLOAD), tmp_path, "--dump-dom"))
    bump = Elements(browse(exe, out / workload_page(fixture.BUMP_WORKLOAD), tmp_path, "--dump-dom"))
    # the step's chart: one confirmed regression, on kiln, at the planted run, linked to its bisection
    (reg,) = step.with_class("mark", "regressed")
    assert reg["data-workload"] == fixture.STEP_WORKLOAD and reg["data-compiler"] == "kiln"
    assert reg["data-run"] == str(ids[fixture.STEP_RUN]) and reg["data-confirmed"] == "true"
    assert reg["data-commit"] == fixture.commit_of(fixture.STEP_RUN)
    assert (
        reg["data-bisection"].startswith(f"bisect-{fixture.STEP_WORKLOAD}-kiln-")
        and (out / reg["data-bisection"]).is_file()
    )
    assert reg["svg"] == f"c-{fixture.STEP_WORKLOAD}-{fixture.HW_CLASS}-tiny-latency"  # on the latency chart
    assert not step.with_class("mark", "rejected")
    # the bump's chart: marked as a rejected suspect, never as a regression
    assert not bump.with_class("mark", "regressed")
    (rej,) = bump.with_class("mark", "rejected")
    assert rej["data-run"] == str(ids[fixture.BUMP_RUN]) and rej["data-confirmed"] == "false"
    # charts are inline SVG with their figure's hardware class and metric
    figs = step.with_class("graph")
    assert {f["data-metric"] for f in figs} == {"latency", "bandwidth"}
    assert all(f["data-hw-class"] == fixture.HW_CLASS for f in figs)

    tests = Elements(browse(exe, out / "tests.html", tmp_path, "--dump-dom"))
    rows = {a["data-node-id"]: a for a in tests.with_class("test-row")}
    assert set(rows) == {fixture.FAILING_TEST, fixture.FLAKY_TEST}
    assert (
        rows[fixture.FAILING_TEST]["data-state"] == "failing"
        and "failing" in rows[fixture.FAILING_TEST]["class"]
    )
    assert rows[fixture.FAILING_TEST]["data-failed"] == str(30 - fixture.FAILING_FROM)
    assert rows[fixture.FLAKY_TEST]["data-state"] == "flaky"
    assert rows[fixture.FLAKY_TEST]["data-quarantined"] == "true"
    assert rows[fixture.FAILING_TEST]["data-quarantined"] == "false"
    assert rows[fixture.FLAKY_TEST]["data-failed"] == str(len(fixture.FLAKY_RUNS))

    index = Elements(browse(exe, out / "index.html", tmp_path, "--dump-dom"))
    links = {a.get("href") for t, a in index.found if t == "a"}
    assert {"tests.html", "runs.html", "models.html", workload_page(fixture.STEP_WORKLOAD)} <= links

    SHOTS.mkdir(parents=True, exist_ok=True)
    for page, shot, size in (
        ("index.html", "index.png", "1280,1100"),
        (workload_page(fixture.STEP_WORKLOAD), "workload.png", "1280,1500"),
    ):
        target = SHOTS / shot
        target.unlink(missing_ok=True)
        browse(
            exe, out / page, tmp_path, f"--screenshot={target}", f"--window-size={size}", "--hide-scrollbars"
        )
        assert target.stat().st_size > 10_000 and target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_pages_fetch_nothing(planted):
    """No script, no stylesheet link, no source or link that leaves the site folder: every page opens offline."""
    out = planted[0]
    pages = list(out.glob("*.html"))
    assert len(pages) > 30
    for page in pages:
        text = page.read_text()
        els = Elements(text)
        assert not [t for t, _ in els.found if t in ("script", "link", "iframe", "img")], page.name
        assert "@import" not in text and not re.search(r"url\((?!#)", text), page.name  # url(#clip) is local
        for _, a in els.found:
            for key in ("src", "href", "xlink:href"):
                ref = a.get(key, "")
                assert not ref.startswith(("http:", "https:", "//")), (page.name, ref)
                if ref and not ref.startswith("#"):
                    assert (out / ref).is_file(), (page.name, ref)  # every link stays inside the site


def test_a_second_build_rewrites_nothing_and_a_new_run_only_its_pages(planted):
    out, ids, planted_db, hist, tmp = planted
    site, db = tmp / "incremental", tmp / "incremental.sqlite"
    shutil.copy(planted_db, db)
    kw = dict(db=str(db), history=str(hist), bisections=[tmp / "bisect"], jobs=1)
    first = build.build(site, **kw)
    assert first.unchanged == [] and len(first.written) > 40
    again = build.build(site, **kw)
    assert again.written == [] and len(again.unchanged) > 40
    step_page = site / workload_page(fixture.STEP_WORKLOAD)
    before = step_page.stat().st_mtime_ns
    from harness.bench.core.records import Result
    from harness.bench.stores.store import Store

    with Store(db) as store:  # one more run that measured one workload only
        rid = store.begin_run(fixture._run_info(99))
        store.add_result(rid, Result("add.bcast", "kiln", "src", samples=[1.0e5 + i for i in range(9)]))
        store.finish_run(rid)
    after = build.build(site, **kw)
    assert workload_page("add.bcast") in after.written
    assert step_page.name not in after.written and step_page.stat().st_mtime_ns == before
    assert {"index.html", "runs.html", "run-fixture-tiny-0099.html"} <= set(after.written)
    assert "tests.html" in after.unchanged


def test_quartiles_are_those_of_stats_of():
    rng = random.Random(3)
    lists = [
        [rng.lognormvariate(0, 0.3) for _ in range(n)] + ([50.0] if n % 2 else [])
        for n in (1, 2, 3, 4, 5, 9, 10, 10, 17, 40)
    ] + [[]]
    got = quartiles(lists)
    for xs, q in zip(lists, got):
        if not xs:
            assert q is None
            continue
        s = Stats.of(xs)
        assert q == pytest.approx((s.median, s.q1, s.q3), rel=1e-12)


def test_bad_input_is_one_line(tmp_path, capsys):
    assert main(["site", "--out", str(tmp_path / "s"), "--last", "0"]) == 2
    assert main(["site", "--out", str(tmp_path / "s"), "--db", str(tmp_path / "missing.sqlite")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("harness site: error: ") for line in err)
    assert not (tmp_path / "s").exists()


def test_one_graph_per_hardware_class_and_a_log_axis_across_decades(tmp_path):
    """Runs of two hardware classes give a workload two graphs; times that span decades get a log axis."""
    from harness.bench.core.records import Result
    from harness.bench.stores.store import Store

    db = tmp_path / "two.sqlite"
    with Store(db) as store:
        for i, cls in enumerate(("gpu-a", "gpu-a", "gpu-b", "gpu-b")):
            info = fixture._run_info(i)
            info.hw_class = cls
            rid = store.begin_run(info)
            slow = 1000.0 if cls == "gpu-b" else 1.0  # gpu-b: kiln 1000x eager, three decades apart
            store.add_result(rid, Result("mm.small", "eager", "s", samples=[1e3 + k for k in range(5)]))
            store.add_result(rid, Result("mm.small", "kiln", "s", samples=[2e3 * slow + k for k in range(5)]))
            store.finish_run(rid)
    out = tmp_path / "site"
    build.build(out, db=str(db), no_history=True, jobs=1, commit_url="https://git.invalid/c/{commit}")
    run_page = (out / "run-fixture-tiny-0002.html").read_text()
    assert f'href="https://git.invalid/c/{fixture.commit_of(2)}"' in run_page  # its commit's CI runs
    page = Elements((out / workload_page("mm.small")).read_text())
    figs = {a["data-hw-class"]: a for a in page.with_class("graph")}
    assert set(figs) == {"gpu-a", "gpu-b"} and {a["data-metric"] for a in figs.values()} == {"latency"}
    text = (out / workload_page("mm.small")).read_text()
    charts = {m: text[text.index(f'id="c-mm.small-{m}-tiny-latency"') :] for m in ("gpu-a", "gpu-b")}
    assert "log scale" in charts["gpu-b"].split("</svg>")[0]
    assert "log scale" not in charts["gpu-a"].split("</svg>")[0]


def test_link_only_writes_the_job_summary(tmp_path, monkeypatch, capsys):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    url = "https://github.invalid/o/r/actions/runs/1/artifacts/2"
    assert main(["site", "--out", str(tmp_path / "s"), "--link", url]) == 0
    assert url in summary.read_text() and "History site" in summary.read_text()
    assert not (tmp_path / "s").exists()  # builds nothing


def test_numerics_reports_are_shown(tmp_path):
    """A real `numerics compare` report (eager against eager with three planted changes, written by the
    report's own writer) is listed with each pair's verdict and the check's outcome; a report.json of another
    schema beside it is left out."""
    from harness.numerics import capture as cap
    from harness.numerics import compare as cmp
    from harness.numerics import report
    from harness.numerics.comparison import Check
    from harness.numerics.program import resolve
    from harness.numerics.store import RunFolder, save_run

    def bumped(prog):
        def fn(*args):
            out = prog.fn(*args).detach().clone()
            out.view(-1)[[3, 300, 1000]] += 0.5
            return out

        return fn

    prog = resolve("softmax_rows")
    prog.backward = False
    comps = [cap.standard("eager"), cap.Compiler("bumped", bumped)]
    inputs, cots, sides = cap.capture(prog, comps, 0, "cpu", 1)
    folder = RunFolder(save_run(tmp_path / "run", prog, 0, "cpu", inputs, cots, sides, None))
    comparison = cmp.compare([cmp.Side("A", folder, "eager"), cmp.Side("B", folder, "bumped")])
    (pair,) = comparison.outputs[0].pairs
    report.write_json(tmp_path / "numerics" / "softmax" / "report.json", [comparison], Check(2.0, None, []))
    (tmp_path / "numerics" / "other").mkdir()
    (tmp_path / "numerics" / "other" / "report.json").write_text('{"schema": 99, "reports": []}')

    out = tmp_path / "site"
    build.build(out, no_bench=True, no_history=True, numerics=[tmp_path / "numerics"], jobs=1)
    text = (out / "numerics.html").read_text()
    assert "softmax_rows" in text and pair.verdict.startswith("run B is further from fp64")
    assert html.escape(pair.verdict) in text and "Check: passed" in text
    assert html.escape(str(tmp_path / "numerics" / "softmax")) in text
    assert html.escape(str(tmp_path / "numerics" / "other")) not in text


def test_a_missing_browser_fails_in_ci_and_skips_elsewhere(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true but chromium is not installed"):
        chromium()
    monkeypatch.setenv("CI", "")
    with pytest.raises(pytest.skip.Exception, match="chromium is not installed"):
        chromium()


def test_site_of_a_backend_reads_a_store_or_fails_clearly_never_builds_from_an_empty_one(tmp_path):
    """`nox -s site -- --backend cpu` (`harness site --lasting cpu`) on a machine without CI's lasting store: the
    local store the sessions write is read (with a note), and without that one too the verb fails in one line,
    exit 2, and writes no site."""
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "harness" / "bench"))
    from bench_helpers import make_results, make_run

    from harness.bench.stores.store import Store

    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("KILN_")},
        "PYTHONPATH": str(ROOT),
        "KILN_MATRIX": str(ROOT / "ci" / "matrix.json"),
        "KILN_BENCH_STORE": str(tmp_path / "no-lasting.sqlite"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
    }

    def site() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "harness", "site", "--out", "results/site/cpu", "--lasting", "cpu"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )

    none = site()
    assert none.returncode == 2, none.stdout + none.stderr
    (line,) = none.stderr.strip().splitlines()
    assert "no bench store for cpu" in line and "results/bench/cpu/bench.sqlite" in line
    assert not (tmp_path / "results").exists()
    local = tmp_path / "results" / "bench" / "cpu" / "bench.sqlite"
    local.parent.mkdir(parents=True)
    with Store(local) as store:
        for k in range(2):
            run = make_run(device="cpu", commit=f"c{k}")
            store.begin_run(run)
            for r in make_results({("w.fwd.fp32.8", "eager"): 5000.0}, seed=k):
                store.add_result(run.id, r)
            store.finish_run(run.id)
    built = site()
    assert built.returncode == 0, built.stderr[-2000:]
    assert "read the local one, results/bench/cpu/bench.sqlite" in built.stderr
    assert "bench store: results/bench/cpu/bench.sqlite (2 complete runs)" in built.stderr
    assert len(list((tmp_path / "results" / "site" / "cpu").glob("run-*.html"))) == 2
