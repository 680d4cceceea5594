"""Where a warm compile spends its time: one model case compiled cold in a fresh process, then warm
(kiln's graph cache and Triton's kernels on disk) in a second fresh process under cProfile, with the split.

    python ci/warm_profile.py CASE[,CASE...] [--profile tiny] [--device cpu] [--compiler kiln] [--top 25]
                                            [--prof-out FILE] [--autotune]

Terms (seconds of the first step, as the model tier's compile probe counts them: the first step's wall time
less one steady step; cProfile inflates Python-heavy parts, so the split is reported beside the unprofiled
warm compile of a third process):
- *dynamo*: Dynamo's frame conversion (``convert_frame._compile``) less the backend call;
- *aot*: AOTAutograd inside the backend (tracing, functionalization, partition), i.e. ``kiln_backend`` less
  kiln's forward/inference graph compiles; *aot backward*: the lazy backward compile less kiln's part;
- *kiln*: the inference front cache (``inference_cache.Front``: its key, and on a hit the graph rebuilt
  before AOTAutograd) and ``compile_fx_graph`` of every graph, split into the key (``graph_cache.graph_key``),
  the entry read (``cache.read_entry``: file read + checksum), the decode (``graph_cache.decode_entry``: JSON,
  the wrapper's ``GraphModule``, kernel-source checks) and the rest;
- *first call*: what the compiled graphs do at their first run beyond a steady run: kernel modules
  imported and ``JITFunction`` objects made (``cache.load_kernel``), launches prepared, on a GPU each
  kernel's compile-or-load (``gpu_compile.compile_launch``: the binary index's load, else Triton's cache key;
  then the binary load).

Exit 0, 1 when a child failed, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the repository's packages (harness, compiler) come from here
    sys.path.insert(0, str(REPO))
TAG = "KILN_WARM_PROFILE "

#: (label, file suffix, function name): cumulative seconds reported per row (first match of each)
POINTS = [
    ("dynamo compile (all)", "torch/_dynamo/convert_frame.py", "_compile"),
    ("backend call", "compiler/backend.py", "kiln_backend"),
    ("kiln compile_fx_graph", "compiler/backend.py", "compile_fx_graph"),
    ("kiln backward compiles", "compiler/backend.py", "compile_backward"),
    ("kiln front cache: key", "compiler/runtime/inference_cache.py", "__init__"),
    ("kiln front cache: lookup (hit: the graph rebuilt)", "compiler/runtime/inference_cache.py", "lookup"),
    ("  graph_key", "compiler/runtime/graph_cache.py", "graph_key"),
    ("    kiln_source_hash", "compiler/runtime/graph_cache.py", "kiln_source_hash"),
    ("    toolchain", "compiler/runtime/graph_cache.py", "toolchain"),
    ("  load (read+decode)", "compiler/runtime/graph_cache.py", "load"),
    ("    read_entry", "compiler/runtime/cache.py", "read_entry"),
    ("    decode_entry", "compiler/runtime/graph_cache.py", "decode_entry"),
    ("      json loads", "json/__init__.py", "loads"),
    ("      decode_module", "compiler/runtime/fx_codec.py", "decode_module"),
    ("      check_kernel_source", "compiler/runtime/fx_codec.py", "check_kernel_source"),
    ("      GraphModule init", "torch/fx/graph_module.py", "__init__"),
    ("  _dump", "compiler/backend.py", "_dump"),
    ("  record", "compiler/capture.py", "record"),
    ("first launches: _prepare", "compiler/runtime/launcher.py", "_prepare"),
    ("  load_kernel (import)", "compiler/runtime/cache.py", "load_kernel"),
    ("  JITFunction init", "triton/runtime/jit.py", "__init__"),
    ("  autotune tuned_config", "compiler/runtime/autotune.py", "tuned_config"),
    ("  autotune _tune", "compiler/runtime/autotune.py", "_tune"),
    ("  gpu compile_launch", "compiler/runtime/gpu_compile.py", "compile_launch"),
    ("    binary index load (no triton.compile)", "compiler/runtime/binary_index.py", "load"),
    ("    triton.compile", "triton/compiler/compiler.py", "compile"),
    (
        "    CompiledKernel _init_handles (launcher, binary load)",
        "triton/compiler/compiler.py",
        "_init_handles",
    ),
    ("      platform.architecture (Triton 3.6 launcher key)", "platform.py", "architecture"),
    ("    JIT cache_key", "triton/runtime/jit.py", "cache_key"),
]


def _cum(stats: dict, suffix: str, name: str) -> float:
    total = 0.0
    for (path, _line, fn), (_cc, _nc, _tt, ct, _callers) in stats.items():
        if fn == name and path.replace(os.sep, "/").endswith(suffix):
            total += ct
    return total


def split(stats: dict) -> dict[str, float]:
    """The named cumulative times and the derived dynamo / aot / kiln shares (see the module docstring)."""
    out = {label: _cum(stats, suffix, name) for label, suffix, name in POINTS}
    kiln_fw = out["kiln compile_fx_graph"] - out["kiln backward compiles"]
    out["= dynamo (less backend)"] = out["dynamo compile (all)"] - out["backend call"]
    front = out["kiln front cache: key"] + out["kiln front cache: lookup (hit: the graph rebuilt)"]
    out["= aot (fw/inference, less kiln)"] = out["backend call"] - kiln_fw - front
    return out


def kiln_top(stats: dict, n: int) -> list[tuple[float, float, int, str]]:
    """(cumulative s, own s, calls, where) of the ``n`` kiln functions of largest cumulative time."""
    root = str(REPO / "compiler")
    rows = [
        (ct, tt, nc, f"{os.path.relpath(path, REPO)}:{line}:{fn}")
        for (path, line, fn), (_cc, nc, tt, ct, _callers) in stats.items()
        if path.startswith(root)
    ]
    return sorted(rows, reverse=True)[:n]


#: Dynamo's own timed phases reported per process (seconds, summed over graphs): its trace, the backend call
#: (kiln, AOTAutograd inside it), AOTAutograd's parts, guards, the lazy backward
PHASES = (
    "_compile.compile_inner",
    "bytecode_tracing",
    "OutputGraph.call_user_compiler",
    "create_aot_dispatcher_function",
    "aot_trace_joint_graph",
    "build_guards",
    "backward._backward_impl",
)


def dynamo_phases() -> dict[str, float]:
    """``torch._dynamo.utils.compile_times`` of this process for ``PHASES`` (timers that work where cProfile
    misses frames run under Dynamo's frame hook, as on Python 3.12)."""
    try:
        from torch._dynamo.utils import compile_times

        names, values = compile_times(repr="csv", aggregate=True)
        got = dict(zip(names, values))
        return {k: float(str(got[k])) for k in PHASES if k in got}
    except Exception:  # noqa: BLE001 - a torch without these timers: no phases
        return {}


# ------------------------------------------------------------------ child: one fresh process
def child(args: argparse.Namespace) -> int:
    import cProfile
    import pstats

    import torch

    import compiler  # noqa: F401  (before triton: picks the interpreter without a GPU)
    from harness.bench.models import catalog as mdl
    from harness.bench.models.run import BASELINE_COMPILER, Stepper, sync

    case = mdl.find(args.case, args.profile, args.device)
    device = torch.device(args.device)
    base = case.build(0)
    Stepper(case, base, BASELINE_COMPILER, device, 0).step()
    st = Stepper(case, base, args.compiler, device, 0)
    prof = cProfile.Profile() if args.prof_out else None
    t0 = time.perf_counter()
    if prof is not None:
        prof.enable()
    st.step()
    sync(device)
    if prof is not None:
        prof.disable()
    first = time.perf_counter() - t0
    steady = []
    for _ in range(2):
        t0 = time.perf_counter()
        st.step()
        sync(device)
        steady.append(time.perf_counter() - t0)
    from compiler.runtime import compile_stats

    data = {
        "first_s": first,
        "steady_s": min(steady),
        "compile_s": max(0.0, first - min(steady)),
        "stats": compile_stats().summary(),
        "dynamo": dynamo_phases(),
    }
    if prof is not None:
        prof.dump_stats(args.prof_out)
        stats = pstats.Stats(args.prof_out).stats  # type: ignore[attr-defined]
        data["split"] = split(stats)
        data["top"] = kiln_top(stats, args.top)
    print(TAG + json.dumps(data), flush=True)
    return 0


def run_child(case: str, args: argparse.Namespace, env: dict, prof_out: str | None) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        case,
        "--profile",
        args.profile,
        "--device",
        args.device,
        "--compiler",
        args.compiler,
        "--top",
        str(args.top),
    ] + (["--prof-out", prof_out] if prof_out else [])
    done = subprocess.run(cmd, env=env, cwd=str(REPO), capture_output=True, text=True, check=False)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(TAG):
            return json.loads(line[len(TAG) :])
    tail = [ln for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
    return {"error": f"exit {done.returncode}: {tail[-1][:300] if tail else 'no output'}"}


def report(case: str, cold: dict, warm: dict, warm_prof: dict) -> list[str]:
    lines = [
        f"## {case}",
        f"cold compile {cold['compile_s']:.2f} s; warm {warm['compile_s']:.2f} s "
        f"({warm['compile_s'] / max(cold['compile_s'], 1e-9):.0%} of cold); steady step "
        f"{warm['steady_s'] * 1e3:.1f} ms",
        f"warm stats: {warm['stats']}",
        f"profiled warm: first step {warm_prof['first_s']:.2f} s, compile {warm_prof['compile_s']:.2f} s",
        "",
        "| Dynamo's timed phase (unprofiled) | cold s | warm s |",
        "|---|---|---|",
        *[
            f"| {k} | {cold.get('dynamo', {}).get(k, 0.0):.3f} | {v:.3f} |"
            for k, v in warm.get("dynamo", {}).items()
        ],
        "",
        "| part (cProfile cumulative) | s |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v:.3f} |" for k, v in warm_prof["split"].items()]
    lines += ["", "| kiln function | cum s | own s | calls |", "|---|---|---|---|"]
    lines += [f"| {where} | {ct:.3f} | {tt:.3f} | {nc} |" for ct, tt, nc, where in warm_prof["top"]]
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--compiler", default="kiln")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--prof-out", default=None, help="keep the warm process's cProfile here")
    ap.add_argument("--autotune", action="store_true", help="KILN_AUTOTUNE=1 in every process")
    ap.add_argument("--md", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.child:
        args.case = args.child
        return child(args)
    if not args.cases:
        print(
            "warm_profile: name at least one model case (python -m harness bench models --list)",
            file=sys.stderr,
        )
        return 2
    from harness.bench.models.run import probe_env

    out, bad = [], 0
    for case in [c for arg in args.cases for c in arg.split(",") if c]:
        folder = Path(tempfile.mkdtemp(prefix="kiln-warm-profile-"))
        try:
            env = {**probe_env(folder), "KILN_CACHE": "1", "KILN_CACHE_DIR": str(folder / "kiln")}
            if args.autotune:
                env["KILN_AUTOTUNE"] = "1"
            prof = args.prof_out or str(folder / "warm.prof")
            cold = run_child(case, args, env, None)
            warm = run_child(case, args, env, None) if "error" not in cold else {}
            warm_prof = run_child(case, args, env, prof) if "error" not in warm and warm else {}
            errors = [
                f"{w}: {d['error']}"
                for w, d in (("cold", cold), ("warm", warm), ("profiled", warm_prof))
                if "error" in d
            ]
            lines = [f"## {case}", *errors, ""] if errors else report(case, cold, warm, warm_prof)
            bad = 1 if errors else bad
            out += lines
            print("\n".join(lines), flush=True)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    if args.md:
        args.md.write_text("\n".join(out) + "\n")
    return bad


if __name__ == "__main__":
    sys.exit(main())
