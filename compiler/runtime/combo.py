"""Launching combo kernels (``codegen/combo.py``), and the guard that keeps a combination from losing to its parts.

The wrapper calls a combo as ``self.<combo>(pointers of every part..., xnumel of each part...)``. Each part's
``XBLOCK`` is what its own launch would use (``TritonKernel.heuristic_config`` of the part at its size); the grid
is the sum of the parts' grids.

The guard: the first launch of a combo at a set of sizes on a GPU times the combo (one launch) against its parts
launched one after another on the same arguments (``triton.testing.do_bench``: host launch time included, which
is what a combo saves) and keeps the faster: the parts run instead of the combo when they are faster. The
buffers the kernels write are restored after the timing. Decisions are cached in this process and on disk
beside the autotune choices (``autotune_dir``, one checked entry per combo source, device name, sizes and Triton
version), so a second compile times nothing. No timing runs inside a CUDA-graph capture (the combo runs) nor on
the CPU: under Triton's interpreter, whose timings say nothing about a GPU, the rule is to combine (every part
is a static pointwise kernel of at most ``combo_max_numel`` elements, which the pass chose as launch-bound).
Tests inject a timer (``set_timer``) to check the guard on CPU. ``decisions()`` counts what the guard chose.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from typing import Any

import torch

from .. import config
from ..blocks import cdiv
from . import autotune, cache
from .launcher import MAX_LAUNCHES, Launch, LazyJit, TritonKernel, device_index_of, multi_gpu

log = logging.getLogger("kiln")

FORMAT = 1
SUFFIX = ".kcb"
#: (fn) -> seconds, replacing the GPU timer (tests); None: ``triton.testing.do_bench`` on CUDA
_timer: list[Callable[[Callable[[], Any]], float] | None] = [None]
_decided: dict[str, bool] = {}  # key -> split (parts faster), this process
#: what the guard chose in this process: "combined"/"split" (timed now), "cached" (read), "rule" (no timing),
#: "earlier" (the same combo at the same sizes decided before in this process: another compile of the graph)
_counts = {"combined": 0, "split": 0, "cached": 0, "rule": 0, "earlier": 0}
#: one entry per decision in this process (`decision_log`), the first MAX_LOGGED
_log: list[dict[str, Any]] = []
MAX_LOGGED = 1000


def set_timer(timer: Callable[[Callable[[], Any]], float] | None) -> None:
    """Use ``timer(launch) -> seconds`` on any device (tests); None restores the GPU timer. Also forgets this
    process's decisions, so that the next first launch reads the disk cache."""
    _timer[0] = timer
    _decided.clear()


def decisions() -> dict[str, int]:
    """How many first launches of combos the guard decided in this process, by how: ``combined`` and ``split``
    (timed now: the combo, or its parts, were faster), ``cached`` (a decision read from the cache), ``rule`` (no
    timing: the CPU interpreter or a CUDA-graph capture; combined), ``earlier`` (decided before in this process,
    for another kernel object of the same source and sizes: the same graph compiled again, as a CUDA-graph arm
    after a plain one)."""
    return dict(_counts)


def decision_log() -> list[dict[str, Any]]:
    """Each decision of this process (the first ``MAX_LOGGED``): the combo's name, its number of parts, how it
    was decided (``timed``, ``cached``, ``rule``, ``earlier``), whether the parts run instead (``split``) and,
    when timed, the combo's and its parts' microseconds (``combo_us``, ``parts_us``)."""
    return [dict(d) for d in _log]


def reset_decisions() -> None:
    """Forget this process's counts and decision log (the decisions themselves stay cached)."""
    for k in _counts:
        _counts[k] = 0
    _log.clear()


def _logged(name: str, parts: int, how: str, split: bool, times: tuple[float, float] | None = None) -> None:
    if len(_log) < MAX_LOGGED:
        entry: dict[str, Any] = {"kernel": name, "parts": parts, "how": how, "split": split}
        if times is not None:
            entry["combo_us"], entry["parts_us"] = round(times[0] * 1e6, 2), round(times[1] * 1e6, 2)
        _log.append(entry)


