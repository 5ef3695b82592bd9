"""Forget-gate analysis: per-head statistics, decay matrices F, attention matrices A, effective context length.

For layer l and head h with gates f_t = exp(log f_t) and c_t = sum_{s<=t} log f_s:
  F[i, j] = prod_{s=j+1..i} f_s = exp(c_i - c_j)                     (j <= i), the decay matrix
  A[i, j] = softmax_j(q_i . k_j / sqrt(D) + c_i - c_j)                the attention matrix
           = (q_i . k_j) F[i, j] with unit q, k                         (gated linear attention: no softmax)
  D(d)    = mean over queries i >= d (and sequences) of F[i, i - d]   the mean decay at distance d
  effective context length = the distance d where D(d) falls below 1/e (interpolated in log D).
Statistics over all tokens t >= 1 of the text: mean log f, timescale 1 / -mean(log f), share of f < 0.5.

The q, k and log f of every layer are captured by temporarily wrapping each attention module's ``_attend``
(its inputs are the final q, k after shift / norm / RoPE) and calling the module's own ``_log_fgate``.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass, field
from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from foxformer.argtypes import setting_name
from foxformer.models.calls import backbone, fox_blocks, model_device
from foxformer.progress import progress_bar
from .loss import check_batch_size, check_tokens


def _attention_modules(model: torch.nn.Module) -> list:
    return [b.attn for b in fox_blocks(model, "gate analysis")]


def is_linear(model: torch.nn.Module) -> bool:
    """Gated linear attention (attention="linear"): its A has no softmax."""
    return getattr(getattr(model, "config", None), "attention", None) == "linear"


@contextlib.contextmanager
def capture_attention(model: torch.nn.Module, qk_layers: Sequence[int] = ()):
    """Record per layer: "log_f" fp32 [B, T, H] (None without a gate) and, for ``qk_layers``, "q" [B, T, H, D]
    and "k" [B, T, Hkv, D]. Yields the list of per-layer dicts, filled by forward passes inside the block."""
    attns = _attention_modules(model)
    records: list[dict] = [{} for _ in attns]
    wanted = set(qk_layers)

    def wrap(idx: int, attn):
        original = attn._attend

        def _attend(x, q, k, v, ctx, cache, f_logits, shift=(None, None)):
            log_f = attn._log_fgate(x, ctx, f_logits)
            records[idx]["log_f"] = None if log_f is None else log_f.detach().float()
            if idx in wanted:
                records[idx]["q"], records[idx]["k"] = q.detach().float(), k.detach().float()
            return original(x, q, k, v, ctx, cache, f_logits, shift)

        return _attend

    try:
        for i, attn in enumerate(attns):
            attn._attend = wrap(i, attn)
        yield records
    finally:
        for attn in attns:
            attn.__dict__.pop("_attend", None)


def distance_grid(max_distance: int, points: int = 96) -> np.ndarray:
    """Integer distances 1 .. max_distance, geometric, unique."""
    if max_distance < 1:
        return np.zeros(0, dtype=np.int64)
    return np.unique(np.geomspace(1, max_distance, num=points).round().astype(np.int64))


def mean_decay(log_f: torch.Tensor, distances: np.ndarray) -> np.ndarray:
    """D(d) per head: fp64 [len(distances), H] for log f [B, T, H] (fp64 cumulative sums)."""
    c = torch.cumsum(log_f.double().clamp(min=-1e4), dim=1)
    out = np.zeros((len(distances), log_f.shape[-1]))
    for n, d in enumerate(distances):
        out[n] = torch.exp(c[:, d:] - c[:, :-d]).mean(dim=(0, 1)).cpu().numpy()
    return out


def effective_length(distances: np.ndarray, decay: np.ndarray, threshold: float = math.exp(-1.0)) -> list:
    """First distance where decay [len(distances), H] drops below ``threshold``, per head; None if never."""
    out: list = []
    logt = math.log(threshold)
    for h in range(decay.shape[1]):
        col = decay[:, h]
        below = np.flatnonzero(col < threshold)
        if below.size == 0:
            out.append(None)
            continue
        k = int(below[0])
        # D(0) = 1 anchors the interpolation when the very first distance is already below the threshold
        la = 0.0 if k == 0 else math.log(max(col[k - 1], 1e-300))
        da = 0.0 if k == 0 else float(distances[k - 1])
        lb, db = math.log(max(col[k], 1e-300)), float(distances[k])
        out.append(da + (db - da) * (la - logt) / (la - lb) if la != lb else db)
    return out


# Each number of GateStats.summary(): what it is, in words, and what it counts. The units are written beside the
# summaries (a bare "median_timescale": 1.05 did not say tokens); `foxformer report` heads its table with both
SUMMARY_COLUMNS = {"tokens": ("text analysed", "tokens"), "median_timescale": ("median timescale", "tokens"),
                   "min_timescale": ("min timescale", "tokens"),
                   "heads_beyond_text": ("heads with effective context beyond the text", "heads (of all layers)"),
                   "median_eff_context": ("median effective context", "tokens")}
SUMMARY_UNITS = {key: unit for key, (_, unit) in SUMMARY_COLUMNS.items()}


@dataclass
class GateStats:
    """Per layer [L][H] lists. eff_context: None = the decay stays above 1/e up to ``max_distance``."""

    name: str
    num_layers: int
    num_heads: int
    tokens: int
    has_gate: bool
    max_distance: int
    mean_log_f: list = field(default_factory=list)
    timescale: list = field(default_factory=list)
    frac_below_half: list = field(default_factory=list)
    eff_context: list = field(default_factory=list)
    distances: list = field(default_factory=list)
    decay: list = field(default_factory=list)  # [L][len(distances)][H]

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> dict:
        if not self.has_gate:
            return {"name": self.name, "has_gate": False}
        ts = np.asarray(self.timescale, dtype=np.float64)
        eff = np.asarray([[np.inf if e is None else e for e in row] for row in self.eff_context])
        return {"name": self.name, "has_gate": True, "tokens": self.tokens,
                "median_timescale": float(np.median(ts)), "min_timescale": float(ts.min()),
                "heads_beyond_text": int(np.isinf(eff).sum()), "median_eff_context": float(np.median(eff))}


@torch.no_grad()
def gate_stats(model: torch.nn.Module, tokens, *, name: str = "model", points: int = 96,
               batch_size: int = 4, progress: bool = False) -> GateStats:
    """Forget-gate statistics of ``model`` over tokens int64 [N, T] (or [T]); see the module docstring.
    ``points``: distances at which the mean decay is measured (geometric); ``batch_size``: sequences per forward."""
    tokens = check_tokens(tokens, model)
    attns = _attention_modules(model)
    check_batch_size(batch_size)
    log_fs: list[list[torch.Tensor]] = [[] for _ in attns]
    for s in progress_bar(range(0, tokens.shape[0], batch_size), desc=f"gates {name}", unit="batch",
                          wanted=progress):
        with capture_attention(model) as rec:
            backbone(model)(input_ids=tokens[s:s + batch_size].to(model_device(model)))
        for layer, r in enumerate(rec):
            if r.get("log_f") is not None:
                log_fs[layer].append(r["log_f"].cpu())
    L, H, T = len(attns), attns[0].num_heads, tokens.shape[1]
    stats = GateStats(name=name, num_layers=L, num_heads=H, tokens=int(tokens.numel()),
                      has_gate=bool(log_fs[0]), max_distance=T - 1)
    if not stats.has_gate:
        return stats
    dist = distance_grid(T - 1, points)
    stats.distances = dist.tolist()
    for parts in log_fs:
        log_f = torch.cat(parts, dim=0)  # fp32 [N, T, H]
        lf = log_f[:, 1:].double().clamp(min=-1e4)  # position 0 has nothing before it to forget
        mean = lf.mean(dim=(0, 1)).numpy()
        stats.mean_log_f.append(mean.tolist())
        stats.timescale.append([float(1.0 / -m) if m < 0 else float("inf") for m in mean])
        stats.frac_below_half.append((lf < math.log(0.5)).double().mean(dim=(0, 1)).numpy().tolist())
        dec = mean_decay(log_f, dist)
        stats.decay.append(dec.tolist())
        stats.eff_context.append(effective_length(dist, dec))
    return stats


def parse_heads(spec: Optional[str], *, label: str = "{}") -> Optional[list[tuple[int, int]]]:
    """"0:1,3:2" -> [(0, 1), (3, 2)] (layer:head); None or "" -> None (automatic choice). ``label`` names the
    setting as argtypes.setting_name does: the keyword, or "--{}" the flag of `analyze gates`."""
    if not spec:
        return None
    out = []
    for part in spec.split(","):
        try:
            layer, head = part.split(":")
            out.append((int(layer), int(head)))
        except ValueError as e:
            raise ValueError(f"{setting_name(label, 'heads')}: expected 'layer:head[,layer:head...]' such as "
                             f"'0:1,3:2', got {spec!r}") from e
    return out


def choose_heads(stats: GateStats, count: int = 8) -> list[tuple[int, int]]:
    """Heads spread over the range of timescales (shortest to longest), or the first heads without gates."""
    pairs = [(l, h) for l in range(stats.num_layers) for h in range(stats.num_heads)]
    if not stats.has_gate:
        return pairs[:count]
    order = sorted(pairs, key=lambda p: stats.timescale[p[0]][p[1]])
    picks = np.unique(np.linspace(0, len(order) - 1, num=min(count, len(order))).round().astype(int))
    return [order[i] for i in picks]


@torch.no_grad()
def head_matrices(model: torch.nn.Module, tokens, heads: Sequence[tuple[int, int]],
                  max_len: int = 256, label: str = "{}") -> list[dict]:
    """Decay matrix F and attention matrix A (fp64 numpy [T, T], T <= max_len) of each (layer, head),
    from the first sequence of ``tokens``. A is what the model weighs the values with: rows of softmax
    probabilities, or for gated linear attention signed weights (rows need not sum to 1). ``label``: as
    parse_heads' (``max_len`` is save_gates' and the command's matrix_len)."""
    # a negative slice end would silently drop tokens from the end; 0 leaves nothing to run
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"{setting_name(label, 'matrix_len')}: expected a positive integer (tokens shown), got "
                         f"{max_len!r}")
    tokens = check_tokens(tokens, model)[:1, :max_len]
    attns = _attention_modules(model)
    for layer, head in heads:
        if not (0 <= layer < len(attns) and 0 <= head < attns[layer].num_heads):
            raise ValueError(f"{setting_name(label, 'heads')}: ({layer}, {head}) is outside {len(attns)} layers x "
                             f"{attns[0].num_heads} heads")
    with capture_attention(model, qk_layers={l for l, _ in heads}) as rec:
        backbone(model)(input_ids=tokens.to(model_device(model)))
    T = tokens.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    linear = is_linear(model)
    out = []
    for layer, head in heads:
        r = rec[layer]
        log_f = r["log_f"]
        c = (torch.zeros(T, dtype=torch.float64) if log_f is None
             else torch.cumsum(log_f[0, :, head].double().cpu().clamp(min=-1e4), dim=0))
        bias = c[:, None] - c[None, :]
        group = attns[layer].num_heads // attns[layer].num_kv_heads
        q = r["q"][0, :, head].double().cpu()
        k = r["k"][0, :, head // group].double().cpu()
        decay = torch.exp(bias).masked_fill(~causal, 0.0)
        if linear:
            attn = (F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).T) * decay
        else:
            scores = q @ k.T / math.sqrt(q.shape[-1]) + bias
            scores = scores.masked_fill(~causal, float("-inf"))
            attn = torch.softmax(scores, dim=-1)
        out.append({"layer": layer, "head": head, "decay": decay.numpy(), "attention": attn.numpy()})
    return out
