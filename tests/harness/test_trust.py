"""The trust model (harness/trust.py): the scope a job's GitHub event, ref and repository give it, KILN_CACHE_SCOPE
only narrowing it, and what each scope gets: compiler cache folders (natively, in containers, in the
compile-check), the cache key, stores, durations and image names."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness import commands, trust
from harness.exc import SettingsError, UsageError
from harness.settings import fleet_settings, settings

REPO = Path(__file__).resolve().parents[2]
BASE = "kiln-org/kiln"


def gh(tmp_path: Path, event: str, ref: str, head: str | None = None, repo: str = BASE) -> dict[str, str]:
    env = {"GITHUB_ACTIONS": "true", "GITHUB_EVENT_NAME": event, "GITHUB_REF": ref, "GITHUB_REPOSITORY": repo}
    if head is not None:
        path = tmp_path / f"event-{head.replace('/', '-')}.json"
        path.write_text(json.dumps({"pull_request": {"head": {"repo": {"full_name": head}}}}))
        env["GITHUB_EVENT_PATH"] = str(path)
    return env


def as_job(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)


@pytest.mark.parametrize(
    "event,ref,head,scope",
    [
        ("push", "refs/heads/main", None, "main"),
        ("workflow_dispatch", "refs/heads/main", None, "main"),
        ("schedule", "refs/heads/main", None, "main"),
        ("push", "refs/heads/feature", None, "branch"),
        ("workflow_dispatch", "refs/heads/feature", None, "branch"),
        ("push", "refs/tags/v1", None, "branch"),
        ("pull_request", "refs/pull/7/merge", BASE, "pr"),
        ("pull_request", "refs/pull/7/merge", "Kiln-Org/Kiln", "pr"),
        ("pull_request", "refs/pull/7/merge", "mallory/kiln", "fork"),
        (
            "pull_request",
            "refs/heads/main",
            "mallory/kiln",
            "fork",
        ),  # a pull request is never main, whatever its ref
        ("pull_request_target", "refs/heads/main", "mallory/kiln", "fork"),
        ("pull_request", "refs/pull/7/merge", None, "fork"),  # no payload: the head repository is unknown
        ("issue_comment", "refs/heads/main", None, "fork"),  # an event the harness does not know
    ],
)
def test_the_scope_follows_the_event_ref_and_head_repository(tmp_path, event, ref, head, scope):
    assert trust.derive(gh(tmp_path, event, ref, head))[0] == scope


def test_outside_github_is_local_and_an_incomplete_github_environment_is_a_fork(tmp_path):
    assert trust.derive({}) == ("local", "no GitHub Actions environment")
    assert trust.derive({"GITHUB_ACTIONS": "true"})[0] == "fork"
    assert (
        trust.derive(
            {"GITHUB_ACTIONS": "true", "GITHUB_EVENT_NAME": "push", "GITHUB_REF": "refs/heads/main"}
        )[0]
        == "fork"
    )  # no repository: nothing to compare a head with
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    env = {**gh(tmp_path, "pull_request", "refs/pull/1/merge"), "GITHUB_EVENT_PATH": str(bad)}
    assert trust.derive(env)[0] == "fork"


@pytest.mark.parametrize(
    "derived_env,asked,scope",
    [
        (("push", "refs/heads/main", None), "pr", "pr"),
        (("push", "refs/heads/main", None), "untrusted", "fork"),
        (("push", "refs/heads/main", None), "main", "main"),
        (("pull_request", "refs/pull/7/merge", BASE), "fork", "fork"),
        (None, "pr", "pr"),
    ],
)
def test_kiln_cache_scope_may_narrow(tmp_path, derived_env, asked, scope):
    env = gh(tmp_path, *derived_env) if derived_env else {}
    t = trust.resolve({**env, "KILN_CACHE_SCOPE": asked})
    assert t.scope == scope and (t.derived != t.scope or asked == scope)


@pytest.mark.parametrize(
    "derived_env,asked",
    [
        (("pull_request", "refs/pull/7/merge", "mallory/kiln"), "main"),
        (("pull_request", "refs/pull/7/merge", BASE), "main"),
        (("pull_request", "refs/pull/7/merge", BASE), "branch"),
        (("push", "refs/heads/feature", None), "main"),
        (None, "main"),
        (None, "branch"),
        (None, "nonsense"),
    ],
)
def test_kiln_cache_scope_never_widens(tmp_path, derived_env, asked):
    env = gh(tmp_path, *derived_env) if derived_env else {}
    with pytest.raises(SettingsError, match="KILN_CACHE_SCOPE"):
        trust.resolve({**env, "KILN_CACHE_SCOPE": asked})


def test_a_widening_setting_stops_every_verb_with_one_line(tmp_path, monkeypatch):
    as_job(
        monkeypatch,
        {**gh(tmp_path, "pull_request", "refs/pull/7/merge", "mallory/kiln"), "KILN_CACHE_SCOPE": "main"},
    )
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "trust"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().count("\n") == 0 and "would widen this job's trust: it is fork" in proc.stderr


def test_the_trust_verb_lists_the_scope_and_its_folders(tmp_path, monkeypatch):
    as_job(monkeypatch, gh(tmp_path, "pull_request", "refs/pull/7/merge", BASE))
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "trust", "--json", "-"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["scope"] == "pr"
    where = {r["what"]: r["where"] for r in out["folders"]}
    assert "/pr/" in where["kiln's graph and front caches (native)"] and "/pr/" in where["test history"]
    assert where["images this job builds"].startswith("kiln-<backend>-pr:")


def test_scoped_paths_and_image_names():
    p = Path("/h/.local/share/kiln/history/history.sqlite")
    assert trust.scoped_path(p, "main") == p and trust.scoped_path(p, "local") == p
    assert trust.scoped_path(p, "pr") == Path("/h/.local/share/kiln/history/pr/history.sqlite")
    assert trust.scoped_image("kiln-cpu:0123456789abcdef", "main") == "kiln-cpu:0123456789abcdef"
    assert trust.scoped_image("kiln-cpu:0123456789abcdef", "fork") == "kiln-cpu-fork:0123456789abcdef"
    assert trust.scoped_image("reg:5000/kiln/base", "pr") == "reg:5000/kiln/base-pr"


# ---- compiler caches (item: every lasting cache scoped) --------------------------------------------------


CACHE_VARS = (
    "TRITON_CACHE_DIR",
    "KILN_CACHE_DIR",
    "KILN_GRAPH_CACHE_DIR",
    "KILN_AUTOTUNE_DIR",
    "TORCHINDUCTOR_CACHE_DIR",
)


def _clear_cache_vars(monkeypatch):
    for name in CACHE_VARS:
        monkeypatch.delenv(name, raising=False)


def test_untrusted_and_main_jobs_never_share_a_cache_folder(tmp_path, monkeypatch):
    _clear_cache_vars(monkeypatch)
    monkeypatch.setenv("TRITON_CACHE_DIR", "/runner/wide/triton")  # a runner-wide setting: not in CI
    envs = {}
    for name, job in {
        "fork": gh(tmp_path, "pull_request", "refs/pull/7/merge", "mallory/kiln"),
        "pr": gh(tmp_path, "pull_request", "refs/pull/7/merge", BASE),
        "branch": gh(tmp_path, "push", "refs/heads/x"),
        "main": gh(tmp_path, "push", "refs/heads/main"),
    }.items():
        as_job(monkeypatch, job)
        envs[name] = commands.native_cache_env()
        assert set(CACHE_VARS) <= set(envs[name]), name
    folders = {name: {Path(env[v]) for v in CACHE_VARS} for name, env in envs.items()}
    for a, mine in folders.items():
        for b, theirs in folders.items():
            if a != b:
                assert not any(x == y or y in x.parents or x in y.parents for x in mine for y in theirs), (
                    a,
                    b,
                )
    assert envs["main"]["KILN_CACHE_AUTH"] == "1" and all(
        "KILN_CACHE_AUTH" not in envs[n] for n in ("pr", "fork")
    )


def test_the_cache_key_reaches_main_only(tmp_path, monkeypatch):
    _clear_cache_vars(monkeypatch)
    monkeypatch.setenv("KILN_CACHE_KEY", "s3cret")
    as_job(monkeypatch, gh(tmp_path, "pull_request", "refs/pull/7/merge", BASE))
    _, env = commands.native_command(["python"], commands.native_cache_env(), src=REPO)
    assert "KILN_CACHE_KEY" not in env
    as_job(monkeypatch, gh(tmp_path, "push", "refs/heads/main"))
    _, env = commands.native_command(["python"], commands.native_cache_env(), src=REPO)
    assert env["KILN_CACHE_KEY"] == "s3cret" and env["KILN_CACHE_AUTH"] == "1"


def test_containers_get_their_scopes_folder_and_only_main_the_key(tmp_path, monkeypatch):
    from harness import matrix
    from harness.suites import place

    key = tmp_path / "cache.key"
    key.write_text("s3cret\n")
    monkeypatch.setenv("KILN_CACHE_KEY_FILE", str(key))
    monkeypatch.setattr("harness.images.cleanup.mark_used", lambda image: None)
    b = matrix.load(REPO / "ci" / "matrix.json").backend("cpu")
    argvs = {}
    for name, job in {
        "pr": gh(tmp_path, "pull_request", "refs/pull/7/merge", BASE),
        "main": gh(tmp_path, "push", "refs/heads/main"),
    }.items():
        as_job(monkeypatch, job)
        argvs[name] = " ".join(
            commands.container_argv(
                b,
                "kiln-cpu:0123456789abcdef",
                ["true"],
                src=REPO,
                env={},
                **place.container_extras(b, "kiln-cpu:0123456789abcdef"),
            )
        )
    assert "/pr/kiln-cpu-0123456789abcdef:/cache " in argvs["pr"] and "/main/" not in argvs["pr"]
    assert "kiln-cache.key" not in argvs["pr"] and "KILN_CACHE_AUTH" not in argvs["pr"]
    assert f"{key}:/run/kiln-cache.key:ro" in argvs["main"] and "KILN_CACHE_AUTH=1" in argvs["main"]
    assert "s3cret" not in argvs["main"]  # never on a command line


def test_the_compile_check_compiles_in_its_scopes_folders(tmp_path, monkeypatch):
    from harness.checks import compile_check

    _clear_cache_vars(monkeypatch)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "users-own-triton"))
    monkeypatch.setenv("KILN_CACHE_KEY", "s3cret")
    as_job(monkeypatch, gh(tmp_path, "pull_request", "refs/pull/7/merge", BASE))
    env = compile_check.compiler_env()
    scope_root = settings().compile_cache / "pr"
    assert all(scope_root in Path(env[v]).parents for v in CACHE_VARS)
    assert "KILN_CACHE_KEY" not in env and "TRITON_INTERPRET" not in env
    seen = {}

    def fake_execute(cmd, *, env, **kw):
        seen.update(env)
        return 0, False

    monkeypatch.setattr(compile_check, "execute", fake_execute)
    compile_check.dump_kernels(tmp_path / "dump", ["tests/x.py"], REPO, tmp_path / "log")
    assert all(scope_root in Path(seen[v]).parents for v in CACHE_VARS) and "KILN_CACHE_KEY" not in seen


def test_a_verb_runs_in_its_scopes_folders_without_the_key(tmp_path, monkeypatch):
    _clear_cache_vars(monkeypatch)
    monkeypatch.setenv("KILN_CACHE_KEY", "s3cret")
    as_job(monkeypatch, gh(tmp_path, "pull_request", "refs/pull/7/merge", "mallory/kiln"))
    code = (
        "import os, sys; from harness.commands import scope_this_process; scope_this_process(); "
        "print(os.environ['TORCHINDUCTOR_CACHE_DIR']); print(os.environ.get('KILN_CACHE_KEY'))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    inductor, key = proc.stdout.split()
    assert "/fork/" in inductor and key == "None" and "not handed to this job's processes" in proc.stderr


# ---- stores, durations, images ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "job,writes",
    [
        (("push", "refs/heads/main", None), True),
        (("workflow_dispatch", "refs/heads/feature", None), False),
        (("pull_request", "refs/pull/7/merge", BASE), False),
        (("pull_request", "refs/pull/7/merge", "mallory/kiln"), False),
    ],
)
def test_only_main_writes_the_fleet_store_whatever_url_it_is_given(tmp_path, monkeypatch, job, writes):
    from harness.store import cli, url

    as_job(monkeypatch, {**gh(tmp_path, *job), "KILN_STORE_URL": "postgresql://kiln@db.invalid/kiln"})
    assert (cli.configured(write=True) is not None) is writes
    assert cli.configured(write=False) is not None  # reading stays open
    server = url.parse("postgresql://kiln@db.invalid/kiln")
    if writes:
        assert cli.guard_write(server) is server
    else:
        assert fleet_settings().read_only
        with pytest.raises(UsageError, match="never writes a store server"):
            cli.location("postgresql://kiln@db.invalid/kiln", tmp_path / "h.sqlite", write=True)
        assert (
            cli.location(tmp_path / "own.sqlite", tmp_path / "h.sqlite", write=True)
            == tmp_path / "own.sqlite"
        )


def test_a_pull_request_cannot_push_into_the_fleet_store(tmp_path, monkeypatch):
    as_job(monkeypatch, gh(tmp_path, "pull_request", "refs/pull/7/merge", BASE))
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "store", "push", "--to", "postgresql://kiln@db.invalid/k"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (
        proc.returncode == 2
        and "trust scope pr" in proc.stderr
        and "never writes a store server" in proc.stderr
    )


def test_untrusted_history_and_durations_never_feed_mains(tmp_path, monkeypatch):
    from harness.suites.shard import lasting_durations_path

    history = tmp_path / "lasting" / "history" / "history.sqlite"
    monkeypatch.setenv("KILN_HISTORY_DB", str(history))
    monkeypatch.setenv("KILN_STORE_SPOOL", str(tmp_path / "spool.sqlite"))
    as_job(monkeypatch, gh(tmp_path, "push", "refs/heads/main"))
    main = (settings().history_db, lasting_durations_path("cpu"), fleet_settings().spool)
    assert main == (history, history.parent / "durations" / "cpu.json", tmp_path / "spool.sqlite")
    for job in (("pull_request", "refs/pull/7/merge", BASE), ("push", "refs/heads/feature", None)):
        as_job(monkeypatch, gh(tmp_path, *job))
        mine = (settings().history_db, lasting_durations_path("cpu"), fleet_settings().spool)
        assert all(a != b and b not in a.parents for a, b in zip(mine, main)), mine
        assert all(main[0].parent in p.parents for p in mine[:2])  # beside main's, in a folder of the scope


def test_an_untrusted_bench_record_never_writes_mains_lasting_store(tmp_path, monkeypatch):
    from harness.bench import cli

    monkeypatch.setenv("KILN_BENCH_STORE", str(tmp_path / "bench" / "{backend}.sqlite"))
    opened = []
    monkeypatch.setattr(
        "harness.bench.stores.store.open_lasting", lambda path, write: opened.append((path, write))
    )
    as_job(monkeypatch, gh(tmp_path, "pull_request", "refs/pull/7/merge", BASE))
    cli.open_bench_store(None, "cpu", write=True)
    cli.open_bench_store(None, "cpu", write=False)
    assert opened == [
        (tmp_path / "bench" / "pr" / "cpu.sqlite", True),
        (tmp_path / "bench" / "cpu.sqlite", False),
    ]


def test_images_built_by_untrusted_jobs_never_carry_mains_names(tmp_path, monkeypatch):
    from harness import matrix
    from harness.images import cleanup, image

    cpu = matrix.load(REPO / "ci" / "matrix.json").backend("cpu")
    present: set[str] = set()
    built = []
    monkeypatch.setattr(image, "require_docker", lambda: None)
    monkeypatch.setattr(image, "require_lock", lambda b, allow=None: type("L", (), {"digest": "sha256:1"})())
    monkeypatch.setattr(image, "resolve_base", lambda b, base_image=None, bootstrap=None: "base:1")
    monkeypatch.setattr(image, "image_id", lambda ref: "sha256:x" if ref in present else None)
    monkeypatch.setattr(image, "prepare_context", lambda b, root=None: tmp_path)

    def fake_execute(argv, **kw):
        tag = argv[argv.index("--tag") + 1]
        built.append(tag)
        present.add(tag)
        return 0, False

    monkeypatch.setattr(image, "execute", fake_execute)
    as_job(monkeypatch, gh(tmp_path, "pull_request", "refs/pull/7/merge", "mallory/kiln"))
    mains = image.image_tag(cpu, "base:1")
    got = image.build(cpu)
    assert (
        built == [got.tag]
        and got.tag == trust.scoped_image(mains, "fork")
        and got.tag.startswith("kiln-cpu-fork:")
    )
    assert image.build(cpu, force=True).tag == got.tag  # forced: still its own name
    present.add(mains)  # main built these inputs: the fork runs main's image (same inputs), tags nothing
    assert image.build(cpu).tag == mains and len(built) == 2
    monkeypatch.setattr(image, "current_tag", lambda b, base_image=None: f"{b.image}:0123456789abcdef")
    keep = cleanup.current_tags(matrix.load(REPO / "ci" / "matrix.json"))
    assert "kiln-cpu" not in keep and keep["kiln-cpu-fork"] == "kiln-cpu-fork:0123456789abcdef"
