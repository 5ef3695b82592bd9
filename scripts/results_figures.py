"""The fifth session's figures of docs/results.md, from the run records committed under docs/results.

    python scripts/results_figures.py

lr_sweep_45m.png: final validation loss against peak lr for the four small models (lr 2e-3: the two
main runs, first and third session; 1e-3 / 4e-3: the fifth session's sweep). ablations.png: loss by
position octave for the LLaMA-block gate variants and Transformer (LLaMA), from `foxformer eval
compare` outputs (compare.json).
"""
import json, matplotlib; matplotlib.use("Agg"); import matplotlib.pyplot as plt
R = "docs/results"
def end(path):
    return [r for r in map(json.loads, open(path)) if r["kind"] == "end"][-1]["val_loss"]
models = [("fox-pro-small", "FoX (Pro)", "C0", "-"), ("transformer-pro-small", "Transformer (Pro)", "C1", "-"),
          ("fox-llama-small", "FoX (LLaMA)", "C0", "--"), ("transformer-llama-small", "Transformer (LLaMA)", "C1", "--")]
table = {}
plt.figure(figsize=(6, 4))
for p, name, c, ls in models:
    v1, v4 = (end(f"{R}/lr_sweep_45m/{p}_lr{lr}/metrics.jsonl") for lr in ("1e-3", "4e-3"))
    v2 = [end(f"{R}/runs/{p}/metrics.jsonl"), end(f"{R}/rerun_session3/runs/{p}/metrics.jsonl")]
    table[name] = (v1, v2, v4)
    mid = sum(v2) / 2
    plt.plot([1e-3, 2e-3, 4e-3], [v1, mid, v4], "o" + ls, color=c, label=name)
    plt.vlines(2e-3, min(v2), max(v2), color=c)
    print(f"| {name} | {v1:.3f} | {v2[0]:.3f} / {v2[1]:.3f} | {v4:.3f} |")
plt.xscale("log"); plt.minorticks_off(); plt.xticks([1e-3, 2e-3, 4e-3], ["1e-3", "2e-3", "4e-3"])
plt.xlabel("peak lr"); plt.ylabel("final validation loss, nats")
plt.title("lr sweep, 45M tokens (2e-3: two runs, bar = range)"); plt.legend(); plt.tight_layout()
plt.savefig(f"{R}/lr_sweep_45m.png", dpi=100)

rows = {}
for f, tag in [(f"{R}/compare.json", "run 1"), (f"{R}/rerun_session3/compare.json", "run 2"), (f"{R}/ablations/compare.json", "")]:
    for r in json.load(open(f))["rows"]:
        rows[({"FoX (LLaMA)": "fox-llama-small", "Transformer (LLaMA)": "transformer-llama-small"}.get(r["model"], r["model"]), tag)] = r
variants = [(("fox-llama-small", "run 1"), "data-dependent gate (run 1)", "C0", "-"),
            (("fox-llama-small", "run 2"), "data-dependent gate (run 2)", "C0", ":"),
            (("fox-llama-small_fgate-data_independent", ""), "data-independent gate", "C2", "-"),
            (("fox-llama-small_fgate-fixed", ""), "fixed gate (ALiBi)", "C3", "-"),
            (("transformer-llama-small", "run 1"), "Transformer (LLaMA, RoPE) (run 1)", "C1", "-"),
            (("transformer-llama-small", "run 2"), "Transformer (LLaMA, RoPE) (run 2)", "C1", ":")]
pos = [512, 2048, 4096, 8192, 16384]
plt.figure(figsize=(6.5, 4))
for key, name, c, ls in variants:
    r = rows[key]
    plt.plot(pos, [r[f"L@{p}"] for p in pos], "o" + ls, color=c, label=name)
    print(f"| {name} | {r['mean_loss']:.3f} | " + " | ".join(f"{r[f'L@{p}']:.3f}" for p in pos) + " |")
plt.xscale("log", base=2); plt.xticks(pos, ["256..512", "1K..2K", "2K..4K", "4K..8K", "8K..16K"])
plt.axvline(4096 * 1.4, color="gray", ls="--", lw=0.8)
plt.xlabel("position bin (training length 4K)"); plt.ylabel("mean loss, nats")
plt.title("gate ablations, LLaMA block, 25M, 45M tokens"); plt.legend(fontsize=8); plt.tight_layout()
plt.savefig(f"{R}/ablations.png", dpi=100)
