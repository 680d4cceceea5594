"""Test results: JUnit XML parsed into classified records, and atomic writes of the results folder.

Terms:
  outcome    one of OUTCOMES: passed, failed (assertion/xpass-strict), error (setup/teardown/collection
             error, crash, timeout), skipped, xfailed (expected failure that failed).
  test id    the pytest node id, e.g. `tests/fallback/test_ops.py::TestX::test_y[2-fp32]`, which is
             what a repro line passes to pytest.
  results folder  results/<run id>/: run.json (manifest, status running/complete/incomplete),
             env.json, health.json, suites/<suite>.xml + .log, summary.json, report.txt/.md.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.exc import ResultsError
from harness.record import FAILING, OUTCOMES, Outcome, TestOutcome  # noqa: F401 - re-exported: res.FAILING, res.OUTCOMES

# what XML 1.0 cannot hold (C0 controls but tab, newline and return; U+FFFE, U+FFFF) and unpaired surrogates
# (UTF-8 cannot encode them): a test's message or output may hold any of them
_UNPRINTABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff\ufffe\uffff]")


def printable(text: str) -> str:
    """`text` with every character that XML 1.0 or UTF-8 cannot carry (and DEL, ESC's terminal codes) written as
    its Python escape (`\\x00`, `\\x1b`, `\\ud800`): what any test said survives, readable, into the JUnit
    files, the reports and the stores."""
    return _UNPRINTABLE.sub(
        lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}", text
    )


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` so readers see the old file or the new one, never half of one (a character UTF-8
    cannot encode, an unpaired surrogate, is written as its escape)."""
    atomic_write_bytes(path, text.encode("utf-8", "backslashreplace"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file and a rename.

    A path that exists and is no regular file (`/dev/null`, a FIFO, `/dev/stdout`) is written in place: renaming
    over it would replace the device with a file (as root, `--md /dev/null` turned /dev/null into a file)."""
    path = Path(path)
    if path.exists() and not path.is_file():
        with open(path, "wb") as fh:
            fh.write(data)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def unused_sibling(path: Path, label: str, tail: str = "") -> Path:
    """`<path>.<label>-<UTC time><tail>` beside `path`, or with `-1`, `-2`... after the time when that name is
    taken: the names of set-aside and backed-up stores, never over an existing file."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    found, k = path.with_name(f"{path.name}.{label}-{stamp}{tail}"), 1
    while found.exists():
        found, k = path.with_name(f"{path.name}.{label}-{stamp}-{k}{tail}"), k + 1
    return found


def set_aside(path: Path) -> Path:
    """Rename a damaged SQLite store `path` (and its -wal/-shm files) to `<path>.corrupt-<UTC time>`, never
    over an existing file; returns the new path. The test history and the bench's lasting stores use it."""
    aside = unused_sibling(path, "corrupt")
    os.rename(path, aside)  # same folder: a rename, never a copy over something
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            os.rename(side, aside.with_name(aside.name + suffix))
    return aside


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> list[str]:
    """The lines of a Markdown table: header, rule, one line per row (a `|` inside a cell is escaped).
    `align` has a letter per column, `l` or `r` (right: numbers); missing letters are left. Every report of
    the harness (run, flakes, compile-check, bench, numerics) builds its tables with it."""

    def line(cells: Sequence[object]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    rule = "|" + "".join("---:|" if align[i : i + 1] == "r" else "---|" for i in range(len(header)))
    return [line(header), rule, *map(line, rows)]


def append_job_summary(markdown: str, *, force: bool = False) -> bool:
    """Append `markdown` to the GitHub Actions job summary when running there and asked to (`--github-summary`,
    which sets KILN_GITHUB_SUMMARY; `force`: the verbs that exist to write it); True when it was written.
    The one writer of the job summary for every harness report."""
    from harness.settings import settings

    s = settings()
    target = s.github_step_summary
    if not target or not (force or s.github_summary):
        return False
    with open(target, "a", encoding="utf-8") as fh:
        fh.write(markdown.rstrip("\n") + "\n\n")
    return True


def output_folder(path: str | Path, option: str) -> Path:
    """`path` as a folder a command is about to write (it may not exist yet). A ResultsError (exit 2) naming
    `option` (the flag or variable that gave it) when it, or a folder above it, exists and is not a folder:
    checked before anything starts, so the mistake is one line rather than a traceback after the work."""
    p = Path(path)
    for where in (p, *p.parents):
        if where.exists() and not where.is_dir():
            what = "is" if where == p else f"lies under {where}, which is"
            raise ResultsError(
                f"{option} {path}: {what} a file, not a folder; give a folder to write the results into"
            )
    return p


def atomic_write_json(path: Path, data: Any) -> None:
    """atomic_write_text of `data` as indented, key-sorted JSON."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: Path) -> Any:
    """Read a JSON file of a results folder, with a clear error."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultsError(f"{path} not found") from None
    except (OSError, json.JSONDecodeError) as e:
        raise ResultsError(f"{path} is unreadable: {e}") from None


def node_id(case: ET.Element, root: Path | None = None) -> str:
    """The pytest node id of a JUnit <testcase>: exactly as `harness.suites.flake_plugin` recorded it (every suite
    run loads the plugin), else recovered from the names of a JUnit file written without it.

    pytest writes classname `pkg.mod.Class` and name `test[param]`. With junit_family=xunit1 it also
    writes `file`, which splits module from class; otherwise the longest classname prefix that is a file
    under `root` is the module.
    """
    for prop in case.iter("property"):
        if prop.get("name") == "kiln_nodeid" and prop.get("value"):
            return prop.get("value", "")
    classname = case.get("classname", "")
    name = case.get("name", "")
    parts = classname.split(".") if classname else []
    file = case.get("file")
    n_mod = 0
    if file and file.endswith(".py"):
        mod_parts = file[:-3].replace("\\", "/").split("/")
        if parts[: len(mod_parts)] == mod_parts:
            n_mod = len(mod_parts)
    if not n_mod and root is not None:
        for i in range(len(parts), 0, -1):
            if (root / Path(*parts[:i])).with_suffix(".py").is_file():
                n_mod = i
                break
    if not n_mod:  # best guess: classes start with an upper-case letter
        n_mod = next((i for i, p in enumerate(parts) if p[:1].isupper()), len(parts))
    module = "/".join(parts[:n_mod]) + ".py" if n_mod else (file or "")
    return "::".join([module, *parts[n_mod:], name]) if module else name


def classify_case(case: ET.Element) -> tuple[str, str]:
    """(outcome, message) of one JUnit ``<testcase>``: failed, error, xfailed, skipped or passed.

    A failure or error wins over a skip (pytest reports a teardown error next to the test's own result).
    """
    for tag in ("failure", "error"):
        el = case.find(tag)
        if el is not None:
            return ("failed" if tag == "failure" else "error"), (el.get("message") or "").strip()
    el = case.find("skipped")
    if el is not None:
        kind = "xfailed" if el.get("type") == "pytest.xfail" else "skipped"
        return kind, (el.get("message") or "").strip()
    return "passed", ""


def is_bare(case: ET.Element) -> bool:
    """The nameless ``<testcase/>`` pytest writes for a test a Ctrl-C cut short: it has no outcome."""
    return not case.get("name") and not case.get("classname")


@dataclass(frozen=True)
class Case:
    """One finished ``<testcase>`` of a JUnit file: node id, outcome, full message, seconds and its
    ``<property>`` values (the ones `harness.suites.flake_plugin` writes: kiln_nodeid, kiln_flake_run)."""

    id: str
    outcome: str
    message: str
    duration_s: float
    props: dict[str, str]
    text: str = (
        ""  # what JUnit recorded of a failure: failure/error bodies (pytest's --tb) and captured output
    )


def case_text(case: ET.Element) -> str:
    """A ``<testcase>``'s failure/error text and captured output, each part headed by its tag (and message)."""
    parts = []
    for tag in ("failure", "error", "system-out", "system-err"):
        for el in case.findall(tag):
            body = (el.text or "").strip()
            head = (el.get("message") or "").strip()
            if body or head:
                parts.append(f"--- {tag}{': ' + head.splitlines()[0] if head else ''}\n{body}")
    return "\n".join(parts)


def read_cases(path: Path, root: Path | None = None) -> list[Case]:
    """Every finished test case of a pytest JUnit XML file, in file order: the one JUnit reader (suite
    results here, flake runs in `harness.suites.flakes`, retried tests in `harness.suites.retries`)."""
    try:
        tree = ET.parse(path)
    except FileNotFoundError:
        raise ResultsError(f"JUnit file {path} not found") from None
    except OSError as e:
        raise ResultsError(f"JUnit file {path} is unreadable: {e}") from None
    except ET.ParseError as e:
        raise ResultsError(
            f"JUnit file {path} is not valid XML ({e}); the run was probably cut off"
        ) from None
    out = []
    for case in tree.iter("testcase"):
        if is_bare(case):
            continue
        outcome, msg = classify_case(case)
        props = {p.get("name", ""): p.get("value", "") for p in case.iter("property")}
        out.append(
            Case(node_id(case, root), outcome, msg, float(case.get("time") or 0.0), props, case_text(case))
        )
    return out


def parse_junit(path: Path, root: Path | None = None) -> list[TestOutcome]:
    """Every test case of a pytest JUnit XML file, classified, in file order."""
    return [
        TestOutcome(c.id, Outcome(c.outcome), c.message.strip()[:500], c.duration_s)
        for c in read_cases(path, root)
    ]


def counts(tests: list[TestOutcome]) -> dict[str, int]:
    """outcome -> number of tests, every outcome present, in OUTCOMES order."""
    c = Counter(t.outcome for t in tests)
    return {o: c[Outcome(o)] for o in OUTCOMES}


def summary_line(
    suite: str, label: str, tests: list[TestOutcome], duration_s: float, status: str, where: str = ""
) -> str:
    """One line per suite, e.g. `suite fallback [cpu/container] FAIL: 10 passed, 1 failed ... in 3.2s`."""
    c = counts(tests)
    body = ", ".join(f"{n} {o}" for o, n in c.items() if n) or "no tests"
    tail = f" -> {where}" if where else ""
    return f"suite {suite} [{label}] {status}: {body} in {duration_s:.1f}s{tail}"


def to_json(tests: list[TestOutcome]) -> list[dict[str, Any]]:
    return [t.to_json() for t in tests]


def from_json(items: list[dict[str, Any]]) -> list[TestOutcome]:
    return [TestOutcome(**item) for item in items]
