"""Numerics triage: which side of a mismatch is closer to the truth, across compilers, backends and machines.

    python -m harness numerics run PROGRAM --out DIR [--compilers kiln,kiln-emulate,inductor,eager] [--repeat 2]
    python -m harness numerics compare A B [C ...] [--md report.md] [--json report.json] [--plot p.png] [--check]
    python -m harness numerics gpu --out DIR          (the two bf16 GPU programs, every compiler, report)
    python -m harness numerics trace-diff A.jsonl B.jsonl   (two KILN_TRACE_VALUES traces: the first launch that
                                                       diverges, with its kernel's source; trace_diff.py)

Terms used across the package:
  program     a function with declared inputs (`module.path:function`, a built-in name, a test of the
              numerics suite, or a `torch.export` .pt2 file); see `program.py`.
  inputs      generated from a seed on the CPU (`inputs.py`), then moved to the device: every machine and
              compiler sees the same bits; each input's *digest* is the sha256 of its bytes.
  side        one compiler's outputs in one run folder (`DIR:kiln`); *repeats* are the same side run again.
  outputs     forward outputs (`out`, `out.1`, ...) and, for programs with a backward, the gradients of a fixed
              loss (sum of each float output times a seeded cotangent) wrt the float inputs (`grad.<input>`).
  reference   the program in float64 eager on the CPU from the same inputs (`reference.py`).
  error       |output - reference| per element; *ULP error* divides it by the spacing of the output dtype at
              the reference value (a correctly rounded result has at most 0.5).
  run folder  written by `store.py`; complete only when its manifest.json (written last) exists.

Modules, one per step: inputs, program (+ programs: the built-in programs), capture, store, reference,
compare, report, cli; suite (the save hook of tests/numerics); trace_diff (value traces, a step of its own).
The records they pass are typed, and read from or written to JSON only by their `from_dict`/`to_dict`: records
(a run folder's manifest), comparison (what compare makes and report.json holds), trace_records (a value
trace's lines).
"""

from __future__ import annotations

#: version of the run-folder format; runs of another version are refused, never compared silently
SCHEMA = 1
