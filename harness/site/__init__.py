"""The history site: `python -m harness site --out DIR`, a static HTML site of the stored runs.

Terms:
  site          a folder of plain HTML pages with their charts inlined as SVG (matplotlib), opened from disk or any
                static host: no server, no network, no JavaScript.
  graph         one workload's trend over the runs of one hardware class and profile (a hardware class: the runner's
                GPU label, else GPU model, else the device name; harness/store/runner.py): median per compiler arm
                with its IQR band, in the arm's colour (harness/arms.py COLOURS).
  mark          a point of a graph whose run stored a verdict other than unchanged/new (harness/bench/core/records.py
                Comparison): `regressed` (confirmed side by side), `rejected` (a suspect the confirmation did not
                confirm), `suspect`, `unconfirmed`, `improved`. Each is an SVG group with the class `mark` and its
                verdict, and data attributes (run, commit, workload, compiler, ratio) a test can read in the DOM.
  manifest      `manifest.json` in the site: each page's input hash and content hash. A page whose inputs did not
                change is neither rendered nor rewritten (incremental builds).

Modules: `data.py` (what the stores hold, read once), `charts.py` (SVG charts), `pages.py` (HTML), `build.py`
(the verb, the manifest), `fixture.py` (a planted history written through the stores' writers: the tests and
ci/site_bench.py).
"""
