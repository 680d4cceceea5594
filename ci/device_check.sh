#!/usr/bin/env bash
# GPU checks and timings in one device call (the GPU box: no docker, the machine's own torch/triton).
# Usage: ci/device_check.sh STAGE...   stages: cudagraphs, overhead, suites, suites-cg, compiler-tests, profile,
#   fx-passes, models, kernels-vs, bisect-demo, shards, sweep, faults, value-trace, cgtrain, visible, preflight,
#   scatter, warmcache, warmprofile, runner-id, memdiag, attention, caches, autotune-diff, numerics-flakes, verdicts-aa,
#   split-sweep, compile-ab, mix-sweep
# (profile: where model steps spend their time, per compiler; cases from $PROFILE_ONLY, the $PROFILE_TOP (25) longest kernels;
#  fx-passes: the layout rewrites' and compile path's tests; attention: the eager-attention rewrite's tests; models: the model tier for $MODELS_ONLY,
#  resuming (MODELS_RESUME= to measure again; MODELS_TARGET_S / MODELS_ROUNDS: sampling, default the GPU's) the store copied from $MODELS_FROM (a folder carried from an earlier call) into $OUT/models;
#  cold/warm compile s for $MODELS_COMPILE_TIMES, default none; MODELS_COMPILE_ONLY=1: those alone, no step timing;
#  MODELS_COMPILE_JOBS=N: that many cases' probes at once, each on 1/N of the CPUs; MODELS_COLD_ONLY=1: no warm probe;
#  cgtrain (at most 415 s): the CUDA-graph training tests, the CI-size model rows ($CGTRAIN_ONLY, default ci_*;
#  cases past $CGTRAIN_BUDGET_S=200 s are deferred: rerun the models line with --resume) under every arm with
#  kernel ms, fallbacks, unrecorded graphs and memory into $OUT/cgtrain, the memory check of one row by hand, and a
#  kiln-cg profile of the GPT-2-style CI-size training step with its host gaps;
#  sweep: launch configs of real steps' kernels ($SWEEP_CASES, default convnext,vit,resnet,bert; adamw: the
#  GPT-2 AdamW step's update kernels);
#  scatter: the scatter family's atomic kernels and scans against eager CUDA, and their numerics cases)
# Output: one log per stage under $OUT (default results/device), the summary last on stdout; PACK=FILE also packs
# all of $OUT into one tarball FILE at the end (a device call returns a limited number of files: put FILE under
# the call's own output folder and OUT elsewhere). PROFILE_DUMP=1: the profile stage's kiln arms write their
# wrappers and kernel sources under $OUT/dump (KILN_DUMP_DIR), to read what a profiled kernel is.
# Carry the tree to the GPU box as a shallow clone (`git clone -q --depth 1 file://$PWD .kiln/head`), not a
# `git archive`: bench runs record the commit from git, and an archive inside the checkout records its parent's.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/device}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONHASHSEED=0
nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm --format=csv,noheader || true
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
SUITES="tests/dynamic_shapes tests/control_flow tests/fallback tests/numerics"
summary=()
for stage in "$@"; do
  start=$SECONDS
  case "$stage" in
    cudagraphs) timeout 300 python3 -m pytest -q -p no:cacheprovider tests/compiler/test_cudagraphs.py > "$OUT/$stage.log" 2>&1 ;;
    overhead) timeout 420 python3 -m harness bench overhead --calls 100 --samples 15 --md "$OUT/overhead.md" \
                --json "$OUT/overhead.json" --profile "$OUT/profile.txt" > "$OUT/$stage.log" 2>&1 ;;
    suites) timeout 400 python3 -m pytest -q -p no:cacheprovider -p no:xdist $SUITES > "$OUT/$stage.log" 2>&1 ;;
    suites-cg) KILN_CUDAGRAPHS=1 timeout 400 python3 -m pytest -q -p no:cacheprovider -p no:xdist $SUITES \
                > "$OUT/$stage.log" 2>&1 ;;
    profile) ${PROFILE_DUMP:+env KILN_DUMP_DIR="$OUT/dump"} timeout "${PROFILE_TIMEOUT_S:-200}" python3 -m harness bench model-profile --only "${PROFILE_ONLY:-model.gpt2.infer.bf16,model.resnet50.infer.bf16}" \
                --compilers "${PROFILE_COMPILERS:-kiln,inductor}" --steps 10 --top "${PROFILE_TOP:-25}" --md "$OUT/profile.md" > "$OUT/$stage.log" 2>&1 ;;
    fx-passes) KILN_NO_VENV=1 timeout 150 python3 -m pytest -q -p no:cacheprovider -p no:xdist tests/compiler/test_fx_passes.py \
                tests/compiler/test_compile_pool.py tests/compiler/test_launcher.py tests/compiler/test_dedup.py > "$OUT/$stage.log" 2>&1 ;;
    autotune-diff) # kiln against kiln autotuned (arm kiln-autotune) side by side for $AUTOTUNE_ONLY
            # (default ResNet-50 training, which read 15.3 -> 24.1 ms a step in two compile probes on a busy host and
            # 23.6 -> 23.9 ms, p 0.94, here, kernel ms 8.02 -> 7.46): model tier step times with the report's
            # "Autotuning's gain" verdicts, then per-kernel device times of both (about 250 s for ResNet-50 training)
            { timeout "${AUTOTUNE_TIMEOUT_S:-300}" python3 -m harness bench models --only "${AUTOTUNE_ONLY:-model.resnet50.train.amp}" \
                --compilers eager,kiln,kiln-autotune --compile-times none --target-s 1 --rounds 3 --out "$OUT/autotune-diff"
              timeout 240 python3 -m harness bench model-profile --only "${AUTOTUNE_ONLY:-model.resnet50.train.amp}" \
                --compilers kiln,kiln-autotune --steps 10 --top 40 --md "$OUT/autotune-diff.md"; } > "$OUT/$stage.log" 2>&1 ;;
    caches) # the graph cache, the inference and training front caches and kiln's binary index on the GPU
            # (cold then warm in one process: CUDA tensors, Triton's real compile), about 60 s
            KILN_NO_VENV=1 timeout "${CACHES_TIMEOUT_S:-300}" python3 -m pytest -q -p no:cacheprovider -p no:xdist tests/compiler/test_graph_cache.py \
              tests/compiler/test_inference_cache.py tests/compiler/test_training_cache.py \
              $(ls tests/compiler/test_binary_index.py 2>/dev/null) > "$OUT/$stage.log" 2>&1 ;;
    attention) # the attention rewrite on the GPU: _scaled_dot_product_efficient_attention end to end, HF BERT eager and sdpa (math form)
               KILN_NO_VENV=1 timeout 240 python3 -m pytest -q -p no:cacheprovider -p no:xdist \
                 tests/compiler/test_attention_pass.py > "$OUT/$stage.log" 2>&1 ;;
    models) if [ -n "${MODELS_FROM:-}" ]; then mkdir -p "$OUT/models" && cp -r "$MODELS_FROM"/. "$OUT/models/"; fi
            timeout "${MODELS_TIMEOUT_S:-540}" python3 -m harness bench models ${MODELS_RESUME---resume} ${MODELS_COMPILE_ONLY:+--compile-only} \
                ${MODELS_COMPILE_JOBS:+--compile-jobs "$MODELS_COMPILE_JOBS"} ${MODELS_COLD_ONLY:+--cold-only} \
                --only "${MODELS_ONLY:-model.gpt2.infer.*,model.resnet50.infer.*}" \
                --compilers "${MODELS_COMPILERS:-kiln,inductor,kiln-cg,inductor-cg,eager}" \
                --compile-times "${MODELS_COMPILE_TIMES:-none}" \
                ${MODELS_TARGET_S:+--target-s "$MODELS_TARGET_S"} ${MODELS_ROUNDS:+--rounds "$MODELS_ROUNDS"} \
                --budget-s "${MODELS_BUDGET_S:-400}" --out "$OUT/models" > "$OUT/$stage.log" 2>&1 ;;
    kernels-vs) # the kernel bench at $KERNELS_BASE (a worktree; carry a full clone) and at HEAD, one store, compared
                timeout 560 bash ci/kernels_vs.sh "${KERNELS_BASE:?KERNELS_BASE=<commit> is needed}" "$OUT" > "$OUT/$stage.log" 2>&1 ;;
    bisect-demo) # a scratch repo: base -> good -> planted host sleep in kiln's launcher -> good x2; bench bisect names it
                timeout 560 bash ci/bisect_demo.sh "$OUT" > "$OUT/$stage.log" 2>&1 ;;
    shards) # the suites natively as one shard, then as $SHARDS shards at once on $SHARD_DEVICES (default 0,0: two
            # shards sharing GPU 0; empty: one per GPU), merged and checked; nvidia-smi samples compute processes and
            # their GPUs each second
            { timeout 300 python3 -m harness run --backend cuda --native --no-history --results "$OUT/shards1" --quiet
              echo "one shard: exit $?"
              nvidia-smi --query-compute-apps=timestamp,pid,used_memory,gpu_bus_id --format=csv,noheader -l 1 > "$OUT/smi.csv" 2>&1 &
              smi=$!
              devs=${SHARD_DEVICES-0,0}  # SHARD_DEVICES= (empty): every visible GPU, one shard each (--shards auto)
              timeout 300 python3 -m harness run --backend cuda --native --no-history --shards "${SHARDS:-2}" \
                --gpus-per-shard 1 ${devs:+--devices "$devs"} --results "$OUT/shards2"
              echo "sharded: exit $?"; kill $smi
              python3 -m harness report "$OUT/shards2" --check
              python3 ci/smi_overlap.py "$OUT/smi.csv"; } > "$OUT/$stage.log" 2>&1 ;;
    sweep) # launch configs of real steps' reduction kernels (convnext: its pointwise epilogues too): the heuristic's
           # against the best measured, and each case's step time
            timeout 560 python3 -m compiler.tools.launch_sweep --case "${SWEEP_CASES:-convnext,vit,resnet,bert}" > "$OUT/$stage.log" 2>&1 ;;
    compile-ab) # kiln's cold compile at the tree in $AB_BASE (a shallow clone carried beside this one) and here,
            # alternated (ci/compile_ab.sh: AB_ONLY, AB_REPS, AB_JOBS, AB_BUDGET_S)
            timeout 580 bash ci/compile_ab.sh "${AB_BASE:?AB_BASE=<folder of the base tree> is needed}" "$OUT/compile-ab" \
                > "$OUT/$stage.log" 2>&1 ;;
    split-sweep) # chunk sizes of split column reductions (norm and bias gradients), kiln per chunk beside Inductor
            timeout "${SPLIT_TIMEOUT_S:-300}" python3 -m compiler.tools.split_sweep ${SPLIT_CASES:+--cases "$SPLIT_CASES"} \
                ${SPLIT_CHUNKS:+--chunks "$SPLIT_CHUNKS"} > "$OUT/$stage.log" 2>&1 ;;
    mix-sweep) # program counts of mixed row/column kernels (norm backwards), kiln per count beside Inductor
               # (MIX_CASES, MIX_PROGRAMS, MIX_TILE_ACC_COLS: the sweep's --cases, --programs, --tile-acc-cols)
            timeout "${MIX_TIMEOUT_S:-300}" python3 -m compiler.tools.mix_sweep ${MIX_CASES:+--cases "$MIX_CASES"} \
                ${MIX_PROGRAMS:+--programs "$MIX_PROGRAMS"} ${MIX_TILE_ACC_COLS:+--tile-acc-cols "$MIX_TILE_ACC_COLS"} \
                > "$OUT/$stage.log" 2>&1 ;;
    visible) # a runner given one GPU by UUID: the harness's visible set and torch agree on it, the health
             # check runs on it; a runner given none (CUDA_VISIBLE_DEVICES empty) stops with one line, exit 2
             { uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)
               CUDA_VISIBLE_DEVICES=$uuid python3 -c "import torch; from harness.suites import shard
