"""The compile check: dumped kernels compiled ahead of time for every GPU target in ci/matrix.json."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import matrix
from harness.checks import compile_check as cc
from harness.exc import CompileCheckError

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "tests" / "harness" / "planted" / "kernels"
TARGETS = cc.targets_from_matrix(matrix.load(ROOT / "ci" / "matrix.json"))


@pytest.fixture
def dump(tmp_path):
    """A dump folder in the compiler's format, made from the planted hand-written kernels."""
    folder = tmp_path / "dump"
    shutil.copytree(KERNELS, folder / "kernels")
    return folder


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_PLANTED")}
    env.update(extra)
    return env


def test_matrix_targets_cover_sm90_gfx942_gfx950():
    labels = [t.label for t in TARGETS]
    assert {"sm_90", "gfx942", "gfx950"} <= set(labels)
    assert cc.Target("hip", "gfx942", 64) in TARGETS and cc.Target("cuda", 90, 32) in TARGETS
    assert [t.label for t in cc.select_targets(TARGETS, ["gfx950", "sm_90"])] == ["gfx950", "sm_90"]
    with pytest.raises(CompileCheckError, match=r"unknown target\(s\) \['sm_75'\]"):
        cc.select_targets(TARGETS, ["sm_75"])


@pytest.mark.parametrize(
    "obj",
    [
        {"backend": "cuda", "arch": "90", "warp_size": 32},
        {"backend": "hip", "arch": "mi300", "warp_size": 64},
        {"backend": "cuda", "arch": 90},
        {"backend": "metal", "arch": 1, "warp_size": 32},
    ],
)
def test_bad_target_is_a_clear_error(obj):
    with pytest.raises(CompileCheckError, match="compile target"):
        cc.Target.from_json(obj, "ci/matrix.json: backends.x.compile_targets[0]")


def test_valid_kernel_compiles_and_interpreter_only_kernel_fails_naming_source_and_target(
    dump, tmp_path, monkeypatch
):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))  # really compile, no cache hits
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # as in a CPU suite run: the workers must drop it
    report = cc.check(dump, TARGETS, tmp_path / "out", jobs=2)
    assert (report["kernels"], report["specializations"]) == (2, 3)
    assert report["compiled"] == 2 * len(TARGETS)  # both specializations of the valid kernel, every target
    assert report["failed"] == len(TARGETS) and not report["ok"]
    failures = [cc.Outcome(**f) for f in report["failures"]]
    assert [f.target for f in failures] == [t.name for t in TARGETS]
    for f in failures:
        assert f.kernel == "kiln_planted_interp_only"
        assert f.location == "kernels/kiln_planted_interp_only.py:14:4"  # the `try` statement
        assert "unsupported AST node type: Try" in f.error
    msg = failures[TARGETS.index(cc.Target("hip", "gfx942", 64))].message(dump)
    assert msg == (
        f"{dump}/kernels/kiln_planted_interp_only.py:14:4: kernel kiln_planted_interp_only "
        "(kernels/kiln_planted_interp_only.0f1e2d3c.json) does not compile for hip gfx942: "
        "UnsupportedLanguageConstruct: unsupported AST node type: Try"
    )
    saved = json.loads((tmp_path / "out" / "compile_check.json").read_text())
    assert saved == report
    md = (tmp_path / "out" / "compile_check.md").read_text()
    assert (
        "| `kernels/kiln_planted_interp_only.py:14:4` | `kernels/kiln_planted_interp_only.0f1e2d3c.json` | "
        "hip gfx950 |" in md
    )
    artefacts = list((tmp_path / "triton-cache").rglob("*.hsaco")) + list(
        (tmp_path / "triton-cache").rglob("*.cubin")
    )
    assert artefacts, "the valid kernel was compiled to cubin/hsaco"


def test_cli_runs_the_suite_in_interpreter_mode_then_compiles_its_dump(tmp_path):
    out = tmp_path / "out"
    (tmp_path / "state").mkdir()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "compile-check",
            "--out",
            str(out),
            "--target",
            "sm_90",
            "--target",
            "gfx942",
            "--pytest-arg=--confcutdir=tests/harness/planted",
            "tests/harness/planted/planted_dump.py",
        ],
        cwd=ROOT,
        env=_env(KILN_PLANTED_STATE=str(tmp_path / "state")),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1 passed" in (out / "suites.log").read_text()  # the interpreter accepted both kernels
    assert (
        "2 kernels, 3 specializations x 2 targets (cuda sm_90, hip gfx942): 4 compiled, 2 failed"
        in proc.stdout
    )
    fails = [ln for ln in proc.stderr.splitlines() if ln.startswith("compile-check: FAIL")]
    assert len(fails) == 2
    assert "kiln_planted_interp_only.py:14:4" in fails[1] and "does not compile for hip gfx942" in fails[1]


