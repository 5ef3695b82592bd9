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


def path_checks(table, path: str, llama) -> list[tuple]:
    """The issue's targets on the rows of one decode path ("graphs" or "compiled")."""
    fox = "fox-pro-125m"
    b1, b32 = pick(table, fox, "fox", path, 1), pick(table, fox, "fox", path, 32)
    ev1 = pick(table, fox, "fox+evict", path, 1)
    big = pick(table, "fox-pro-760m", "fox", path, 1)
    checks = []
    if b1:
        checks += [("125M, 32K, batch 1: <= 1.5 ms per token (median)", b1["ms_per_step"] <= 1.5, b1["ms_per_step"]),
                   ("p90 within 1.3x the median", b1["ms_per_step_p90"] <= 1.3 * b1["ms_per_step"],
                    b1["ms_per_step_p90"] / b1["ms_per_step"]),
                   ("moonshot: batch 1 within 2x of the bandwidth floor", (b1.get("x_floor") or 99) <= 2,
                    b1.get("x_floor"))]
    if b1 and llama:
        checks.append((">= 1.0x the static-cache compiled Llama (its ms / ours)",
                       b1["ms_per_step"] <= llama["ms_per_step"], llama["ms_per_step"] / b1["ms_per_step"]))
    if b32:
        checks.append(("125M, 32K, batch 32: <= 1.3x the bandwidth floor", (b32.get("x_floor") or 99) <= 1.3,
                       b32.get("x_floor")))
    if big:
        checks.append(("760M, 32K, batch 1: <= 3 ms per token", big["ms_per_step"] <= 3, big["ms_per_step"]))
    if b1 and ev1:
        checks.append(("eviction costs <= 10% per token at batch 1 (ratio)",
                       ev1["ms_per_step"] <= 1.1 * b1["ms_per_step"], ev1["ms_per_step"] / b1["ms_per_step"]))
    return [(f"[{path}] {name}", ok, value) for name, ok, value in checks]


def main(out: Path) -> None:
    table = rows(out)
    print(f"{'preset':<22}{'model':<22}{'decode':<16}{'B':>3}{'ms':>9}{'p90':>9}{'tok/s':>9}{'x floor':>8}"
          f"{'vs eager':>9}")
    for r in table:
        print(f"{r['preset']:<22}{r['model']:<22}{str(r.get('decode'))[:15]:<16}{r['batch']:>3}{r['ms_per_step']:>9.3f}"
              f"{r['ms_per_step_p90']:>9.3f}{r['tokens_per_s']:>9.0f}{r.get('x_floor') or float('nan'):>8.2f}"
              f"{r.get('logprob_diff_vs_eager', float('nan')):>9.2g}")
    llama = pick(table, "transformer-pro-125m", "llama-static-compiled", "static-compiled", 1)
    checks = []
    for path in ("graphs", "compiled"):  # each target per decode path that has rows
        checks += path_checks(table, path, llama)
    same = [r["logprob_diff_vs_eager"] for r in table if r.get("decode") == "graphs" and "logprob_diff_vs_eager" in r]
    if same:
        checks.append(("graphs reproduce the eager log-probabilities (largest difference)", max(same) == 0, max(same)))
    for name, ok, value in checks:
        print(f"{'PASS' if ok else 'MISS'}  {name}: {value if value is None else round(value, 4)}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "bench_out"))
