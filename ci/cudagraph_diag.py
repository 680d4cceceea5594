"""Why a model runs (or not) through kiln's CUDA graphs: per compiled graph, replays and recorded reasons.

    PYTHONPATH=. python3 ci/cudagraph_diag.py [gpt2|bert] [infer|train]      (on the GPU box)
"""
import sys
import time

import torch

import compiler

def main() -> None:
    family, mode = (sys.argv[1:] + ["gpt2", "infer"])[:2]
    import transformers
    cfg = {"gpt2": transformers.GPT2Config(n_layer=4, n_embd=768, n_head=12, use_cache=False),
           "bert": transformers.BertConfig(num_hidden_layers=4)}[family]
    model = transformers.AutoModelForCausalLM.from_config(cfg) if family == "gpt2" else \
        transformers.AutoModel.from_config(cfg)
    dtype = torch.bfloat16 if mode == "infer" else torch.float32
    model = model.cuda().to(dtype)
    ids = torch.randint(0, 1000, (8, 256), device="cuda")
    f = torch.compile(model, backend="kiln", options={"cudagraphs": True})
    with compiler.capture() as graphs:
        for i in range(6):
            torch.cuda.synchronize()
            t = time.perf_counter()
            if mode == "infer":
                with torch.no_grad():
                    f(input_ids=ids)
            else:
                f(input_ids=ids, labels=ids).loss.backward()
            torch.cuda.synchronize()
            print(f"step {i}: {1e3 * (time.perf_counter() - t):.2f} ms")
    for g in graphs:
        r = g.cudagraphs
        print(g.name, "kernels", g.kernel_launches, "stats", r.stats if r else None,
              [str(x) for x in g.fallbacks if x.kind == "cudagraph"])
    print("graphs:", len(graphs))


if __name__ == "__main__":
    main()
