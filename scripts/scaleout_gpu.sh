#!/usr/bin/env bash
# One H200, about 5 minutes (6 at most: each step has its own limit), from the repo root: the one-GPU inputs of docs/architecture.md's scale-out
# estimate and what a checkpoint costs the training loop.
#   step      FoX (Pro) 760M and 1.3B at 16K, eager bf16 autocast, 2 sequences a step (micro-batch 1, as the
#             760M reference of docs/benchmarks.md), GPT-2-sized vocabulary (50304) on byte-level data
#             (no tokenizer files needed): median tokens/s of steps 3-8, then scripts/scaleout_estimate.py
#             with both measurements
#   ckpt      760M with AdamW state on the GPU: time the training loop is held by a full save, a sharded
#             synchronous save and a sharded async save, and the time until each is committed
# Everything lands in $OUT (JSON, logs); a short table is printed at the end.
# Usage: OUT=/tmp/out PYTHONPATH=src bash scripts/scaleout_gpu.sh
# A CPU smoke run of its logic: DEVICE=cpu P760=fox-pro-tiny P13=fox-pro-tiny CTX=64 bash scripts/scaleout_gpu.sh
set -u
OUT=${OUT:-scaleout_out}; RUNS=${RUNS:-/tmp/scaleout_runs}
P760=${P760:-fox-pro-760m}; P13=${P13:-fox-pro-1.3b}; CTX=${CTX:-16384}; DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT" "$RUNS"
export PYTHONPATH=${PYTHONPATH:-src} TRITON_INTERPRET=0
python -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, \
'transformers', transformers.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')" \
    | tee "$OUT/env.txt"
python -c "from foxformer.provenance import code_version; print('commit', code_version())" | tee -a "$OUT/env.txt"

echo "=== data $(date +%T)"
timeout 40 python -m foxformer.cli data prepare --source builtin:pydoc --tokenizer bytes --out "$RUNS/data" \
    --max-tokens-per-source 1000000 --no-progress > "$OUT/data.log" 2>&1 || tail -n 5 "$OUT/data.log"

for preset in "$P760" "$P13"; do
    echo "=== $preset $(date +%T)"
    rm -rf "${RUNS:?}/$preset"
    timeout 100 python -m foxformer.cli train --preset "$preset" --context "$CTX" --data "$RUNS/data" \
        --tokenizer bytes --set vocab_size=50304 --batch-tokens $((2 * CTX)) --micro-batch-size 1 --max-steps 8 \
        --total-tokens 1G --warmup-tokens 2M --checkpoint-every-tokens 100G --eval-every-tokens 100G \
        --eval-tokens "$CTX" --device "$DEVICE" --out "$RUNS/$preset" --log-every 1 --no-progress --set export_hf=false \
        --set tensorboard=false > "$OUT/train_$preset.log" 2>&1
    echo "rc=$?"; tail -n 3 "$OUT/train_$preset.log"
    cp "$RUNS/$preset/metrics.jsonl" "$OUT/train_$preset.metrics.jsonl" 2>/dev/null
done
python - "$OUT" "$P760" "$P13" <<'EOF' | tee "$OUT/step_times.txt"
import json, os, statistics, sys
out, rates = sys.argv[1], {}
for key, preset in zip(("760m", "1.3b"), sys.argv[2:]):
    path = os.path.join(out, f"train_{preset}.metrics.jsonl")
    recs = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
    tps = [r["tokens_per_s"] for r in recs if r.get("kind") == "train" and r["step"] >= 3]
    if tps:
        rates[key] = statistics.median(tps)
        print(f"{preset}: {rates[key]:,.0f} tokens/s (median of {len(tps)} steps)")
json.dump(rates, open(os.path.join(out, "step_tok_s.json"), "w"), indent=2)
EOF
args=()
r760=$(python -c "import json; print(json.load(open('$OUT/step_tok_s.json')).get('760m', ''))")
r13=$(python -c "import json; print(json.load(open('$OUT/step_tok_s.json')).get('1.3b', ''))")
[ -n "$r760" ] && args+=(--tok-s "$r760")
[ -n "$r13" ] && args+=(--tok-s-1p3b "$r13")
python scripts/scaleout_estimate.py "${args[@]}" --json "$OUT/estimate.json" | tee "$OUT/estimate.md"

echo "=== ckpt $(date +%T)"
timeout 140 python - "$OUT" "$RUNS" "$P760" "$DEVICE" <<'EOF' 2>&1 | tee "$OUT/checkpoint.txt"
import json, os, shutil, sys, time
import torch
from foxformer.models import FoxForCausalLM, get_preset
from foxformer.train.distributed import init_distributed
from foxformer.train.sharded import CheckpointWriter

out, runs, preset, device = sys.argv[1:5]
info = init_distributed(device, "none")
model = FoxForCausalLM(get_preset(preset, vocab_size=50304)).to(info.device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **({"fused": True} if device == "cuda" else {}))
x = torch.randint(0, 50304, (1, 2048), device=info.device)
with torch.autocast(info.device.type, torch.bfloat16):
    model(x, labels=x).loss.backward()
opt.step()
rows = []
for fmt, async_save in (("sharded", True), ("sharded", False), ("full", False)):  # the new path first
    run = os.path.join(runs, f"ckpt_{fmt}_{'async' if async_save else 'sync'}")
    shutil.rmtree(run, ignore_errors=True)
    with CheckpointWriter(run, info, fmt, async_save, 1, None) as writer:
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        writer.save(1, model, opt, {"tokens": 0})
        held = time.perf_counter() - t0
        path = writer.wait() or os.path.join(run, "checkpoints", "step_00000001")
        total = time.perf_counter() - t0
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    rows.append({"format": fmt, "async": async_save, "held_s": held, "committed_s": total, "bytes": size})
    print(f"{fmt:8s} {'async' if async_save else 'sync ':5s} training held {held:6.2f} s, committed after "
          f"{total:6.2f} s, {size / 1e9:.2f} GB")
    shutil.rmtree(run)
    json.dump(rows, open(os.path.join(out, "checkpoint.json"), "w"), indent=2)  # kept if the limit cuts the rest
EOF
echo "=== done $(date +%T)"
