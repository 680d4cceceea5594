"""Optional extras (transformers, matplotlib, scipy; tests/conftest.py `needs` marker): a test that needs one is
skipped with the reason where it does not import, never failed. Checked by running the tests that need them in a
real pytest process where a sitecustomize makes the modules unimportable (as when the extra is not installed)."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# the tests that need an extra (found with `grep -rn 'transformers\|matplotlib\|scipy' tests`; the one module
# that needs matplotlib throughout, test_bench_history.py, skips itself with pytest.importorskip)
NEEDS = {
    "tests/harness/bench/test_bench_models.py::test_compile_only_cli_stores_compile_phase_resumes_and_reports": "transformers",
    "tests/harness/bench/test_bench_cli.py::test_run_compare_report_export_import_plot": "matplotlib",
    "tests/harness/numerics/test_numerics_triage.py::test_compare_names_exactly_the_planted_elements_and_the_closer_side": "matplotlib",
    "tests/harness/bench/test_bench_job.py::test_two_main_jobs_share_the_lasting_store_and_the_second_compares_with_the_first": "matplotlib",
    "tests/harness/bench/test_model_profile.py::test_profile_of_tiny_gpt2_names_kernels_and_kiln_graphs": "transformers",
}
BLOCK = """
import os, sys
for name in os.environ.get("KILN_TEST_BLOCK", "").split(","):
    if name:
        sys.modules[name] = None  # `import name` raises ModuleNotFoundError, as when it is not installed
"""


def test_tests_needing_an_absent_extra_skip_with_the_reason(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(BLOCK)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "KILN_TEST_BLOCK": "transformers,matplotlib,scipy",
    }
    junit = tmp_path / "junit.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *NEEDS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:]
    cases = ET.parse(junit).getroot().iter("testcase")
    skips = {
        (c.get("classname", "").replace(".", "/") + ".py", c.get("name")): c.find("skipped") for c in cases
    }
    assert skips and all(s is not None for s in skips.values()), out[-2000:]  # every one skipped, none ran
    for test, module in NEEDS.items():
        path, _, name = test.partition("::")
        found = [s.get("message", "") for (p, n), s in skips.items() if p == path and (not name or n == name)]
        assert found and all(module in m for m in found), (test, found)


def test_the_marker_skips_only_what_is_missing():
    # kiln_testing, not conftest: several conftest.py files share that module name in one session
    from kiln_testing import import_problem

    assert import_problem("json") is None
    assert import_problem("kiln_no_such_module").startswith("ModuleNotFoundError: No module named")
