"""Registry of the model tier: real model families built from configs with random weights (no downloads).

Terms:
- *model*: a `ModelSpec`: a family (`gpt2`, `llama`, `bert`, `t5`, `hf_vit`, `hf_resnet`, `resnet50`,
  `vit_b16`), the package that provides it (`transformers`, `torchvision`, `timm`: the optional extra
  `models`), a builder from a config dict, and per profile a `Sizes` (config, batch, sequence or image size,
  and the cases to run).
- *case*: one model in one mode and dtype, named `model.<model>.<mode>.<dtype>` (e.g. `model.gpt2.infer.bf16`):
  `infer` is a no_grad forward; `train` is zero_grad + forward + loss + backward (+ an optimizer step when
  the case names one: `adamw` or `sgd`); `opt` is the optimizer step alone (the case names its optimizer): the
  compiler compiles `opt.step` of a `foreach` AdamW or SGD-momentum over the model's parameters (hundreds of
  tensors of mixed sizes for the vision models), whose gradients are drawn once from the seed and stay, and
  whose state exists before it compiles (`prime_optimizer`: the steady-state step); every step moves the
  weights. Its name carries the optimizer: `model.<model>.opt_<optimizer>.<dtype>`. Dtypes: `fp32`; `bf16`
  (weights and floating inputs in bf16, inference only); `amp` (fp32 weights under `torch.autocast(bfloat16)`).
  A case spec `MODE[:DTYPE][:OPT]` without a dtype means bf16 for inference on a GPU, fp32 otherwise.
- *profile*: `tiny` (1-2 layers, hidden 32-64, short sequences, 32x32 images: runs on CPU through Triton's
  interpreter; transformers models only, since PyPI's torchvision does not load with the CPU torch) and
  `gpu` (H100-sized: the full-size rows and the 17 *CI-size* rows `ci_*`: GPT-2-, BERT-, Llama- and
  Qwen2-style training and inference and T5-style inference at 4 layers, hidden 512, 8 x 256 tokens (the full
  models' vocabularies); ResNet-18 inference and training, MobileNet-v3, EfficientNet-B0, ConvNeXt-tiny and
  ViT-small inference at batch 32 or 16). The CPU tier runs `tiny` only, so the `ci_*` rows never run there.
- *weights*: every case builds its model on CPU in fp32 from `seed` (`torch.manual_seed`), so every compiler
  gets the same weights (the runner deep-copies that model to the device per compiler).
- *source hash*: sha256 of `PROTOCOL`, the tier's shared code (input builder, forward/loss/step functions,
  optimizer factory), the model's builder source, its config and sizes, the mode, dtype and optimizer, and
  the providing package's name and version (a new transformers may change a model's graph); results are
  compared only when their source hashes are equal.
- *missing packages*: `package_problem(pkg)` imports a package once and returns None or a one-line reason.
  A torchvision that is installed but does not load (PyPI's build against another torch: "operator
  torchvision::nms does not exist") is hidden from later imports, because transformers and timm import it
  when they find it; transformers then works without it and timm is reported as needing it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import inspect
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

import torch
import torch.nn.functional as F

from harness.bench.core.records import Meta
from harness.exc import UsageError

# Bump when the way a model case is built, stepped or timed changes its meaning (invalidates comparisons).
PROTOCOL = "kiln-bench-model-v1"
PREFIX = "model."
PROFILES = ("tiny", "gpu")
MODES = ("infer", "train", "opt")
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "amp": torch.float32}
OPTIMIZERS = ("adamw", "sgd")
PACKAGES = ("transformers", "torchvision", "timm")

Inputs = dict[str, torch.Tensor]


# ---------------------------------------------------------------- builders (config dict -> nn.Module)
def _hf(config_cls: str, model_cls: str, cfg: dict[str, Any]) -> torch.nn.Module:
    import transformers

    config = getattr(transformers, config_cls)(**cfg)
    return getattr(transformers, model_cls)(config)


def build_gpt2(cfg: dict[str, Any]) -> torch.nn.Module:
    return _hf("GPT2Config", "GPT2LMHeadModel", cfg)


def build_llama(cfg: dict[str, Any]) -> torch.nn.Module:
    return _hf("LlamaConfig", "LlamaForCausalLM", cfg)


def build_bert(cfg: dict[str, Any]) -> torch.nn.Module:
    return _hf("BertConfig", "BertForMaskedLM", cfg)


def build_qwen2(cfg: dict[str, Any]) -> torch.nn.Module:
    return _hf("Qwen2Config", "Qwen2ForCausalLM", cfg)


def build_t5(cfg: dict[str, Any]) -> torch.nn.Module:
    return _hf("T5Config", "T5ForConditionalGeneration", cfg)


def build_hf_vit(cfg: dict[str, Any]) -> torch.nn.Module:
    return _hf("ViTConfig", "ViTForImageClassification", cfg)


def build_hf_resnet(cfg: dict[str, Any]) -> torch.nn.Module:
    return _hf("ResNetConfig", "ResNetForImageClassification", cfg)


def build_torchvision(cfg: dict[str, Any]) -> torch.nn.Module:
    import torchvision

    kw = dict(cfg)
    return getattr(torchvision.models, kw.pop("arch"))(weights=None, **kw)


def build_timm(cfg: dict[str, Any]) -> torch.nn.Module:
    import timm

    kw = dict(cfg)
    return timm.create_model(kw.pop("arch"), pretrained=False, **kw)


# ---------------------------------------------------------------- inputs, forward, loss, step pieces
def make_inputs(
    kind: str, sizes: Sizes, mode: str, device: torch.device, float_dtype: torch.dtype, seed: int
) -> Inputs:
    """Deterministic inputs (drawn on CPU from `seed`, then moved): token ids for language models, images
    for vision models; `labels` too in train mode (the LM's own ids, or class ids)."""
    gen = torch.Generator().manual_seed(seed + 1)
    b, cfg = sizes.batch, sizes.config
    out: Inputs = {}
    if kind == "vision":
        out["pixel_values"] = torch.randn(b, 3, sizes.image, sizes.image, generator=gen).to(float_dtype)
        if mode == "train":
            out["labels"] = torch.randint(0, sizes.classes, (b,), generator=gen)
    else:
        vocab = int(cfg["vocab_size"])
        out["input_ids"] = torch.randint(1, vocab, (b, sizes.seq), generator=gen)
        if kind == "encoder-decoder":
            dec = torch.randint(1, vocab, (b, sizes.dec_seq), generator=gen)
            out["labels" if mode == "train" else "decoder_input_ids"] = dec
        elif mode == "train":
            out["labels"] = out["input_ids"]
    return {k: v.to(device) for k, v in out.items()}


def forward(style: str, model: Any, inputs: Inputs) -> Any:
    """One forward call: transformers models take keyword inputs (labels included, so they compute their
    own loss), plain vision models take the image tensor."""
    if style == "hf":
        return model(**inputs)
    return model(inputs["pixel_values"])


def loss_of(out: Any, inputs: Inputs) -> torch.Tensor:
    """The model's own loss (transformers with labels), else cross-entropy of the logits in fp32."""
    loss = getattr(out, "loss", None)
    if loss is not None:
        return loss
    return F.cross_entropy(primary(out).float(), inputs["labels"])


def primary(out: Any) -> torch.Tensor:
    """The main output tensor: logits, else the last hidden state, else the output itself."""
    if isinstance(out, torch.Tensor):
        return out
    for name in ("logits", "last_hidden_state"):
        t = getattr(out, name, None)
        if isinstance(t, torch.Tensor):
            return t
    raise TypeError(f"no logits or last_hidden_state in {type(out).__name__}")


def make_optimizer(
    name: str | None, params: Any, foreach: bool | None = None
) -> torch.optim.Optimizer | None:
    if name is None:
        return None
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=foreach)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-2, momentum=0.9, foreach=foreach)
    raise ValueError(f"unknown optimizer {name!r} (choose from {', '.join(OPTIMIZERS)})")


