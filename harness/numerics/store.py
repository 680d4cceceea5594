"""Run folders: what a capture writes and what compare reads, with clear errors for bad folders.

Layout of a run folder (every file written to a temporary name, then renamed):
  inputs/<name>.bin, cotangents/<output>.bin      the exact bytes (see inputs.tensor_bytes)
  sides/<compiler>/r<k>/<output>.bin              an output of repeat k: the whole tensor, or its sample
  env.json                                        the environment record (harness.envinfo.capture)
  manifest.json                                   written last: a folder without it is incomplete

Terms:
  full / sample   an output of at most `full_max` elements is stored whole; a larger one stores the values at
                  its *sample indices* (`sample_indices`: a fixed arithmetic rule of (numel, count), the same
                  on every machine), plus its digest and statistics over every element.
  entry           the manifest's record of one stored file: path, bytes and sha256 (checked on every read:
                  a short file is *truncated*, another sha256 is *corrupt*).
  stats           over all elements, in float64: count, nan, posinf, neginf, zeros, min, max, mean, std, absmax
                  (finite elements only for the last five).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.results import atomic_write_bytes

from . import SCHEMA
from . import inputs as inp
from .exc import RecordError, RunFolderError
from .records import (
    SAMPLE_RULE,
    Entry,
    Manifest,
    OutputStats,
    ProgramRecord,
    Sample,
    SideInfo,
    SideRecord,
    Storage,
    StorageRule,
)

KIND = "kiln-numerics-run"
FULL_MAX = 4_194_304  # elements: the field case's output size is stored whole
SAMPLE = 65_536
_MULT = 2_654_435_761  # Knuth's multiplicative constant: spreads j -> (a*j + b) mod n over the whole tensor


def sample_indices(numel: int, count: int) -> np.ndarray:
    """`count` distinct sorted flat indices of a tensor of `numel` elements, always including the first and last."""
    if count >= numel:
        return np.arange(numel, dtype=np.int64)
    a = _MULT % numel or 1
    while math.gcd(a, numel) != 1:
        a += 1
    j = np.arange(count - 2, dtype=np.int64)
    idx = (a * j + 12_345) % numel  # distinct: a is invertible mod numel
    return np.unique(np.concatenate([idx, np.array([0, numel - 1], dtype=np.int64)]))


def stats(t: torch.Tensor) -> OutputStats:
    """Summary statistics of every element (see the module docstring)."""
    x = t.detach().reshape(-1).to(torch.float64)
    finite = x[torch.isfinite(x)]
    counts = OutputStats(
        count=x.numel(),
        nan=int(torch.isnan(x).sum()),
        posinf=int(torch.isposinf(x).sum()),
        neginf=int(torch.isneginf(x).sum()),
        zeros=int((x == 0).sum()),
    )
    if not finite.numel():
        return counts
    return dataclasses.replace(
        counts,
        min=finite.min().item(),
        max=finite.max().item(),
        mean=finite.mean().item(),
        std=finite.std(unbiased=False).item(),
        absmax=finite.abs().max().item(),
    )


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def write_bytes(path: Path, data: bytes) -> None:
    """Atomically (``harness.results.atomic_write_bytes``: devices such as /dev/null are written in place)."""
    atomic_write_bytes(path, data)


def write_json(path: Path, data: Any) -> None:
    """Indented, key-sorted JSON, written atomically."""
    write_bytes(path, (json.dumps(data, indent=1, sort_keys=True, default=str) + "\n").encode())


class RunWriter:
    """Writes one run folder; `finish` writes the manifest last."""

    def __init__(self, path: Path, full_max: int = FULL_MAX, sample: int = SAMPLE) -> None:
        if (path / "manifest.json").exists() or (path.is_dir() and any(path.iterdir())):
            raise RunFolderError(f"{path} already holds files; numerics runs go into a new folder")
        self.path, self.full_max, self.sample = path, full_max, sample
        path.mkdir(parents=True, exist_ok=True)

    def tensor(self, rel: str, t: torch.Tensor) -> Entry:
        """Store a whole tensor; its entry (file, bytes, sha256 = digest, shape, dtype)."""
        data = inp.tensor_bytes(t)
        write_bytes(self.path / rel, data)
        sha = hashlib.sha256(data).hexdigest()
        return Entry(rel, len(data), sha, sha, tuple(t.shape), inp.dtype_name(t.dtype))

    def output(self, rel: str, t: torch.Tensor) -> Entry:
        """Store an output whole or sampled; its entry with digest and stats."""
        if t.numel() <= self.full_max:
            return dataclasses.replace(self.tensor(rel, t), stored=Storage.FULL, stats=stats(t))
        idx = sample_indices(t.numel(), self.sample)
        part = t.reshape(-1)[torch.from_numpy(idx)]
        data = inp.tensor_bytes(part)
        write_bytes(self.path / rel, data)
        return Entry(
            rel,
            len(data),
            hashlib.sha256(data).hexdigest(),
            inp.digest(t),
            tuple(t.shape),
            inp.dtype_name(t.dtype),
            stored=Storage.SAMPLE,
            sample=Sample(int(idx.size), SAMPLE_RULE),
            stats=stats(t),
        )

    def header(self) -> dict[str, Any]:
        """The manifest fields the writer sets: schema, kind, creation time and how outputs are stored."""
        return {
            "schema": SCHEMA,
            "kind": KIND,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "storage": StorageRule(self.full_max, self.sample),
        }

    def finish(self, manifest: Manifest, env: dict[str, Any] | None) -> Path:
        """env.json, then manifest.json: the folder is complete."""
        if env is not None:
            write_json(self.path / "env.json", env)
        write_json(self.path / "manifest.json", manifest.to_dict())
        return self.path


@dataclass
class Stored:
    """An output as read back: the stored elements (flat), their flat indices (None: all), shape, dtype, digest."""

    values: torch.Tensor
    indices: np.ndarray | None
    shape: tuple[int, ...]
    dtype: torch.dtype
    digest: str
    stats: OutputStats | None

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1


class RunFolder:
    """A complete run folder, read-only. Every file is checked against the manifest when read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        if not path.is_dir():
            raise RunFolderError(f"{path} is not a folder")
        mpath = path / "manifest.json"
        if not mpath.is_file():
            raise RunFolderError(
                f"{path} has no manifest.json: the run is incomplete (cut off or still running)"
            )
        try:
            raw = json.loads(mpath.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise RunFolderError(f"{mpath} is corrupt or truncated: {e}") from None
        if not isinstance(raw, dict) or raw.get("kind") != KIND:
            raise RunFolderError(f"{mpath} is not a numerics run manifest")
        if raw.get("schema") != SCHEMA:
            raise RunFolderError(
                f"{path} has schema version {raw.get('schema')}; this harness reads version {SCHEMA}"
            )
        for key in ("program", "seed", "inputs", "sides"):
            if key not in raw:
                raise RunFolderError(f"{mpath} lacks {key!r}: truncated or written by something else")
        try:
            self.manifest = Manifest.from_dict(raw)
        except RecordError as e:
            raise RunFolderError(f"{mpath}: {e}") from None

    @property
    def program(self) -> ProgramRecord:
        return self.manifest.program

    @property
    def sides(self) -> list[SideRecord]:
        return self.manifest.sides

    def side(self, compiler: str) -> SideRecord:
        for s in self.sides:
            if s.compiler == compiler:
                return s
        known = ", ".join(s.compiler for s in self.sides)
        raise RunFolderError(f"{self.path} has no side {compiler!r}; it has {known}")

    def read(self, entry: Entry, count: int | None = None) -> torch.Tensor:
        """A stored tensor (whole, or the `count` sampled values), checked for truncation and corruption."""
        path = self.path / entry.file
        try:
            dtype = inp.to_dtype(entry.dtype)
        except (KeyError, TypeError, ValueError) as e:
            raise RunFolderError(
                f"{self.path}/manifest.json: malformed entry {entry.to_dict()!r} ({e})"
            ) from None
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise RunFolderError(f"{path} is missing") from None
        if len(data) != entry.bytes:
            raise RunFolderError(f"{path} is truncated: {len(data)} of {entry.bytes} bytes")
        if hashlib.sha256(data).hexdigest() != entry.sha256:
            raise RunFolderError(f"{path} is corrupt: its sha256 differs from the manifest's")
        shape = list(entry.shape) if count is None else [count]
        return inp.from_bytes(data, shape, dtype)

    def output(self, compiler: str, repeat: int, name: str) -> Stored:
        side = self.side(compiler)
        try:
            entry = side.repeats[repeat][name]
        except (IndexError, KeyError):
            raise RunFolderError(
                f"{self.path}: side {compiler} repeat {repeat} has no output {name!r}"
            ) from None
        shape, dtype = entry.shape, inp.to_dtype(entry.dtype)
        if entry.sampled:
            if entry.sample is None:
                raise RunFolderError(f"{self.path}: output {name} is sampled by no rule")
            numel = int(np.prod(shape, dtype=np.int64))
            idx = sample_indices(numel, entry.sample.count)
            if entry.sample.rule != SAMPLE_RULE or idx.size != entry.sample.count:
                raise RunFolderError(f"{self.path}: output {name} has an unknown sample rule")
            return Stored(self.read(entry, int(idx.size)), idx, shape, dtype, entry.digest, entry.stats)
        return Stored(self.read(entry).reshape(-1), None, shape, dtype, entry.digest, entry.stats)

    def tensors(self, group: str) -> dict[str, torch.Tensor]:
        """The stored inputs (`group="inputs"`, in call order) or cotangents, checked against their digests."""
        if group == "inputs":
            entries, order = self.manifest.inputs, self.manifest.input_order
        else:
            entries = self.manifest.cotangents
            order = sorted(entries)
        if sorted(order) != sorted(entries):
            raise RunFolderError(f"{self.path}/manifest.json: input_order does not name the stored inputs")
        return {name: self.read(entries[name]) for name in order}

    def env(self) -> dict[str, Any]:
        try:
            return json.loads((self.path / "env.json").read_text())
        except (OSError, json.JSONDecodeError):
            return {}


def find_runs(path: Path) -> list[Path]:
    """The run folders a path names: itself, or (a suite save folder, a harness results folder) those below it."""
    if (path / "manifest.json").exists() or not path.is_dir():
        return [path]
    for base in (path, path / "suites" / "numerics-outputs"):
        if base.is_dir():
            found = sorted(p.parent for p in base.glob("*/manifest.json"))
            if found:
                return found
    return [path]  # RunFolder reports what is wrong with it


def save_run(
    path: Path,
    prog: Any,
    seed: int,
    device: str,
    cpu_inputs: dict[str, torch.Tensor],
    cotangents: dict[str, torch.Tensor],
    sides: list[Any],
    env: dict[str, Any] | None,
    full_max: int = FULL_MAX,
    sample: int = SAMPLE,
    reference: dict[str, torch.Tensor] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write a capture (`capture.capture`'s results) as a run folder; the manifest goes last."""
    w = RunWriter(path, full_max, sample)
    inputs = {n: w.tensor(f"inputs/{safe_name(n)}.bin", t) for n, t in cpu_inputs.items()}
    cots = {n: w.tensor(f"cotangents/{safe_name(n)}.bin", t) for n, t in sorted(cotangents.items())}
    records = []
    for side in sides:
        base = f"sides/{safe_name(side.compiler)}"
        repeats = [
            {n: w.output(f"{base}/r{k}/{safe_name(n)}.bin", t) for n, t in outs.items()}
            for k, outs in enumerate(side.repeats)
        ]
        info = side.info if isinstance(side.info, SideInfo) else SideInfo.from_dict(side.info)
        records.append(SideRecord(side.compiler, repeats, side.error, info))
    ref = None
    if reference is not None:
        ref = {n: w.output(f"reference/{safe_name(n)}.bin", t) for n, t in reference.items()}
    manifest = Manifest(
        **w.header(),
        program=prog.describe(),
        seed=seed,
        device=device,
        inputs=inputs,
        input_order=list(
            cpu_inputs
        ),  # JSON objects are written with sorted keys: the call order is kept here
        cotangents=cots,
        sides=records,
        reference=ref,
        extra=dict(extra or {}),
    )
    return w.finish(manifest, env)
