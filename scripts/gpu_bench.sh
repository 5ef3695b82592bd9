#!/usr/bin/env bash
# One batched GPU run of the measurements docs/benchmarks.md lists (run from the repo root on the GPU
# machine: PYTHONPATH=src, fla-core wheel optional). Each step has its own time limit so that one slow or
# failing step cannot take the others with it; JSON and logs end up in one archive, $OUT/bench_bundle.tgz
# (the GPU machine hands back few files).
# Usage: bash scripts/gpu_bench.sh [step ...]   (default: every step below, in this order; the whole list
# outlasts one 10-minute device call: split it, e.g. "fused tune prune model", then "train decode")
#   fused       the fused-loss GPU test (compiled and eager gradients against the plain loss)
#   tests       every GPU test
#   tune        tile configs at D = 64 (scripts/tune_attention.py)
#   prune       pruned vs unpruned kernels, realistic and open gates
#   prunegiven  the same with a given bound (--qk-bound 25, about what "auto" finds on these inputs):
#               the open-gate overhead without the pass over the norms of q and k
#   model       whole-model training step throughput, 125M at 16K (compiled, fused loss)
#   modelplain  the same, compiled without the fused loss, with transformers' Llama (compiled) as anchor
#   profile     one compiled training step of FoX (Pro) and Transformer (LLaMA) 125M at 16K under
#               torch.profiler: where FoX (Pro)'s extra time goes (kernel tables in profile/)
#   power       FoX (Pro) and Transformer (LLaMA) 125M at 16K, compiled, one after the other, 20 steps each, with the SM
#               clock and power sampled every 100 ms (scripts/power_clocks.py: each model's clock at the power cap)
#   headdims    FoX (Pro) and Transformer (LLaMA) 125M at 16K, compiled, each also at the other's head dim (64 / 128),
#               with a profile of each step (profile_headdims/): how much of FoX's gap is the head dim, not the gate
#   joint       FoX (Pro) and Transformer (LLaMA) 125M at 16K, compiled, each also with joint_input_projections (the
#               products that read one input as one product: FoxConfig), with a profile of each step (profile_joint/)
#   fusedpro    FoX (Pro) 125M at 16K, compiled, also without fused_pro_ops (on by default: the token shifts, QK-norm,
#               output norm and gate as the Triton ops of ops/pro_block), and Transformer (LLaMA) 125M: what they buy
#   train       FoX (Pro) 125M training MFU at 16K, fused loss: default and tile pruning (needs DATA)
#   trainplain  the training loop in modelplain's setting (4 sequences a step, one micro-batch, no fused loss), 30
#               steps: its MFU against the bench's (after modelplain in the same call: scripts/train_mfu_gap.py;
#               DATA, else byte tokens of builtin:pydoc with the GPT-2-sized vocabulary)
#   trainprune  tile pruning on a model trained for a while: FoX (Pro) 125M at 16K trains for TRAIN_MIN
#               minutes, then both settings resume from its checkpoint for 8 steps (needs DATA); between, the
#               checkpoint's attention rows' lse against the max-free forward's window (scripts/lse_window.py)
#   attn        kernel rows at 2K and 8K
#   attn16      the Gluon kernels through the op against SDPA CUDNN at 16K, D 64 and 128, three interleaved rounds
#               (medians), with the operator and kernel tables of one forward+backward each (attention_profile/)
#   attnlong    the Gluon and Triton kernels against SDPA FLASH, SDPA CUDNN and fla-core at 16K and 64K (one run)
#   attnall     the same providers at 16K, D 64 and 128, five interleaved rounds, each starting one provider later
#               (the issue-17 table with every provider: 175 s in the twenty-sixth session)
#   gluon       the Hopper kernels: tests/gpu/test_gluon_gpu.py and the models' GPU tests (three training steps of
#               the small presets at the recipe's shape among them; 8 processes), then their config sweep
#               (scripts/hopper_tune.py $HOPPER_SECTIONS, default "fwd bwd") at 16K
#   maxfree     the forward without a row maximum (FwdConfig.max_free: D 128's default, off at D 64) and with it:
#               their GPU tests, then the forward sweep that alternates the two (HOPPER_SECTIONS=fwd of the gluon step)
#   maxfreemodel  FoX (Pro) 125M at 16K, compiled once, timed with the default forward and max_free in turn, two
#               rounds (bench model --gluon-fwd x2 --rounds 2), and Transformer (LLaMA) 125M in the same run (the
#               preset ratio under each form); after maxfree, one call:
#               BUDGET=590 bash scripts/gpu_bench.sh maxfree maxfreemodel
#   ncusass     the D 64 kernels' stall samples per SASS instruction (Nsight Compute's source page as CSV)
#   ncu         the Gluon kernels' hardware counters at 16K, D 64 and 128 (Nsight Compute, clocks left alone):
#               each kernel's report with every section's details, stall reasons included (ncu_d64.txt, ncu_d128.txt;
#               about 60 s)
#   decode      decode op; whole-model decoding of the 760M preset at 32K
#   decode125   whole-model decoding of the 125M preset, 4K to 64K, with and without eviction
#   Issue 18 (CUDA-graph decoding), in one 5-minute call: BUDGET=295 bash scripts/gpu_bench.sh graphs
#   graphcheck  tests/gpu/test_decode_graphs_cuda.py: graphs give the eager path's greedy tokens, few captures;
#               tests/gpu/test_decode_cuda.py: the decode op and the one-token cache write against torch
#   graphs125   FoX (Pro) 125M, 32K, batch 1 and 32, eager and graphs, with and without eviction, against
#               transformers' Llama (eager SDPA; StaticCache + torch.compile reduce-overhead); bandwidth floors
#   graphsbase  our Transformer (Pro) 125M through graphs; FoX (Pro) 760M, batch 1; the recurrent baseline
#   graphscomp  FoX (Pro) 125M through graphs of the torch.compile'd step, batch 1 and 32, and 760M at batch 1
#               (alone: BUDGET=240 ... graphscomp graphtargets)
#   graphs      all four, then graphtargets: the targets against the rows (scripts/decode_targets.py)
#   graphprof   where a step's time goes: FoX (Pro) 125M at 32K, batch 1 and 32, through graphs and the compiled
#               graphs, 8 steps each under torch.profiler (tables and timelines in decode_profile/)
#   decodesplits  the decode op alone at the 125M head shape, 32K, batch 1 and 32: the default key-split count
#               against 16 to 256 splits (the op read the cache at ~2.3 TB/s at batch 1 in the eleventh session)
# BUDGET: seconds for the whole script; a step is cut to what is left (minus bundling time) or skipped.
# FOXFORMER_COMMIT: the commit to record (provenance.code_version); set it from the checkout that sent the tree where the
# GPU machine's copy of .git lags behind it (the seventeenth session's calls all read the session's first commit).
set -u
START=$(date +%s); BUDGET=${BUDGET:-100000}
OUT=${OUT:-bench_out}; DATA=${DATA:-repro_data/gpt2}; mkdir -p "$OUT"
export TRITON_INTERPRET=0
FX="python -m foxformer.cli"
# The card in the JSON names (h100, h200, ...): the thirty-ninth session's calls got H100s, whose figures went into
# files named for the H200 until this.
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oiE "[A-Z][0-9]{3}" | head -1 \
    | tr '[:upper:]' '[:lower:]'); GPU=${GPU:-gpu}
