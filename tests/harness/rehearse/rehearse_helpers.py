"""What the rehearsal's tests share: the `rehearsal` package (ci/rehearse/rehearsal) made importable, the committed
workflows as the rehearsal reads them, and a shortcut for one pair's act command line."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "harness" / "fixtures" / "act"
SCRIPT = ROOT / "ci" / "rehearse" / "rehearse.py"
if str(SCRIPT.parent) not in sys.path:
    sys.path.insert(0, str(SCRIPT.parent))

from rehearsal.act import act_argv  # noqa: E402 (importable only after the sys.path line above)
from rehearsal.actions import ACTIONS_DIR  # noqa: E402 (importable only after the sys.path line above)
from rehearsal.plan import JobSpec, load_workflows  # noqa: E402 (importable only after the sys.path line above)

WORKFLOWS = load_workflows(ROOT)


def argv_for(spec: JobSpec, workflows: dict[str, dict] = WORKFLOWS, tmp: Path = Path("/tmp/x")) -> list[str]:
    """act's command line for `spec` with fixed folders and port."""
    return act_argv(
        "act",
        spec,
        workflows,
        root=ROOT,
        actions_dir=ACTIONS_DIR,
        artifacts=tmp / "artifacts",
        cache=tmp / "cache",
        port=40000,
        event_file=tmp / "event.json",
    )


def pairs(argv: list[str], flag: str) -> list[str]:
    """The values that follow every `flag` in `argv`."""
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]
