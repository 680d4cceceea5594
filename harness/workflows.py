"""`python -m harness workflows [--write]`: the parts of the GitHub workflows that come from one place.

Terms:
  shared env   each workflow's top-level `env:` block starts with harness/settings.py WORKFLOW_ENV as
               `workflow_env_yaml` writes it (the same variables in ci.yml, bench.yml, flakes.yml); a workflow's
               own variables (an input of its own, e.g. a test selection) follow it, kept as written.
  runs-on      the labels of each backend job (`tests-B`, `flakes-B`, `bench-B`): backend B's `runner_labels` in
               ci/matrix.json (`cpu` for CPU runners; the vendor and the GPU model for GPU runners).
GitHub must know a job's labels before any job runs, so the workflows carry them written out; this verb writes
them from the matrix and the list (`--write`) or says which file differs (exit 1), and
tests/harness/test_workflows.py checks the committed files agree.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from harness import matrix as matrix_mod
from harness.settings import WORKFLOW_ENV, settings, workflow_env_yaml

JOB_RE = re.compile(r"^  ([\w-]+):\s*$")
BACKEND_JOB_RE = re.compile(r"(?:tests|flakes|bench)-(\w+)")
RUNS_ON_RE = re.compile(r"^(    runs-on: )\[.*\]\s*$")


def _env_blocks(lines: list[str]) -> tuple[list[tuple[int, int]], list[str], int]:
    """The top-level `env:` blocks as (first line, end), the workflow's own entries in them (variables not in
    WORKFLOW_ENV, each with the comment lines above it), in order, and the first line of the shared block (the
    first holding a WORKFLOW_ENV variable, else the first)."""
    blocks, own, shared = [], [], -1
    i = 0
    while i < len(lines):
        if lines[i] != "env:":
            i += 1
            continue
        start, i = i, i + 1
        pending: list[str] = []  # comment lines go with the variable below them
        while i < len(lines) and lines[i].startswith("  "):
            if lines[i].lstrip().startswith("#"):
                pending.append(lines[i])
            else:
                if lines[i].strip().split(":", 1)[0] not in WORKFLOW_ENV:
                    own += [*pending, lines[i]]
                elif shared < 0:
                    shared = start
                pending = []
            i += 1
        blocks.append((start, i))
    return blocks, own, shared if shared >= 0 else (blocks[0][0] if blocks else -1)


def render(text: str, m: matrix_mod.Matrix) -> str:
    """`text` (a workflow file) with its top-level env block (one, where the shared one was: WORKFLOW_ENV, then
    the workflow's own variables from every top-level block) and its backend jobs' runs-on from the one place each comes from; everything else
    kept as written."""
    lines = text.splitlines()
    blocks, own, shared = _env_blocks(lines)
    starts = {start: end for start, end in blocks}
    out: list[str] = []
    job = None
    in_jobs = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if i in starts:
            if i == shared:
                out += [*workflow_env_yaml().splitlines(), *own]
            else:  # another block (its variables moved into the shared one) goes with its comments and a blank
                while out and out[-1].startswith("#"):
                    out.pop()
                i = starts[i]
                if out and not out[-1].strip() and i < len(lines) and not lines[i].strip():
                    i += 1
                continue
            i = starts[i]
            continue
        if line == "jobs:":
            in_jobs = True
        elif in_jobs and (job_match := JOB_RE.match(line)):
            job = job_match.group(1)
        runs_on = RUNS_ON_RE.match(line)
        backend = BACKEND_JOB_RE.fullmatch(job or "")
        if runs_on and backend and backend.group(1) in m.backends:
            line = runs_on.group(1) + "[" + ", ".join(m.backend(backend.group(1)).runner_labels) + "]"
        out.append(line)
        i += 1
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def workflow_files(root: Path) -> list[Path]:
    return sorted((root / ".github" / "workflows").glob("*.yml"))


def cli_add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--write", action="store_true", help="rewrite the files that differ (default: only say which)"
    )


def cli_main(args: argparse.Namespace) -> int:
    """Write (or check) the workflows' shared env block and backend jobs' runner labels from their one place."""
    m = matrix_mod.load()
    differ = []
    for path in workflow_files(settings().root):
        text = path.read_text()
        new = render(text, m)
        if new != text:
            differ.append(path)
            if args.write:
                path.write_text(new)
    for path in differ:
        print(
            f"{path}: {'rewritten' if args.write else 'differs from the matrix and WORKFLOW_ENV (--write)'}"
        )
    if not differ:
        print("workflows agree with ci/matrix.json and harness/settings.py WORKFLOW_ENV")
    return 0 if args.write or not differ else 1
