"""The record of a run: what run.json holds, typed, in one place.

Terms:
  RunRecord     one run folder's run.json: a plain run (`harness run`, one shard of one) or a merged run
                (`harness merge`, `run --shards`: `shards` is set, `suites` empty on disk).
  SuiteRecord   one suite of a run: its status, JUnit and log paths, exit status, counts, and under crash
                isolation its pytest processes (`attempts`), crashes, tests not run; `retries` when failed
                tests were rerun alone. In memory only, a merged run's suite holds its shards' records.
  ShardRecord   one shard of a merged run: status, reason, folder, GPUs, wall seconds.
  RetryRecord   one failed test rerun alone (harness.suites.retries): its attempts (AttemptRecord), flaky or failing.
  CrashRecord   a test whose process ended while it ran (harness.suites.isolation).
  TestOutcome   one test case of a JUnit file, classified (Outcome).
  schema        SCHEMA_VERSION (3) is written; schema 1 (the same keys, written before this module) and 2 (without
                `commit` and `seeds`) are read as they are, those two keys then None and empty.
  commit        the source tree the run tested (schema 3): git sha, dirty (tracked files changed), the dirty files,
                the branch; None when it was not a git checkout. `harness repro` checks this commit out.
  seeds         the seed variables the suites ran with (schema 3; PYTHONHASHSEED and any *_SEED of the suites'
                environment), applied again by `harness repro`; the tests seed torch and random themselves.

`RunRecord.to_json()` gives run.json's dict; `RunRecord.from_json(data, where)` reads one back and raises a
one-line ResultsError naming `where` when it is malformed. Records are frozen: the runner makes new ones with
`dataclasses.replace`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

from harness.exc import ResultsError

SCHEMA_VERSION = 3
READABLE_SCHEMAS = (1, 2, 3)


class Outcome(StrEnum):
    """A test case's outcome: failed is an assertion (or strict xpass), error a setup/teardown/collection
    error, crash or timeout, xfailed an expected failure that failed."""

    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    SKIPPED = "skipped"
    XFAILED = "xfailed"


OUTCOMES = tuple(o.value for o in Outcome)
FAILING = (Outcome.FAILED.value, Outcome.ERROR.value)
PASSED = (Outcome.PASSED.value, Outcome.XFAILED.value)  # as harness.suites.quarantine counts a pass


class RunStatus(StrEnum):
    """running -> complete, or incomplete (interrupted, an error) / aborted (health check); a merged run may be
    inconsistent (its shards do not partition the tests)."""

    RUNNING = "running"
    COMPLETE = "complete"
    INCOMPLETE = "incomplete"
    ABORTED = "aborted"
    INCONSISTENT = "inconsistent"


class SuiteStatus(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    EMPTY = "empty"
    TIMEOUT = "timeout"
    ERROR = "error"
    MISSING = "missing"
    INTERRUPTED = "interrupted"


class ShardStatus(StrEnum):
    COMPLETE = "complete"
    INCOMPLETE = "incomplete"
    ABORTED = "aborted"
    CRASHED = "crashed"
    HUNG = "hung"
    MISSING = "missing"


class RetryStatus(StrEnum):
    """flaky: failed in one attempt and passed in another; failing: passed in none."""

    FLAKY = "flaky"
    FAILING = "failing"


@dataclass(frozen=True)
class TestOutcome:
    """One test case from a JUnit file."""

    __test__ = False  # not a pytest test class

    id: str
    outcome: Outcome
    message: str
    duration_s: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "outcome", Outcome(self.outcome))

    @property
    def failing(self) -> bool:
        return self.outcome in FAILING

    @property
    def headline(self) -> str:
        """The message's first non-empty line (messages may span lines)."""
        return next((ln.strip() for ln in self.message.splitlines() if ln.strip()), "")

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "outcome": self.outcome.value,
            "message": self.message,
            "duration_s": self.duration_s,
        }


@dataclass(frozen=True)
class CrashRecord:
    """A test whose process ended while it ran (harness.suites.isolation): why, exit status, the attempt (process) it
    ran in, that process's log and its last lines."""

    id: str
    reason: str
    returncode: int | None
    attempt: int
    log: str
    tail: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class AttemptRecord:
    """One run of a failed test: 0 is the suite's run, 1.. the reruns alone (harness.suites.retries)."""

    n: int
    outcome: str
    message: str
    log: str  # relative to the run folder
    duration_s: float = 0.0
    returncode: int | None = None
    junit: str = ""


