#!/usr/bin/env bash
# One batched GPU run of every measurement docs/benchmarks.md lists (run from the repo root on the GPU
# machine: PYTHONPATH=src, fla-core wheel in .whl/ optional). Each step has its own time limit so that one
# slow or failing step cannot take the others with it; JSON and logs land in ${OUT:-bench_out}.
# Usage: bash scripts/gpu_bench.sh [step ...]   (steps: tests prune attn decode model small; default all)
set -u
OUT=${OUT:-bench_out}; mkdir -p "$OUT"
export TRITON_INTERPRET=0
FX="python -m foxformer.cli"
step() {  # step NAME SECONDS CMD...: run CMD under a time limit, log to $OUT/NAME.log
    local name=$1 secs=$2; shift 2
    echo "=== $name (limit ${secs}s) $(date +%T)"
    timeout "$secs" "$@" > "$OUT/$name.log" 2>&1; echo "=== $name rc=$? $(date +%T)"
    tail -n 25 "$OUT/$name.log"
}
want() { [ $# -eq 0 ] || [[ " $* " == *" $1 "* ]]; }
STEPS=${*:-tests prune decode small model attn}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
for s in $STEPS; do case $s in
tests) step tests 150 python -m pytest -q tests/gpu ;;
prune) step prune 90 $FX bench attention --prune --providers foxformer --seqlens 4096,16384,65536 \
           --configs 64x24,128x12,128x12x2 --out "$OUT/attention_prune_h200.json" ;;
attn) step attn 70 $FX bench attention --providers foxformer,sdpa_flash,sdpa_cudnn,fla --seqlens 2048,8192 \
          --configs 64x24,128x12,128x12x2 --out "$OUT/attention_2k_8k_h200.json" ;;
decode) step decode_kernel 45 $FX bench decode --kernel --preset fox-pro-125m --contexts 4096,32768,65536 \
            --batches 1,32 --out "$OUT/decode_kernel_h200.json"
        step decode_model 100 $FX bench decode --preset fox-pro-125m --contexts 4096,32768,65536 --batches 1,32 \
            --steps 16 --out "$OUT/decode_model_125m_h200.json" ;;
model) step model 120 $FX bench model --presets fox-pro-125m,transformer-llama-125m --context 16384 \
           --compile --fused-loss --no-anchor --out "$OUT/model_125m_compiled_fused_h200.json" ;;
small) step small 80 $FX bench model --presets fox-pro-small,transformer-llama-small --context 4096 \
           --compile --fused-loss --no-anchor --out "$OUT/model_small_4k_h200.json" ;;
*) echo "unknown step $s" ;;
esac; done