def test_clean_dump_passes(dump, tmp_path):
    for path in dump.glob("kernels/kiln_planted_interp_only*"):
        path.unlink()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "compile-check",
            "--dump",
            str(dump),
            "--out",
            str(tmp_path / "out"),
            "--target",
            "gfx950",
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "1 kernels, 2 specializations x 1 targets (hip gfx950): 2 compiled, 0 failed" in proc.stdout


def test_findings_for_unimportable_module_and_wrong_signature(dump, tmp_path):
    (dump / "kernels" / "kiln_planted_interp_only.py").write_text("def broken(:\n")
    spec = dump / "kernels" / "kiln_planted_ok.9a8b7c6d.json"
    data = json.loads(spec.read_text())
    data["signature"] = {"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    spec.write_text(json.dumps(data))
    target = [cc.Target("cuda", 90, 32)]
    report = cc.check(dump, target, tmp_path / "out")
    errors = {f["spec_file"]: f["error"] for f in report["failures"]}
    assert errors["kernels/kiln_planted_interp_only.0f1e2d3c.json"].startswith(
        "module does not import: SyntaxError"
    )
    assert errors["kernels/kiln_planted_ok.9a8b7c6d.json"].startswith(
        "spec signature ['BLOCK', 'n', 'x_ptr'] does not match the kernel's arguments"
    )
    assert report["compiled"] == 1


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.pop("num_warps"), "'num_warps' must be a int, got None"),
        (lambda d: d.update(source="../evil.py"), "source '../evil.py' is not a file in"),
        (lambda d: d.update(source="missing.py"), "source 'missing.py' is not a file in"),
        (lambda d: d.update(constexprs={}), r"constexpr argument\(s\) \['BLOCK'\] have no value"),
        (lambda d: d.update(signature={"x_ptr": 1}), "signature types must be strings"),
    ],
)
def test_malformed_spec_is_a_clear_error(dump, edit, message):
    spec = dump / "kernels" / "kiln_planted_ok.0f1e2d3c.json"
    data = json.loads(spec.read_text())
    edit(data)
    spec.write_text(json.dumps(data))
    with pytest.raises(CompileCheckError, match=message) as info:
        cc.load_specs(dump)
    assert str(spec) in str(info.value)


def test_unreadable_spec_and_missing_dump(dump, tmp_path):
    (dump / "kernels" / "x.1.json").write_text("{not json")
    with pytest.raises(CompileCheckError, match="unreadable kernel spec"):
        cc.load_specs(dump)
    with pytest.raises(CompileCheckError, match="no dump folder at"):
        cc.load_specs(tmp_path / "nowhere")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cc.load_specs(empty) == []
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "compile-check",
            "--dump",
            str(empty),
            "--out",
            str(tmp_path / "o"),
            "--min-kernels",
            "1",
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("harness compile-check: error: only 0 kernel specializations")