@dataclass(frozen=True)
class RetryRecord:
    """A failed test and its attempts, classified (harness.suites.retries)."""

    __test__ = False

    id: str
    suite: str
    status: str  # RetryStatus
    attempts: tuple[AttemptRecord, ...]

    @property
    def outcomes(self) -> list[str]:
        return [a.outcome for a in self.attempts]

    @property
    def failing_log(self) -> str:
        """The log of the first failing attempt (the suite run's failure text)."""
        return next((a.log for a in self.attempts if a.outcome in FAILING), "")

    @property
    def passed_on(self) -> int | None:
        """The attempt that passed (None when none did)."""
        return next((a.n for a in self.attempts if a.outcome in PASSED), None)

    def describe(self) -> str:
        """`failed, failed, passed (passed on retry 2)` or `failed 3 of 3 attempts`."""
        if self.status == RetryStatus.FLAKY:
            return f"{', '.join(self.outcomes)} (passed on retry {self.passed_on})"
        failed = sum(o in FAILING for o in self.outcomes)
        return f"failed {failed} of {len(self.attempts)} attempts ({', '.join(self.outcomes)})"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "suite": self.suite,
            "status": str(self.status),
            "attempts": [asdict(a) for a in self.attempts],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], prefix: str = "") -> RetryRecord:
        """From run.json; `prefix` (a shard's folder) is put before every path."""

        def place(p: str) -> str:
            return f"{prefix}/{p}" if prefix and p else p

        attempts = tuple(
            AttemptRecord(**{**a, "log": place(a.get("log", "")), "junit": place(a.get("junit", ""))})
            for a in data.get("attempts", [])
        )
        return cls(data["id"], data.get("suite", ""), data.get("status", RetryStatus.FAILING.value), attempts)

    def placed(self, prefix: str) -> RetryRecord:
        """This record with `prefix` (a shard's folder in a merged run) before every path."""
        return RetryRecord.from_json(self.to_json(), prefix)


@dataclass(frozen=True)
class SuiteRetries:
    """A suite's reruns: the policy they ran under, the tests rerun, the failed tests left without a rerun."""

    attempts: int
    max_tests: int
    tests: tuple[RetryRecord, ...] = ()
    not_retried: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "attempts": self.attempts,
            "max_tests": self.max_tests,
            "tests": [r.to_json() for r in self.tests],
            "not_retried": list(self.not_retried),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SuiteRetries:
        return cls(
            int(data.get("attempts", 0)),
            int(data.get("max_tests", 0)),
            tuple(RetryRecord.from_json(t) for t in data.get("tests", [])),
            tuple(data.get("not_retried", [])),
        )


@dataclass(frozen=True)
class ProcessRecord:
    """One pytest process of an isolated suite (the first, then one per resume after a crash)."""

    log: str
    returncode: int | None
    duration_s: float


@dataclass(frozen=True)
class SuiteRecord:
    """One suite of a run (module docstring). The isolation fields are None for a suite run without it."""

    name: str
    status: SuiteStatus
    junit: str = ""
    log: str = ""
    returncode: int | None = None
    timed_out: bool = False
    duration_s: float = 0.0
    counts: Mapping[str, int] = field(default_factory=lambda: {o: 0 for o in OUTCOMES})
    argv: tuple[str, ...] = ()
    attempts: tuple[ProcessRecord, ...] | None = None
    crashes: tuple[CrashRecord, ...] | None = None
    not_run: tuple[str, ...] | None = None
    collect_failed: str | None = None
    ended_badly: str | None = None
    retries: SuiteRetries | None = None
    shards: Mapping[int, SuiteRecord] | None = None  # merged runs, in memory only: shard index -> its suite

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "status": str(self.status),
            "junit": self.junit,
            "log": self.log,
            "returncode": self.returncode,
            "timed_out": self.timed_out,
            "duration_s": self.duration_s,
            "counts": dict(self.counts),
            "argv": list(self.argv),
        }
        if self.attempts is not None:
            out["attempts"] = [asdict(a) for a in self.attempts]
        if self.crashes is not None:
            out["crashes"] = [c.to_json() for c in self.crashes]
        for key in ("not_run", "collect_failed", "ended_badly"):
            value = getattr(self, key)
            if value is not None:
                out[key] = list(value) if isinstance(value, tuple) else value
        if self.retries is not None:
            out["retries"] = self.retries.to_json()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SuiteRecord:
        def opt(key: str, make: Any) -> Any:
            return make(data[key]) if data.get(key) is not None else None

        return cls(
            str(data["name"]),
            SuiteStatus(data.get("status", "error")),
            str(data.get("junit") or ""),
            str(data.get("log") or ""),
            data.get("returncode"),
            bool(data.get("timed_out", False)),
            float(data.get("duration_s") or 0.0),
            {str(k): int(v) for k, v in (data.get("counts") or {}).items()},
            tuple(data.get("argv") or ()),
            opt("attempts", lambda xs: tuple(ProcessRecord(**x) for x in xs)),
            opt("crashes", lambda xs: tuple(CrashRecord(**x) for x in xs)),
            opt("not_run", tuple),
            opt("collect_failed", str),
            opt("ended_badly", str),
            opt("retries", SuiteRetries.from_json),
        )


