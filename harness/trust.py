"""The trust scope of a job: what the event, ref and repository say about who wrote the code it runs, and what
that lets the job read and write on a runner that other jobs share (README: Trust on a shared runner fleet).

Scopes, most trusted first (SCOPES):
  main    a push, manual dispatch or schedule on refs/heads/main of the repository: reviewed code. The only
          scope that writes the fleet store, main's durations and the image tags main reuses, and the only one
          whose on-disk kernel and graph caches must be authenticated (KILN_CACHE_AUTH: entries carry an HMAC
          keyed by the runner secret KILN_CACHE_KEY / KILN_CACHE_KEY_FILE, and without that key it loads none).
  branch  a push, dispatch or schedule of this repository on any other ref: code someone with write access
          pushed, not reviewed.
  local   no GitHub Actions environment: a developer's machine, the lead's `.ci/run`. Caches as before.
  pr      a pull request whose head branch is in this repository.
  fork    a pull request from another repository (or one whose head repository cannot be read), and any event
          the harness does not know: the least trust.

Derivation (`derive`) reads GITHUB_ACTIONS, GITHUB_EVENT_NAME, GITHUB_REF, GITHUB_REPOSITORY and, for pull
request events, `pull_request.head.repo.full_name` of the event payload at GITHUB_EVENT_PATH. A GitHub
environment that is incomplete or unreadable derives `fork`: missing facts never add trust.

KILN_CACHE_SCOPE, when set, may only narrow the derived scope (name one lower in SCOPES; `untrusted` is `fork`);
naming a scope above the derived one is a SettingsError (one line, exit 2), so a workflow line or a runner's
environment cannot lend a pull request main's folders.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from harness.exc import SettingsError

SCOPES = ("main", "branch", "local", "pr", "fork")  # most trusted first
ALIASES = {"untrusted": "fork"}
MAIN_REF = "refs/heads/main"
TRUSTED_EVENTS = frozenset({"push", "workflow_dispatch", "schedule"})
PULL_REQUEST_EVENTS = frozenset(
    {"pull_request", "pull_request_target", "pull_request_review", "pull_request_review_comment"}
)
KEY_VARIABLES = ("KILN_CACHE_KEY", "KILN_CACHE_KEY_FILE")  # the runner secret that signs main's cache entries


@dataclass(frozen=True)
class Trust:
    """A job's scope (`scope`), what the event alone gave (`derived`) and why, in words (`reason`)."""

    scope: str
    derived: str
    reason: str

    @property
    def trusted(self) -> bool:
        """Main's own work: what it writes, later main jobs load and the fleet relies on."""
        return self.scope == "main"

    @property
    def ci(self) -> bool:
        """A job of GitHub Actions (any scope but `local`)."""
        return self.scope != "local"

    @property
    def writes_fleet(self) -> bool:
        """May write the fleet store (KILN_STORE_URL) and push into it."""
        return self.scope in ("main", "local")

    @property
    def feeds_main(self) -> bool:
        """Its test history, durations and lasting bench results are the ones main reads (main's, and a
        developer's own machine, which has no other scope to keep apart)."""
        return self.scope in ("main", "local")

    @property
    def holds_key(self) -> bool:
        """May hold the cache key: main's jobs, and a machine outside CI (its own key, its own caches)."""
        return self.scope in ("main", "local")

    @property
    def auth_required(self) -> bool:
        """Its on-disk compiler caches load only entries signed with the runner's key (KILN_CACHE_AUTH)."""
        return self.scope == "main"

    def line(self) -> str:
        """One line for a job's log: the scope and why."""
        narrowed = (
            f" (narrowed from {self.derived} by KILN_CACHE_SCOPE)" if self.scope != self.derived else ""
        )
        return f"trust: scope {self.scope}{narrowed}: {self.reason}"


_heads: dict[tuple[str, int, int], str | None] = {}  # (payload path, size, mtime_ns) -> its head repository


def _head_repo(env: Mapping[str, str]) -> str | None:
    """`pull_request.head.repo.full_name` of the event payload, or None where it cannot be read (read once per
    payload file: settings() asks for the scope often)."""
    path = env.get("GITHUB_EVENT_PATH", "").strip()
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    memo = (path, st.st_size, st.st_mtime_ns)
    if memo not in _heads:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            name = data["pull_request"]["head"]["repo"]["full_name"]
        except (OSError, ValueError, KeyError, TypeError):
            name = None
        _heads[memo] = name if isinstance(name, str) and name else None
    return _heads[memo]


