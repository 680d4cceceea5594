"""noxfile.py as a module for the tests, loaded once per test process.

Loading the noxfile registers its sessions with nox; loading it a second time into the same registry makes nox
warn once per session (`FutureWarning: The session ... has already been registered`, 26 lines at the end of
`nox -s tests`). `noxfile()` loads it once, into an emptied registry, and every test shares that module.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def _load() -> tuple[ModuleType, dict[str, Any]]:
    from nox import registry

    registry.reset()  # whatever another loader left: this load registers every session exactly once
    spec = importlib.util.spec_from_file_location("kiln_noxfile", ROOT / "noxfile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, dict(registry.get())


def noxfile() -> ModuleType:
    """The noxfile module (skips the test where nox is not installed)."""
    pytest.importorskip("nox")
    return _load()[0]


def sessions() -> dict[str, Any]:
    """The sessions the noxfile registered: name -> nox's session function."""
    pytest.importorskip("nox")
    return _load()[1]