@dataclass(frozen=True)
class ShardRecord:
    """One shard of a merged run (harness.suites.merge): `dir` is its folder under the merged one ("" when none)."""

    index: int
    count: int
    status: ShardStatus
    reason: str = ""
    dir: str = ""
    devices: tuple[str, ...] = ()
    wall_s: float | None = None
    run_id: str | None = None
    started: str | None = None
    finished: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "status": str(self.status), "devices": list(self.devices)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ShardRecord:
        return cls(
            int(data["index"]),
            int(data["count"]),
            ShardStatus(data["status"]),
            str(data.get("reason") or ""),
            str(data.get("dir") or ""),
            tuple(data.get("devices") or ()),
            data.get("wall_s"),
            data.get("run_id"),
            data.get("started"),
            data.get("finished"),
        )


@dataclass(frozen=True)
class ShardSpec:
    """Which shard of a split a plain run ran (`--shard I/N`) and the durations file it was balanced by."""

    index: int
    count: int
    durations: str | None = None


@dataclass(frozen=True)
class HealthRecord:
    ok: bool
    log: str


@dataclass(frozen=True)
class RetryPolicy:
    """How failed tests were rerun: up to `attempts` times each, at most `max_tests` per suite."""

    attempts: int
    max_tests: int


SEED_VARIABLES = ("PYTHONHASHSEED",)  # and any variable ending in _SEED


def seeds_of(env: Mapping[str, str]) -> dict[str, str]:
    """The seed variables of a suites' environment: PYTHONHASHSEED and every *_SEED (the record's `seeds`)."""
    return {k: str(v) for k, v in sorted(env.items()) if k in SEED_VARIABLES or k.endswith("_SEED")}


# the keys a merged run.json copies from its first shard (harness.suites.merge), the rest being per shard
SHARED_KEYS = (
    "backend",
    "mode",
    "src",
    "python",
    "docker",
    "image",
    "pytest_extra",
    "test_timeout_s",
    "suite_timeout_s",
    "per_test_timeout",
    "retries",
    "quarantine",
    "commit",
    "seeds",
)