bundle() { (cd "$OUT" && tar -czf ../bench_bundle.tgz . && find . -mindepth 1 -delete && mv ../bench_bundle.tgz .); }
trap bundle EXIT
step() {  # step NAME SECONDS CMD...: run CMD under a time limit, log to $OUT/NAME.log
    local name=$1 secs=$2 left=$((BUDGET - ($(date +%s) - START) - 15)); shift 2
    [ "$left" -lt "$secs" ] && secs=$left
    if [ "$secs" -lt 20 ]; then echo "=== $name skipped: ${secs}s left"; return; fi
    echo "=== $name (limit ${secs}s) $(date +%T)"
    timeout "$secs" "$@" > "$OUT/$name.log" 2>&1; echo "=== $name rc=$? $(date +%T)"
    tail -n 25 "$OUT/$name.log"
}
train_run() {  # train_run NAME SECONDS EXTRA...: a short FoX (Pro) 125M run at 16K, compiled (EXTRA: --fused-loss ...)
    local name=$1 secs=$2; shift 2
    rm -rf "runs_bench/$name"  # a warm machine's earlier run would be resumed, not measured
    step "$name" "$secs" $FX train --preset fox-pro-125m --context 16384 --data "$DATA" --batch-tokens 256Ki \
        --micro-batch-size 2 --max-steps 10 --total-tokens 100M --warmup-tokens 1M --compile \
        --log-every 1 --checkpoint-every-tokens 100G --eval-every-tokens 100G --no-progress \
        --set export_hf=false --out "runs_bench/$name" "$@"
    cp "runs_bench/$name/metrics.jsonl" "$OUT/$name.metrics.jsonl" 2>/dev/null
}
STEPS=${*:-fused tests tune prune model train attn decode decode125}
# "graphs": issue 18's steps, in order
STEPS=$(for s in $STEPS; do [ "$s" = graphs ] && echo graphcheck graphs125 graphsbase graphscomp graphtargets \
    || echo "$s"; done)
