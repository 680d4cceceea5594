"""The rehearsal's tests import its package, `rehearsal`, from ci/rehearse (where ci/rehearse/rehearse.py finds it)."""

from __future__ import annotations

import sys
from pathlib import Path

_CI_REHEARSE = str(Path(__file__).resolve().parents[3] / "ci" / "rehearse")
if _CI_REHEARSE not in sys.path:
    sys.path.insert(0, _CI_REHEARSE)
