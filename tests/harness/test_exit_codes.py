"""Exit codes (harness/exc.py): 0 ok, 1 tests failed, 2 usage or input error, 3 infrastructure, the same for every
verb and listed in every verb's `--help`. Input errors are one line naming the input, never a traceback. Each
through a real `python -m harness` (or `nox`) process."""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import exc
from harness.__main__ import VERBS, with_exit_codes
from harness.settings import parse_bool, settings

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("KILN_NATIVE", "KILN_HISTORY_DB")}
    full.update(PYTHONPATH=str(ROOT), **env)
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=full,
        timeout=120,
        check=False,
    )


def one_line(proc: subprocess.CompletedProcess, code: int) -> str:
    """The only stderr line of a process that exited `code` without a traceback."""
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_the_codes_are_defined_once_on_the_error_classes():
    assert (exc.EXIT_OK, exc.EXIT_FAILED, exc.EXIT_USAGE, exc.EXIT_INFRA) == (0, 1, 2, 3)
    for cls in (
        exc.DockerError,
        exc.ImageError,
        exc.NoDeviceError,
        exc.HealthError,
        exc.MissingTool,
        exc.StoreUnavailable,
    ):
        assert cls("x").exit_code == exc.EXIT_INFRA, cls
    for cls in (
        exc.HarnessError,
        exc.MatrixError,
        exc.SettingsError,
        exc.ResultsError,
        exc.QuarantineError,
        exc.UsageError,
        exc.StoreError,
        exc.ImageInputError,
        exc.HistoryError,
    ):
        assert cls("x").exit_code == exc.EXIT_USAGE, cls
    from harness.numerics.exc import NumericsError

    assert NumericsError("x").exit_code == exc.EXIT_USAGE


def test_infrastructure_error_exits_3_docker_missing(tmp_path):
    proc = cli(
        "run", "--backend", "cpu", "--results", str(tmp_path / "run"), KILN_DOCKER=str(tmp_path / "no-docker")
    )
    line = one_line(proc, 3)
    assert line.startswith("harness run: error: docker client ") and "not found" in line
    assert not (tmp_path / "run").exists()  # stopped before the run began


def test_infrastructure_error_exits_3_no_device(tmp_path):
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA driver")
    import torch

    line = one_line(cli("health", "--backend", "cuda"), 3)
    if torch.version.cuda is None:  # a CPU-only torch (the CPU wheel)
        assert "backend cuda needs a CUDA build of torch" in line
    else:  # a CUDA build with no GPU here (the package index's torch on a GPU-less machine)
        assert f"backend cuda: torch {torch.__version__} sees no GPU" in line


@pytest.mark.parametrize("verb,flag", [("run", "--results"), ("flakes", "--out"), ("merge", "--out")])
def test_an_output_folder_that_is_a_file_exits_2_naming_it(tmp_path, verb, flag):
    target = tmp_path / "some_file"
    target.write_text("not a folder\n")
    extra = ["--backend", "cpu", "--native"] if verb != "merge" else [str(tmp_path)]
    for given in (target, target / "below"):
        line = one_line(cli(verb, *extra, flag, str(given)), 2)
        assert (
            line.startswith(f"harness {verb}: error: {flag} {given}: ") and "is a file, not a folder" in line
        )
    assert target.read_text() == "not a folder\n"


@pytest.mark.parametrize("verb", ["run", "flakes"])
def test_a_results_root_that_is_a_file_exits_2_naming_the_variable(tmp_path, verb):
    target = tmp_path / "results_file"
    target.write_text("")
    line = one_line(cli(verb, "--backend", "cpu", "--native", KILN_RESULTS=str(target)), 2)
    assert line == (
        f"harness {verb}: error: KILN_RESULTS {target}: is a file, not a folder; give a folder to write "
        "the results into"
    )


@pytest.mark.parametrize("var", ["KILN_NATIVE", "KILN_BOOTSTRAP", "KILN_ALLOW_UNLOCKED"])
def test_a_boolean_variable_that_is_not_a_boolean_exits_2_naming_it(var):
    line = one_line(cli("run", "--backend", "cpu", **{var: "maybe"}), 2)
    assert line == (
        f"harness run: error: {var}='maybe': expected a boolean: one of 1/true/yes/on or 0/false/no/off"
    )