def prime_optimizer(opt: torch.optim.Optimizer) -> None:
    """Give `opt` its state (AdamW's moments and step count, SGD's momentum buffers) with one eager step at
    learning rate 0, which leaves the weights as they are: an `opt` case compiles the steady-state step. Left
    unprimed, the first compiled call creates the state inside the compiled graph (a graph that never runs
    again, then a recompile), and under CUDA graphs the buffers it creates are outputs of a recorded graph that
    the next step's replay may overwrite while the optimizer still holds them (Inductor's CUDA-graph trees
    raise "accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run")."""
    lrs = [g["lr"] for g in opt.param_groups]
    for g in opt.param_groups:
        g["lr"] = 0.0
    opt.step()
    for g, lr in zip(opt.param_groups, lrs):
        g["lr"] = lr


def grad_names(model: torch.nn.Module, k: int = 2) -> list[str]:
    """Parameters whose gradients the accuracy check compares: the first and the last `k` that need grad
    (embeddings/stem and head/final norm: the two ends of the backward pass)."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    return list(dict.fromkeys(names[:k] + names[-k:]))


_SHARED = (make_inputs, forward, loss_of, primary, make_optimizer, prime_optimizer, grad_names)


# ---------------------------------------------------------------- registry
@dataclass(frozen=True)
class Sizes:
    """One model's size table in one profile; `cases` are specs `MODE[:DTYPE][:OPTIMIZER]`."""

    config: dict[str, Any]
    batch: int
    cases: tuple[str, ...]
    seq: int = 0  # tokens (encoder tokens for T5)
    dec_seq: int = 0  # decoder tokens (T5)
    image: int = 0  # image height = width (vision)
    classes: int = 0  # classes of the vision head (train labels)


