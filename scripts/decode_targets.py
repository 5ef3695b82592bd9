"""Issue 18's decode targets against the rows of `bash scripts/gpu_bench.sh graphs` (its decode_graphs_*.json):
`python scripts/decode_targets.py OUT`. Prints the rows, then PASS / MISS per target."""
import json
import sys
from pathlib import Path


def rows(out: Path) -> list[dict]:
    found = []
    for path in sorted(out.glob("decode_graphs_*.json")):
        found += [r for r in json.loads(path.read_text())["rows"] if r.get("ms_per_step")]
    return found


def pick(table, preset, model, decode, batch):
    want = (preset, model, decode, batch)
    return next((r for r in table if (r["preset"], r["model"], r.get("decode"), r["batch"]) == want), None)


# Per-token times: each step waited for before the next is queued ("synced", every session's rows), or the
# interval between tokens while the next step is already queued, as generation streams them ("streamed").
METRICS = {"synced": ("ms_per_step", "ms_per_step_p90", "x_floor"),
           "streamed": ("ms_per_token_streamed", "ms_per_token_streamed_p90", "x_floor_streamed")}


def path_checks(table, path: str, llama, metric: str = "synced") -> list[tuple]:
    """The issue's targets on the rows of one decode path ("graphs" or "compiled"), timed as ``metric``."""
    ms, p90, xf = METRICS[metric]
    fox = "fox-pro-125m"
    b1, b32 = pick(table, fox, "fox", path, 1), pick(table, fox, "fox", path, 32)
    ev1 = pick(table, fox, "fox+evict", path, 1)
    big = pick(table, "fox-pro-760m", "fox", path, 1)
    b1, b32, ev1, big, llama = (r if r and r.get(ms) else None for r in (b1, b32, ev1, big, llama))
    checks = []
    if b1:
        checks += [("125M, 32K, batch 1: <= 1.5 ms per token (median)", b1[ms] <= 1.5, b1[ms]),
                   ("p90 within 1.3x the median", b1[p90] <= 1.3 * b1[ms], b1[p90] / b1[ms]),
                   ("moonshot: batch 1 within 2x of the bandwidth floor", (b1.get(xf) or 99) <= 2, b1.get(xf))]
    if b1 and llama:
        checks.append((">= 1.0x the static-cache compiled Llama (its ms / ours)", b1[ms] <= llama[ms],
                       llama[ms] / b1[ms]))
    if b32:
        checks.append(("125M, 32K, batch 32: <= 1.3x the bandwidth floor", (b32.get(xf) or 99) <= 1.3, b32.get(xf)))
    if big:
        checks.append(("760M, 32K, batch 1: <= 3 ms per token", big[ms] <= 3, big[ms]))
    if b1 and ev1:
        checks.append(("eviction costs <= 10% per token at batch 1 (ratio)", ev1[ms] <= 1.1 * b1[ms], ev1[ms] / b1[ms]))
    return [(f"[{path}, {metric}] {name}", ok, value) for name, ok, value in checks]


def main(out: Path) -> None:
    table = rows(out)
    nan = float("nan")
    print(f"{'preset':<22}{'model':<22}{'decode':<16}{'B':>3}{'ms':>9}{'p90':>9}{'tok/s':>9}{'x floor':>8}"
          f"{'host':>8}{'streamed':>9}{'vs eager':>9}")
    for r in table:
        print(f"{r['preset']:<22}{r['model']:<22}{str(r.get('decode'))[:15]:<16}{r['batch']:>3}{r['ms_per_step']:>9.3f}"
              f"{r['ms_per_step_p90']:>9.3f}{r['tokens_per_s']:>9.0f}{r.get('x_floor') or nan:>8.2f}"
              f"{r.get('ms_host_per_step') or nan:>8.3f}{r.get('ms_per_token_streamed') or nan:>9.3f}"
              f"{r.get('logprob_diff_vs_eager', nan):>9.2g}")
    llama = pick(table, "transformer-pro-125m", "llama-static-compiled", "static-compiled", 1)
    checks = []
    for path in ("graphs", "compiled"):  # each target per decode path that has rows, both timings
        for metric in METRICS:
            checks += path_checks(table, path, llama, metric)
    same = [r["logprob_diff_vs_eager"] for r in table if r.get("decode") == "graphs" and "logprob_diff_vs_eager" in r]
    if same:
        checks.append(("graphs reproduce the eager log-probabilities (largest difference)", max(same) == 0, max(same)))
    for name, ok, value in checks:
        print(f"{'PASS' if ok else 'MISS'}  {name}: {value if value is None else round(value, 4)}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "bench_out"))
