"""What keeps a dropped kiln-cg model's CUDA-graph memory alive (GPU only).

    python ci/cg_leak_probe.py [CASE] [--steps N]

Runs CASE (a gpu-profile model case, default model.ci_bert.train.fp32) under kiln-cg for N steps, drops the
model, Dynamo's caches and every local reference, collects garbage and empties the allocator's cache, then
prints the bytes still allocated above the start and, for every kiln CUDA-graph runner or recording still
alive, the chain of objects that refer to it (types and, for dicts, the key), up to a few levels: the
owner of the leak.
"""

from __future__ import annotations

import argparse
import gc
import sys
import types

import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))  # run as a script from ci/

MIB = 2**20


def _describe(o: object) -> str:
    if isinstance(o, dict):
        return f"dict({len(o)})"
    if isinstance(o, (list, tuple)):
        return f"{type(o).__name__}({len(o)})"
    if isinstance(o, types.FrameType):
        return f"frame {o.f_code.co_name} {o.f_code.co_filename}:{o.f_lineno}"
    if isinstance(o, types.FunctionType):
        return f"function {o.__qualname__} ({o.__module__})"
    if isinstance(o, types.CellType):
        return "cell"
    return f"{type(o).__module__}.{type(o).__qualname__}"


def chains(obj: object, depth: int, skip: set[int], prefix: str = "") -> None:
    if depth == 0:
        return
    for r in gc.get_referrers(obj):
        if id(r) in skip or isinstance(r, types.FrameType) and r.f_code.co_name == "chains":
            continue
        print(f"{prefix}<- {_describe(r)}")
        skip.add(id(r))
        chains(r, depth - 1, skip, prefix + "   ")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("case", nargs="?", default="model.ci_bert.train.fp32")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--depth", type=int, default=4)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("error: needs a CUDA device", file=sys.stderr)
        return 3
    from compiler.runtime import cudagraphs as cg
    from harness.bench.models import catalog as mdl
    from harness.bench.models.run import Stepper

    dev = torch.device("cuda")
    case = mdl.find(args.case, "gpu", "cuda")
    base = case.build(0)
    gc.collect()
    torch.cuda.empty_cache()
    start = torch.cuda.memory_allocated(dev)
    st = Stepper(case, base, "kiln-cg", dev)
    for _ in range(args.steps):
        st.step()
    torch.cuda.synchronize(dev)
    during = torch.cuda.memory_allocated(dev)
    del st
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    left = torch.cuda.memory_allocated(dev) - start
    print(
        f"{case.name}: allocated above start while stepping {(during - start) / MIB:.1f} MiB, "
        f"after dropping everything {left / MIB:.1f} MiB; _RECORDED_OUTPUTS entries {len(cg._RECORDED_OUTPUTS)}"
    )
    alive = [o for o in gc.get_objects() if type(o) in (cg.CudaGraphRunner, torch.cuda.CUDAGraph)]
    print(f"alive: {len(alive)} runner(s)/CUDAGraph(s)")
    skip = {id(alive)}
    for o in alive[:4]:
        print(f"== {_describe(o)} {getattr(o, 'name', '')}")
        chains(o, args.depth, skip)
    return 0


if __name__ == "__main__":
    sys.exit(main())
