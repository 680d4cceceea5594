"""Launch configs of a real step's reduction (and epilogue) kernels, measured: `python -m compiler.tools.launch_sweep`.

kiln picks block sizes and warps by heuristics (``runtime/launcher.py``), or with ``KILN_AUTOTUNE=1`` times the
same candidates at the first launch (``runtime/autotune.candidates``, shared with this tool). This tool is the
evidence for the heuristics: it compiles a training step under kiln on a GPU, records the arguments of each
reduction kernel's first launch, and times each kernel (``triton.testing.do_bench``, median) under the
heuristic's config and under alternatives (rows per program ``XBLOCK`` and ``num_warps``; column reductions
also ``RBLOCK``). One row per kernel: its *tile loads* (full-tile ``tl.load`` calls, the register-pressure
proxy the heuristic reads), the heuristic's config and time, the best config and time.

Cases (``--case``): ``vit`` (a ViT-B block: LayerNorm, fused-QKV attention, GELU MLP; batch 32 x 197 tokens,
bf16 autocast, forward + backward: LayerNorm backward), ``resnet`` (a ResNet-50 bottleneck stage,
channels-last, bf16 autocast, forward + backward: BatchNorm backward), ``bert`` (a BERT-base layer, bf16
inference), ``convnext`` (a ConvNeXt-T stage, channels-last bf16 inference, batch 16 at 56 x 56 x 96: depthwise
7x7 convolution, LayerNorm, Linear-GELU-Linear, layer scale, residual; then a LayerNorm2d downsample and a block at
28 x 28 x 192), ``adamw`` (a compiled AdamW foreach step over the parameters of a 4-layer GPT-2 at hidden 768,
the model tier's ``gpt2.opt_adamw`` row: 52 tensors, 68M elements, one 38.6M-element embedding; its update
kernels each update every tensor of one shape, up to 8 at once with 40 pointers). The ``convnext`` and
``adamw`` cases also sweep their pointwise kernels (rows that say ``pointwise`` and have no ``RBLOCK``).
Kernels whose heuristic time is below ``--min-us`` are listed without sweeping.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F


class _VitBlock(nn.Module):
    def __init__(self, d: int = 768, h: int = 12) -> None:
        super().__init__()
        self.h = h
        self.n1, self.n2 = nn.LayerNorm(d, eps=1e-6), nn.LayerNorm(d, eps=1e-6)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(self.n1(x)).reshape(b, n, 3, self.h, c // self.h).permute(2, 0, 3, 1, 4).unbind(0)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c))
        return x + self.fc2(F.gelu(self.fc1(self.n2(x))))


class _Bottleneck(nn.Module):
    def __init__(self, c: int = 256, mid: int = 64) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, mid, 1, bias=False), nn.BatchNorm2d(mid)
        self.c2, self.b2 = nn.Conv2d(mid, mid, 3, padding=1, bias=False), nn.BatchNorm2d(mid)
        self.c3, self.b3 = nn.Conv2d(mid, c, 1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.b1(self.c1(x)))
        y = F.relu(self.b2(self.c2(y)))
        return F.relu(self.b3(self.c3(y)) + x)


class _LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor (through NHWC permutes, as timm's ConvNeXt does)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class _ConvNeXtBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.full((c,), 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc2(F.gelu(self.fc1(self.norm(self.dw(x).permute(0, 2, 3, 1)))))
        return x + y.permute(0, 3, 1, 2).mul(self.gamma.reshape(1, -1, 1, 1))


def _convnext_stage() -> nn.Module:
    return nn.Sequential(
        _ConvNeXtBlock(96),
        _ConvNeXtBlock(96),
        _LayerNorm2d(96, eps=1e-6),
        nn.Conv2d(96, 192, 2, stride=2),
        _ConvNeXtBlock(192),
    )


#: cases whose pointwise kernels are swept too (the others: reduction kernels only)
POINTWISE_CASES = ("convnext", "adamw")


def _train_step(model: nn.Module, x: torch.Tensor) -> Callable[[], Any]:
    f = torch.compile(model, backend="kiln")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = f(x)
        y.float().square().mean().backward()

    return step


def build_case(name: str) -> Callable[[], Any]:
    """A step function for ``name`` (module docstring), on the GPU, not yet run."""
    torch.manual_seed(0)
    if name == "vit":
        model = nn.Sequential(_VitBlock(), _VitBlock()).cuda()
        return _train_step(model, torch.randn(32, 197, 768, device="cuda", requires_grad=True))
    if name == "resnet":
        # torch's stubs lack Module.to's memory_format keyword, which it accepts
        model = nn.Sequential(_Bottleneck(), _Bottleneck()).cuda().to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        return _train_step(
            model, torch.randn(32, 256, 56, 56, device="cuda").to(memory_format=torch.channels_last)
        )
    if name == "convnext":
        model = _convnext_stage().cuda().to(torch.bfloat16, memory_format=torch.channels_last).eval()  # type: ignore[call-overload]
        x = torch.randn(16, 96, 56, 56, device="cuda", dtype=torch.bfloat16).to(
            memory_format=torch.channels_last
        )
        f = torch.compile(model, backend="kiln")

        def infer() -> None:
            with torch.no_grad():
                f(x)

        return infer
    if name == "bert":
        import transformers

        cfg = transformers.BertConfig(num_hidden_layers=2)
        model = transformers.AutoModel.from_config(cfg).cuda().to(torch.bfloat16).eval()
        ids = torch.randint(0, 1000, (8, 256), device="cuda")
        f = torch.compile(model, backend="kiln")

        def step() -> None:
            with torch.no_grad():
                f(input_ids=ids)

        return step
    if name == "adamw":
        return _adamw_step()
    raise SystemExit(f"launch_sweep: unknown case {name!r} (vit, resnet, bert, convnext, adamw)")


def _gpt2_shapes(layers: int = 4, d: int = 768, vocab: int = 50257, positions: int = 1024) -> list[tuple]:
    """The parameter shapes of a GPT-2 (Conv1D weights are (in, out)), in ``named_parameters`` order."""
    ln = [(d,), (d,)]
    attn = [(d, 3 * d), (3 * d,), (d, d), (d,)]
    mlp = [(d, 4 * d), (4 * d,), (4 * d, d), (d,)]
    return [(vocab, d), (positions, d)] + (ln + attn + ln + mlp) * layers + ln


def _adamw_step() -> Callable[[], Any]:
    """The ``adamw`` case: AdamW's foreach step compiled over GPT-2-shaped parameters with gradients drawn
    once, its state primed by one eager step at learning rate 0 (the steady-state step, as the model tier's)."""
    params = [nn.Parameter(torch.randn(s, device="cuda") * 0.02) for s in _gpt2_shapes()]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-2
    opt = torch.optim.AdamW(params, lr=1e-4, foreach=True)
    for g in opt.param_groups:
        g["lr"] = 0.0
    opt.step()
    for g in opt.param_groups:
        g["lr"] = 1e-4
    return torch.compile(opt.step, backend="kiln")


def tile_loads(source: str) -> int:
    """Full-tile loads of a kernel (``tl.load`` masked by ``xrmask``): tiles it holds in registers at once."""
    return len(re.findall(r"tl\.load\([^\n]*xrmask", source))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m compiler.tools.launch_sweep", description=__doc__.splitlines()[0]
    )
    p.add_argument(
        "--case", default="vit", help="vit, resnet, bert, convnext or adamw (comma-separated for several)"
    )
    p.add_argument("--min-us", type=float, default=15.0, help="sweep kernels at least this slow (us)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "launch_sweep: needs a CUDA GPU (launch configs of the interpreter mean nothing)", file=sys.stderr
        )
        return 2
    import triton.testing

    from compiler import register

    register()  # `python -m compiler.tools...` imports the package before torch: its import registered nothing
    from compiler.runtime.autotune import candidates
    from compiler.runtime.combo import ComboKernel
    from compiler.runtime.launcher import TritonKernel

    rows = []
    for case in args.case.split(","):
        torch._dynamo.reset()
        step = build_case(case)
        firsts: dict[str, tuple[TritonKernel, tuple]] = {}
        combos: set[str] = set()
        orig = TritonKernel.forward

        def spy(
            self: TritonKernel,
            *a: Any,
            pointwise: bool = case in POINTWISE_CASES,
            firsts: dict[str, tuple[TritonKernel, tuple]] = firsts,
            combos: set[str] = combos,
            orig: Any = orig,
        ) -> None:
            if isinstance(self, ComboKernel):  # its parts' blocks come from their own heuristic configs
                combos.add(self.name)
            elif (self.reduction or pointwise) and self.name not in firsts:
                firsts[self.name] = (self, a)
            return orig(self, *a)

        TritonKernel.forward = spy  # type: ignore[method-assign]  # the spy records each kernel's first launch
        t_case = time.perf_counter()
        try:
            step()
            torch.cuda.synchronize()
        finally:
            TritonKernel.forward = orig  # type: ignore[method-assign]
        first_s = time.perf_counter() - t_case
        step_ms = triton.testing.do_bench(step, warmup=5, rep=50, return_mode="median")
        print(
            f"{case:6} step {step_ms:.3f} ms (median; first call, compile included, {first_s:.0f} s)",
            flush=True,
        )
        if combos:
            print(f"{case:6} {len(combos)} combo kernel(s) not swept (a block size per part)", flush=True)
        for name, (k, a) in sorted(firsts.items()):
            nptr = len(k.ptr_args)
            xnumel = int(a[nptr + len(k.size_args)])
            rnumel = int(a[nptr + len(k.size_args) + 1]) if k.reduction else 1
            base = k.heuristic_config(xnumel, rnumel, interp=False)

            def timed(cfg: dict[str, Any], k: TritonKernel = k, a: tuple = a) -> float:
                def fixed(x: int, r: int, d: Any) -> dict[str, Any]:
                    return cfg

                k.launch_config = fixed  # type: ignore[assignment]  # an instance attribute: this kernel only
                k._launches.clear()
                try:
                    return (
                        triton.testing.do_bench(lambda: k(*a), warmup=5, rep=25, return_mode="median") * 1e3
                    )
                finally:
                    del k.launch_config
                    k._launches.clear()

            t0 = timed(base)
            best, tbest = base, t0
            if t0 >= args.min_us:
                for cfg in candidates(base, k.hint, k.programs):
                    try:
                        t = timed(cfg)
                    except Exception as e:  # noqa: BLE001 - a config a kernel cannot compile is no candidate
                        print(f"  {name} {cfg}: {type(e).__name__}", file=sys.stderr)
                        continue
                    if t < tbest:
                        best, tbest = cfg, t
            kind = (k.hint + (" mixed" if k.programs else "")) if k.reduction else "pointwise"
            rows.append((case, name, kind, tile_loads(k.source), xnumel, rnumel, base, t0, best, tbest))
            print(
                f"{case:6} {name:44} {rows[-1][2]:12} loads {rows[-1][3]:2}  {xnumel}x{rnumel}  "
                f"heuristic {_cfg(base)} {t0:8.1f} us   best {_cfg(best)} {tbest:8.1f} us  ({t0 / tbest:.2f}x)",
                flush=True,
            )
    for label, sel in (
        ("reduction", lambda r: r[2] != "pointwise"),
        ("pointwise", lambda r: r[2] == "pointwise"),
    ):
        picked = [r for r in rows if sel(r)]
        if picked:
            total0, total1 = sum(r[7] for r in picked), sum(r[9] for r in picked)
            print(
                f"all {label} kernels: heuristic {total0:.0f} us, best configs {total1:.0f} us "
                f"({total0 / total1:.2f}x)"
            )
    return 0


def _cfg(c: dict[str, Any]) -> str:
    return f"X{c['XBLOCK']}/R{c.get('RBLOCK', '-')}/w{c['num_warps']}"


if __name__ == "__main__":
    sys.exit(main())
