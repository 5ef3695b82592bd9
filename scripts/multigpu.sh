#!/usr/bin/env bash
# Multi-GPU checks of docs/benchmarks.md ("Multi-GPU training"), run from the repo root on a machine with
# N >= 2 GPUs (PYTHONPATH=src). The one-GPU reference trains on the same token batches with gradient
# accumulation, so every run sees the same sequences at every step; `foxformer bench scaling` then
# compares losses step by step and tokens/s per GPU. Logs and JSON end up in $OUT/multigpu_bundle.tgz.
# Usage: DATA=repro_data/gpt2 bash scripts/multigpu.sh [step ...]   (default: match125 resume match760)
#   match125   fox-pro-125m at 16K, 50 steps of 2 sequences per GPU: 1 GPU (twice: accumulation 2N and
#              N, the noise floor of regrouping the same batch), N-GPU DDP, N-GPU FSDP2
#   match760   fox-pro-760m at 16K, 50 steps of 1 sequence per GPU: 1 GPU, N-GPU DDP, N-GPU FSDP2
#   compiled   fox-pro-125m at 16K, compiled, fused loss: 1 GPU vs N-GPU FSDP2 (throughput only)
#   resume     fox-pro-125m at 4K: FSDP2 on N GPUs to step 10, resumed on 1 GPU to step 20; one GPU to
#              step 10, resumed by DDP on N GPUs to step 20; both against an uninterrupted 1-GPU run
# BUDGET: seconds for the whole script; a run is cut to what is left (minus bundling time) or skipped.
set -u
START=$(date +%s); BUDGET=${BUDGET:-560}
OUT=${OUT:-multigpu_out}; DATA=${DATA:-repro_data/gpt2}; RUNS=${RUNS:-runs_mg}
NGPU=${NGPU:-$(nvidia-smi -L | wc -l)}; STEPS_MATCH=${STEPS_MATCH:-50}
# A CPU smoke run of the script's logic (gloo): NGPU=2 P125=fox-pro-tiny P760=fox-pro-tiny CTX=64 RCTX=32
P125=${P125:-fox-pro-125m}; P760=${P760:-fox-pro-760m}; CTX=${CTX:-16384}; RCTX=${RCTX:-4096}
# NVLink multicast stays off: on a shared host it can take the GPUs out of service (device KINDS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 TRITON_INTERPRET=0
mkdir -p "$OUT" "$RUNS"
FX="-m foxformer.cli"
bundle() { (cd "$OUT" && tar -czf ../multigpu_bundle.tgz . && find . -mindepth 1 -delete \
           && mv ../multigpu_bundle.tgz .); }
trap bundle EXIT
left() { echo $((BUDGET - ($(date +%s) - START) - 15)); }

train() {  # train NAME NPROC SECONDS ARGS...: one `foxformer train`, torchrun when NPROC > 1
    local name=$1 nproc=$2 secs=$3; shift 3
    [ "$(left)" -lt "$secs" ] && secs=$(left)
    if [ "$secs" -lt 30 ]; then echo "=== $name skipped: ${secs}s left"; return; fi
    local launch="python" log="$OUT/${name}_${nproc}gpu.log"
    [ "$nproc" -gt 1 ] && launch="torchrun --standalone --nproc-per-node $nproc"
    echo "=== $name on $nproc GPU(s) (limit ${secs}s) $(date +%T)"
    timeout "$secs" $launch $FX train --data "$DATA" --out "$RUNS/$name" --log-every 10 --no-progress \
        --eval-tokens 64Ki --eval-every-tokens 100G --set export_hf=false --set tensorboard=false "$@" \
        > "$log" 2>&1
    echo "=== $name rc=$? $(date +%T)"; tail -n 4 "$log"
    cp "$RUNS/$name/metrics.jsonl" "$OUT/$name.metrics.jsonl" 2>/dev/null
}
scaling() {  # scaling NAME RUN...: the comparison table (first run = reference)
    local name=$1; shift
    python $FX bench scaling "$@" --out "$OUT/$name.json" 2>&1 | tee "$OUT/$name.txt"
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.txt"
nvidia-smi topo -m >> "$OUT/env.txt" 2>&1
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, \
'nccl', torch.cuda.nccl.version())" | tee -a "$OUT/env.txt"
python -c "from foxformer.provenance import code_version; print('commit', code_version())" | tee -a "$OUT/env.txt"

for s in ${*:-match125 resume match760}; do case $s in
match125)
    common=(--preset $P125 --context $CTX --batch-tokens $((2 * NGPU * CTX)) --micro-batch-size 1
            --max-steps "$STEPS_MATCH" --total-tokens 1G --warmup-tokens 2M --checkpoint-every-tokens 100G)
    train m125_1gpu 1 200 "${common[@]}"
    train m125_1gpu_mb2 1 200 "${common[@]}" --micro-batch-size 2
    train m125_ddp "$NGPU" 150 "${common[@]}" --parallel ddp
    train m125_fsdp "$NGPU" 150 "${common[@]}" --parallel fsdp
    scaling scaling_125m_16k "$RUNS"/m125_{1gpu,1gpu_mb2,ddp,fsdp} ;;
match760)
    common=(--preset $P760 --context $CTX --batch-tokens $((NGPU * CTX)) --micro-batch-size 1
            --max-steps "$STEPS_MATCH" --total-tokens 1G --warmup-tokens 2M --checkpoint-every-tokens 100G)
    [ "${REF760:-1}" = 1 ] && train m760_1gpu 1 240 "${common[@]}"
    train m760_ddp "$NGPU" 180 "${common[@]}" --parallel ddp
    train m760_fsdp "$NGPU" 180 "${common[@]}" --parallel fsdp
    scaling scaling_760m_16k "$RUNS"/m760_{1gpu,ddp,fsdp} ;;
compiled)
    common=(--preset $P125 --context $CTX --batch-tokens $((4 * NGPU * CTX)) --micro-batch-size 2
            --max-steps 20 --total-tokens 1G --warmup-tokens 2M --checkpoint-every-tokens 100G --compile
            --fused-loss)
    train c125_1gpu 1 200 "${common[@]}"
    train c125_fsdp "$NGPU" 200 "${common[@]}" --parallel fsdp
    scaling scaling_125m_16k_compiled --skip 8 "$RUNS"/c125_{1gpu,fsdp} ;;
resume)
    common=(--preset $P125 --context $RCTX --batch-tokens $((8 * RCTX)) --micro-batch-size 2
            --total-tokens $((20 * 8 * RCTX)) --warmup-tokens $((4 * 8 * RCTX))
            --checkpoint-every-tokens $((10 * 8 * RCTX)))
    train r_1gpu 1 120 "${common[@]}" --max-steps 20
    train r_fsdp_to_1 "$NGPU" 120 "${common[@]}" --max-steps 10 --parallel fsdp
    train r_fsdp_to_1 1 120 "${common[@]}" --max-steps 20 --parallel none
    train r_1_to_ddp 1 120 "${common[@]}" --max-steps 10
    train r_1_to_ddp "$NGPU" 120 "${common[@]}" --max-steps 20 --parallel ddp
    scaling resume --skip 0 "$RUNS"/r_{1gpu,fsdp_to_1,1_to_ddp}
    grep -h '"kind": "start"' "$RUNS"/r_{fsdp_to_1,1_to_ddp}/metrics.jsonl > "$OUT/resume_starts.jsonl" ;;
*) echo "unknown step $s" ;;
esac; done
