"""Progress and logs of long steps: `process.Heartbeat` prints a line every interval of silence with the
step, the elapsed time and the last log line; `execute` runs one for every command; image builds, debootstrap and
wheel downloads write their logs under <results>/logs, which the workflows upload with results/."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from harness import matrix
from harness.images import image
from harness.process import Heartbeat, elapsed_text, execute, last_log_line

ROOT = Path(__file__).resolve().parents[2]


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    "seconds, text", [(0, "0s"), (59.9, "59s"), (60, "1m00s"), (125, "2m05s"), (3720, "1h02m")]
)
def test_elapsed_text(seconds, text):
    assert elapsed_text(seconds) == text


def test_a_beat_names_the_step_the_time_and_the_last_line_unless_something_was_shown():
    clock, out, shown = Clock(), io.StringIO(), {"t": None}
    beat = Heartbeat(
        "image build kiln-cuda:1",
        30,
        last_line=lambda: "  #8 95.1 Installing collected   packages ",
        shown=lambda: shown["t"],
        out=out,
        clock=clock,
    )
    clock.now += 90
    assert beat.beat()
    assert out.getvalue() == (
        "progress: image build kiln-cuda:1: running 1m30s; last line: #8 95.1 Installing collected packages\n"
    )
    shown["t"] = clock.now - 10  # the command printed 10 s ago: no progress line needed
    assert not beat.beat() and beat.beats == 1
    clock.now += 25  # 35 s of silence
    assert beat.beat() and beat.beats == 2
    long = Heartbeat("s", 30, last_line=lambda: "x" * 500, out=out, clock=clock)
    assert long.line().endswith("x" * 157 + "...")


def test_a_silent_command_gets_progress_lines_with_its_last_line(tmp_path, capsys):
    log = tmp_path / "logs" / "wheelhouse-cuda.log"
    rc, _ = execute(
        [sys.executable, "-c", "import time; print('Collecting torch', flush=True); time.sleep(1.3)"],
        log=log,
        timeout_s=60,
        echo=False,
        step="wheel download for cuda",
        heartbeat_s=0.25,
    )
    err = capsys.readouterr().err
    beats = [ln for ln in err.splitlines() if ln.startswith("progress: wheel download for cuda: running ")]
    assert rc == 0 and len(beats) >= 3, err
    assert beats[-1].endswith("; last line: Collecting torch")
    assert log.read_text() == "Collecting torch\n" and last_log_line(log) == "Collecting torch"


def test_a_command_that_shows_its_output_gets_none_and_zero_turns_them_off(tmp_path, capsys):
    # sh: output from its first ms, then every 0.1 s for 7 s, past two intervals of 3 s (far above any gap between
    # its lines, even on a loaded host)
    chatty = "echo start; for i in $(seq 70); do echo $i; sleep 0.1; done"
    execute(["sh", "-c", chatty], log=tmp_path / "a.log", timeout_s=300, echo=True, heartbeat_s=3)
    assert "progress:" not in capsys.readouterr().err
    execute(
        [sys.executable, "-c", "import time; time.sleep(0.6)"],
        log=tmp_path / "b.log",
        timeout_s=60,
        echo=False,
        heartbeat_s=0,
    )
    assert "progress:" not in capsys.readouterr().err


def test_the_default_interval_is_the_setting(monkeypatch):
    from harness.process import heartbeat_interval
    from harness.settings import settings

    monkeypatch.delenv("KILN_HEARTBEAT_S", raising=False)
    assert heartbeat_interval(None) == 30 == settings().heartbeat_s
    monkeypatch.setenv("KILN_HEARTBEAT_S", "5")
    assert heartbeat_interval(None) == 5 and heartbeat_interval(2) == 2


def test_image_logs_go_under_the_results_folder(tmp_path, monkeypatch):
    """The build's and the wheelhouse's logs land in <results>/logs (each as a named, heartbeating step)."""
    monkeypatch.setenv("KILN_RESULTS", str(tmp_path / "results"))
    monkeypatch.delenv("KILN_LOGS", raising=False)
    monkeypatch.setenv("KILN_STATE", str(tmp_path / "state"))
    cpu = matrix.load(ROOT / "ci" / "matrix.json").backend("cpu")
    calls = []

    def fake_execute(argv, *, log, step=None, **kw):
        calls.append((log, step))
        log.write_text("ERROR: No matching distribution found for torch==0\n")
        return 1, False

    monkeypatch.setattr(image, "execute", fake_execute)
    with pytest.raises(image.ImageError) as e:
        image.prepare_context(cpu, ROOT)
    log = tmp_path / "results" / "logs" / "wheelhouse-cpu.log"
    assert calls == [(log, "wheel download for cpu")]
    assert "No matching distribution found" in str(e.value) and str(log) in str(e.value)
    assert image.log_path("build", cpu) == tmp_path / "results" / "logs" / "build-cpu.log"
    monkeypatch.setenv("KILN_LOGS", str(tmp_path / "elsewhere"))
    assert image.log_path("debootstrap", cpu) == tmp_path / "elsewhere" / "debootstrap-cpu.log"


def test_a_failed_debootstrap_quotes_its_log_under_the_results_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_RESULTS", str(tmp_path / "results"))
    monkeypatch.delenv("KILN_LOGS", raising=False)
    monkeypatch.setenv("KILN_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("KILN_DEBIAN_MIRROR", "http://mirror.test/debian")
    monkeypatch.setattr(image, "image_id", lambda ref: None)
    monkeypatch.setattr(image.shutil, "which", lambda name: f"/usr/sbin/{name}")
    monkeypatch.setattr(image.os, "geteuid", lambda: 0)
    seen = []

    def fake_execute(argv, *, log, step=None, **kw):
        seen.append((argv[0], log, step))
        log.write_text("I: Retrieving InRelease\nE: Failed getting release file http://mirror.test/debian\n")
        return 1, False

    monkeypatch.setattr(image, "execute", fake_execute)
    cuda = matrix.load(ROOT / "ci" / "matrix.json").backend("cuda")
    with pytest.raises(
        image.ImageError, match=r"debootstrap failed \(exit 1\): .*E: Failed getting release file"
    ):
        image.bootstrap_base(cuda)
    log = tmp_path / "results" / "logs" / "debootstrap-cuda.log"
    assert seen == [("/usr/sbin/debootstrap", log, f"debootstrap of {cuda.bootstrap.image}")]  # the one found


def test_the_workflows_upload_the_results_folder_that_holds_the_logs():
    for wf in sorted((ROOT / ".github" / "workflows").glob("*.yml")):
        text = wf.read_text()
        if "upload-artifact" in text:
            assert "path: results/" in text, wf.name
