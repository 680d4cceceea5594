"""Errors of numerics triage. Each is a `HarnessError`: the CLI prints one line and exits with `exit_code`."""

from __future__ import annotations

from harness.exc import HarnessError, InfrastructureError


class NumericsError(HarnessError):
    """Base of every expected failure of `python -m harness numerics` (exit 2)."""


class InputSpecError(NumericsError):
    """An input spec that does not parse, or asks for what its dtype cannot hold (specials in an int)."""


class ProgramError(NumericsError):
    """A program that cannot be found, imported, or run the way its spec says."""


class RunFolderError(NumericsError):
    """A run folder that is missing, incomplete (no manifest), truncated, corrupt or of another schema."""


class NotComparable(NumericsError):
    """Runs that differ in program, inputs (digests), output shapes or schema: never compared silently."""


class TraceError(NumericsError):
    """A value trace (``KILN_TRACE_VALUES``) that is missing, empty, not JSON lines or of another schema, or two
    traces whose launches do not align (other graphs, kernels, shapes): never compared silently."""


class NoDevice(NumericsError, InfrastructureError):
    """A verb meant for a GPU (`numerics gpu`) on a machine without one, and no `--device cpu` to say run it anyway
    (exit 3: another runner may have the GPU)."""


class RecordError(NumericsError):
    """A stored record (a run manifest's entry, a report, a trace line) with a key missing or a value of the wrong
    kind; the reader that found it names the file."""