@dataclass(frozen=True)
class RunRecord:
    """One run.json (module docstring). `quarantine` is the entries in force as recorded (Quarantine.to_json);
    None for a run from before it was recorded. `shards` is set for a merged run only."""

    run_id: str
    backend: str
    status: RunStatus
    mode: str = ""
    started: str | None = None
    src: str | None = None
    python: str | None = None
    docker: str = "docker"
    image: Mapping[str, Any] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    container_options: tuple[str, ...] | None = None
    test_timeout_s: float | None = None
    suite_timeout_s: float | None = None
    pytest_extra: tuple[str, ...] = ()
    per_test_timeout: bool = True
    devices: tuple[str, ...] = ()
    retries: RetryPolicy | None = None
    history: str | None = None
    quarantine: Mapping[str, Any] | None = None
    health: HealthRecord | None = None
    shard: ShardSpec | None = None
    suites: tuple[SuiteRecord, ...] = ()
    finished: str | None = None
    wall_s: float | None = None
    reason: str | None = None
    shards: tuple[ShardRecord, ...] | None = None
    shard_count: int | None = None
    problems: tuple[str, ...] = ()
    commit: Mapping[str, Any] | None = None
    seeds: Mapping[str, str] = field(default_factory=dict)
    schema: int = SCHEMA_VERSION

    @property
    def merged(self) -> bool:
        return self.shards is not None

    @property
    def complete(self) -> bool:
        return self.status == RunStatus.COMPLETE

    def with_suite(self, suite: SuiteRecord) -> RunRecord:
        """This record with `suite` added, or put in place of the last suite of its name."""
        suites = list(self.suites)
        if suites and suites[-1].name == suite.name:
            suites[-1] = suite
        else:
            suites.append(suite)
        return replace(self, suites=tuple(suites))

    def to_json(self) -> dict[str, Any]:
        """run.json's dict: the keys a plain run (or a merged one) wrote before records, and schema 3's `commit` and
        `seeds` when known."""
        out: dict[str, Any] = {
            "schema": SCHEMA_VERSION,
            "run_id": self.run_id,
            "backend": self.backend,
            "mode": self.mode,
            "status": str(self.status),
            "started": self.started,
            "src": self.src,
            "suites": [s.to_json() for s in self.suites],
            "history": self.history,
        }
        shared = {
            "python": self.python,
            "docker": self.docker,
            "image": dict(self.image) if self.image else None,
            "pytest_extra": list(self.pytest_extra),
            "test_timeout_s": self.test_timeout_s,
            "suite_timeout_s": self.suite_timeout_s,
            "per_test_timeout": self.per_test_timeout,
            "retries": asdict(self.retries) if self.retries else None,
        }
        if self.merged:
            out.update({k: v for k, v in shared.items() if v is not None})
            out.update(
                shard_count=self.shard_count,
                shards=[s.to_json() for s in self.shards or ()],
                problems=list(self.problems),
            )
        else:
            out.update(
                shared,
                env=dict(self.env),
                container_options=list(self.container_options or ()),
                devices=list(self.devices),
                health=asdict(self.health) if self.health else None,
            )
            if self.shard is not None:
                out["shard"] = asdict(self.shard)
        if self.quarantine is not None:
            out["quarantine"] = dict(self.quarantine)
        if self.commit is not None:
            out["commit"] = dict(self.commit)
        if self.seeds:
            out["seeds"] = dict(self.seeds)
        for key in ("finished", "wall_s", "reason"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    @classmethod
    def from_json(cls, data: Any, where: str = "run.json") -> RunRecord:
        """A run.json of schema 1, 2 or 3; a malformed one raises ResultsError naming `where`."""
        if not isinstance(data, dict) or "backend" not in data:
            raise ResultsError(f"{where} is not a harness run manifest")
        schema = data.get("schema", 1)
        if schema not in READABLE_SCHEMAS:
            raise ResultsError(
                f"{where} has schema {schema!r}; this harness reads schemas "
                f"{', '.join(map(str, READABLE_SCHEMAS))}"
            )
        try:
            return cls._parse(data)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ResultsError(f"{where} is malformed: {type(e).__name__}: {e}") from None

    @classmethod
    def _parse(cls, d: dict[str, Any]) -> RunRecord:
        def opt(key: str, make: Any) -> Any:
            return make(d[key]) if d.get(key) is not None else None

        retries = d.get("retries")
        shard = d.get("shard")
        return cls(
            run_id=str(d.get("run_id") or ""),
            backend=str(d["backend"]),
            status=RunStatus(d.get("status", "running")),
            mode=str(d.get("mode") or ""),
            started=d.get("started"),
            src=d.get("src"),
            python=d.get("python"),
            docker=str(d.get("docker") or "docker"),
            image=opt("image", dict),
            env=dict(d.get("env") or {}),
            container_options=tuple(d["container_options"]) if "container_options" in d else None,
            test_timeout_s=d.get("test_timeout_s"),
            suite_timeout_s=d.get("suite_timeout_s"),
            pytest_extra=tuple(d.get("pytest_extra") or ()),
            per_test_timeout=bool(d.get("per_test_timeout", True)),
            devices=tuple(d.get("devices") or ()),
            retries=RetryPolicy(int(retries["attempts"]), int(retries["max_tests"])) if retries else None,
            history=d.get("history"),
            quarantine=d["quarantine"] or {"entries": []} if "quarantine" in d else None,
            health=HealthRecord(bool(d["health"]["ok"]), str(d["health"].get("log", "")))
            if d.get("health")
            else None,
            shard=ShardSpec(int(shard["index"]), int(shard["count"]), shard.get("durations"))
            if isinstance(shard, dict)
            else None,
            suites=tuple(SuiteRecord.from_json(s) for s in d.get("suites") or ()),
            finished=d.get("finished"),
            wall_s=d.get("wall_s"),
            reason=d.get("reason"),
            shards=opt("shards", lambda xs: tuple(ShardRecord.from_json(x) for x in xs)),
            shard_count=d.get("shard_count"),
            problems=tuple(d.get("problems") or ()),
            commit=opt("commit", dict),
            seeds={str(k): str(v) for k, v in (d.get("seeds") or {}).items()},
            schema=int(d.get("schema", 1)),
        )