# 17 warm-up steps: past the first eviction scan step (every 8th) and its capture (the next scan step)
GRAPHS="$FX bench decode --contexts 32768 --batches 1,32 --steps 32 --warmup 17"
# fla-core, the peer kernel of the attention tables: its wheel, carried in .whl/ (the GPU machine reaches no
# registry), goes into a folder on PYTHONPATH; without it the fla rows say "not installed".
if ls .whl/fla_core-*.whl > /dev/null 2>&1 && ! python -c "import fla" 2> /dev/null; then
    python -m pip install -q --no-index --no-deps --target /tmp/fla_site .whl/fla_core-*.whl \
        && export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}/tmp/fla_site"
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/env.txt"
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/env.txt"
python -c "from foxformer.provenance import code_version; print('commit', code_version())" | tee -a "$OUT/env.txt"
for s in $STEPS; do case $s in
fused) step fused 100 python -m pytest -q tests/gpu/test_fused_loss_cuda.py ;;
# 480 s and four processes (as the gluon step's eight): at 931a750 one process reached 251 of the suite's then 268
# tests in the 320 s limit (history, "GPU tests"), and 80 more came since; -rA names every test in the log. At d50fd04
# the 378 tests took 206 s.
tests) step tests 480 python -m pytest -q -rA -n 4 tests/gpu ;;
tune) step tune 150 python scripts/tune_attention.py --dims 64 --heads 24 --minutes 2 \
          --out "$OUT/tune_d64_${GPU}.json" ;;
prune) step prune 90 $FX bench attention --prune --providers foxformer --seqlens 4096,16384,65536 \
           --configs 64x24,128x12,128x12x2 --out "$OUT/attention_prune_${GPU}.json" ;;
profile) step profile 200 $FX bench model --presets fox-pro-125m,transformer-llama-125m --context 16384 \
           --compile --no-anchor --steps 3 --warmup 2 --profile "$OUT/profile" --out "$OUT/model_profiled_${GPU}.json" ;;
headdims) step headdims 420 $FX bench model --context 16384 --compile --no-anchor --profile "$OUT/profile_headdims" \
           --presets fox-pro-125m,transformer-llama-125m,fox-pro-125m:head_dim=128,transformer-llama-125m:head_dim=64 \
           --out "$OUT/model_125m_headdims_${GPU}.json" ;;
joint) step joint 420 $FX bench model --context 16384 --compile --no-anchor --profile "$OUT/profile_joint" \
           --presets fox-pro-125m,fox-pro-125m:joint_input_projections=true,transformer-llama-125m,\
transformer-llama-125m:joint_input_projections=true --out "$OUT/model_125m_joint_${GPU}.json" ;;
fusedpro) step fusedpro 300 $FX bench model --context 16384 --compile --no-anchor \
           --presets fox-pro-125m,fox-pro-125m:fused_pro_ops=false,transformer-llama-125m \
           --out "$OUT/model_125m_fused_pro_${GPU}.json" ;;
prunegiven) step prunegiven 90 $FX bench attention --prune --qk-bound 25 --providers foxformer \
           --seqlens 4096,16384,65536 --configs 64x24,128x12,128x12x2 \
           --out "$OUT/attention_prune_given_bound_${GPU}.json" ;;
model) step model 150 $FX bench model --presets fox-pro-125m,transformer-llama-125m --context 16384 \
           --compile --fused-loss --no-anchor --out "$OUT/model_125m_compiled_fused_${GPU}.json" ;;
modelplain) step modelplain 300 $FX bench model --presets fox-pro-125m,transformer-llama-125m --context 16384 \
           --compile --out "$OUT/model_125m_compiled_${GPU}.json" ;;
