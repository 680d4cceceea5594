"""Bad, mismatched, incomplete or truncated result files: one clear line and exit 2, never a silent comparison."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from numerics_helpers import harness, one_error_line, planted, save

from harness.numerics.store import RunFolder


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("runs")
    return {
        "a": save(base / "a", ["eager"]),
        "b": save(base / "b", ["eager"]),
        "seed1": save(base / "seed1", ["eager"], seed=1),
        "other": save(base / "other", ["eager"], ref="softmax_rows"),
        "flat": save(base / "flat", [planted("flat", lambda out, call: out.reshape(-1))]),
    }


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _compare(capsys, *args) -> str:
    rc, _, err = harness(capsys, "numerics", "compare", *args, "--md", "/dev/null")
    return one_error_line(rc, err)


def test_good_runs_compare(runs, capsys):
    rc, out, err = harness(capsys, "numerics", "compare", runs["a"], runs["b"], "--md", "/dev/null")
    assert rc == 0, err
    # the terminal says which compiler (and run folder) each side label is
    assert "run A (eager) and run B (eager) are bitwise identical on 4096 compared elements" in out
    assert f"sides: A = eager ({runs['a']}), B = eager ({runs['b']})" in out


def test_the_terminal_names_each_sides_compiler_in_a_real_process(runs):
    """`python -m harness numerics compare` as a user runs it: no bare side letters on the terminal."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[3]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "numerics",
            "compare",
            f"{runs['a']}:eager",
            f"{runs['b']}:eager",
            "--md",
            os.devnull,
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    verdicts = [ln for ln in proc.stdout.splitlines() if " vs " in ln]
    assert verdicts and all(
        "B (eager) vs A (eager): run A (eager) and run B (eager)" in ln for ln in verdicts
    )


def test_truncated_output_file(runs, tmp_path, capsys):
    bad = _copy(runs["b"], tmp_path / "b")
    f = bad / "sides" / "eager" / "r0" / "out.bin"
    f.write_bytes(f.read_bytes()[:1000])
    assert f"{f} is truncated: 1000 of 8192 bytes" in _compare(capsys, runs["a"], bad)


def test_corrupt_output_file(runs, tmp_path, capsys):
    bad = _copy(runs["b"], tmp_path / "b")
    f = bad / "sides" / "eager" / "r0" / "out.bin"
    data = bytearray(f.read_bytes())
    data[10] ^= 0xFF
    f.write_bytes(bytes(data))
    assert f"{f} is corrupt: its sha256 differs from the manifest's" in _compare(capsys, runs["a"], bad)


def test_corrupt_input_file(runs, tmp_path, capsys):
    bad = _copy(runs["a"], tmp_path / "a")
    (bad / "inputs" / "y.bin").write_bytes(b"")
    assert "y.bin is truncated: 0 of 8192 bytes" in _compare(capsys, bad, runs["b"])


def test_run_without_manifest_is_incomplete(runs, tmp_path, capsys):
    bad = _copy(runs["b"], tmp_path / "b")
    (bad / "manifest.json").unlink()
    assert "has no manifest.json: the run is incomplete" in _compare(capsys, runs["a"], bad)


def test_truncated_manifest(runs, tmp_path, capsys):
    bad = _copy(runs["b"], tmp_path / "b")
    m = bad / "manifest.json"
    m.write_text(m.read_text()[:200])
    assert "manifest.json is corrupt or truncated" in _compare(capsys, runs["a"], bad)


def test_other_schema_version(runs, tmp_path, capsys):
    bad = _copy(runs["b"], tmp_path / "b")
    m = bad / "manifest.json"
    m.write_text(json.dumps({**json.loads(m.read_text()), "schema": 99}))
    assert "has schema version 99; this harness reads version 1" in _compare(capsys, runs["a"], bad)


def test_other_inputs(runs, capsys):
    line = _compare(capsys, runs["a"], runs["seed1"])
    assert "input 'x' differs between A and B" in line and "not the same inputs" in line


def test_other_program(runs, capsys):
    assert "B ran another program than A: ref 'softmax_rows' vs 'bf16_chain'" in _compare(
        capsys, runs["a"], runs["other"]
    )


def test_other_output_shapes(runs, capsys):
    assert "output out: bfloat16[64, 64] in A vs bfloat16[4096] in B" in _compare(
        capsys, runs["a"], runs["flat"]
    )


def test_unknown_side_and_missing_folder(runs, tmp_path, capsys):
    assert "has no side 'kiln'; it has eager" in _compare(capsys, runs["a"], f"{runs['b']}:kiln")
    assert f"{tmp_path / 'nope'} is not a folder" in _compare(capsys, runs["a"], tmp_path / "nope")


def test_one_side_alone_is_not_a_comparison(runs, capsys):
    assert "compare needs two sides" in _compare(capsys, runs["a"])


def test_run_refuses_a_used_folder_and_bad_specs(runs, capsys):
    rc, _, err = harness(capsys, "numerics", "run", "bf16_chain", "--out", runs["a"], "--compilers", "eager")
    assert "already holds files" in one_error_line(rc, err)
    rc, _, err = harness(
        capsys, "numerics", "run", "bf16_chain", "--inputs", "x:bf17[3]", "--compilers", "eager"
    )
    assert "unknown dtype 'bf17'" in one_error_line(rc, err)
    rc, _, err = harness(capsys, "numerics", "run", "no_such_program", "--compilers", "eager")
    assert "unknown program 'no_such_program'" in one_error_line(rc, err)
    rc, _, err = harness(capsys, "numerics", "run", "bf16_chain", "--compilers", "tvm")
    assert "unknown compiler 'tvm'" in one_error_line(rc, err)


def test_a_failing_compiler_is_recorded_and_left_out(tmp_path, capsys):
    def boom(out: torch.Tensor, call: int) -> torch.Tensor:
        raise RuntimeError("planted compile failure")

    run = save(tmp_path / "r", ["eager", planted("broken", boom), planted("same", lambda out, call: out)])
    side = RunFolder(run).sides[1]
    assert side.error == "RuntimeError: planted compile failure" and side.repeats == []
    rc, out, err = harness(capsys, "numerics", "compare", run, "--md", "/dev/null")
    assert rc == 0, err
    assert f"note: left out {run}:broken failed: RuntimeError: planted compile failure" in out
    line = _compare(capsys, f"{run}:eager,broken")
    assert "B" in line and "has no outputs: RuntimeError: planted compile failure" in line


def test_interrupted_run_leaves_no_manifest(tmp_path, monkeypatch, capsys):
    from harness.numerics import store

    def cut(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(store, "write_json", cut)  # dies when env.json/manifest.json would be written
    with pytest.raises(KeyboardInterrupt):
        save(tmp_path / "cut", ["eager"])
    assert (tmp_path / "cut" / "inputs" / "x.bin").exists() and not (
        tmp_path / "cut" / "manifest.json"
    ).exists()
    monkeypatch.undo()
    assert "the run is incomplete" in _compare(capsys, tmp_path / "cut", tmp_path / "cut")