@dataclass(frozen=True)
class ModelSpec:
    """A model family (see module docstring). `kind`: decoder, encoder, encoder-decoder or vision; `style`:
    hf (keyword inputs) or tensor (an image tensor)."""

    name: str
    kind: str
    package: str
    build: Callable[[dict[str, Any]], torch.nn.Module]
    sizes: dict[str, Sizes]
    style: str = "hf"


@dataclass(frozen=True)
class ModelCase:
    """One model in one mode and dtype in one profile (see module docstring)."""

    name: str
    spec: ModelSpec = field(repr=False)
    profile: str
    mode: str
    dtype_name: str
    optimizer: str | None
    sizes: Sizes = field(repr=False)
    source_hash: str

    @property
    def model_dtype(self) -> torch.dtype:
        """dtype of the weights and floating inputs (fp32 under autocast for `amp`)."""
        return DTYPES[self.dtype_name]

    @property
    def autocast(self) -> bool:
        return self.dtype_name == "amp"

    def build(self, seed: int = 0) -> torch.nn.Module:
        """The model in fp32 on CPU with weights drawn from `seed`, in train/eval mode as the case needs."""
        torch.manual_seed(seed)
        model = self.spec.build(self.sizes.config)
        return model.eval() if self.mode == "infer" else model.train()

    def inputs(
        self, device: torch.device | str, seed: int = 0, float_dtype: torch.dtype | None = None
    ) -> Inputs:
        return make_inputs(
            self.spec.kind, self.sizes, self.mode, torch.device(device), float_dtype or self.model_dtype, seed
        )

    def describe(self) -> Meta:
        """What the case is, for the stored result's `meta`."""
        s = self.sizes
        shape = {"batch": s.batch}
        shape.update({k: v for k, v in (("seq", s.seq), ("dec_seq", s.dec_seq), ("image", s.image)) if v})
        return Meta(
            tier="models",
            family=self.spec.name,
            kind=self.spec.kind,
            package=self.spec.package,
            package_version=package_version(self.spec.package),
            mode=self.mode,
            dtype=self.dtype_name,
            optimizer=self.optimizer,
            shape=shape,
            config=s.config,
        )


