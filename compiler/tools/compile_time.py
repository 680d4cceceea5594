"""Compile time, cold and warm, with and without compile workers: ``python -m compiler.tools.compile_time``.

Each measurement is a fresh process (``--child``) that builds a model from plain ``torch.nn``, compiles it,
and times its first step (compile + first run, synchronized) and its second step (run only): compile time
is the difference. *cold* runs start from empty caches (new folders under ``--work`` for TRITON_CACHE_DIR,
KILN_CACHE_DIR, KILN_GRAPH_CACHE_DIR, KILN_AUTOTUNE_DIR, TORCHINDUCTOR_CACHE_DIR and XDG_CACHE_HOME); *warm*
runs reuse the cold run's caches, as a second process on
the same machine would. Variants:

  kiln         compile workers (``compile_workers``, default min(32, usable CPUs)), cold then warm
  kiln-serial  KILN_COMPILE_THREADS=1: every kernel compiled in-process at its first launch, cold
  inductor     torch.compile's default backend, cold then warm (for comparison)

Models (fwd+bwd unless noted): ``gpt`` (``--layers`` GPT-2 style blocks: LayerNorm, causal attention written
out, GELU MLP), ``gpt-infer`` (the same, forward under no_grad), ``mlp`` (a small MLP). kiln rows print its
compile stats (``compiler.runtime.gpu_compile.compile_stats``): specializations compiled, compiled in workers,
found in the on-disk cache, time waiting for workers. A warm kiln run should compile 0.

    python -m compiler.tools.compile_time                      # on the GPU box
    python -m compiler.tools.compile_time --small --device cpu # a smoke test (interpreter: no compiles)
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
from typing import Any

MODELS = ("gpt", "gpt-infer", "mlp")
VARIANTS = ("kiln", "kiln-serial", "inductor")


# ------------------------------------------------------------------------------------------ models (child)
def build(model: str, args: argparse.Namespace) -> tuple[Any, Any, bool]:
    """(module, input, train?) on ``args.device``."""
    import torch

    small = args.small
    d, heads, seq, batch = (64, 4, 16, 2) if small else (768, 12, 512, 8)

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
            self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
            self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, 2)
            q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / (c // heads) ** 0.5)
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~causal, float("-inf")).softmax(-1)
            x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, c))
            return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    torch.manual_seed(0)
    if model in ("gpt", "gpt-infer"):
        net = torch.nn.Sequential(*[Block() for _ in range(args.layers)], torch.nn.LayerNorm(d))
        x = torch.randn(batch, seq, d)
    elif model == "mlp":
        width = 64 if small else 1024
        net = torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width),
            torch.nn.GELU(),
            torch.nn.Linear(4 * width, width),
            torch.nn.LayerNorm(width),
        )
        x = torch.randn(64 if small else 4096, width)
    else:
        raise SystemExit(f"unknown model {model!r}; one of {', '.join(MODELS)}")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    net = net.to(args.device, dtype)
    return net, x.to(args.device, dtype), model != "gpt-infer"


def child(args: argparse.Namespace) -> int:
    """One measurement in this (fresh) process; prints one JSON line."""
    import torch

    import compiler
    from compiler.runtime import gpu_compile

    compiler.register()  # the package was imported before torch (``-m compiler.tools...``): nothing registered yet

    net, x, train = build(args.child, args)
    backend = "kiln" if args.variant.startswith("kiln") else "inductor"
    fn = torch.compile(net, backend=backend)

    def sync() -> None:
        if x.device.type == "cuda":
            torch.cuda.synchronize()

    def step() -> float:
        sync()
        start = time.perf_counter()
        if train:
            fn(x.requires_grad_()).float().square().mean().backward()
        else:
            with torch.no_grad():
                fn(x)
        sync()
        return time.perf_counter() - start

    with compiler.capture() as graphs:
        first = step()
    second = step()
    out: dict[str, Any] = {
        "model": args.child,
        "variant": args.variant,
        "phase": args.phase,
        "first_s": round(first, 3),
        "second_s": round(second, 4),
        "compile_s": round(first - second, 3),
    }
    if backend == "kiln":
        s = gpu_compile.compile_stats()
        out.update(
            graphs=len(graphs),
            kernels=sum(len(g.kernel_sources) for g in graphs),
            launches=sum(g.kernel_count for g in graphs),
            compiled=s.compiled,
            in_workers=s.worker_compiles,
            cache_hits=s.cache_hits,
            jit=s.jit_compiles,
            worker_misses=s.worker_misses,
            wait_s=round(s.wait_seconds, 3),
            launch_compile_s=round(s.seconds, 3),
            worker_s=round(s.worker_seconds, 2),
        )
    print("RESULT " + json.dumps(out), flush=True)
    return 0


# ------------------------------------------------------------------------------------------ parent
def run_child(model: str, variant: str, phase: str, caches: str, args: argparse.Namespace) -> dict:
    env = dict(os.environ)
    env.update(
        TRITON_CACHE_DIR=os.path.join(caches, "triton"),
        KILN_CACHE_DIR=os.path.join(caches, "kiln"),
        KILN_GRAPH_CACHE_DIR=os.path.join(caches, "graphs"),  # else a set variable shares them across runs
        KILN_AUTOTUNE_DIR=os.path.join(caches, "autotune"),
        TORCHINDUCTOR_CACHE_DIR=os.path.join(caches, "inductor"),
        XDG_CACHE_HOME=os.path.join(caches, "xdg"),
    )
    if variant == "kiln-serial":
        env["KILN_COMPILE_THREADS"] = "1"
    elif variant == "kiln":
        env.pop("KILN_COMPILE_THREADS", None)  # the suites' setting must not turn the pool off here
        if args.workers:
            env["KILN_COMPILE_WORKERS"] = str(args.workers)
    cmd = [
        sys.executable,
        "-m",
        "compiler.tools.compile_time",
        "--child",
        model,
        "--variant",
        variant,
        "--phase",
        phase,
        "--layers",
        str(args.layers),
        "--dtype",
        args.dtype,
        "--device",
        args.device,
    ]
    if args.small:
        cmd.append("--small")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
    return {
        "model": model,
        "variant": variant,
        "phase": phase,
        "error": f"exit {proc.returncode}: {' | '.join(tail)}",
    }


COLUMNS = (
    "model",
    "variant",
    "phase",
    "compile_s",
    "first_s",
    "second_s",
    "kernels",
    "launches",
    "compiled",
    "in_workers",
    "cache_hits",
    "jit",
    "worker_misses",
    "wait_s",
    "worker_s",
)


def table(rows: list[dict]) -> str:
    lines = ["  ".join(f"{c:>12}" for c in COLUMNS)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['model']:>12}  {r['variant']:>12}  {r['phase']:>12}  ERROR {r['error']}")
            continue
        lines.append("  ".join(f"{r.get(c, ''):>12}" for c in COLUMNS))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m compiler.tools.compile_time", description=__doc__.splitlines()[0]
    )
    p.add_argument("--models", default=",".join(MODELS), help=f"comma list of {', '.join(MODELS)}")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    p.add_argument("--layers", type=int, default=12, help="GPT blocks (default 12, GPT-2 small)")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"))
    p.add_argument("--device", default="cuda")
    p.add_argument(
        "--workers", type=int, default=0, help="KILN_COMPILE_WORKERS for the kiln variant (0: default)"
    )
    p.add_argument("--small", action="store_true", help="tiny sizes (a smoke test)")
    p.add_argument("--work", default="", help="folder for the caches (default: a temporary folder, removed)")
    p.add_argument("--json", default="", help="also write the rows to this file")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per measurement")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--variant", default="kiln", help=argparse.SUPPRESS)
    p.add_argument("--phase", default="cold", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():  # every child would fail with torch's traceback, one row at a time
            print(
                "compile_time: needs a CUDA GPU (--device cuda); `--device cpu --small` is a smoke test here",
                file=sys.stderr,
            )
            return 2
    work = args.work or tempfile.mkdtemp(prefix="kiln-compile-time-")
    rows = []
    try:
        for model in args.models.split(","):
            for variant in args.variants.split(","):
                caches = os.path.join(work, f"{model}-{variant}")
                shutil.rmtree(caches, ignore_errors=True)
                phases = ("cold",) if variant == "kiln-serial" else ("cold", "warm")
                for phase in phases:
                    row = run_child(model, variant, phase, caches, args)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
