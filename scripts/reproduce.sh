#!/usr/bin/env bash
# The one-GPU reproduction of docs/results.md: train the given presets side by side on one GPU (small
# models do not fill an H200 alone, and their compiles overlap), then evaluate each one: per-position
# loss and perplexity up to 4x the training length on held-out documents, needle in a haystack within
# and beyond the training length, forget-gate analysis, and KV eviction on the trained FoX model.
# Everything but checkpoints is copied to $OUT (the GPU machine keeps nothing).
#
#   DATA=repro_data/gpt2 TOKENS=120M bash scripts/reproduce.sh fox-pro-small transformer-pro-small
#
# DATA: a `foxformer data prepare` dir (docs/results.md has the command); the other knobs below.
set -u
OUT=${OUT:-repro_out}; DATA=${DATA:-repro_data/gpt2}; RUNS=${RUNS:-runs}
CONTEXT=${CONTEXT:-4096}; TOKENS=${TOKENS:-120M}; BATCH=${BATCH:-128Ki}; MICRO=${MICRO:-16}
LR=${LR:-2e-3}; WARMUP=${WARMUP:-12M}; MINUTES=${MINUTES:-7}; SEED=${SEED:-0}; EXTRA=${EXTRA:---compile --fused-loss}
EVAL_LEN=${EVAL_LEN:-$((4 * CONTEXT))}; EVAL_SEQS=${EVAL_SEQS:-32}
NIAH_LENS=${NIAH_LENS:-$((CONTEXT / 2)),$CONTEXT,$((2 * CONTEXT)),$((4 * CONTEXT))}; NIAH_SEEDS=${NIAH_SEEDS:-0,1}
EVICT=${EVICT:-1}; EVAL_EVERY=${EVAL_EVERY:-20M}
FX="python -m foxformer.cli"
mkdir -p "$OUT" "$RUNS"
git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null || true
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')" | tee "$OUT/env.txt"

echo "=== train $* ($(date +%T))"
for p in "$@"; do
    $FX train --preset "$p" --data "$DATA" --context "$CONTEXT" --total-tokens "$TOKENS" --batch-tokens "$BATCH" \
        --micro-batch-size "$MICRO" --lr "$LR" --warmup-tokens "$WARMUP" --max-minutes "$MINUTES" --seed "$SEED" \
        --eval-every-tokens "$EVAL_EVERY" --checkpoint-every-tokens 100G --keep-last 1 --no-progress \
        --out "$RUNS/$p" $EXTRA > "$OUT/train_$p.log" 2>&1 &
done
wait
for p in "$@"; do tail -n 3 "$OUT/train_$p.log"; done

echo "=== eval ($(date +%T))"
evaluate() {  # evaluate PRESET: every evaluation of one run, logs and outputs to $OUT
    local p=$1 r="$RUNS/$1"
    $FX eval loss "$r" --data "$DATA" --within-docs --seq-len "$EVAL_LEN" --num-seqs "$EVAL_SEQS" --no-progress \
        > "$OUT/eval_loss_$p.log" 2>&1
    $FX eval niah "$r" --lengths "$NIAH_LENS" --seeds "$NIAH_SEEDS" --no-progress > "$OUT/eval_niah_$p.log" 2>&1
    case $p in fox-*) $FX analyze gates "$r" --data "$DATA" --no-progress > "$OUT/gates_$p.log" 2>&1 ;; esac
    case $p in fox-pro-*) [ "$EVICT" = 1 ] && $FX bench decode --model "$r" --contexts $((16 * CONTEXT)) \
        --batches 1 --steps 32 --evict-eps 4.54e-5 --no-baseline --out "$OUT/evict_$p.json" \
        > "$OUT/evict_$p.log" 2>&1 ;; esac
    mkdir -p "$OUT/runs/$p"
    tar -C "$r" --exclude=checkpoints --exclude='*.pt' --exclude='*.safetensors' -cf - . | tar -C "$OUT/runs/$p" -xf -
}
for p in "$@"; do evaluate "$p" & done  # small models: the evaluations share the GPU too
wait
for p in "$@"; do tail -n 4 "$OUT/eval_loss_$p.log"; done
# The GPU machine hands back few files: one archive of everything.
(cd "$OUT" && tar -czf ../repro_bundle.tgz . && rm -rf ./* && mv ../repro_bundle.tgz .)
echo "=== done ($(date +%T))"