class ComboKernel(TritonKernel):
    """A combo kernel: ``source`` defines each part's function and the ``@triton.jit`` function ``name`` that
    dispatches to them; ``parts`` are the parts' own kernels (what runs when the guard finds them faster)."""

    def __init__(self, name: str, source: str, ptr_args: list[str], parts: list[TritonKernel]) -> None:
        super().__init__(name, source, ptr_args, [], False, "combo", 0)
        self.parts: list[TritonKernel] = torch.nn.ModuleList(parts)  # type: ignore[assignment]
        self._autotune = False  # each part keeps its own launch's config
        self._ranges: list[tuple[int, int]] = []
        start = 0
        for p in parts:
            self._ranges.append((start, start + len(p.ptr_args)))
            start += len(p.ptr_args)
        self._split: dict[tuple, bool] = {}  # (sizes, device) -> run the parts instead

    def extra_repr(self) -> str:
        return f"{self.name} (combo of {', '.join(p.name for p in self.parts)})"

    def forward(self, *args: Any) -> None:
        nptr = self._nptr
        key = (args[nptr:], device_index_of(args[:nptr]))
        split = self._split.get(key)
        if split is None:
            split = self._split[key] = self._decide(args, key[1])
        if split:
            self.launch_parts(args)
            return None
        return TritonKernel.forward(self, *args)

    def launch_parts(self, args: tuple) -> None:
        """Launch every part on its own (the combo's arguments split among them)."""
        sizes = args[self._nptr :]
        for p, (a, b), n in zip(self.parts, self._ranges, sizes):
            p(*args[a:b], n)

    def combo_config(self, sizes: tuple, interp: bool) -> dict[str, Any]:
        """Each part's ``XBLOCK`` (``XBLOCK_p<k>``) as its own launch would pick it; the most warps of any part."""
        cfgs = [p.heuristic_config(int(n), 1, interp) for p, n in zip(self.parts, sizes)]
        cfg: dict[str, Any] = {f"XBLOCK_p{k}": c["XBLOCK"] for k, c in enumerate(cfgs)}
        cfg["num_warps"] = max(c["num_warps"] for c in cfgs)
        return cfg

    def _prepare(self, ints: tuple, where: int, args: tuple = ()) -> Launch:
        device = torch.device("cpu") if where < 0 else torch.device("cuda", where)
        cfg = self.combo_config(ints, config.interpreting())
        if where < 0:
            self.jit_function()
        grid0 = sum(cdiv(int(n), cfg[f"XBLOCK_p{k}"]) for k, n in enumerate(ints))
        consts = tuple(cfg[f"XBLOCK_p{k}"] for k in range(len(ints)))
        int_spec = tuple((a == 1, a % 16 == 0, -2147483648 <= a <= 2147483647) for a in ints)
        jit = self._fn[(grid0,)] if self._fn is not None else LazyJit(self, grid0)
        launch = Launch(
            jit,
            cfg,
            grid0,
            consts,
            (where, int_spec, tuple(sorted(cfg.items()))),
            max(where, 0),
            device,
            sum(int(n) for n in ints),
            1,
            grid0 == 0,
            where >= 0 and multi_gpu(),
            {},
        )
        if len(self._launches) >= MAX_LAUNCHES:
            self._launches.clear()
        self._launches[(ints, where)] = launch
        return launch

    def _dump_spec(self, args: tuple, cfg: dict[str, Any]) -> None:
        """No ahead-of-time spec for a combo: its parts' block sizes are chosen at launch."""
        return

    # ------------------------------------------------------------------ the guard
    def _decide(self, args: tuple, where: int) -> bool:
        """True when the parts should run instead of the combo at these sizes (module docstring)."""
        timer = _timer[0]
        gpu = where >= 0 and not config.interpreting()
        if timer is None and (not gpu or torch.cuda.is_current_stream_capturing()):
            _counts["rule"] += 1
            _logged(self.name, len(self.parts), "rule", False)
            return False
        key = self._key(args[self._nptr :], where)
        split = _decided.get(key)
        if split is not None:
            _counts["earlier"] += 1
            _logged(self.name, len(self.parts), "earlier", split)
        if split is None:
            split = _read(key)
            if split is not None:
                _counts["cached"] += 1
                _logged(self.name, len(self.parts), "cached", split)
        if split is None:
            t_combo, t_parts = self._time(args, timer or _gpu_timer)
            split = t_parts < t_combo
            _counts["split" if split else "combined"] += 1
            _logged(self.name, len(self.parts), "timed", split, (t_combo, t_parts))
            log.info(
                "kiln: combo %s (%d parts): %.1f us, its parts %.1f us: %s",
                self.name,
                len(self.parts),
                t_combo * 1e6,
                t_parts * 1e6,
                "parts" if split else "combined",
            )
            _write(key, split, self.name)
        _decided[key] = split
        return split

    def _key(self, sizes: tuple, where: int) -> str:
        import triton

        device = torch.device("cpu") if where < 0 else torch.device("cuda", where)
        text = json.dumps(
            [FORMAT, self.source, autotune.device_name(device), [int(n) for n in sizes], triton.__version__]
        )
        return hashlib.sha256(text.encode()).hexdigest()

    def _time(self, args: tuple, timer: Callable[[Callable[[], Any]], float]) -> tuple[float, float]:
        """(seconds of the combo, of its parts one after another) on ``args``; written buffers restored."""
        outs = [
            a for p, a in zip(self.ptr_args, args) if p.startswith("out_ptr") and isinstance(a, torch.Tensor)
        ]
        saved = [o.clone() for o in outs]

        def combo() -> None:
            TritonKernel.forward(self, *args)

        def parts() -> None:
            self.launch_parts(args)

        try:
            combo()
            parts()  # both compiled before either is timed
            return timer(combo), timer(parts)
        finally:
            for o, s in zip(outs, saved):
                o.copy_(s)


def _gpu_timer(fn: Callable[[], Any]) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median") * 1e-3


def _path(key: str) -> str:
    return os.path.join(autotune.folder(), key + SUFFIX)


def _read(key: str) -> bool | None:
    if config.settings().cache_mode() == "0":
        return None
    data = cache.read_json_entry(_path(key), FORMAT, key)
    if data is None or not isinstance(data.get("split"), bool):
        return None
    cache.touch(_path(key))
    return data["split"]


def _write(key: str, split: bool, name: str) -> None:
    if config.settings().cache_mode() != "1":
        return
    try:
        cache.write_entry(
            _path(key), json.dumps({"format": FORMAT, "key": key, "kernel": name, "split": split}).encode()
        )
    except OSError as e:
        log.warning("kiln: combo decision of %s not stored: %s", name, e)