def test_the_boolean_words(monkeypatch):
    for raw, want in (
        ("1", True),
        ("TRUE", True),
        (" yes ", True),
        ("On", True),
        ("0", False),
        ("false", False),
        ("NO", False),
        ("off", False),
        ("", False),
        (None, False),
    ):
        assert parse_bool("X", raw) is want, raw
    assert parse_bool("X", "", default=True) is True
    for raw in ("maybe", "2", "y", "enabled"):
        with pytest.raises(exc.SettingsError, match=f"X={raw!r}: expected a boolean"):
            parse_bool("X", raw)
    monkeypatch.setenv("KILN_NATIVE", "off")
    assert settings().native is False
    monkeypatch.setenv("KILN_NATIVE", "yes")
    assert settings().native is True


def _parsers(parser: argparse.ArgumentParser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_verb_and_sub_verb_lists_the_exit_codes_in_its_help():
    # in-process over the verb table: every parser (sub-verbs too) ends with the shared epilog
    for verb, (module_name, _) in VERBS.items():
        module = importlib.import_module(module_name)
        parser = argparse.ArgumentParser(prog=verb)
        (getattr(module, f"cli_{verb}_add_arguments", None) or module.cli_add_arguments)(parser)
        with_exit_codes(parser)
        for p in _parsers(parser):
            assert p.format_help().rstrip().endswith(exc.EXIT_CODES_EPILOG.splitlines()[-1].strip()), p.prog
            assert exc.EXIT_CODES_EPILOG in p.format_help(), p.prog


@pytest.mark.parametrize("verb", list(VERBS))
def test_help_of_every_verb_lists_the_exit_codes(verb):
    proc = cli(verb, "--help")
    assert proc.returncode == 0, proc.stderr
    assert exc.EXIT_CODES_EPILOG in proc.stdout
    for code in ("0", "1", "2", "3"):
        assert f"\n  {code}    " in proc.stdout


def _nox_project(tmp_path: Path, matrix_text: str) -> Path:
    (tmp_path / "ci").mkdir()
    shutil.copy(ROOT / "noxfile.py", tmp_path / "noxfile.py")
    (tmp_path / "ci" / "matrix.json").write_text(matrix_text)
    return tmp_path / "noxfile.py"


def nox(*args: str, **env: str) -> subprocess.CompletedProcess:
    pytest.importorskip("nox")
    full = {**{k: v for k, v in os.environ.items() if k != "KILN_NATIVE"}, **env}
    return subprocess.run(
        [sys.executable, "-m", "nox", *args],
        capture_output=True,
        text=True,
        env=full,
        timeout=120,
        check=False,
        cwd=ROOT,
    )


@pytest.mark.parametrize(
    "text,says",
    [
        ('{"suites": [', "not valid JSON: Expecting value: line 1 column 13"),
        ('{"suites": []}', "missing or malformed key 'backends'"),
    ],
)
def test_nox_list_with_a_malformed_matrix_is_one_line(tmp_path, text, says):
    noxfile = _nox_project(tmp_path, text)
    proc = nox("-l", "-f", str(noxfile))
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1, out
    assert lines[0].startswith("nox: ci/matrix.json: ") and says in lines[0], lines[0]


def test_nox_list_with_the_real_matrix_still_lists(tmp_path):
    noxfile = _nox_project(tmp_path, (ROOT / "ci" / "matrix.json").read_text())
    proc = nox("-l", "-f", str(noxfile))
    assert proc.returncode == 0, proc.stderr
    assert "tests-cpu" in proc.stdout


def test_nox_rejects_a_non_boolean_kiln_native(tmp_path):
    # the session stops before it starts the harness: nox reports the failed session, and our one line
    noxfile = _nox_project(tmp_path, (ROOT / "ci" / "matrix.json").read_text())
    proc = nox("-s", "tests-cpu", "-f", str(noxfile), "--no-venv", "--", "--help", KILN_NATIVE="maybe")
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "nox: KILN_NATIVE='maybe' is not a boolean" in out and "Traceback" not in out
    assert "usage: python -m harness run" not in out  # the harness never ran


@pytest.mark.parametrize("how", [{"flag": True}, {"KILN_NATIVE": "1"}])
def test_flakes_run_natively_checks_kilns_settings_first(tmp_path, how):
    """`flakes` natively (by its flag or by KILN_NATIVE) compiles in this Python: a bad kiln setting is one line
    and exit 2 before any test runs; in the container it is the image's Python that reads them."""
    flag = ["--native"] if how.pop("flag", False) else []
    out = tmp_path / "out"
    proc = cli(
        "flakes", "--backend", "cpu", *flag, "--out", str(out), "tests/x.py", KILN_AUTOTUNE="maybe", **how
    )
    line = one_line(proc, 2)
    assert line.startswith(
        "harness flakes: error: bad compiler setting: KILN_AUTOTUNE='maybe': expected a boolean"
    )
    assert not out.exists()