trainprune) train_run trained_base 300 --fused-loss --max-steps 100000 --max-minutes "${TRAIN_MIN:-3}"
       ck=$(ls -d runs_bench/trained_base/checkpoints/step_* 2>/dev/null | tail -n 1)
       if [ -n "$ck" ]; then
           # where the trained rows' lse lie against the max-free forward's window (FwdConfig.max_free)
           step lsewindow 90 python scripts/lse_window.py "$ck" --data "$DATA"
           n=$(( 10#${ck##*step_} + 8 ))
           train_run trained_noprune 120 --fused-loss --max-steps "$n" --resume "$ck"
           train_run trained_prune 120 --fused-loss --max-steps "$n" --resume "$ck" --model prune_eps=4.54e-5
       fi ;;
train) train_run train_fox_pro_125m_16k 150 --fused-loss
       train_run train_fox_pro_125m_16k_prune 150 --fused-loss --model prune_eps=4.54e-5 ;;
trainplain) data0=$DATA vocab=""  # without DATA: byte tokens of the stdlib's docs, the bench's vocabulary size
       if [ ! -d "$DATA" ]; then
           DATA=runs_bench/pydoc_bytes vocab="--set vocab_size=50304"
           [ -d "$DATA" ] || $FX data prepare --source builtin:pydoc --tokenizer bytes --out "$DATA" > /dev/null
       fi
       train_run train_fox_pro_125m_16k_plain 150 --batch-tokens 64Ki --micro-batch-size 4 --max-steps 30 $vocab
       DATA=$data0
       [ -f "$OUT/model_125m_compiled_${GPU}.json" ] && python scripts/train_mfu_gap.py \
           "$OUT/train_fox_pro_125m_16k_plain.metrics.jsonl" "$OUT/model_125m_compiled_${GPU}.json" \
           | tee "$OUT/train_mfu_gap.txt" ;;
attn) step attn 200 $FX bench attention --providers foxformer,sdpa_flash,sdpa_cudnn,fla --seqlens 2048,8192 \
          --configs 128x12,128x12x2,64x24 --out "$OUT/attention_2k_8k_${GPU}.json" ;;
ncu) for D in 64 128; do
         step "ncu_d$D" 120 ncu --clock-control none --kernel-name regex:'^(fwd|dkdv|dq)_kernel' --launch-skip 3 \
             --launch-count 3 --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
             --section SchedulerStats --section InstructionStats --section SourceCounters --print-details all \
             python scripts/ncu_kernels.py --dim "$D"
     done ;;
ncusass) for K in fwd dkdv dq; do  # per-instruction stall samples of each D 64 kernel, one launch: the SASS page
             # as CSV (ncu_sass_K.csv; scripts/ncu_roles.py splits the samples by warp role)
             step "ncusass_$K" 100 ncu --clock-control none --kernel-name regex:"^${K}_kernel" --launch-skip 1 \
                 --launch-count 1 --section WarpStateStats --section SourceCounters --import-source no \
                 -o "$OUT/ncu_$K" -f python scripts/ncu_kernels.py --dim 64
             ncu --import "$OUT/ncu_$K.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_sass_$K.csv" \
                 2> "$OUT/ncu_sass_$K.err"; head -c 600 "$OUT/ncu_sass_$K.err"
             [ -s "$OUT/ncu_sass_$K.csv" ] && rm -f "$OUT/ncu_$K.ncu-rep"  # the report only where the export failed
         done ;;
gluon) step gluontests 180 python -m pytest -q -n 8 tests/gpu/test_gluon_gpu.py tests/gpu/test_models_cuda.py
       # 320 s (200 before the code options): the fwd + bwd sweep, 10 + 24 rows, took 49 s (243d2a9)
       # (scripts/hopper_tune.py BWD_SWEEP); run HOPPER_SECTIONS=bwd alone if the step is cut
       step gluontune 320 python scripts/hopper_tune.py ${HOPPER_SECTIONS:-fwd bwd} --out "$OUT/hopper_tune_${GPU}.json" ;;
maxfree) step maxfreetests 150 python -m pytest -q -rA -n 4 tests/gpu/test_gluon_gpu.py -k max_free
         # the fwd + bwd sweep, 10 + 24 rows, took 49 s (243d2a9); fwd alone has the 10 and the max-free rows
         step maxfreetune 120 python scripts/hopper_tune.py fwd --out "$OUT/hopper_tune_max_free_${GPU}.json" ;;
maxfreemodel) # one compile, the three forms in turn for two rounds (bench model --gluon-fwd given three times), and
             # the Transformer (LLaMA) in the same run for the preset ratio of each
             step maxfreemodel 300 $FX bench model --presets fox-pro-125m,transformer-llama-125m --context 16384 \
                 --compile --no-anchor \
                 --gluon-fwd default --gluon-fwd 64:max_free=true \
                 --rounds 2 --out "$OUT/model_fox_pro_125m_max_free_${GPU}.json" ;;
