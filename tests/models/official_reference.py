"""Checkpoints in the layout of the FoX paper's own code (github zhixuan-lin/forgetting-transformer,
src/forgetting_transformer/model/), with random weights, and an fp64 forward written from their modeling code's
maths, independently of foxformer's model (no foxformer import here).

What the forward follows, per block (pre-norm, RMSNorm eps = norm_eps): q = q_proj(h); k, v = their projection,
shifted when use_k_shift / use_v_shift (y_t = a_t y_{t-1} + (1 - a_t) y_t per head, a = sigmoid(shift_proj h),
y_{-1} = 0); QK-norm (eps 1e-5: their modules' default) with one [head_dim] weight or [hidden] grouped by head;
RoPE on halves (GPT-NeoX) with inv_freq = 1 / base^(2i / head_dim); log f = logsigmoid(fgate_proj h) ("full"), the
bias alone ("bias_only", "fixed") or 0 ("none"); causal softmax of q.k / sqrt(head_dim) + c_i - c_j with
c = cumsum(log f); GQA (their Transformer class) by repeating each kv head over its group; output: grouped RMSNorm
times sigmoid(ogate_proj h) (FusedGroupNormGated), or the norm alone, or sigmoid(ogate) * o (glu_linear), then
o_proj; MLP: gate_proj [2I, d] chunked into gate and up, down(silu(gate) * up).
"""
from __future__ import annotations

import json
import math
import os

import torch
import torch.nn.functional as F

FOX = "forgetting_transformer-project_fox"
TRANSFORMER = "transformer-project_fox"

# Tiny sizes: hidden 32, 4 heads of 8, 2 layers, SwiGLU width 40.
BASE = dict(hidden_size=32, num_heads=4, num_hidden_layers=2, intermediate_size=40, norm_eps=1e-6,
            hidden_act="swish", window_size=None, max_position_embeddings=None, tie_word_embeddings=False,
            pad_token_id=None, bos_token_id=None, eos_token_id=None, initializer_range=0.02)
PRO = dict(use_k_shift=True, use_v_shift=True, qk_norm=True, use_output_gate=True, use_output_norm=True)

VARIANTS = {
    # the released FoX (Pro): QK-norm weights shared by the heads, GPT-2 vocabulary
    "fox-pro-released": dict(model_type=FOX, vocab_size=50257, fgate_type="full", use_rope=False,
                             qk_norm_share_param_across_head=True, **PRO),
    "fox-pro-per-head": dict(model_type=FOX, vocab_size=97, fgate_type="full", use_rope=False,
                             qk_norm_share_param_across_head=False, **PRO),
    "fox-llama": dict(model_type=FOX, vocab_size=97, fgate_type="full", use_rope=False),
    # their Transformer (Pro): the FoX class without forget gate, with RoPE
    "transformer-pro": dict(model_type=FOX, vocab_size=97, fgate_type="none", use_rope=True, rope_base=500000.0,
                            qk_norm_share_param_across_head=True, **PRO),
    "transformer-llama-gqa": dict(model_type=TRANSFORMER, vocab_size=97, num_kv_heads=2, use_rope=True,
                                  rope_base=10000.0),
    "fox-k-shift-gate-only": dict(model_type=FOX, vocab_size=97, fgate_type="bias_only", use_rope=True,
                                  rope_base=10000.0, use_k_shift=True, use_output_gate=True, ogate_act="sigmoid",
                                  tie_word_embeddings=True),
    "fox-v-shift-norm-only": dict(model_type=FOX, vocab_size=97, fgate_type="fixed", fgate_bias_init=True,
                                  decay_time_min=2.0, decay_time_max=64.0, use_v_shift=True, use_output_norm=True,
                                  qk_norm=True, log_pruning_tolerance=-10.0),
}


def official_config(variant: str, **overrides) -> dict:
    return {**BASE, **VARIANTS[variant], **overrides}


