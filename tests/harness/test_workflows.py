"""The GitHub Actions workflows agree with ci/matrix.json (the one source of truth) and stay thin and safe."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from harness import matrix

yaml = pytest.importorskip("yaml", reason="PyYAML is in the test extras")

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
MATRIX = matrix.load(ROOT / "ci" / "matrix.json")
NOX = '"$RUNNER_TEMP/venv/bin/nox"'
NOX_INSTALL = re.compile(
    r'^python3 -m venv "\$RUNNER_TEMP/venv" && "\$RUNNER_TEMP/venv/bin/pip" install '
    r"--quiet nox==[0-9.]+ sqlalchemy==[0-9.]+ alembic==[0-9.]+ \"psycopg\[binary\]==[0-9.]+\"$"  # the stores (harness/store) need them; psycopg: the fleet store
)
GITHUB_LABELS = {"self-hosted", "linux", "x64", "arm64", "ubuntu-latest"}


def _load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def _jobs():
    for path in WORKFLOWS:
        for job_id, job in _load(path)["jobs"].items():
            yield path.name, job_id, job


def _nox_sessions() -> set[str]:
    """The session names `nox --list` prints for the noxfile (lines `* name -> doc` / `- name -> doc`)."""
    pytest.importorskip("nox")
    proc = subprocess.run(
        [sys.executable, "-m", "nox", "--list", "-f", str(ROOT / "noxfile.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return set(re.findall(r"^[*-] (\S+)", proc.stdout, flags=re.MULTILINE))


def test_there_are_ci_flakes_and_bench_workflows():
    assert {p.name for p in WORKFLOWS} >= {"ci.yml", "flakes.yml", "bench.yml"}


def test_every_backend_has_a_tests_job_and_a_flakes_job():
    jobs = {(wf, job_id) for wf, job_id, _ in _jobs()}
    for name in MATRIX.backends:
        assert ("ci.yml", f"tests-{name}") in jobs
        assert ("flakes.yml", f"flakes-{name}") in jobs


def test_backend_jobs_use_the_matrix_runner_labels_timeouts_and_sessions():
    seen = 0
    for wf, job_id, job in _jobs():
        m = re.fullmatch(r"(tests|flakes)-(\w+)", job_id)
        if not m:
            continue
        backend = MATRIX.backend(m.group(2))  # an unknown backend fails here, naming the known ones
        assert job["runs-on"] == list(backend.runner_labels), f"{wf}:{job_id} runs-on"
        assert job["timeout-minutes"] == backend.timeouts.job_min, f"{wf}:{job_id} timeout-minutes"
        sessions = [s for step in job["steps"] for s in re.findall(r"-s ([\w-]+)", step.get("run", ""))]
        assert f"{m.group(1)}-{backend.name}" in sessions, f"{wf}:{job_id} does not run its session"
        for s in sessions:
            other = re.fullmatch(r"(?:tests|flakes)-(\w+)", s)
            assert other is None or other.group(1) == backend.name, f"{wf}:{job_id} runs {s}"
        seen += 1
    assert seen == 2 * len(MATRIX.backends)


def _nox_steps(job: dict) -> list[tuple[dict, list[str]]]:
    """(step, argv) of the job's steps that run nox."""
    return [(st, shlex.split(st["run"])) for st in job["steps"] if st.get("run", "").startswith(NOX + " -s ")]