attn16) step attn16 150 $FX bench attention --providers gluon,sdpa_cudnn --seqlens 16384 --configs 64x24,128x12 \
          --rounds 3 --profile "$OUT/attention_profile" --out "$OUT/attention_16k_${GPU}.json" ;;
attnall) step attnall 240 $FX bench attention --providers gluon,triton,sdpa_flash,sdpa_cudnn,fla --seqlens 16384 \
          --configs 64x24,128x12 --rounds 5 --out "$OUT/attention_16k_all_${GPU}.json" ;;
attnlong) step attnlong 330 $FX bench attention --providers gluon,triton,sdpa_flash,sdpa_cudnn,fla --seqlens 16384,65536 \
          --configs 64x24,128x12,128x12x2 --out "$OUT/attention_16k_64k_${GPU}.json" ;;
decode) step decode_kernel 45 $FX bench decode --kernel --preset fox-pro-125m --contexts 4096,32768,65536 \
            --batches 1,32 --out "$OUT/decode_kernel_${GPU}.json"
        step decode_760m 60 $FX bench decode --preset fox-pro-760m --contexts 32768 --batches 1 \
            --steps 16 --out "$OUT/decode_model_760m_${GPU}.json" ;;
graphcheck) step graphcheck 90 python -m pytest -q -x tests/gpu/test_decode_graphs_cuda.py tests/gpu/test_decode_cuda.py ;;
graphs125) step graphs125 150 $GRAPHS --preset fox-pro-125m --decode eager,graphs \
               --anchors sdpa,static-compiled --out "$OUT/decode_graphs_fox_125m.json" ;;
graphsbase) step graphs_transformer 30 $GRAPHS --preset transformer-pro-125m --decode graphs --no-baseline \
                --out "$OUT/decode_graphs_transformer_125m.json"
            step graphs_760m 35 $GRAPHS --preset fox-pro-760m --batches 1 --decode graphs --no-baseline \
                --out "$OUT/decode_graphs_fox_760m.json"
            step graphs_linear 25 $GRAPHS --preset linear-pro-125m --decode eager,graphs --no-baseline \
                --out "$OUT/decode_graphs_linear_125m.json" ;;
graphscomp) step graphscomp 150 $GRAPHS --preset fox-pro-125m --decode compiled --no-baseline \
                --out "$OUT/decode_graphs_fox_125m_compiled.json"
            step graphscomp_760m 90 $GRAPHS --preset fox-pro-760m --batches 1 --decode compiled --no-baseline \
                --out "$OUT/decode_graphs_fox_760m_compiled.json" ;;
graphtargets) python scripts/decode_targets.py "$OUT" | tee "$OUT/decode_targets.txt" ;;
graphprof) step graphprof 150 $GRAPHS --preset fox-pro-125m --decode graphs,compiled --no-baseline \
               --profile "$OUT/decode_profile" --out "$OUT/decode_profile_fox_125m.json" ;;
decodesplits) step decodesplits 60 $FX bench decode --kernel --preset fox-pro-125m --contexts 32768 --batches 1,32 \
            --num-splits 16,32,64,128,256 --out "$OUT/decode_splits_${GPU}.json" ;;
decode125) step decode_model 100 $FX bench decode --preset fox-pro-125m --contexts 4096,32768,65536 \
            --batches 1,32 --steps 16 --out "$OUT/decode_model_125m_${GPU}.json" ;;
power) # one model at a time, 20 timed steps each, with nvidia-smi sampling SM clock and power (UTC timestamps)
       TZ=UTC nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,nounits -lms 100 \
           > "$OUT/smi.csv" 2>&1 & smi=$!
       for p in fox-pro-125m transformer-llama-125m; do
           echo "$p start $(date +%s.%N)" >> "$OUT/phases.txt"
           step "power_$p" 130 $FX bench model --context 16384 --compile --no-anchor --steps 20 --presets "$p" \
               --no-progress --out "$OUT/model_power_${p}_${GPU}.json"
           echo "$p end $(date +%s.%N)" >> "$OUT/phases.txt"
       done
       kill $smi; python scripts/power_clocks.py "$OUT/smi.csv" "$OUT/phases.txt" --json "$OUT/power_${GPU}.json" ;;
*) echo "unknown step $s" ;;
esac; done