def test_worker_refuses_interpreter_mode(dump, tmp_path):
    request = tmp_path / "req.json"
    request.write_text(json.dumps({"dump_dir": str(dump), "targets": [], "specs": []}))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.checks.compile_check",
            "--worker",
            str(request),
            str(tmp_path / "out.jsonl"),
        ],
        cwd=ROOT,
        env=_env(TRITON_INTERPRET="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "must run without TRITON_INTERPRET" in proc.stderr and "Traceback" not in proc.stderr


def test_the_compilers_own_dump_compiles_for_every_target(tmp_path):
    """The contract of docs/TEAM.md end to end: kiln's dump of a fused pointwise and a softmax kernel."""
    script = (
        "import torch, compiler\n"
        "f = torch.compile(lambda a, b: torch.relu(a * 2 + b).sigmoid(), backend='kiln')\n"
        "g = torch.compile(lambda x: torch.softmax(x, dim=-1), backend='kiln')\n"
        "a, b, x = torch.randn(1000), torch.randn(1000), torch.randn(64, 100)\n"
        "assert torch.allclose(f(a, b), torch.relu(a * 2 + b).sigmoid(), atol=1e-5)\n"
        "assert torch.allclose(g(x), torch.softmax(x, dim=-1), atol=1e-5)\n"
    )
    dump = tmp_path / "dump"
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(KILN_DUMP_DIR=str(dump), TRITON_INTERPRET="1", PYTHONPATH=str(ROOT)),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = cc.check(dump, TARGETS, tmp_path / "out")
    assert report["specializations"] >= 2
    assert report["failed"] == 0, report["failures"]
    assert report["compiled"] == report["specializations"] * len(TARGETS)


def test_missing_suite_folders_are_skipped_and_missing_paths_are_errors(tmp_path):
    root = (
        tmp_path / "checkout"
    )  # a checkout whose suite folders do not exist yet (git keeps no empty folder)
    (root / "ci").mkdir(parents=True)
    shutil.copy(ROOT / "ci" / "matrix.json", root / "ci" / "matrix.json")
    env = _env(KILN_ROOT=str(root), PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "compile-check", "--out", str(tmp_path / "o")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "compile-check: suite folder tests/numerics does not exist: skipped" in proc.stdout
    assert "0 kernels, 0 specializations" in proc.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "compile-check", "--out", str(tmp_path / "o"), "tests/nope"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (proc.returncode, proc.stderr.strip()) == (
        2,
        "harness compile-check: error: no such test path: tests/nope",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "flakes", "--native", "--out", str(tmp_path / "f")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().endswith(
        "none of the matrix's suite folders exist under tests/; name test paths"
    )


SLOW_KERNEL = """
import triton
import triton.language as tl


@triton.jit
def kiln_slow(x_ptr, N: tl.constexpr):
    acc = tl.load(x_ptr)
    for i in tl.static_range(N):  # unrolled at compile time: N copies of the body
        acc = acc * 1.0001 + i
    tl.store(x_ptr, acc)
"""


def _dump_slow_kernel(tmp_path, n: int) -> None:
    """A dump under tmp_path/dump holding SLOW_KERNEL with N = n (compile time grows with n)."""
    kernels = tmp_path / "dump" / "kernels"
    kernels.mkdir(parents=True)
    (kernels / "kiln_slow.py").write_text(SLOW_KERNEL)
    spec = {
        "kernel": "kiln_slow",
        "source": "kiln_slow.py",
        "signature": {"x_ptr": "*fp32", "N": "constexpr"},
        "constexprs": {"N": n},
        "num_warps": 1,
        "num_stages": 1,
    }
    (kernels / "kiln_slow.1.json").write_text(json.dumps(spec))


def test_a_compile_that_runs_past_the_timeout_is_a_finding_and_the_worker_is_stopped(tmp_path):
    _dump_slow_kernel(tmp_path, 200000)
    targets = [cc.Target("cuda", 90, 32), cc.Target("hip", "gfx942", 64)]
    report = cc.check(tmp_path / "dump", targets, tmp_path / "out", timeout_s=3)
    errors = [(f["target"], f["error"]) for f in report["failures"]]
    assert errors == [
        ("cuda sm_90", "compile did not finish within the 3 s limit of the compile check"),
        ("hip gfx942", "not compiled: the compile worker was stopped after 3 s"),
    ]


def test_sigterm_stops_the_workers_and_reports_an_interrupted_run(tmp_path):
    import signal
    import time

    _dump_slow_kernel(tmp_path, 400000)
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness",
            "compile-check",
            "--dump",
            str(tmp_path / "dump"),
            "--out",
            str(out),
            "--target",
            "sm_90",
        ],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    request = out / "work" / "request-0.json"
    for _ in range(200):
        if request.exists():
            break
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert err.strip().startswith("harness compile-check: error: compile check interrupted")
    workers = subprocess.run(
        ["pgrep", "-f", f"compile_check --worker {request}"], capture_output=True, text=True
    )
    assert workers.stdout.strip() == ""


def test_a_stop_while_the_workers_start_stops_those_already_started(tmp_path, monkeypatch):
    """SIGINT arriving just after the second compile worker started: it is held until the worker is recorded,
    then both workers are stopped and the interrupt goes on (none is left running)."""
    import os
    import signal

    specs = [cc.KernelSpec(f"k{i}", f"k{i}.py", f"k{i}.1.json", {"x": "*fp32"}, {}, 1, 1) for i in range(2)]
    started = []
    real_spawn = cc.spawn

    def spawn_sleeper(cmd, log, **kw):
        spawned = real_spawn([sys.executable, "-c", "import time; time.sleep(60)"], log, **kw)
        started.append(spawned.proc)
        if len(started) == 2:
            os.kill(os.getpid(), signal.SIGINT)  # handled before compile_specs records this worker
        return spawned

    monkeypatch.setattr(cc, "spawn", spawn_sleeper)
    with pytest.raises(KeyboardInterrupt):
        cc.compile_specs(specs, [cc.Target("cuda", 90, 32)], tmp_path, tmp_path / "work", jobs=2)
    assert len(started) == 2
    for proc in started:
        proc.wait(timeout=30)  # stopped: returns long before the sleep would end
