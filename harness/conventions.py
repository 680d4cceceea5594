"""The command-line conventions every verb shares (`python -m harness <verb>`, `python -m harness.bench`).

Terms:
  report-like verb  a verb that prints what a store or a results folder holds (`report`, `history show`,
                    `bench list`, `bench history`, `bench show`...). Each takes `--json PATH`; `--json -` writes
                    the JSON to stdout and sends the human-readable lines to stderr, so `| jq` reads only JSON.
  job summary       $GITHUB_STEP_SUMMARY, the Markdown page of a GitHub Actions job. A verb appends to it only
                    with `--github-summary` (every verb accepts it; it sets KILN_GITHUB_SUMMARY=1 for the verb
                    and the processes it starts). `bench summary` and `bench job-summary` exist to write it and
                    need no flag.
  help              every verb's `--help`: a description, an example (`EXAMPLES`) and the exit codes
                    (harness.exc.EXIT_CODES_EPILOG), in that order.

Ground floor: imports only harness.exc (and harness.results to write a file).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from harness.exc import EXIT_CODES_EPILOG

STDOUT = "-"
SUMMARY_VARIABLE = "KILN_GITHUB_SUMMARY"
SUMMARY_HELP = (
    "append the Markdown report to $GITHUB_STEP_SUMMARY (GitHub Actions' job summary) when it is set"
)


def finish(
    parser: argparse.ArgumentParser, example: str | None = None, sub_examples: dict[str, str] | None = None
) -> argparse.ArgumentParser:
    """Give `parser` and every sub-verb parser under it the shared tail of its help (an example, then the exit
    codes, kept as written) and the `--github-summary` flag where it has none of its own. A sub-verb without a
    description gets its one-line help as one; `sub_examples`: sub-verb name -> its example."""
    parts = [parser.epilog] if parser.epilog else []
    if example:
        parts.append("example:\n" + "\n".join(f"  {line}" for line in example.strip().splitlines()))
    parts.append(EXIT_CODES_EPILOG)
    parser.epilog = "\n\n".join(parts)
    if parser.formatter_class is argparse.HelpFormatter:
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs and "--github-summary" not in parser._option_string_actions:
        parser.add_argument("--github-summary", action="store_true", help=SUMMARY_HELP)
    for action in subs:
        helps = {a.dest: a.help for a in action._choices_actions}
        for name, sub in dict((id(p), (n, p)) for n, p in action.choices.items()).values():  # aliases: once
            if not sub.description and helps.get(name):
                sub.description = helps[name]
            finish(sub, (sub_examples or {}).get(name))
    return parser


def apply(args: argparse.Namespace) -> None:
    """What the shared flags of parsed `args` do before the verb runs: `--github-summary` opts in (for this
    process and the processes it starts)."""
    if getattr(args, "github_summary", False):
        os.environ[SUMMARY_VARIABLE] = "1"


def add_json(p: argparse.ArgumentParser, what: str = "the report") -> None:
    """`--json PATH` (`-`: stdout) for a report-like verb."""
    p.add_argument(
        "--json",
        metavar="PATH",
        type=Path,
        help=f"write {what} as JSON to PATH; `--json -` prints only the JSON on stdout",
    )


def to_stdout(path: Any) -> bool:
    """True when a `--json`/`--md` value means stdout (`-`)."""
    return path is not None and str(path) == STDOUT


# the stdouts that human_to_stderr set aside, innermost last: `--json -` writes to the one set aside first
_SET_ASIDE: list[TextIO] = []


@contextlib.contextmanager
def human_to_stderr(active: bool) -> Iterator[None]:
    """While `active` (a `--json -` run), the human-readable lines go to stderr so stdout carries only JSON;
    `write_json(STDOUT, ...)` inside it still writes to the stdout it set aside."""
    if not active:
        yield
        return
    _SET_ASIDE.append(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _SET_ASIDE.pop()


def write_json(path: Any, data: Any, *, indent: int | None = 1) -> None:
    """Write `data` as JSON to `path`, or to stdout for `-` (atomically for a file); inside human_to_stderr,
    `-` is the stdout it set aside (a verb may write its JSON while its tables go to stderr)."""
    text = json.dumps(data, indent=indent, default=str)
    if to_stdout(path):
        out = _SET_ASIDE[0] if _SET_ASIDE else sys.stdout
        out.write(text + "\n")
        out.flush()
        return
    from harness.results import atomic_write_text

    atomic_write_text(Path(path), text)
