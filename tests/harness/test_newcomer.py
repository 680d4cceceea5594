"""A newcomer's first day, outside the bench (tests/harness/bench/test_bench_newcomer.py has its
part): a bad compiler setting is one line through every verb, a suite that fails to collect is reported as a
collection error with its cause and a repro line, `env` warns about nothing, `numerics --help` needs no torch,
the CLI conventions (`--json -`, `--github-summary`, help with description, example and exit codes), and the
nox sessions (one shared venv, native sessions that work, sessions registered once). CLI ones run
`python -m harness` in a real subprocess."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from harness import exc
from harness.__main__ import EXAMPLES, VERBS

ROOT = Path(__file__).resolve().parents[2]
BAD = {"KILN_MM_LAYOUT": "garbage"}


def harness(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("GITHUB_STEP_SUMMARY", "KILN_GITHUB_SUMMARY")}
    base["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=cwd or ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


# ---- item 6: a bad compiler setting is one line, exit 2, through every verb -------------------------------
@pytest.mark.parametrize(
    "argv",
    [
        ["env"],
        ["health"],
        ["numerics", "run", "attention"],
        ["bench", "run", "--only", "softmax.fwd.fp32*", "--db", "{tmp}/b.sqlite"],
        ["bench", "models", "--only", "gpt2*", "--out", "{tmp}/m"],
        ["flakes", "--native", "--runs", "2", "tests/fallback"],
    ],
)
def test_a_bad_compiler_setting_is_one_line_through_every_verb(tmp_path, argv):
    proc = harness(*[a.format(tmp=tmp_path) for a in argv], **BAD)
    assert proc.returncode == exc.EXIT_USAGE, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "bad compiler setting: KILN_MM_LAYOUT='garbage'" in lines[0], proc.stderr
    assert not (tmp_path / "b.sqlite").exists() and not (tmp_path / "m").exists()  # stopped before any work


def test_a_config_error_under_any_wrapper_is_one_line():
    from compiler.exc import ConfigError

    def deep() -> int:
        try:
            raise ConfigError("KILN_MM_LAYOUT='x': expected bench, pad, contiguous or off")
        except ConfigError as e:
            raise RuntimeError("backend compiler failed") from e  # as torch wraps a backend's error

    assert exc.guarded("bench", deep) == exc.EXIT_USAGE
    with pytest.raises(RuntimeError):  # anything else still raises
        exc.guarded("bench", lambda: (_ for _ in ()).throw(RuntimeError("other")))


# ---- item 7: a suite that fails to collect ---------------------------------------------------------------
def test_a_suite_that_dies_collecting_is_a_collection_error_with_cause_and_repro(tmp_path):
    from test_run import harness as run_harness
    from test_run import make_project, only_run

    root = make_project(tmp_path)
    (root / "tests" / "alpha" / "conftest.py").write_text(
        'raise ValueError("KILN_PLANTED=garbage: expected a planted value")\n'
    )
    proc = run_harness(root, "run", "--backend", "cpu", "--native", "--no-health", "--quiet")
    assert proc.returncode == 1, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("suite alpha"))
    assert "COLLECTION ERROR" in line
    assert Path(line.rsplit(" -> ", 1)[1]).is_file()  # the pointer names a file that exists
    assert "KILN_PLANTED=garbage" in proc.stdout  # the cause, even with --quiet
    run_dir = only_run(root)
    report = run_harness(root, "report", str(run_dir))
    assert "suite alpha [cpu/native] COLLECTION ERROR" in report.stdout
    assert "- [alpha] collection error: " in report.stdout and "KILN_PLANTED=garbage" in report.stdout
    repro = run_harness(root, "repro", "--print", str(run_dir)).stdout.splitlines()
    assert repro[0].startswith("# suite alpha: collection error:") and "no failing tests" not in repro
    again = subprocess.run(["bash", "-c", repro[1]], capture_output=True, text=True, timeout=120)
    assert again.returncode != 0 and "KILN_PLANTED=garbage" in again.stdout + again.stderr
    data = json.loads(run_harness(root, "report", str(run_dir), "--json", "-").stdout)
    assert data["broken_suite_details"][0]["suite"] == "alpha"
    assert data["broken_suite_details"][0]["repro"] == repro[1]


# ---- item 8: env warns about nothing; numerics --help needs no torch --------------------------------------
def test_env_prints_no_kiln_warning():
    proc = harness("env", "--part", "device")
    assert proc.returncode == 0, proc.stderr
    assert "kiln" not in proc.stderr.lower() and proc.stderr.strip() == ""
    assert "compile_threads" in json.loads(proc.stdout)["compiler_config"]


@pytest.mark.parametrize(
    "argv", [["numerics", "--help"], ["numerics", "run", "--help"], ["numerics", "compare", "--help"]]
)
def test_numerics_help_needs_no_torch(argv):
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['triton'] = None\n"  # any import of them fails
        "from harness.__main__ import main; sys.exit(main(sys.argv[1:]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert exc.EXIT_CODES_EPILOG in proc.stdout and ("example:" in proc.stdout or len(argv) > 2)


# ---- item 10: conventions ----------------------------------------------------------------------------------
def _leaves(parser: argparse.ArgumentParser):
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield parser
    for action in subs:
        for sub in dict.fromkeys(action.choices.values()):
            yield from _leaves(sub)


@pytest.mark.parametrize("verb", list(VERBS))
def test_every_verb_help_has_a_description_an_example_and_the_exit_codes(verb):
    proc = harness(verb, "--help")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert set(EXAMPLES) == set(VERBS)  # a new verb comes with its example
    assert VERBS[verb][1] in text  # the description
    assert "example:\n  " + EXAMPLES[verb].splitlines()[0] in text
    assert text.index("example:") < text.index("exit codes:") and text.rstrip().endswith(
        exc.EXIT_CODES_EPILOG.splitlines()[-1].strip()
    )


def test_every_verb_and_sub_verb_takes_github_summary():
    from harness import conventions

    for verb, (module_name, _) in VERBS.items():
        module = importlib.import_module(module_name)
        parser = argparse.ArgumentParser(prog=verb)
        (getattr(module, f"cli_{verb}_add_arguments", None) or module.cli_add_arguments)(parser)
        conventions.finish(parser)
        for leaf in _leaves(parser):
            assert "--github-summary" in leaf._option_string_actions, leaf.prog


def test_json_dash_for_report_and_history_show(tmp_path):
    from test_run import harness as run_harness
    from test_run import make_project, only_run

    root = make_project(tmp_path)
    db = tmp_path / "history.sqlite"
    run_harness(root, "run", "--backend", "cpu", "--native", "--no-health", "--quiet", "--suite", "beta")
    run_dir = only_run(root)
    report = run_harness(root, "report", str(run_dir), "--json", "-")
    data = json.loads(report.stdout)  # stdout is JSON only; the text report went to stderr
    assert data["counts"]["passed"] == 3 and data["suites"][0]["name"] == "beta"
    assert "kiln cpu/native OK" in report.stderr and not (root / "-").exists()
    assert run_harness(root, "history", "--history", str(db), "record", str(run_dir)).returncode == 0
    shown = run_harness(root, "history", "--history", str(db), "show", "--json", "-")
    assert shown.returncode == 0, shown.stderr
    tests = json.loads(shown.stdout)["tests"]
    assert {t["node_id"] for t in tests} >= {"tests/beta/test_beta.py::test_fine"} and tests[0]["runs"] == 1


def test_run_and_report_append_to_the_job_summary_only_with_the_flag(tmp_path):
    from test_run import make_project, only_run

    root = make_project(tmp_path)
    summary = tmp_path / "summary.md"
    env = {
        **os.environ,
        "GITHUB_STEP_SUMMARY": str(summary),
        "PYTHONPATH": str(ROOT),
        "KILN_ROOT": str(root),
        "KILN_RESULTS": str(root / "results"),
        "KILN_HISTORY_DB": str(tmp_path / "h.sqlite"),
    }
    env.pop("KILN_GITHUB_SUMMARY", None)

    def run(*args: str) -> None:
        proc = subprocess.run(
            [sys.executable, "-m", "harness", *args],
            env=env,
            cwd=root,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert proc.returncode == 0, proc.stderr

    run("run", "--backend", "cpu", "--native", "--no-health", "--quiet", "--suite", "beta")
    run("report", str(only_run(root)))
    assert not summary.exists()
    run("report", str(only_run(root)), "--github-summary")
    assert summary.read_text().count("kiln cpu/native OK") == 1
    run(
        "run", "--backend", "cpu", "--native", "--no-health", "--quiet", "--suite", "beta", "--github-summary"
    )
    assert summary.read_text().count("kiln cpu/native OK") == 2


# ---- items 4 and 9: nox sessions ---------------------------------------------------------------------------
class FakeSession:
    """What the sessions call of nox.Session, recorded; `detect` answers cpu."""

    def __init__(self, posargs: list[str] | None = None) -> None:
        self.posargs = posargs or []
        self.calls: list[tuple[str, tuple]] = []

    def run(self, *args, **kw):
        self.calls.append(("run", args))
        return "cpu\n" if "detect" in args else ""

    def run_install(self, *args, **kw):
        self.calls.append(("install", args))
        if args[1:3] == ("-m", "venv"):  # make the interpreter path exist, as venv would
            python = Path(args[3]) / "bin" / "python"
            python.parent.mkdir(parents=True)
            python.write_text("")

    def log(self, line):
        self.calls.append(("log", (line,)))

    def error(self, line):
        raise SystemExit(line)


def _call(session_fn, s: FakeSession) -> None:
    (session_fn.func if hasattr(session_fn, "func") else session_fn)(s)


def test_sessions_share_one_venv_filled_once_and_native_sessions_use_it(tmp_path, monkeypatch):
    from noxfile_loader import noxfile, sessions

    nf = noxfile()
    for name in (
        "tests",
        "ci",
        "bench",
        "bench-check",
        "compile-check",
        "numerics",
        "tests-cpu",
        "flakes-cpu",
    ):
        assert sessions()[name].python is False, name  # nox makes no venv of its own for them
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    monkeypatch.delenv("KILN_NO_VENV", raising=False)
    # the pair pip resolves (tests/harness/test_stranger.py runs that for real): here the matrix's
    monkeypatch.setattr(nf, "torch_pins", lambda python: ([nf.TORCH_PIN, nf.TRITON_PIN], "matrix pins", []))
    python = os.path.join(".nox", "kiln", "bin", "python")
    first = FakeSession(["--native", "--suite", "fallback"])
    _call(sessions()["tests-cpu"], first)
    installs = [a for kind, a in first.calls if kind == "install"]
    assert installs[0][1:] == ("-m", "venv", os.path.join(".nox", "kiln"))
    assert (
        any(nf.TORCH_PIN in a for a in installs)
        and any(nf.PROJECT in a for a in installs)
        and nf.PROJECT.startswith(".[test,bench,models")
    )
    runs = [a for kind, a in first.calls if kind == "run"]
    assert runs == [(python, "-m", "harness", "run", "--backend", "cpu", "--native", "--suite", "fallback")]
    for name, posargs in (("flakes-cpu", ["--native", "--runs", "2"]), ("tests", []), ("bench-check", [])):
        again = FakeSession(posargs)
        _call(sessions()[name], again)
        assert not [a for kind, a in again.calls if kind == "install"], name  # reused, not reinstalled
        assert {a[0] for kind, a in again.calls if kind == "run"} == {python}, name
    container = FakeSession([])
    _call(sessions()["tests-cpu"], container)  # container mode: the harness needs only the standard library
    assert [a[0] for kind, a in container.calls if kind == "run"] == [sys.executable]
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\nversion = '2'\n")
    changed = FakeSession(["--native"])
    _call(sessions()["tests-cpu"], changed)  # pyproject changed: the venv is refilled (not made again)
    installs = [a for kind, a in changed.calls if kind == "install"]
    assert installs and all(a[0] == python for a in installs)


def test_loading_the_noxfile_again_registers_each_session_once():
    from nox import registry
    from noxfile_loader import _load, sessions

    assert len(sessions()) > 20
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nox's "has already been registered" FutureWarning fails this
        _load.__wrapped__()
    assert set(registry.get()) == set(sessions())


# ---- the transcript (docs/newcomer): the harness run with the Python that has only nox ------------------------
def test_a_python_without_the_dependencies_gets_one_line_naming_the_venv(tmp_path):
    """After the README's set-up a newcomer runs `python -m harness bench list` with the Python they installed nox
    into (no SQLAlchemy, no torch): one line naming the missing module and the project's venv, exit 3, no traceback."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    python = bare / ("Scripts" if os.name == "nt" else "bin") / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env["PYTHONPATH"] = str(ROOT)
    for argv in (["bench", "list"], ["bench", "--help"], ["numerics", "run", "attention"]):
        proc = subprocess.run(
            [str(python), "-m", "harness", *argv],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == exc.EXIT_INFRA, (argv, proc.stderr)
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith(f"harness {argv[0]}: error: no module named ") and str(bare) in line
        assert ".nox/kiln" in line and "Traceback" not in proc.stderr


def test_the_missing_dependency_hint_names_what_to_do_where_the_newcomer_is(tmp_path, monkeypatch):
    """No venv yet: run the set-up; a venv and another Python: activate it; inside it: refill it. The project's
    own modules are not a set-up problem (a bug: the traceback stays)."""
    e = ModuleNotFoundError("No module named 'sqlalchemy'", name="sqlalchemy")
    assert "run `nox -s ci` or `nox -s tests` first" in exc.missing_dependency_line(e, str(tmp_path))
    bindir = tmp_path / ".nox" / "kiln" / ("Scripts" if os.name == "nt" else "bin")
    bindir.mkdir(parents=True)
    (bindir / "python").write_text("")
    assert "`. .nox/kiln/bin/activate`" in exc.missing_dependency_line(e, str(tmp_path))
    monkeypatch.setattr(sys, "prefix", str(tmp_path / ".nox" / "kiln"))  # running inside the venv
    assert "the project's venv lacks it" in exc.missing_dependency_line(e, str(tmp_path))
    assert exc.missing_dependency_line(ModuleNotFoundError("x", name="harness.nope"), str(tmp_path)) is None


def test_numerics_gpu_without_a_gpu_is_one_line_unless_asked_for_the_cpu(tmp_path):
    """`numerics gpu --out results/numerics/h100` (the README's GPU-box command) on a laptop ran the GPU-size
    programs through the interpreter for 7 minutes; now: one line naming `--device cpu`, exit 3, nothing written."""
    out = tmp_path / "h100"
    proc = harness(
        "numerics", "gpu", "--out", str(out), cwd=tmp_path, CUDA_VISIBLE_DEVICES="", HIP_VISIBLE_DEVICES=""
    )
    assert proc.returncode == exc.EXIT_INFRA, proc.stderr[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("harness numerics: error: no GPU found") and "--device cpu" in line
    assert not out.exists()


def test_history_show_in_a_terminal_counts_the_tests_that_never_failed_in_one_line(tmp_path):
    """After `nox -s ci`, `history show` printed 225 lines of "failed 0 of the last 1 runs": past 20 such tests the
    terminal gets the failing ones and one line counting the rest; `--all` and `--json -` still give every test."""
    from test_history import fake_run

    from harness.suites import history

    db = tmp_path / "h.sqlite"
    outcomes = {f"t::ok{i:02d}": ("passed", 1.0) for i in range(30)}
    for k in range(2):
        history.record(
            db,
            fake_run(
                tmp_path / f"r{k}",
                {**outcomes, "t::bad": ("failed", 1.0)},
                started=f"2026-01-0{k + 1}T00:00:00+00:00",
            ),
        )
    short = harness("history", "--history", str(db), "show", cwd=tmp_path)
    assert short.returncode == 0, short.stderr
    lines = short.stdout.strip().splitlines()
    assert lines[0] == "t::bad: failed 2 of the last 2 runs"
    assert "30 test(s) never failed in the last 2 run(s) (`--all` lists them" in lines[1]
    assert lines[2].endswith("1 of 31 test(s) listed (1 failed in the window)") and len(lines) == 3
    green = tmp_path / "green.sqlite"  # none failing: the count says none is listed, not "30 shown"
    history.record(green, fake_run(tmp_path / "g", outcomes, started="2026-01-03T00:00:00+00:00"))
    quiet = harness("history", "--history", str(green), "show", cwd=tmp_path).stdout.strip().splitlines()
    assert quiet[-1].endswith("0 of 30 test(s) listed (0 failed in the window)"), quiet
    every = harness("history", "--history", str(db), "show", "--all", cwd=tmp_path)
    assert every.returncode == 0 and "t::ok29: failed 0 of the last 2 runs" in every.stdout
    js = harness("history", "--history", str(db), "show", "--json", "-", cwd=tmp_path)
    assert len(json.loads(js.stdout)["tests"]) == 31


def test_compile_time_tool_without_a_gpu_is_one_line(tmp_path):
    """`python -m compiler.tools.compile_time` (named in the README) on a laptop ran 51 s of children that each
    died with torch's "not compiled with CUDA" traceback; now one line, exit 2, as `launch_sweep` does."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, "-m", "compiler.tools.compile_time"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("compile_time: needs a CUDA GPU") and "--device cpu --small" in line


def test_numerics_plot_colours_each_compiler_as_every_harness_plot_does(tmp_path):
    """The numerics report's ULP histogram used matplotlib's default cycle (kiln blue, inductor green, eager red,
    where the bench plots draw kiln orange, inductor blue, eager grey): now each side has its compiler's colour,
    a second run of the same compiler a hatch, and the figure names the device and its axes."""
    pytest.importorskip("matplotlib")
    from harness import arms
    from harness.numerics import report
    from harness.numerics.compare import ULP_BUCKETS
    from harness.numerics.comparison import Comparison, OutputComparison, SideDescription, SideErrors
    from harness.numerics.records import ProgramRecord

    compilers = ["kiln", "eager", "inductor", "kiln"]
    styles = report.side_styles(compilers)
    assert [c for c, _ in styles] == [
        arms.colour("kiln"),
        arms.colour("eager"),
        arms.colour("inductor"),
        arms.colour("kiln"),
    ]
    assert styles[0][1] == "" and styles[3][1] != "" and len({h for _, h in styles[:3]}) == 1
    hist = [1] * len(ULP_BUCKETS)
    labels = "ABCD"
    errors = [SideErrors(lab, 0.0, [], 0.0, 0.0, 0.0, 0, hist, "", None) for lab in labels]
    rep = Comparison(
        program=ProgramRecord("p"),
        reference="",
        seed=0,
        inputs={},
        sides=[SideDescription(lab, lab, "run", c, device="cpu") for lab, c in zip(labels, compilers)],
        baseline="A",
        outputs=[OutputComparison("out", [1], "float32", 1, 1, False, 0.0, 0.0, None, errors, [])],
    )
    png = report.plot(tmp_path / "r.png", [rep])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_postgres_script_starts_with_a_root_shell_path_without_sbin():
    """`nox -s tests` in the transcript's terminal (root, PATH=/usr/local/bin:/usr/bin:/bin) had 12 store tests error
    with "ci/postgres.sh ... exit status 127": runuser is in /usr/sbin. The script finds it there."""
    import glob
    import shutil

    if os.name != "posix" or os.geteuid() != 0:
        pytest.skip("the runuser path is taken by root only")
    if not (shutil.which("initdb") or glob.glob("/usr/lib/postgresql/*/bin/initdb")):
        pytest.skip("no PostgreSQL here (initdb not found)")
    script = str(ROOT / "ci" / "postgres.sh")
    env = {"HOME": os.environ.get("HOME", "/root"), "PATH": "/usr/local/bin:/usr/bin:/bin"}
    import tempfile

    folder = tempfile.mkdtemp(
        prefix="kiln-pg-"
    )  # as the store fixtures: pytest's tmp_path is closed to postgres
    try:
        proc = subprocess.run(
            ["bash", script, "start", str(folder)], env=env, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip().splitlines()[-1].startswith("postgresql://kiln@/kiln?host=")
    finally:
        subprocess.run(["bash", script, "stop", str(folder)], env=env, capture_output=True, timeout=120)
        shutil.rmtree(folder, ignore_errors=True)


def test_kiln_no_venv_with_a_python_without_the_project_names_what_it_lacks_and_the_venv(tmp_path):
    """`KILN_NO_VENV=1 nox -s ci` (the README's GPU-box command) from the Python nox was installed into said
    "pip install pytest pytest-timeout", which would still fail on torch: now it names everything missing and the
    shared venv, one line, exit 3."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    python = bare / ("Scripts" if os.name == "nt" else "bin") / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PYTHONPATH=str(ROOT), XDG_DATA_HOME=str(tmp_path / "data"))
    proc = subprocess.run(
        [
            str(python),
            "-m",
            "harness",
            "run",
            "--backend",
            "cpu",
            "--native",
            "--no-health",
            "--results",
            str(tmp_path / "r"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == exc.EXIT_INFRA, proc.stderr[-2000:]
    (line,) = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    assert "it lacks pytest, torch, triton" in line and "drop KILN_NO_VENV" in line and ".nox/kiln" in line


def test_the_readme_python_example_prints_readable_kernel_source(tmp_path):
    """The README's first Python block, run as a newcomer pastes it: the kernels print as source lines (a
    `@triton.jit` line of its own), not a dict with `\\n` escapes."""
    import re

    block = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    assert block, "README.md has no ```python block"
    proc = subprocess.run(
        [sys.executable, "-c", block.group(1)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "TRITON_INTERPRET": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "@triton.jit" in lines and any(ln.startswith("# kernel ") for ln in lines), proc.stdout[-2000:]
    assert "\\n" not in proc.stdout and not any(ln.startswith("{") for ln in lines)