def derive(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(scope, reason) that the GitHub environment in `env` (default: this process's) gives; module docstring."""
    env = os.environ if env is None else env
    event = env.get("GITHUB_EVENT_NAME", "").strip()
    if env.get("GITHUB_ACTIONS", "").strip().lower() != "true" and not event:
        return "local", "no GitHub Actions environment"
    repo = env.get("GITHUB_REPOSITORY", "").strip()
    ref = env.get("GITHUB_REF", "").strip()
    if not event or not repo:
        return "fork", "a GitHub Actions job without GITHUB_EVENT_NAME or GITHUB_REPOSITORY"
    if event in PULL_REQUEST_EVENTS:
        head = _head_repo(env)
        if head is None:
            return "fork", f"{event} whose head repository the event payload does not name"
        if head.lower() != repo.lower():
            return "fork", f"{event} from {head} into {repo}"
        return "pr", f"{event} from a branch of {repo}"
    if event in TRUSTED_EVENTS:
        if ref == MAIN_REF:
            return "main", f"{event} on {ref} of {repo}"
        return "branch", f"{event} on {ref or 'no ref'} of {repo}"
    return "fork", f"event {event!r}, which the harness does not trust"


def resolve(env: Mapping[str, str] | None = None) -> Trust:
    """The job's Trust: the derived scope, narrowed by KILN_CACHE_SCOPE; a widening KILN_CACHE_SCOPE or an
    unknown name is a SettingsError."""
    env = os.environ if env is None else env
    derived, reason = derive(env)
    raw = env.get("KILN_CACHE_SCOPE", "").strip()
    if not raw:
        return Trust(derived, derived, reason)
    asked = ALIASES.get(raw.lower(), raw.lower())
    if asked not in SCOPES:
        raise SettingsError(f"KILN_CACHE_SCOPE={raw!r}: expected one of {', '.join(SCOPES)} (or untrusted)")
    if SCOPES.index(asked) < SCOPES.index(derived):
        raise SettingsError(
            f"KILN_CACHE_SCOPE={raw!r} would widen this job's trust: it is {derived} ({reason}); "
            f"a setting may only narrow it ({', '.join(SCOPES[SCOPES.index(derived) :])})"
        )
    return Trust(asked, derived, reason)


def scoped_path(path: Path, scope: str) -> Path:
    """A lasting file of this runner as `scope` may write it: `path` itself for scopes whose data main reads
    (main, local), else the same name in a folder of the scope beside it (history/history.sqlite of a pull
    request: history/pr/history.sqlite)."""
    if scope in ("main", "local"):
        return path
    return path.parent / _safe(scope) / path.name


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", name) or "local"


def untrusted_key_problem(t: Trust, env: Mapping[str, str] | None = None) -> str | None:
    """One line when the cache key reached a job that must not hold it (a setting to fix), else None."""
    env = os.environ if env is None else env
    given = [k for k in KEY_VARIABLES if env.get(k, "").strip()]
    if given and not t.holds_key:
        return (
            f"trust: {' and '.join(given)} set in scope {t.scope}: not handed to this job's processes (the "
            f"key that signs main's cache entries belongs to main's jobs only; README: Trust)"
        )
    return None


def key_missing(t: Trust, env: Mapping[str, str] | None = None) -> bool:
    """A scope that must authenticate its cache entries without a key to do it with."""
    env = os.environ if env is None else env
    return t.auth_required and not any(env.get(k, "").strip() for k in KEY_VARIABLES)


def scoped_image(ref: str, scope: str) -> str:
    """The name a job of `scope` gives an image it builds or imports: `ref` itself for main and local, else the
    repository with the scope appended (`kiln-cpu:3f2a...` of a pull request: `kiln-cpu-pr:3f2a...`), so that no
    image an untrusted job made ever carries a name main reuses."""
    if scope in ("main", "local"):
        return ref
    slash = ref.rfind("/")
    colon = ref.rfind(":")
    repo, tag = (ref[:colon], ref[colon:]) if colon > slash else (ref, "")
    return f"{repo}-{_safe(scope)}{tag}"
