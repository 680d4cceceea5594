"""A scratch project for end-to-end harness tests: the repository's `ci/matrix.json` with planted suites.

Terms: a *planted suite* is a test file written for the test (name -> text); it lands at
`tests/<name>/test_<name>.py`, and the matrix's `suites` become exactly those names, in order."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def scratch_project(
    root: Path,
    suites: dict[str, str],
    *,
    matrix: Callable[[dict], None] | None = None,
    quarantined: tuple[str, ...] = (),
) -> Path:
    """Write the project at `root`: the matrix (edited by `matrix(data)` when given), `pytest.ini` with
    strict xfail, each planted suite, and a quarantine of `quarantined` test ids when any. Returns `root`."""
    (root / "ci").mkdir(parents=True)
    data = json.loads((ROOT / "ci" / "matrix.json").read_text())
    data["suites"] = list(suites)
    if matrix is not None:
        matrix(data)
    (root / "ci" / "matrix.json").write_text(json.dumps(data))
    (root / "pytest.ini").write_text("[pytest]\nxfail_strict = true\n")
    for name, text in suites.items():
        (root / "tests" / name).mkdir(parents=True)
        (root / "tests" / name / f"test_{name}.py").write_text(text)
    if quarantined:
        write_quarantine(root, *quarantined)
    return root


def write_quarantine(root: Path, *ids: str) -> None:
    """`ci/quarantine.toml` naming `ids`, each with the reason "planted"."""
    (root / "ci" / "quarantine.toml").write_text(
        "".join(f'[[test]]\nid = "{i}"\nreason = "planted"\n\n' for i in ids)
    )
