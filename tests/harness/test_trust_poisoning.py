"""The graph-cache poisoning attack, end to end on CPU through the harness's environment and the real compiler:
a job of a fork's pull request compiles a graph and stores its entry; the attacker changes one constant of that
entry, recomputes its sha256 (anyone can) and plants it, with the front entry, in the graph folder a main job
reads (a job running as the runner's user can write any folder that user can); the main job, a push to main
on the same runner, must not load it and must return eager's answer."""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REPOSITORY = "kiln-org/kiln"
KEY = "the-trusted-runners-cache-key"

JOB = """
import json, torch, compiler
def f(x):
    return x * 3.0 + 1.0
x = torch.arange(8, dtype=torch.float32)
with compiler.capture() as graphs:
    out = torch.compile(f, backend="kiln")(x)
print("RESULT " + json.dumps({"out": out.tolist(), "eager": f(x).tolist(), "cache": [g.cache for g in graphs]}))
"""

MAGIC = b"KILNENT1"


def github_env(tmp_path: Path, event: str, ref: str, head_repo: str | None = None) -> dict[str, str]:
    """What GitHub Actions gives a job of `event` on `ref` (a pull request's payload names its head repository)."""
    env = {
        "GITHUB_ACTIONS": "true",
        "GITHUB_EVENT_NAME": event,
        "GITHUB_REF": ref,
        "GITHUB_REPOSITORY": REPOSITORY,
    }
    if head_repo is not None:
        payload = tmp_path / f"event-{event}-{head_repo.replace('/', '-')}.json"
        payload.write_text(
            json.dumps(
                {
                    "pull_request": {
                        "head": {"repo": {"full_name": head_repo}},
                        "base": {"repo": {"full_name": REPOSITORY}},
                    }
                }
            )
        )
        env["GITHUB_EVENT_PATH"] = str(payload)
    return env


def job_env(
    monkeypatch: pytest.MonkeyPatch, runner_cache: Path, github: dict[str, str], secrets: dict[str, str]
) -> dict[str, str]:
    """The environment the harness gives a native suite process of this job on this runner."""
    from harness import commands as runner_commands
    from harness.commands import native_command

    for name in (
        "TRITON_CACHE_DIR",
        "KILN_CACHE_DIR",
        "KILN_GRAPH_CACHE_DIR",
        "KILN_AUTOTUNE_DIR",
        "KILN_CACHE",
        "KILN_CACHE_SCOPE",
        "KILN_COMPILE_CACHE",
        "KILN_CACHE_KEY",
        "KILN_CACHE_KEY_FILE",
        "TORCHINDUCTOR_CACHE_DIR",
        "GITHUB_EVENT_PATH",
        "GITHUB_HEAD_REF",
        "GITHUB_BASE_REF",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(runner_cache))
    for k, v in {**github, **secrets}.items():
        monkeypatch.setenv(k, v)
    _, env = native_command(
        ["python"], {**runner_commands.native_cache_env(), "KILN_INTERPRET": "1"}, src=REPO
    )
    env["KILN_CACHE"] = "1"  # the cache on, as in CI (the test tree's default is off)
    return env


def run_job(env: dict[str, str], cwd: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", JOB],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.stdout + proc.stderr)[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


def graph_folder(env: dict[str, str]) -> Path:
    """Where the compiler of a process with `env` keeps its graph cache (compiler/config.py's default)."""
    if env.get("KILN_GRAPH_CACHE_DIR"):
        return Path(env["KILN_GRAPH_CACHE_DIR"])
    return Path(env["XDG_CACHE_HOME"]) / "kiln" / "graphs"


def forge(entry: bytes) -> bytes:
    """The attacker's edit: one constant of the stored kernel changed (1.0 -> 1000.0), the header's length and
    the sha256 recomputed."""
    assert entry.startswith(MAGIC)
    payload = entry[len(MAGIC) + 32 :]
    (n,) = struct.unpack_from("<Q", payload)
    header = payload[8 : 8 + n].replace(b"tl.full([], 1.0, tl.float32)", b"tl.full([], 1000.0, tl.float32)")
    assert header != payload[8 : 8 + n], "the constant to edit is not in the entry"
    forged = struct.pack("<Q", len(header)) + header + payload[8 + n :]
    return MAGIC + hashlib.sha256(forged).digest() + forged


@pytest.mark.parametrize("main_has_key", [True, False], ids=["main-with-key", "main-without-key"])
def test_a_fork_cannot_poison_the_graph_cache_main_loads(tmp_path, monkeypatch, main_has_key):
    runner_cache = tmp_path / "runner-home-cache"  # the runner's XDG_CACHE_HOME, shared by every job on it
    fork = job_env(
        monkeypatch,
        runner_cache,
        github_env(tmp_path, "pull_request", "refs/pull/7/merge", head_repo="mallory/kiln"),
        {},
    )
    first = run_job(fork, tmp_path)
    assert first["out"] == first["eager"] and first["cache"] == ["stored"], first
    stored = sorted(graph_folder(fork).glob("*.kgc"))
    fronts = sorted(graph_folder(fork).glob("*.kfc"))
    assert len(stored) == 1, list(graph_folder(fork).iterdir())

    main = job_env(
        monkeypatch,
        runner_cache,
        github_env(tmp_path, "push", "refs/heads/main"),
        {"KILN_CACHE_KEY": KEY} if main_has_key else {},
    )
    target = graph_folder(main)
    target.mkdir(parents=True, exist_ok=True)
    (target / stored[0].name).write_bytes(forge(stored[0].read_bytes()))
    for front in fronts:
        if not (target / front.name).exists():
            (target / front.name).write_bytes(front.read_bytes())

    second = run_job(main, tmp_path)
    assert second["out"] == second["eager"], f"the main job returned {second['out']}, eager {second['eager']}"
    assert second["cache"] != ["hit"], "the main job loaded the forged entry"