def random_state(cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Their parameter names and shapes for ``cfg``; every weight random, norm weights around 1 and biases
    around 0 but never equal to them (a wrong split, reshape or eps then changes the logits)."""
    g = torch.Generator().manual_seed(seed)
    d, H = cfg["hidden_size"], cfg["num_heads"]
    D, I = d // H, cfg["intermediate_size"]
    Hkv = cfg.get("num_kv_heads") or H

    def w(*shape, std=0.2):
        return torch.randn(*shape, generator=g) * std

    def norm(n):
        return 1.0 + w(n, std=0.3)

    fox = cfg["model_type"] == FOX
    sd = {"model.embeddings.weight": w(cfg["vocab_size"], d, std=1.0), "model.norm.weight": norm(d)}
    if not cfg.get("tie_word_embeddings"):
        sd["lm_head.weight"] = w(cfg["vocab_size"], d)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        sd.update({p + "attn_norm.weight": norm(d), p + "mlp_norm.weight": norm(d),
                   p + "attn.q_proj.weight": w(H * D, d), p + "attn.o_proj.weight": w(d, H * D),
                   p + "mlp.gate_proj.weight": w(2 * I, d), p + "mlp.down_proj.weight": w(d, I)})
        for name in ("k", "v"):
            if fox and cfg.get(f"use_{name}_shift"):
                sd[p + f"attn.{name}_proj.linear.weight"] = w(Hkv * D, d)
                sd[p + f"attn.{name}_proj.shift_proj.weight"] = w(H, d)
            else:
                sd[p + f"attn.{name}_proj.weight"] = w(Hkv * D, d)
        if not fox:
            continue
        fgate = cfg.get("fgate_type", "full")
        if fgate == "full":
            sd[p + "attn.fgate_proj.weight"] = w(H, d)
            sd[p + "attn.fgate_proj.bias"] = 2.0 + w(H)
        elif fgate in ("bias_only", "fixed"):
            sd[p + "attn.fgate_bias"] = 2.0 + w(H, std=1.0)
        if cfg.get("use_output_gate"):
            sd[p + "attn.ogate_proj.weight"] = w(d, d)
        if cfg.get("use_output_norm"):
            sd[p + "attn.output_norm.weight"] = norm(d)
        if cfg.get("qk_norm"):
            n = D if cfg.get("qk_norm_share_param_across_head") else d
            sd[p + "attn.q_norm.weight"], sd[p + "attn.k_norm.weight"] = norm(n), norm(n)
    return sd


def save_official(folder: str, cfg: dict, state: dict, fmt: str = "safetensors") -> str:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)
    if fmt == "safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, os.path.join(folder, "model.safetensors"))
    else:
        torch.save(state, os.path.join(folder, "pytorch_model.bin"))
    return folder


def _rms(x, weight, eps, groups=None):
    """RMSNorm over the last dim, or over each of ``groups`` equal slices of it (their GroupNorm)."""
    if groups is not None:
        x = x.unflatten(-1, (groups, -1))
        weight = weight.view(groups, -1)
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
    return y.flatten(-2) if groups is not None else y


def _shifted(y, a):
    """y [B, T, H, D], a [B, T, H]: a_t y_{t-1} + (1 - a_t) y_t with y_{-1} = 0."""
    prev = torch.cat((torch.zeros_like(y[:, :1]), y[:, :-1]), dim=1)
    return a[..., None] * prev + (1 - a[..., None]) * y


def _rope(x, base):
    T, D = x.shape[1], x.shape[-1]
    inv_freq = 1.0 / base ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    angles = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None]
    cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def _attention(cfg, sd, p, h):
    fox = cfg["model_type"] == FOX
    B, T, d = h.shape
    H = cfg["num_heads"]
    D = d // H
    Hkv = cfg.get("num_kv_heads") or H
    q = (h @ sd[p + "q_proj.weight"].T).view(B, T, H, D)
    kv = []
    for name in ("k", "v"):
        if fox and cfg.get(f"use_{name}_shift"):
            y = (h @ sd[p + f"{name}_proj.linear.weight"].T).view(B, T, Hkv, D)
            y = _shifted(y, torch.sigmoid(h @ sd[p + f"{name}_proj.shift_proj.weight"].T))
        else:
            y = (h @ sd[p + f"{name}_proj.weight"].T).view(B, T, Hkv, D)
        kv.append(y)
    k, v = kv
    if fox and cfg.get("qk_norm"):
        if cfg.get("qk_norm_share_param_across_head"):
            q, k = _rms(q, sd[p + "q_norm.weight"], 1e-5), _rms(k, sd[p + "k_norm.weight"], 1e-5)
        else:
            q = _rms(q.flatten(-2), sd[p + "q_norm.weight"], 1e-5, groups=H).view(B, T, H, D)
            k = _rms(k.flatten(-2), sd[p + "k_norm.weight"], 1e-5, groups=Hkv).view(B, T, Hkv, D)
    if cfg.get("use_rope", not fox):
        q, k = _rope(q, cfg["rope_base"]), _rope(k, cfg["rope_base"])
    fgate = cfg.get("fgate_type", "full") if fox else "none"
    if fgate == "full":
        log_f = F.logsigmoid(h @ sd[p + "fgate_proj.weight"].T + sd[p + "fgate_proj.bias"])
    elif fgate == "none":
        log_f = torch.zeros(B, T, H, dtype=h.dtype)
    else:
        log_f = F.logsigmoid(sd[p + "fgate_bias"]).expand(B, T, H)
    c = log_f.cumsum(1).transpose(1, 2)                                       # [B, H, T]
    group = H // Hkv
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(D) + c[..., :, None] - c[..., None, :]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    o = torch.einsum("bhij,bjhd->bihd", probs, v).reshape(B, T, d)
    if fox and cfg.get("use_output_norm"):
        o = _rms(o, sd[p + "output_norm.weight"], cfg["norm_eps"], groups=H)
        if cfg.get("use_output_gate"):
            o = o * torch.sigmoid(h @ sd[p + "ogate_proj.weight"].T)
    elif fox and cfg.get("use_output_gate"):
        o = torch.sigmoid(h @ sd[p + "ogate_proj.weight"].T) * o
    return o @ sd[p + "o_proj.weight"].T


def official_logits(cfg: dict, state: dict, ids: torch.Tensor) -> torch.Tensor:
    """fp64 logits [B, T, V] of their model for token ids [B, T]."""
    sd = {k: v.double() for k, v in state.items()}
    eps = cfg["norm_eps"]
    x = sd["model.embeddings.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = x + _attention(cfg, sd, p + "attn.", _rms(x, sd[p + "attn_norm.weight"], eps))
        gate, up = (_rms(x, sd[p + "mlp_norm.weight"], eps) @ sd[p + "mlp.gate_proj.weight"].T).chunk(2, dim=-1)
        x = x + (F.silu(gate) * up) @ sd[p + "mlp.down_proj.weight"].T
    head = sd.get("lm_head.weight", sd["model.embeddings.weight"])
    return _rms(x, sd["model.norm.weight"], eps) @ head.T