def test_every_gpu_backend_has_a_bench_job_that_reads_the_matrix_and_calls_nox():
    """bench.yml: one job per GPU backend, on the matrix's runner labels and job timeout, recording into the lasting
    store on pushes to main (`bench-record`) and comparing on pull requests (`bench-pr`), for its own backend."""
    jobs = _load(ROOT / ".github" / "workflows" / "bench.yml")["jobs"]
    gpu = [b for b in MATRIX.backends.values() if b.is_gpu]
    assert gpu and set(jobs) == {f"bench-{b.name}" for b in gpu}
    sessions = _nox_sessions()
    for b in gpu:
        job = jobs[f"bench-{b.name}"]
        assert job["runs-on"] == list(b.runner_labels), f"bench-{b.name} runs-on"
        assert job["timeout-minutes"] == b.timeouts.job_min, f"bench-{b.name} timeout-minutes"
        steps = {
            argv[2]: (step, argv)
            for step, argv in _nox_steps(job)
            if argv[2] not in ("ci-teardown", "site", "preflight")
        }
        assert set(steps) == {"bench-record", "bench-pr"}, f"bench-{b.name} runs {sorted(steps)}"
        assert set(steps) <= sessions
        for name, (_step, argv) in steps.items():
            assert argv[3:] == ["--", "--backend", b.name], f"bench-{b.name}: {name} runs {argv[3:]}"
        record_if, pr_if = steps["bench-record"][0]["if"], steps["bench-pr"][0]["if"]
        assert "github.event_name != 'pull_request'" in record_if and "refs/heads/main" in record_if
        assert "github.event_name == 'pull_request'" in pr_if
        # main's run bisects a confirmed regression back to main's previous run: the whole history (0) there
        (checkout,) = [s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout@")]
        assert job["steps"].index(checkout) < job["steps"].index(steps["bench-record"][0])
        assert checkout["with"]["fetch-depth"] in (
            0,
            "${{ github.event_name == 'pull_request' && 1 || 0 }}",
        ), f"bench-{b.name}: the checkout must fetch the whole history on main"


def test_bench_jobs_stop_at_their_preflight_before_anything_is_opened_built_or_uploaded():
    """bench.yml: each bench job's first nox step is its pre-flight (`nox -s preflight -- --backend B`); the bench
    sessions run only after it passed (their default `success()`), and the history site is built and uploaded
    only when it passed (those steps run `always()` otherwise: a confirmed regression still gets its site)."""
    jobs = _load(ROOT / ".github" / "workflows" / "bench.yml")["jobs"]
    for b in (b for b in MATRIX.backends.values() if b.is_gpu):
        job = jobs[f"bench-{b.name}"]
        nox_steps = _nox_steps(job)
        first, argv = nox_steps[0]
        assert argv[2:] == ["preflight", "--", "--backend", b.name] and first.get("id") == "preflight"
        assert "if" not in first, f"bench-{b.name}: the pre-flight always runs"
        for st, argv in nox_steps[1:]:
            if argv[2] in ("bench-record", "bench-pr"):
                assert "always()" not in st["if"] and "!cancelled()" not in st["if"]
        uploads = [st for st in job["steps"] if st.get("uses", "").startswith("actions/upload-artifact@")]
        site_build = next(st for st, argv in nox_steps if argv[2] == "site" and "--link" not in argv)
        for st in (site_build, uploads[1]):
            assert "steps.preflight.outcome == 'success'" in st["if"], f"bench-{b.name}: {st.get('name')}"
        assert job["steps"].index(first) < job["steps"].index(site_build)


def test_bench_jobs_build_and_upload_the_history_site_on_main():
    """bench.yml: on main, after the record step, each bench job builds its backend's history site
    (`nox -s site -- --backend B`, into results/site/B), uploads that folder as its own artifact after the results,
    and a last nox step links the uploaded artifact in the job summary; pull requests build no site."""
    jobs = _load(ROOT / ".github" / "workflows" / "bench.yml")["jobs"]
    for b in (b for b in MATRIX.backends.values() if b.is_gpu):
        steps = jobs[f"bench-{b.name}"]["steps"]
        site = [(st, argv) for st, argv in _nox_steps(jobs[f"bench-{b.name}"]) if argv[2] == "site"]
        assert [argv[3:] for _, argv in site] == [
            ["--", "--backend", b.name],
            ["--", "--backend", b.name, "--link", "$SITE_URL"],
        ]
        (build, _), (link, _) = site
        record = next(st for st in steps if "-s bench-record" in st.get("run", ""))
        uploads = [st for st in steps if st.get("uses", "").startswith("actions/upload-artifact@")]
        assert len(uploads) == 2 and uploads[1]["with"] == {
            "name": f"site-{b.name}",
            "path": f"results/site/{b.name}/",
            "if-no-files-found": "warn",
            "retention-days": 90,
        }
        order = [steps.index(x) for x in (record, build, uploads[0], uploads[1], link)]
        assert order == sorted(order), f"bench-{b.name}: the site's steps are out of order"
        for st in (build, uploads[1]):
            assert "github.event_name != 'pull_request'" in st["if"] and "refs/heads/main" in st["if"]
            assert st["if"].startswith("!cancelled()")  # a confirmed regression (exit 1) still gets its site
        assert link["env"] == {"SITE_URL": f"${{{{ steps.{uploads[1]['id']}.outputs.artifact-url }}}}"}
        assert f"steps.{uploads[1]['id']}.outputs.artifact-url != ''" in link["if"]


@pytest.mark.parametrize(
    "tool, argv",
    [
        ("actionlint", ["-color=false"]),
        ("zizmor", ["--offline", "--no-progress", "--min-severity=low"]),
    ],
)
def test_workflow_linters_are_clean_when_installed(tool, argv):
    """`nox -s lint` runs them (pinned in noxfile.LINT_PINS); here too where they are on PATH."""
    import shutil

    exe = shutil.which(tool)
    if exe is None:
        pytest.skip(f"{tool} is not installed (`nox -s lint` installs it)")
    proc = subprocess.run(
        [exe, *argv, *map(str, WORKFLOWS)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_self_hosted_jobs_match_a_matrix_backend():
    labels = {tuple(b.runner_labels) for b in MATRIX.backends.values()}
    for wf, job_id, job in _jobs():
        runs_on = job["runs-on"]
        if "self-hosted" in (runs_on if isinstance(runs_on, list) else [runs_on]):
            assert tuple(runs_on) in labels, f"{wf}:{job_id}: runs-on {runs_on} is no backend's runner_labels"


def test_actionlint_knows_exactly_the_matrix_custom_labels():
    config = yaml.safe_load((ROOT / ".github" / "actionlint.yaml").read_text())
    custom = {lab for b in MATRIX.backends.values() for lab in b.runner_labels} - GITHUB_LABELS
    assert set(config["self-hosted-runner"]["labels"]) == custom


def test_steps_only_call_nox():
    sessions = _nox_sessions()
    for wf, job_id, job in _jobs():
        for step in job["steps"]:
            if "run" not in step:
                continue
            run = step["run"].strip()
            if NOX_INSTALL.match(run):
                continue
            assert run.startswith(NOX + " -s "), f"{wf}:{job_id}: step runs {run!r}, not nox"
            argv = shlex.split(run)
            assert argv[2] in sessions, f"{wf}:{job_id}: no nox session {argv[2]!r}"


def test_least_privilege_pinned_actions_no_credentials():
    for path in WORKFLOWS:
        data = _load(path)
        assert data["permissions"] == {}, f"{path.name}: top-level permissions must be {{}}"
        assert "pull_request_target" not in data["on"], f"{path.name}: pull_request_target exposes secrets"
        for job_id, job in data["jobs"].items():
            assert job["permissions"] == {"contents": "read"}, f"{path.name}:{job_id} permissions"
            for step in job["steps"]:
                if "uses" not in step:
                    continue
                assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", step["uses"]), (
                    f"{path.name}:{job_id}: {step['uses']} is not pinned by commit"
                )
                if step["uses"].startswith("actions/checkout@"):
                    assert step["with"]["persist-credentials"] is False
        # the only secrets: the fleet store's URLs, read once in the shared env (a read-only URL for
        # pull requests); no step or job hands a secret to anything else
        text = path.read_text()
        assert set(re.findall(r"secrets\.(\w+)", text)) <= {"KILN_STORE_URL", "KILN_STORE_READ_URL"}, (
            path.name
        )
        uses = [line for line in text.splitlines() if "secrets." in line]
        assert all(line.startswith("  KILN_STORE_URL: ") for line in uses), (path.name, uses)
        assert (
            data["env"]["KILN_STORE_READ_ONLY"] == "${{ github.event_name == 'pull_request' && '1' || '' }}"
        )


def test_workflows_upload_results_and_write_a_job_summary():
    for wf, job_id, job in _jobs():
        if job_id == "lint":
            continue
        uploads = [s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")]
        assert uploads and uploads[0]["if"] == "!cancelled()" and uploads[0]["with"]["path"] == "results/"
        runs = " ".join(s.get("run", "") for s in job["steps"])
        writes = (
            "-s ci-report",
            "--github-summary",
            "-s bench-record",
            "-s bench-pr",
        )  # bench: `bench summary`
        assert any(w in runs for w in writes), f"{wf}:{job_id} writes no job summary"


# ---- runner-ready: labels, concurrency, one set of variables, teardown ------------------------


def _self_hosted_jobs():
    for wf, job_id, job in _jobs():
        labels = job["runs-on"] if isinstance(job["runs-on"], list) else [job["runs-on"]]
        if "self-hosted" in labels:
            yield wf, job_id, job, set(labels)


def _runner_label_sets() -> dict[str, set[str]]:
    """The labels a runner of each backend registers: its matrix runner_labels."""
    return {name: set(b.runner_labels) for name, b in MATRIX.backends.items()}


def test_cpu_jobs_cannot_match_a_gpu_runner_nor_gpu_jobs_a_cpu_runner():
    """A runner takes a job when the job's labels are a subset of the runner's: every self-hosted job matches
    the runners of exactly one backend, so a GPU runner never takes a CPU job (the `cpu` label) and back."""
    runners = _runner_label_sets()
    cpu = {n for n, b in MATRIX.backends.items() if not b.is_gpu}
    assert cpu and all("cpu" in runners[n] for n in cpu)
    assert not any("cpu" in runners[n] for n in runners if n not in cpu)
    seen = set()
    for wf, job_id, _, labels in _self_hosted_jobs():
        matching = [n for n, registered in runners.items() if labels <= registered]
        assert len(matching) == 1, (
            f"{wf}:{job_id}: runs-on {sorted(labels)} matches the runners of {matching}"
        )
        seen.add(matching[0])
    assert seen == set(runners)
    # the old CPU labels, which every GPU runner matched, are gone
    assert not any(labels == {"self-hosted", "linux", "x64"} for *_, labels in _self_hosted_jobs())


def test_gpu_labels_name_the_gpu_model_and_bench_jobs_require_it():
    bench = _load(ROOT / ".github" / "workflows" / "bench.yml")["jobs"]
    for b in MATRIX.backends.values():
        models = [lab for lab in b.runner_labels if lab.startswith("gpu-")]
        if not b.is_gpu:
            assert models == [], f"{b.name}: a CPU backend names a GPU model"
            continue
        assert len(models) == 1 and re.fullmatch(r"gpu-[a-z0-9]+", models[0]), f"{b.name}: {b.runner_labels}"
        assert models[0] in bench[f"bench-{b.name}"]["runs-on"], (
            f"bench-{b.name} does not require {models[0]}"
        )


def test_main_is_never_cancelled_nor_replaced():
    """cancel-in-progress only off main; on main each run is its own concurrency group, since a pending run of a
    group is replaced by a newer one even without cancel-in-progress."""
    for path in WORKFLOWS:
        conc = _load(path)["concurrency"]
        assert conc["cancel-in-progress"] in (False, "${{ github.ref != 'refs/heads/main' }}"), path.name
        assert "${{ github.ref == 'refs/heads/main' && github.run_id || github.ref }}" in conc["group"], (
            path.name
        )


def test_every_workflow_sets_the_same_variables_from_one_list():
    """Each workflow's top-level env is harness/settings.py WORKFLOW_ENV, written as workflow_env_yaml() makes
    it (a workflow's own variables, such as an input of its own, may follow), and no job or step sets one of
    them again."""
    from harness.settings import WORKFLOW_ENV, workflow_env_yaml

    assert {
        "KILN_ALLOW_UNLOCKED",
        "KILN_TORCH_INDEX_URL",
        "PIP_INDEX_URL",
        "PIP_EXTRA_INDEX_URL",
        "KILN_HISTORY_DB",
        "KILN_BENCH_STORE",
    } <= set(WORKFLOW_ENV)
    shared_kinds = re.compile(
        r"PIP_.*|KILN_.*(INDEX|UNLOCKED|STORE|_DB|CACHE).*"
    )  # what only the list may set
    for path in WORKFLOWS:
        data = _load(path)
        shared = {k: v for k, v in data["env"].items() if k in WORKFLOW_ENV}
        assert shared == WORKFLOW_ENV, f"{path.name}: top-level env differs from WORKFLOW_ENV"
        own = [k for k in data["env"] if k not in WORKFLOW_ENV and shared_kinds.fullmatch(k)]
        assert not own, f"{path.name} sets {own} outside WORKFLOW_ENV: add them to the list instead"
        assert workflow_env_yaml() in path.read_text(), (
            f"{path.name}: its top-level env block is not WORKFLOW_ENV's (python -m harness workflows --write)"
        )
        for job_id, job in data["jobs"].items():
            for where in [job, *job["steps"]]:
                again = set(where.get("env") or {}) & set(WORKFLOW_ENV)
                assert not again, f"{path.name}:{job_id} sets {sorted(again)} again"
    for value in WORKFLOW_ENV.values():  # repository variables or fixed paths: never an index host
        assert "://" not in value


def test_every_self_hosted_job_ends_with_the_teardown():
    sessions = _nox_sessions()
    assert "ci-teardown" in sessions
    for wf, job_id, job, _ in _self_hosted_jobs():
        last = job["steps"][-1]
        assert last.get("if") == "always()" and last.get("run") == f"{NOX} -s ci-teardown", (
            f"{wf}:{job_id} does not end with the teardown"
        )


def test_the_workflows_are_what_the_matrix_and_the_list_write():
    """`python -m harness workflows --write` would change nothing; a new label in the matrix reaches runs-on."""
    from dataclasses import replace

    from harness import workflows

    for path in WORKFLOWS:
        assert workflows.render(path.read_text(), MATRIX) == path.read_text(), (
            f"{path.name} differs from ci/matrix.json or WORKFLOW_ENV: python -m harness workflows --write"
        )
    text = (ROOT / ".github" / "workflows" / "flakes.yml").read_text()
    planted = text.replace(
        "env:\n", "env:\n  # a workflow's own\n  OWN_VAR: x\n  PIP_INDEX_URL: planted-old-value\n", 1
    )
    rendered = workflows.render(planted, MATRIX)
    assert (
        rendered.count("PIP_INDEX_URL") == text.count("PIP_INDEX_URL") and "planted-old-value" not in rendered
    )
    assert "  # a workflow's own\n  OWN_VAR: x\n" in rendered and _env_after(rendered) == {
        **_env_after(text),
        "OWN_VAR": "x",
    }
    cuda = MATRIX.backend("cuda")
    other = replace(
        MATRIX,
        backends={
            **MATRIX.backends,
            "cuda": replace(cuda, runner_labels=(*cuda.runner_labels[:-1], "gpu-b200")),
        },
    )
    text = (ROOT / ".github" / "workflows" / "bench.yml").read_text()
    jobs = yaml.safe_load(workflows.render(text, other))["jobs"]
    assert jobs["bench-cuda"]["runs-on"][-1] == "gpu-b200" and jobs["bench-rocm"]["runs-on"] == list(
        MATRIX.backend("rocm").runner_labels
    )


def _env_after(text: str) -> dict:
    return yaml.safe_load(text)["env"]


def test_two_top_level_env_blocks_become_one():
    """A merge that adds a workflow's own top-level env block beside the shared one (a duplicate key) is made one
    block by `harness workflows --write`: the shared variables, then the workflow's own."""
    from harness import workflows

    text = (ROOT / ".github" / "workflows" / "ci.yml").read_text()
    merged = text.replace(
        "concurrency:\n",
        "env:\n  # its own input\n  OWN_SELECTION: ${{ inputs.selection }}\n\nconcurrency:\n",
        1,
    )
    assert merged.count("\nenv:\n") == 2
    rendered = workflows.render(merged, MATRIX)
    assert rendered.count("\nenv:\n") == 1 and workflows.render(rendered, MATRIX) == rendered
    assert yaml.safe_load(rendered)["env"] == {**_env_after(text), "OWN_SELECTION": "${{ inputs.selection }}"}
    assert rendered.replace("  # its own input\n  OWN_SELECTION: ${{ inputs.selection }}\n", "") == text


# ---- proven whole: the unit tests, cancel, one failure one error, labels, timeouts ---------------------------


def test_a_cpu_job_runs_the_unit_tests_and_uploads_their_junit_results():
    """ci.yml's unit-tests job: on the CPU runners, `nox -s unit-tests` (tests/compiler and tests/harness, this file
    among them) with JUnit XML under results/ and a job summary, uploaded as results-unit-tests."""
    from noxfile_loader import noxfile

    assert noxfile().UNIT_TEST_PARTS == ("compiler", "harness")
    job = _load(ROOT / ".github" / "workflows" / "ci.yml")["jobs"]["unit-tests"]
    assert job["runs-on"] == list(MATRIX.backend("cpu").runner_labels)
    (step, argv), *rest = [(s, a) for s, a in _nox_steps(job) if a[2] != "ci-teardown"]
    assert not rest and argv[2:] == [
        "unit-tests",
        "--",
        "--results",
        "results/unit-tests",
        "--github-summary",
    ]
    (upload,) = [s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert upload["with"]["name"] == "results-unit-tests" and upload["with"]["path"] == "results/"
    assert job["steps"].index(step) < job["steps"].index(upload)
    assert "unit-tests" in _nox_sessions()


def _condition(step_or_job: dict) -> str:
    return str(step_or_job.get("if", ""))


def test_a_cancel_stops_the_job_and_only_the_teardown_runs_after_it():
    """GitHub runs `always()` steps and jobs after a cancel too: every step or job that reports, uploads or checks
    after a failure says `!cancelled()`; `always()` is the teardown's alone (it must run on a cancel)."""
    for path in WORKFLOWS:
        for job_id, job in _load(path)["jobs"].items():
            assert "always()" not in _condition(job), (
                f"{path.name}:{job_id}: a job-level always() runs after a cancel"
            )
            for step in job["steps"]:
                cond = _condition(step)
                teardown = step.get("run") == f"{NOX} -s ci-teardown"
                if teardown:
                    assert cond == "always()", f"{path.name}:{job_id}: the teardown must run on a cancel too"
                    continue
                assert "always()" not in cond, (
                    f"{path.name}:{job_id}: {step.get('name')!r} runs after a cancel"
                )
                after_failure = step.get("uses", "").startswith("actions/upload-artifact@") or any(
                    f"-s {s}" in step.get("run", "")
                    for s in ("ci-report", "ci-durations", "site", "history-record", "compile-check")
                )
                if (
                    after_failure
                ):  # reports, uploads, the compile check: after a failed step, never after a cancel
                    assert cond.startswith("!cancelled()"), (
                        f"{path.name}:{job_id}: {step.get('name')!r} if: {cond!r}"
                    )
    text = "".join(p.read_text() for p in WORKFLOWS)
    assert text.count("if: always()") == sum(
        1 for (*_,) in _self_hosted_jobs()
    )  # one per self-hosted job's teardown


def test_sharded_jobs_take_the_shard_count_from_their_matrix():
    """`--shard I/N`: N is the matrix's `shards` (the length of its `shard` list), not strategy.job-total (which
    act leaves empty), so a shard can be run as written by a workflow runner other than GitHub's."""
    seen = 0
    for _wf, job_id, job in _jobs():
        strategy = job.get("strategy") or {}
        if "shard" not in (strategy.get("matrix") or {}):
            continue
        m = strategy["matrix"]
        assert m["shard"] == list(range(1, len(m["shard"]) + 1)) and m["shards"] == [len(m["shard"])], job_id
        assert (
            job["env"]["SHARD_COUNT"] == "${{ matrix.shards }}"
            and job["env"]["SHARD_INDEX"] == "${{ matrix.shard }}"
        )
        assert "job-total" not in str(job)
        seen += 1
    assert seen == len([b for b in MATRIX.backends.values() if b.is_gpu])


def test_gpu_jobs_record_and_check_the_gpu_model_their_label_names():
    """Every GPU job sets KILN_GPU_LABEL to the model of its `gpu-*` runs-on label (recorded with each run; the
    pre-flight fails when the GPU found is another model); CPU jobs set none."""
    seen = 0
    for wf, job_id, job, labels in _self_hosted_jobs():
        models = [lab.removeprefix("gpu-") for lab in labels if lab.startswith("gpu-")]
        env = job.get("env") or {}
        if not models:
            assert "KILN_GPU_LABEL" not in env, f"{wf}:{job_id}"
            continue
        assert env.get("KILN_GPU_LABEL") == models[0], (
            f"{wf}:{job_id}: KILN_GPU_LABEL {env.get('KILN_GPU_LABEL')!r}"
        )
        seen += 1
    assert seen >= 3 * len([b for b in MATRIX.backends.values() if b.is_gpu])  # tests, flakes, bench


JOB_SETUP_S = 10 * 60  # checkout, nox's venv and the project's install, reports, upload, teardown


def test_job_timeouts_cover_their_suites_limits():
    """A tests job's timeout-minutes covers what the harness may take before it calls a shard hung (environment
    capture, health checks, every suite at its matrix limit: harness.suites.sharded.shard_timeout_s) plus the job's
    setup; tests-cpu also runs the compile check (the suites again on CPU) within it."""
    from harness.suites.sharded import shard_timeout_s

    for wf, job_id, job in _jobs():
        m = re.fullmatch(r"tests-(\w+)", job_id)
        if not m:
            continue
        b = MATRIX.backend(m.group(1))
        need = shard_timeout_s(b, len(MATRIX.suites)) + JOB_SETUP_S
        if any(a[2] == "compile-check" for _, a in _nox_steps(job)):
            need += 15 * 60
        assert job["timeout-minutes"] * 60 >= need, (
            f"{wf}:{job_id}: timeout-minutes {job['timeout-minutes']} < the suites' limits ({need / 60:.0f} min)"
        )


def _nox(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    import os

    pytest.importorskip("nox")
    return subprocess.run(
        [sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "KILN_NO_VENV": "1", **env},
    )


def test_a_failed_job_later_steps_say_one_line_for_a_missing_folder_or_store(tmp_path):
    """One failure, one error: a job whose suites step stopped before writing its results folder, or a first run
    with no history store yet, gets one line from its report and durations steps, and they succeed."""
    missing = tmp_path / "results" / "ci-cuda-shard-1"
    proc = _nox("-s", "ci-report", "--", str(missing), env={})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (
        f"ci-report: no results folder {missing} (the step that writes it stopped before): nothing to report"
        in (proc.stdout + proc.stderr)
    )
    store = tmp_path / "history" / "history.sqlite"
    proc = _nox("-s", "ci-durations", "--", "--backend", "cuda", env={"KILN_HISTORY_DB": str(store)})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and f"ci-durations: no history store at {store} yet" in out, out
    assert not (tmp_path / "history").exists() and "Traceback" not in out


def test_the_unit_tests_summary_counts_what_pytest_wrote(tmp_path):
    """`nox -s unit-tests` tables each part's JUnit XML (as pytest writes it) in the job summary."""
    from noxfile_loader import noxfile

    (tmp_path / "test_x.py").write_text(
        "import pytest\n\ndef test_ok():\n    pass\n\ndef test_bad():\n    assert 0\n\n"
        "@pytest.mark.skip(reason='no')\ndef test_skip():\n    pass\n"
    )
    xml = tmp_path / "x.xml"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:xdist",
            "-p",
            "no:cacheprovider",
            str(tmp_path / "test_x.py"),
            f"--junitxml={xml}",
        ],
        cwd=tmp_path,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert noxfile()._junit_counts(str(xml)) == {"tests": 3, "failures": 1, "errors": 0, "skipped": 1}