print('visible', shard.visible_gpus('cuda'), 'torch sees', torch.cuda.device_count())"
               CUDA_VISIBLE_DEVICES=$uuid timeout 120 python3 -m harness health --backend cuda; echo "health on $uuid: exit $?"
               CUDA_VISIBLE_DEVICES= timeout 60 python3 -m harness run --backend cuda --native --no-history \
                 --results "$OUT/no-gpu"; echo "no GPU given: exit $? (expected 2)"; } > "$OUT/$stage.log" 2>&1 ;;
    faults) # planted segfault + illegal memory access through the harness; suite time with/without isolation
            timeout 590 bash ci/gpu_faults.sh "$OUT/faults" > "$OUT/$stage.log" 2>&1 ;;
    scatter) ( timeout 150 python3 -m pytest -q -p no:cacheprovider -p no:xdist tests/compiler/test_scatter.py; a=$?
               timeout 45 python3 -m pytest -q -p no:cacheprovider -p no:xdist tests/numerics/test_numerics.py \
                 -k "embedding_grad or scatter_add or cumsum"; exit $(( a | $? )) ) > "$OUT/$stage.log" 2>&1 ;;
    warmcache) # cold, warm (kiln's graph cache, kernels on disk) and autotuned compile s in fresh processes,
            # kiln and inductor side by side per row ($WARMCACHE_ONLY); table in $OUT/warmcache.md
            # (about 150 s a row: 8 fresh processes; WARMCACHE_AUTOTUNE=kiln leaves out Inductor's max-autotune, the slowest, empty: none;
            #  WARMCACHE_PROBE_S: compile limit of one probe, default 150)
            timeout "${WARMCACHE_TIMEOUT_S:-400}" python3 -m harness.bench.models.warmcache --only "${WARMCACHE_ONLY:-model.gpt2.infer.bf16,model.bert.infer.bf16}" \
                --compilers "${WARMCACHE_COMPILERS:-kiln,inductor}" --autotune-compilers "${WARMCACHE_AUTOTUNE-kiln,inductor}" \
                --budget-s "${WARMCACHE_BUDGET_S:-180}" --timeout-s "${WARMCACHE_PROBE_S:-150}" \
                --md "$OUT/warmcache.md" --json "$OUT/warmcache.json" > "$OUT/$stage.log" 2>&1 ;;
    warmprofile) # where a warm compile spends its time (Dynamo, AOTAutograd, kiln's cache read, first
                 # launches) for $WARMPROFILE_ONLY (default gpt2.infer.bf16), cProfile split in $OUT/warmprofile.md
                 # (3 fresh processes a case, about 40 s a row)
                 # (WARMPROFILE_AUTOTUNE=1: the same with autotuning on in every process, into $OUT/warmprofile-autotune.md)
                 { timeout "${WARMPROFILE_TIMEOUT_S:-240}" python3 ci/warm_profile.py ${WARMPROFILE_ONLY:-model.gpt2.infer.bf16} --profile gpu \
                     --device cuda --md "$OUT/warmprofile.md"
                   if [ -n "${WARMPROFILE_AUTOTUNE:-}" ]; then
                     timeout "${WARMPROFILE_TIMEOUT_S:-240}" python3 ci/warm_profile.py ${WARMPROFILE_ONLY:-model.gpt2.infer.bf16} --profile gpu \
                       --device cuda --autotune --md "$OUT/warmprofile-autotune.md"
                   fi; } > "$OUT/$stage.log" 2>&1 ;;
    value-trace) # value traces on the GPU (synchronized stats; CUDA graphs refused with a reason) and
                 # trace-diff on two GPU traces
                 timeout 300 python3 -m pytest -q -p no:cacheprovider -p no:xdist tests/compiler/test_value_trace.py \
                   tests/harness/numerics/test_trace_diff.py > "$OUT/$stage.log" 2>&1 ;;
    cgtrain) mkdir -p "$OUT/cgtrain"
            { bad=0
              timeout 45 python3 -m pytest -q -p no:cacheprovider -p no:xdist tests/compiler/test_cudagraphs.py \
                -k "training or attention or unrecorded or cpu_scalar"
              r=$?; echo "cudagraph training tests: exit $r"; [ $r -eq 0 ] || bad=1
              timeout 250 python3 -m harness bench models --only "${CGTRAIN_ONLY:-ci_*}" \
                --compilers eager,kiln,inductor,kiln-cg,inductor-cg --compile-times none --target-s 0.8 --rounds 3 \
                --budget-s "${CGTRAIN_BUDGET_S:-200}" --out "$OUT/cgtrain"
              r=$?; echo "models: exit $r"; [ $r -eq 0 ] || bad=1
              timeout 65 python3 -m harness.bench.models.memcheck model.ci_bert.train.fp32 \
                --json "$OUT/cgtrain/memcheck.json" --md "$OUT/cgtrain/memcheck.md" > "$OUT/cgtrain/memcheck.log" 2>&1
              r=$?; echo "memory check: exit $r ($(tail -n 1 "$OUT/cgtrain/memcheck.log"))"; [ $r -eq 0 ] || bad=1
              timeout 55 python3 -m harness bench model-profile --only model.ci_gpt2.train.fp32 --compilers kiln-cg \
                --steps 5 --top 20 --md "$OUT/cgtrain/profile.md"
              r=$?; echo "profile: exit $r"; [ $r -eq 0 ] || bad=1
              echo "cgtrain: $([ $bad -eq 0 ] && echo ok || echo 'a step failed')"; (exit $bad); } > "$OUT/$stage.log" 2>&1 ;;
    preflight) # the runner pre-flight against a real driver (nvidia-smi -L), then 2 GPUs asked of 1 visible
            { timeout 60 python3 -m harness preflight --backend cuda --native; echo "exit $?"
              CUDA_VISIBLE_DEVICES=0 timeout 60 python3 -m harness preflight --backend cuda --native --gpus 2
              echo "exit $? (3 expected)"; } > "$OUT/$stage.log" 2>&1 ;;
    runner-id) # the runner identity a fleet store records (GPU model and driver from nvidia-smi), loaded
               # alone (the GPU box may lack SQLAlchemy): hardware class = the GPU model without KILN_GPU_LABEL
               timeout 60 env -u KILN_GPU_LABEL python3 -c "
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location('kiln_runner', 'harness/store/runner.py')
m = importlib.util.module_from_spec(spec); sys.modules['kiln_runner'] = m; spec.loader.exec_module(m)
r = m.current(torch.cuda.get_device_name(0)); print(r)
assert r.gpu_model and r.driver and r.hw_class == r.gpu_model, r
print('runner identity ok')" > "$OUT/$stage.log" 2>&1 ;;
    memdiag) # the memory check of one row with each arm's CUDA-graph counters (tier and by hand),
             # then what keeps a dropped kiln-cg model's graph memory alive (ci/cg_leak_probe.py)
             { timeout 150 python3 -m harness.bench.models.memcheck "${MEMCHECK_CASE:-model.ci_bert.train.fp32}" \
                 --md "$OUT/memcheck.md" --json "$OUT/memcheck.json"; echo "memory check: exit $?"
               timeout 120 python3 ci/cg_leak_probe.py "${MEMCHECK_CASE:-model.ci_bert.train.fp32}"
               echo "leak probe: exit $?"; } > "$OUT/$stage.log" 2>&1 ;;
    numerics-flakes) # run-to-run identity: the numerics suite $FLAKE_RUNS times (default 50) under pytest-flakefinder, spread
            # over $FLAKE_PROCS processes sharing the GPU (default 8; runs rounded up per process); 0 flaky, 0 failing
            # expected (ci/flakes_summary.py). Without the plugin installed, a carried pytest_flakefinder.py in
            # $FLAKEFINDER_DIR (default .flakefinder) is loaded
            { fp=() ; python3 -c "import pytest_flakefinder" 2>/dev/null || { export PYTHONPATH="${FLAKEFINDER_DIR:-.flakefinder}${PYTHONPATH:+:$PYTHONPATH}"; fp=(-p pytest_flakefinder); }
              procs=${FLAKE_PROCS:-8}; per=$(( (${FLAKE_RUNS:-50} + procs - 1) / procs )); pids=()
              for k in $(seq 1 "$procs"); do
                KILN_COMPILE_THREADS=1 KILN_COMPILE_WORKERS=1 timeout -s INT "${FLAKES_TIMEOUT_S:-540}" python3 -m pytest -q -p no:cacheprovider -p no:xdist \
                  "${fp[@]}" tests/numerics --flake-finder --flake-runs="$per" --junitxml="$OUT/flakes-$k.xml" > "$OUT/flakes-$k.log" 2>&1 &
                pids+=($!)
              done
              for p in "${pids[@]}"; do wait "$p"; done
              tail -n 2 "$OUT"/flakes-*.log; python3 ci/flakes_summary.py "$OUT"/flakes-*.xml; } > "$OUT/$stage.log" 2>&1 ;;
    verdicts-aa) # side-by-side verdicts beside another GPU process (a loop of matrix products): $VERDICTS_RUNS A/A
            # checks (identical code: a regressed/improved verdict is a false positive) and as many with a planted 20%
            # slowdown under kiln (regressed: a true positive); the rates are the last line (harness/bench/kernels/noise_check.py)
            timeout "${VERDICTS_TIMEOUT_S:-560}" python3 -m harness.bench.kernels.noise_check --device cuda --load gpu \
              --runs "${VERDICTS_RUNS:-4}" --compilers "${VERDICTS_COMPILERS:-kiln}" ${VERDICTS_ONLY:+--only "$VERDICTS_ONLY"} \
              --json "$OUT/verdicts-aa.json" > "$OUT/$stage.log" 2>&1 ;;
    compiler-tests) timeout 400 python3 -m pytest -q -p no:cacheprovider -p no:xdist tests/compiler > "$OUT/$stage.log" 2>&1 ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
  rc=$?
  summary+=("$stage: exit $rc in $((SECONDS - start))s: $(tail -n 1 "$OUT/$stage.log")")
  echo "=== $stage (exit $rc) ==="; tail -n 40 "$OUT/$stage.log"
done
echo "=== summary ==="
printf '%s\n' "${summary[@]}"
if [ -n "${PACK:-}" ]; then
  tar -C "$OUT" -czf "$PACK" . && echo "packed $OUT into $PACK ($(du -h "$PACK" | cut -f1))"
fi