_GPT2_TINY = {
    "n_layer": 1,
    "n_embd": 32,
    "n_head": 2,
    "vocab_size": 128,
    "n_positions": 64,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
    "use_cache": False,
    "bos_token_id": 0,
    "eos_token_id": 0,
}
_GPT2_GPU = {
    "n_layer": 4,
    "n_embd": 768,
    "n_head": 12,
    "vocab_size": 50257,
    "n_positions": 1024,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attn_pdrop": 0.0,
    "use_cache": False,
}
_LLAMA_TINY = {
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "use_cache": False,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "pad_token_id": 0,
}
_LLAMA_GPU = {
    "vocab_size": 32000,
    "hidden_size": 768,
    "intermediate_size": 2048,
    "num_hidden_layers": 4,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "max_position_embeddings": 1024,
    "use_cache": False,
}
_BERT_TINY = {
    "vocab_size": 128,
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
    "pad_token_id": 0,
}
_BERT_GPU = {
    "vocab_size": 30522,
    "hidden_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "max_position_embeddings": 512,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
_T5_TINY = {
    "vocab_size": 128,
    "d_model": 32,
    "d_kv": 16,
    "d_ff": 64,
    "num_layers": 1,
    "num_decoder_layers": 1,
    "num_heads": 2,
    "relative_attention_num_buckets": 8,
    "dropout_rate": 0.0,
    "use_cache": False,
    "decoder_start_token_id": 0,
    "pad_token_id": 0,
    "eos_token_id": 1,
}
_T5_GPU = {
    "vocab_size": 32128,
    "d_model": 512,
    "d_kv": 64,
    "d_ff": 2048,
    "num_layers": 6,
    "num_decoder_layers": 6,
    "num_heads": 8,
    "dropout_rate": 0.0,
    "use_cache": False,
    "decoder_start_token_id": 0,
    "pad_token_id": 0,
    "eos_token_id": 1,
}  # t5-small
_VIT_TINY = {
    "image_size": 32,
    "patch_size": 8,
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "num_labels": 10,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
_RESNET_TINY = {
    "embedding_size": 16,
    "hidden_sizes": [16, 32],
    "depths": [1, 1],
    "layer_type": "basic",
    "num_labels": 10,
}

# CI-size rows: a few layers at hidden 512 and 8 x 256 tokens (the vocabularies of the full models),
# and small torchvision/timm vision models at small batches; models `ci_*`, so `--only 'ci_*'` picks them all
_GPT2_CI = {**_GPT2_GPU, "n_layer": 4, "n_embd": 512, "n_head": 8}
_BERT_CI = {**_BERT_GPU, "hidden_size": 512, "num_attention_heads": 8, "intermediate_size": 2048}
_LLAMA_CI = {
    **_LLAMA_GPU,
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
}
_QWEN2_CI = {  # Qwen2-0.5B's vocabulary and grouped-query attention, at the CI size
    "vocab_size": 151936,
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
    "use_cache": False,
}
_T5_CI = {**_T5_GPU, "num_layers": 4, "num_decoder_layers": 4}
CI_PREFIX = "ci_"

MODELS: tuple[ModelSpec, ...] = (
    ModelSpec(
        "gpt2",
        "decoder",
        "transformers",
        build_gpt2,
        {
            "tiny": Sizes(_GPT2_TINY, 2, ("infer", "train:adamw"), seq=32),
            "gpu": Sizes(_GPT2_GPU, 8, ("infer:bf16", "train:fp32:adamw", "opt:fp32:adamw"), seq=256),
        },
    ),
    ModelSpec(
        "llama",
        "decoder",
        "transformers",
        build_llama,
        {
            "tiny": Sizes(_LLAMA_TINY, 2, ("infer",), seq=32),
            "gpu": Sizes(_LLAMA_GPU, 8, ("infer:bf16", "train:fp32:adamw"), seq=256),
        },
    ),
    ModelSpec(
        "bert",
        "encoder",
        "transformers",
        build_bert,
        {
            "tiny": Sizes(_BERT_TINY, 2, ("infer",), seq=32),
            "gpu": Sizes(_BERT_GPU, 8, ("infer:bf16",), seq=256),
        },
    ),
    ModelSpec(
        "t5",
        "encoder-decoder",
        "transformers",
        build_t5,
        {
            "tiny": Sizes(_T5_TINY, 2, ("infer",), seq=32, dec_seq=16),
            "gpu": Sizes(_T5_GPU, 8, ("infer:bf16",), seq=256, dec_seq=64),
        },
    ),
    ModelSpec(
        "hf_vit",
        "vision",
        "transformers",
        build_hf_vit,
        {
            "tiny": Sizes(_VIT_TINY, 2, ("infer",), image=32, classes=10),
        },
    ),
    ModelSpec(
        "hf_resnet",
        "vision",
        "transformers",
        build_hf_resnet,
        {
            "tiny": Sizes(_RESNET_TINY, 2, ("infer",), image=32, classes=10),
        },
    ),
    ModelSpec(
        "resnet50",
        "vision",
        "torchvision",
        build_torchvision,
        {
            "gpu": Sizes(
                {"arch": "resnet50"},
                32,
                ("infer:bf16", "train:amp:sgd", "opt:fp32:adamw", "opt:fp32:sgd"),
                image=224,
                classes=1000,
            ),
        },
        style="tensor",
    ),
    ModelSpec(
        "vit_b16",
        "vision",
        "timm",
        build_timm,
        {
            "gpu": Sizes(
                {"arch": "vit_base_patch16_224"},
                32,
                ("infer:bf16", "train:amp:adamw"),
                image=224,
                classes=1000,
            ),
        },
        style="tensor",
    ),
    ModelSpec(
        "ci_gpt2",
        "decoder",
        "transformers",
        build_gpt2,
        {"gpu": Sizes(_GPT2_CI, 8, ("train:fp32:adamw", "infer:fp32", "infer:bf16"), seq=256)},
    ),
    ModelSpec(
        "ci_bert",
        "encoder",
        "transformers",
        build_bert,
        {"gpu": Sizes(_BERT_CI, 8, ("train:fp32:adamw", "infer:bf16"), seq=256)},
    ),
    ModelSpec(
        "ci_llama",
        "decoder",
        "transformers",
        build_llama,
        {"gpu": Sizes(_LLAMA_CI, 8, ("train:fp32:adamw", "infer:fp32", "infer:bf16"), seq=256)},
    ),
    ModelSpec(
        "ci_qwen2",
        "decoder",
        "transformers",
        build_qwen2,
        {"gpu": Sizes(_QWEN2_CI, 8, ("train:fp32:adamw", "infer:bf16"), seq=256)},
    ),
    ModelSpec(
        "ci_t5",
        "encoder-decoder",
        "transformers",
        build_t5,
        {"gpu": Sizes(_T5_CI, 8, ("infer:bf16",), seq=256, dec_seq=64)},
    ),
    ModelSpec(
        "ci_resnet18",
        "vision",
        "torchvision",
        build_torchvision,
        {"gpu": Sizes({"arch": "resnet18"}, 32, ("infer:bf16", "train:amp:sgd"), image=224, classes=1000)},
        style="tensor",
    ),
    ModelSpec(
        "ci_mobilenet_v3",
        "vision",
        "torchvision",
        build_torchvision,
        {"gpu": Sizes({"arch": "mobilenet_v3_large"}, 32, ("infer:bf16",), image=224, classes=1000)},
        style="tensor",
    ),
    ModelSpec(
        "ci_efficientnet_b0",
        "vision",
        "torchvision",
        build_torchvision,
        {"gpu": Sizes({"arch": "efficientnet_b0"}, 32, ("infer:bf16",), image=224, classes=1000)},
        style="tensor",
    ),
    ModelSpec(
        "ci_convnext_tiny",
        "vision",
        "timm",
        build_timm,
        {"gpu": Sizes({"arch": "convnext_tiny"}, 16, ("infer:bf16",), image=224, classes=1000)},
        style="tensor",
    ),
    ModelSpec(
        "ci_vit_small",
        "vision",
        "timm",
        build_timm,
        {"gpu": Sizes({"arch": "vit_small_patch16_224"}, 16, ("infer:bf16",), image=224, classes=1000)},
        style="tensor",
    ),
)


# ---------------------------------------------------------------- packages
_PROBLEMS: dict[str, str | None] = {}


def _one_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}".strip()[:200]


def _hide(pkg: str) -> None:
    """Make `pkg` look absent to later imports and `importlib.util.find_spec` (a None entry)."""
    for name in [m for m in sys.modules if m == pkg or m.startswith(pkg + ".")]:
        del sys.modules[name]
    sys.modules[pkg] = None  # type: ignore[assignment]


def package_problem(pkg: str) -> str | None:
    """None when `pkg` imports, else why not (one line); imported once per process (module docstring)."""
    if pkg in _PROBLEMS:
        return _PROBLEMS[pkg]
    if pkg != "torchvision" and "torchvision" not in _PROBLEMS:
        package_problem("torchvision")  # first: a broken one must be hidden before transformers/timm look
    if sys.modules.get(pkg, False) is None:
        problem: str | None = "hidden (None in sys.modules)"
    else:
        try:
            importlib.import_module(pkg)
            problem = None
        except Exception as e:  # noqa: BLE001 - any import failure means: skip this package's models
            problem = _one_line(e)
            if pkg == "torchvision" and not isinstance(e, ImportError):
                _hide(pkg)
            tv = _PROBLEMS.get("torchvision")
            if pkg == "timm" and tv:
                problem = f"needs torchvision, which is not importable ({tv})"
    if pkg == "transformers" and problem is None:
        import transformers

        transformers.logging.set_verbosity_error()
    _PROBLEMS[pkg] = problem
    return problem


def package_version(pkg: str) -> str | None:
    """The installed distribution's version (read from its metadata: nothing is imported), or None."""
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return None


# ---------------------------------------------------------------- cases
def resolve_dtype(mode: str, dtype: str, device: str) -> str:
    """`auto` (or empty) -> bf16 for inference on a GPU, fp32 otherwise."""
    if dtype in ("", "auto"):
        return "bf16" if mode == "infer" and device.startswith("cuda") else "fp32"
    return dtype


def _hash(spec: ModelSpec, sizes: Sizes, mode: str, dtype: str, opt: str | None, version: str | None) -> str:
    parts = [
        PROTOCOL,
        *(inspect.getsource(f) for f in _SHARED),
        inspect.getsource(spec.build),
        json.dumps(sizes.config, sort_keys=True),
        json.dumps([sizes.batch, sizes.seq, sizes.dec_seq, sizes.image, sizes.classes]),
        spec.kind,
        spec.style,
        mode,
        dtype,
        repr(opt),
        f"{spec.package}=={version}",
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _parse(spec: ModelSpec, profile: str, text: str, device: str) -> ModelCase:
    bits = text.split(":")
    mode = bits[0]
    if mode not in MODES:
        raise ValueError(f"{spec.name}: unknown mode {mode!r} in case {text!r}")
    dtype, opt = "auto", None
    for b in bits[1:]:
        if b in OPTIMIZERS:
            opt = b
        elif b in DTYPES or b == "auto":
            dtype = b
        else:
            raise ValueError(f"{spec.name}: unknown dtype or optimizer {b!r} in case {text!r}")
    dtype = resolve_dtype(mode, dtype, device)
    if mode == "infer" and opt:
        raise ValueError(f"{spec.name}: an optimizer in an infer case ({text!r})")
    if mode == "opt" and not opt:
        raise ValueError(f"{spec.name}: an opt case without its optimizer ({text!r})")
    sizes = spec.sizes[profile]
    name = (
        f"{PREFIX}{spec.name}.{mode}_{opt}.{dtype}"
        if mode == "opt"
        else f"{PREFIX}{spec.name}.{mode}.{dtype}"
    )
    version = package_version(spec.package)
    return ModelCase(
        name, spec, profile, mode, dtype, opt, sizes, _hash(spec, sizes, mode, dtype, opt, version)
    )


def all_cases(profile: str, device: str = "cpu") -> list[ModelCase]:
    """Every case of `profile` for `device`, in registry order, whatever packages are installed."""
    if profile not in PROFILES:
        raise UsageError(f"unknown profile {profile!r} (choose from {', '.join(PROFILES)})")
    return [
        _parse(s, profile, c, device) for s in MODELS if profile in s.sizes for c in s.sizes[profile].cases
    ]


def select(cs: list[ModelCase], only: str | None) -> list[ModelCase]:
    """Cases matching any comma-separated fnmatch pattern, against the case name (`model.gpt2.infer.bf16`),
    the name without `model.` (`gpt2.infer.bf16`) or the model (`gpt2`), in the patterns' order (cases of one
    pattern in the tier's order): a run with a time budget measures the cases named first first."""
    if not only:
        return cs
    pats = [p.strip() for p in only.split(",") if p.strip()]

    def first(c: ModelCase) -> int | None:
        names = (c.name, c.name[len(PREFIX) :], c.spec.name)
        return next((i for i, p in enumerate(pats) if any(fnmatchcase(n, p) for n in names)), None)

    ranked = [(first(c), k, c) for k, c in enumerate(cs)]
    return [c for i, _, c in sorted((r for r in ranked if r[0] is not None), key=lambda r: (r[0], r[1]))]


def cases(profile: str, only: str | None = None, device: str = "cpu") -> list[ModelCase]:
    """Cases of `profile` selected by `only` (raises UsageError when nothing matches)."""
    cs = all_cases(profile, device)
    out = select(cs, only)
    if not out:
        raise UsageError(f"no {profile} model matches {only!r} (known: {', '.join(c.name for c in cs)})")
    return out


def available(cs: list[ModelCase]) -> tuple[list[ModelCase], dict[str, str]]:
    """(cases whose package imports, {package: 'pkg: not importable (why): a, b skipped'} for the rest)."""
    problems = {p: package_problem(p) for p in dict.fromkeys(c.spec.package for c in cs)}
    notes = {}
    for pkg, why in problems.items():
        if why:
            names = ", ".join(dict.fromkeys(c.spec.name for c in cs if c.spec.package == pkg))
            notes[pkg] = f"{pkg}: not importable ({why}): {names} skipped"
    return [c for c in cs if not problems[c.spec.package]], notes


def find(name: str, profile: str, device: str = "cpu") -> ModelCase:
    """The case called `name` (with or without `model.`) in `profile` for `device`."""
    full = name if name.startswith(PREFIX) else PREFIX + name
    for c in all_cases(profile, device):
        if c.name == full:
            return c
    raise UsageError(f"unknown {profile} model case {name!r}")
