"""Building blocks of FoX / Transformer blocks. Layout everywhere: [batch, seq, heads, dim]."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from foxformer.ops import (forgetting_attention, gate_norm, gated_linear_attention, naive_gated_linear_attention,
                           shift_norm)
from foxformer.ops.pro_block.checks import check_gate_logits

from .config import FoxConfig
from .fused_linear import joint_linear


@dataclass
class SeqContext:
    """Per-forward facts every layer needs, computed once by the model.

    starts: bool [B, T] or None, True where a sequence begins inside this chunk at a position that
        has tokens before it (left padding's first real token, a packed sequence's first token):
        attention must not see earlier keys there and the kv shift must not read the previous token.
    cos, sin: [B, T, 1, head_dim / 2] RoPE tables or None.
    cu_seqlens, max_seqlen: packed varlen batch (B = 1) or None.
    cache_at: a static decode step (see models.kvcache.base): int64 [2] on the device, the new token's position
        and the positions held after it.
    evict_scan: whether evicting caches look for dead keys in this forward (FoxCache.next_scan).
    """

    starts: Optional[torch.Tensor] = None
    cos: Optional[torch.Tensor] = None
    sin: Optional[torch.Tensor] = None
    cu_seqlens: Optional[torch.Tensor] = None
    max_seqlen: Optional[int] = None
    cache_at: Optional[torch.Tensor] = None
    evict_scan: bool = True


def packed_starts(cu_seqlens: torch.Tensor, batch: int, length: int,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(starts bool [1, T], positions int64 [1, T]) of a packed batch: True where a segment other than the first
    begins (SeqContext.starts), and each token's position within its segment. cu_seqlens int32 [N + 1]."""
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.dtype != torch.int32:
        raise TypeError("cu_seqlens must be a 1-D int32 tensor [N + 1]")
    if batch != 1:
        raise ValueError(f"cu_seqlens needs a packed batch of size 1, got batch size {batch}")
    if cu_seqlens.numel() < 2:
        raise ValueError("cu_seqlens must hold at least two offsets [0, T]")
    idx = torch.arange(length, device=device)
    cu = cu_seqlens.to(device=device, dtype=torch.long)
    seg_start = cu[torch.searchsorted(cu[1:], idx, right=True).clamp(max=cu.numel() - 2)]
    return ((idx == seg_start) & (idx > 0))[None], (idx - seg_start)[None]


@torch.compiler.disable
def cache_update(method, *args, **kwargs):
    """Call a cache method as plain eager code, also inside a torch.compile'd decode step (kvcache.graphs):
    it writes in place into storage that no compiled graph owns."""
    return method(*args, **kwargs)


def upcast(x: torch.Tensor) -> torch.Tensor:
    """At least fp32 (fp64 stays fp64, so float64 test models are exact)."""
    return x if x.dtype == torch.float64 else x.float()


class RMSNorm(nn.Module):
    """RMSNorm over the last dim; ``shape`` is the weight's shape ([dim], or [heads, dim] per head).

    F.rms_norm takes the low-precision input directly: its kernel accumulates in fp32, and
    skipping an explicit fp32 copy halves the cost (measured on H200, bf16, rows of 64).
    """

    def __init__(self, shape: int | tuple[int, ...], eps: float):
        super().__init__()
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.weight = nn.Parameter(torch.ones(shape))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dim = x.shape[-1]
        weight = self.weight.to(x.dtype)
        if weight.dim() == 1:
            return F.rms_norm(x, (dim,), weight, self.eps)
        return F.rms_norm(x, (dim,), None, self.eps) * weight


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [B, T, 1, head_dim / 2] for integer positions [B, T].

    Angles are formed in fp32 (fp64 for fp64 models) so that large positions keep their phase.
    """
    return _rope_tables_op(positions, head_dim, theta, dtype)


# An opaque op, so that torch.compile materialises the tables once a forward: traced as plain aten ops, Inductor
# fused the angle, cos and sin into every layer's RoPE kernels, forward and backward, and evaluated them for each
# element of q and k (H200, Transformer (LLaMA) 125M at 16K, compiled: its RoPE kernels took 34.6 ms of a 269 ms
# step, docs/bench/history.md "Whole models").
@torch.library.custom_op("foxformer::rope_tables", mutates_args=())
def _rope_tables_op(positions: torch.Tensor, head_dim: int, theta: float,
                    dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    calc = torch.float64 if dtype == torch.float64 else torch.float32
    half = head_dim // 2
    inv_freq = theta ** (-torch.arange(half, device=positions.device, dtype=calc) * 2.0 / head_dim)
    angles = (positions.to(calc)[..., None] * inv_freq)[:, :, None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


@_rope_tables_op.register_fake
def _(positions, head_dim, theta, dtype):
    shape = (*positions.shape, 1, head_dim // 2)
    return positions.new_empty(shape, dtype=dtype), positions.new_empty(shape, dtype=dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the two halves of the head dimension (LLaMA convention). x: [B, T, H, D]."""
    x1, x2 = x.chunk(2, dim=-1)
    # Under autocast the tables follow the fp32 residual stream while q, k are bf16: without the cast
    # q, k would be promoted to fp32 next to a bf16 v, which the attention op rejects.
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


# RMS-normalised q and k have norm sqrt(D) before their weights, so |scale * q . k| is bounded by
# scale * D * max|w_q| * max|w_k|; 1% covers the bf16 rounding of the normalised vectors (2^-8 each)
# and the fp32 accumulation of the product.
QK_NORM_ROUNDING = 1.01


def qk_norm_bound(q_weight: torch.Tensor, k_weight: torch.Tensor, head_dim: int,
                  softmax_scale: Optional[float] = None) -> torch.Tensor:
    """U >= |scale * q . k| for QK-normed q, k with norm weights [D] (or [H, D]): a 0-dim float64 tensor
    on the weights' device (a Python float would cost a device sync, and a graph break under compile)."""
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    w_q, w_k = q_weight.detach().abs().max().double(), k_weight.detach().abs().max().double()
    return w_q * w_k * (abs(scale) * head_dim * QK_NORM_ROUNDING)


def timescale_bias(num_heads: int, tmin: float, tmax: float) -> torch.Tensor:
    """Gate biases b [H] whose decay timescales T(b) = 1 / (-log sigmoid(b)) are geometric in [tmin, tmax].

    sigmoid(b) = exp(-1 / T), so b = logit(exp(-1 / T)) = -log(expm1(1 / T)).
    """
    if num_heads == 1:
        t = torch.tensor([tmin], dtype=torch.float64)
    else:
        t = torch.logspace(math.log10(tmin), math.log10(tmax), num_heads, dtype=torch.float64)
    return (-torch.log(torch.expm1(1.0 / t))).to(torch.get_default_dtype())


def initial_gate_bias(config: FoxConfig) -> torch.Tensor:
    """b [H] a new forget gate starts from (FoxConfig.fgate_bias_init)."""
    if config.gate_bias_init == "zero":
        return torch.zeros(config.num_heads)
    return timescale_bias(config.num_heads, config.fgate_tmin, config.fgate_tmax)


class GateProjection(nn.Linear):
    """w, b of a data-dependent forget gate: a Linear of its own type, so that weight initialisation (which
    transformers applies to modules holding parameters, not to the ForgetGate around it) can start b apart."""


class ForgetGate(nn.Module):
    """log f [B, T, H] (fp32) from the block input x [B, T, d]; see FoxConfig.fgate for the kinds."""

    def __init__(self, config: FoxConfig, layer_idx: int = 0):
        super().__init__()
        self.kind = config.fgate
        self.num_heads = config.num_heads
        self.set_bias_shift(config.layer_bias_shift(layer_idx))
        start = initial_gate_bias(config)
        if self.kind == "data_dependent":
            self.proj = GateProjection(config.hidden_size, config.num_heads, bias=True)
            with torch.no_grad():
                self.proj.bias.copy_(start)
        elif self.kind == "data_independent":
            self.bias = nn.Parameter(start)
        else:
            # A frozen gate is a (saved) buffer: loaders re-create parameters with requires_grad=True.
            self.register_buffer("bias", start)

    def set_bias_shift(self, shift, name: str = "fgate_bias_shift") -> None:
        """Inference-time shift [H] (or a float) added to the gate logits; zeros remove it exactly.

        Kept as a plain attribute, not a buffer: it is not part of the trained weights and must not
        enter state dicts or checkpoints. ``name``: how errors name the value (set_fgate_bias_shift adds the layer).
        """
        # Explicitly on the CPU: from_pretrained builds modules under a meta default device.
        if isinstance(shift, torch.Tensor):
            shift = shift.detach().to("cpu")
        given = shift
        try:
            shift = torch.as_tensor(shift, dtype=torch.float64, device="cpu").flatten()
        except (TypeError, ValueError, RuntimeError):  # a str or None among the heads: torch's "too many dimensions"
            shift = None
        if shift is None or shift.numel() not in (1, self.num_heads):
            raise ValueError(f"{name}: expected a number or {self.num_heads} of them (one per head), got {given!r}")
        shift = shift.expand(self.num_heads)
        if not bool(torch.isfinite(shift).all()):
            raise ValueError(f"{name}: expected finite numbers, got {given!r}")
        self._bias_shift = shift.clone() if bool((shift != 0).any()) else None

    @property
    def bias_shift(self) -> Optional[torch.Tensor]:
        """float64 [H] or None (no shift)."""
        return self._bias_shift

    def swap_bias_shift(self, shift: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """Hold ``shift``, a ``bias_shift`` this gate held before (None: no shift), and return the one it held. The
        tensor itself comes back, not a copy: a CUDA graph captured while the gate held it reads it again."""
        previous, self._bias_shift = self._bias_shift, shift
        return previous

    def _shift(self, logits: torch.Tensor) -> torch.Tensor:
        if self._bias_shift is None:
            return logits
        if self._bias_shift.device != logits.device:
            self._bias_shift = self._bias_shift.to(logits.device)
        return logits + self._bias_shift.to(logits.dtype)

    def forward(self, x: torch.Tensor, logits: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``logits``: ``self.proj(x)`` when the caller computed it (Attention's fused decode product)."""
        if self.kind == "data_dependent":
            return F.logsigmoid(self._shift(upcast(self.proj(x) if logits is None else logits)))
        log_f = F.logsigmoid(self._shift(upcast(self.bias)))
        return log_f.expand(x.shape[0], x.shape[1], self.num_heads).contiguous()


def _shift_norm_or_not(x: torch.Tensor, logits: Optional[torch.Tensor], norm: Optional[RMSNorm],
                       starts: Optional[torch.Tensor]) -> torch.Tensor:
    """x after its token shift (logits given) and its RMSNorm (norm given) as one shift_norm (FoxConfig.fused_pro_ops);
    x itself where the block has neither."""
    if logits is None and norm is None:
        return x
    weight, eps = (None, 1e-6) if norm is None else (norm.weight, norm.eps)
    return shift_norm(x, logits, None, starts if logits is not None else None, weight, eps)


class KVShift(nn.Module):
    """Token shift y_t = a_t * kk_{t-1} + (1 - a_t) * kk_t, a_t = sigmoid(w . x_t) per head."""

    def __init__(self, config: FoxConfig, what: str, logits: str):
        """what, logits: the shift and its logits as a NaN refusal names them (the attention knows which it is)."""
        super().__init__()
        self.proj = nn.Linear(config.hidden_size, config.num_kv_heads, bias=False)
        self._said = (what, logits)

    def forward(self, logits: torch.Tensor, kk: torch.Tensor, prev: Optional[torch.Tensor],
                starts: Optional[torch.Tensor]) -> torch.Tensor:
        """logits [B, T, H] = ``self.proj(x)`` (the attention computes its input projections together); kk
        [B, T, H, D] candidates; prev [B, H, D] the candidate before kk[:, 0] (or None for zeros); starts [B, T]
        bool resets the shift at sequence starts."""
        # the unfused path (fused_pro_ops=False, and every cached decode step) refuses what shift_norm refuses,
        # naming this shift: shift_norm does not run here
        check_gate_logits(logits, *self._said)
        a = torch.sigmoid(logits)[..., None]
        first = torch.zeros_like(kk[:, :1]) if prev is None else prev[:, None].to(kk.dtype)
        # one decoded token: the shifted sequence is the previous candidate itself (no concatenation)
        shifted = first if kk.shape[1] == 1 else torch.cat((first, kk[:, :-1]), dim=1)
        if starts is not None:
            shifted = shifted.masked_fill(starts[:, :, None, None], 0.0)
        return torch.lerp(kk, shifted, a)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)), no biases."""

    def __init__(self, config: FoxConfig):
        super().__init__()
        self.config = config
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.config.joint_input_projections:  # read at each call, as Attention does
            gate, up = joint_linear(x, (self.gate_proj, self.up_proj))
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)


# The input products with one output per head (FoxConfig.joint_gate_projections): separately, three 768 -> 12
# products a layer took 5.5 ms of FoX (Pro) 125M's 300 ms step at 16K on the H200 (cuBLAS's sm_80 align2 kernels,
# forward and backward: docs/bench/profile_model_headdims_7f71b0f/); as one product the step took 2.0-2.5% less on an
# H100 (forty-fourth session, docs/bench/model_125m_gates_ab66d7b_h100.json).
GATE_LOGITS = ("f", "ks", "vs")


class Attention(nn.Module):
    """Forgetting, softmax or gated linear attention with the optional Pro components of FoxConfig."""

    def __init__(self, config: FoxConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        h, hkv, dh, d = config.num_heads, config.num_kv_heads, config.head_dim, config.hidden_size
        self.num_heads, self.num_kv_heads, self.head_dim = h, hkv, dh
        self.q_proj = nn.Linear(d, h * dh, bias=False)
        self.k_proj = nn.Linear(d, hkv * dh, bias=False)
        self.v_proj = nn.Linear(d, hkv * dh, bias=False)
        self.o_proj = nn.Linear(h * dh, d, bias=False)
        self.fgate = ForgetGate(config, layer_idx) if config.has_fgate else None
        per_head = config.qk_norm_per_head
        self.q_norm = RMSNorm((h, dh) if per_head else dh, config.qk_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm((hkv, dh) if per_head else dh, config.qk_norm_eps) if config.qk_norm else None
        self.k_shift = KVShift(config, "key shift", "k_shift.proj(x)") if config.k_shift else None
        self.v_shift = KVShift(config, "value shift", "v_shift.proj(x)") if config.v_shift else None
        self.o_norm = RMSNorm((h, dh), config.rms_norm_eps) if config.output_norm else None
        self.g_proj = nn.Linear(d, h * dh, bias=False) if config.output_gate else None

    def _input_linears(self) -> dict[str, nn.Linear]:
        """The Linear layers that read the block input, by what they give: q, k, v, and the logits of the output
        gate (g), the data-dependent forget gate (f) and the token-shift gates (ks, vs) where the block has them."""
        f = self.fgate.proj if self.fgate is not None and self.fgate.kind == "data_dependent" else None
        linears = {"q": self.q_proj, "k": self.k_proj, "v": self.v_proj, "g": self.g_proj, "f": f,
                   "ks": None if self.k_shift is None else self.k_shift.proj,
                   "vs": None if self.v_shift is None else self.v_shift.proj}
        return {name: lin for name, lin in linears.items() if lin is not None}

    def forward(self, x: torch.Tensor, ctx: SeqContext, cache=None) -> torch.Tensor:
        """x [B, T, d] (block input after the norm) -> [B, T, d]. ``cache``: a kvcache LayerState or None."""
        B, T, _ = x.shape
        linears = self._input_linears()
        if T == 1 and cache is not None and not torch.is_grad_enabled():
            # a decode step: one product for all of them (models/fused_linear.py; the copy is the cache's)
            proj = dict(zip(linears, cache.fused_inputs(x, list(linears.values()))))
        elif self.config.joint_input_projections:
            proj = dict(zip(linears, joint_linear(x, list(linears.values()))))
        else:
            gates = [name for name in GATE_LOGITS if name in linears] if self.config.joint_gate_projections else []
            proj = {name: lin(x) for name, lin in linears.items() if name not in gates}
            proj.update(zip(gates, joint_linear(x, [linears[name] for name in gates])))
        q = proj["q"].view(B, T, self.num_heads, self.head_dim)
        k = proj["k"].view(B, T, self.num_kv_heads, self.head_dim)
        v = proj["v"].view(B, T, self.num_kv_heads, self.head_dim)
        fused = self.config.fused_pro_ops and cache is None
        if fused:
            q, k, v = (_shift_norm_or_not(q, None, self.q_norm, None),
                       _shift_norm_or_not(k, proj.get("ks"), self.k_norm, ctx.starts),
                       _shift_norm_or_not(v, proj.get("vs"), None, ctx.starts))
            shift = (None, None)
        else:
            q, k, v, shift = self._shift_and_norm(q, k, v, proj, ctx, cache)
        if ctx.cos is not None:
            q, k = apply_rope(q, ctx.cos, ctx.sin), apply_rope(k, ctx.cos, ctx.sin)
        out = self._attend(x, q, k, v, ctx, cache, proj.get("f"), shift)
        if fused and self.o_norm is not None and self.g_proj is not None:
            return self.o_proj(gate_norm(out, proj["g"], self.o_norm.weight, self.o_norm.eps).reshape(B, T, -1))
        if self.o_norm is not None:
            out = self.o_norm(out)
        out = out.reshape(B, T, self.num_heads * self.head_dim)
        if self.g_proj is not None:
            # refused as gate_norm refuses them, named as what ran: no gate_norm runs without an output norm,
            # with fused_pro_ops=False or with a cache, and "gate_norm: g" sent its reader to an op it never called
            check_gate_logits(proj["g"].unflatten(-1, (self.num_heads, self.head_dim)), "output gate", "g_proj(x)")
            out = out * torch.sigmoid(proj["g"])
        return self.o_proj(out)

    def _shift_and_norm(self, q, k, v, proj: dict, ctx: SeqContext, cache):
        """q, k, v after the token shifts and the QK-norm by the modules, and the last token's raw k / v candidates
        (None where that shift is off): the cache keeps them for the next chunk's shift (set_shift_state copies
        them: views would pin the chunk's whole k / v projections)."""
        k_last = v_last = None
        if self.k_shift is not None:
            k_last = k[:, -1]
            k = self.k_shift(proj["ks"], k, None if cache is None else cache.shift_state()[0], ctx.starts)
        if self.v_shift is not None:
            v_last = v[:, -1]
            v = self.v_shift(proj["vs"], v, None if cache is None else cache.shift_state()[1], ctx.starts)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v, (k_last, v_last)

    def _log_fgate(self, x: torch.Tensor, ctx: SeqContext, logits: Optional[torch.Tensor] = None
                   ) -> Optional[torch.Tensor]:
        """fp32 [B, T, H] log f, with -inf at sequence starts; None for plain causal softmax. ``logits``: the
        data-dependent gate's projection of x, when computed already."""
        if self.fgate is not None:
            log_f = self.fgate(x, logits)
        elif ctx.starts is not None or ctx.cu_seqlens is not None:
            log_f = upcast(x.new_zeros(x.shape[0], x.shape[1], self.num_heads))
        else:
            return None
        if ctx.starts is not None:
            log_f = log_f.masked_fill(ctx.starts[:, :, None], float("-inf"))
        return log_f

    def _pruning(self) -> dict:
        """prune_eps / qk_bound arguments of the op. With QK-norm, |scale * q . k| is bounded by the norm
        weights for free (RoPE keeps norms): qk_norm_bound."""
        eps = self.config.prune_eps
        if eps is None:
            return {}
        if self.q_norm is None:
            return {"prune_eps": eps, "qk_bound": "auto"}
        return {"prune_eps": eps, "qk_bound": qk_norm_bound(self.q_norm.weight, self.k_norm.weight, self.head_dim)}

    def eviction_bound(self, user_bound: Optional[float]) -> Optional[float]:
        """U >= |scale * q . k| for the eviction bound (models.kvcache.policy): from the QK-norm weights, else
        the user's ``user_bound``; None where keys are never evicted (no forget gate: softmax attention never
        forgets; gated linear attention keeps no keys)."""
        if self.fgate is None or self.config.attention == "linear":
            return None
        if self.q_norm is not None:
            return float(qk_norm_bound(self.q_norm.weight, self.k_norm.weight, self.head_dim))
        return user_bound

    def _attend_linear(self, x, q, k, v, ctx: SeqContext, cache, f_logits, shift) -> torch.Tensor:
        """Gated linear attention. Sequence starts (left padding, packed sequences) get f = 0 from
        _log_fgate, which clears the state there, so no earlier token leaks in. A cache holds the state."""
        # FoxConfig refuses these for linear attention, but a config edited after the model was built is not
        # checked again, and this path has no keys to prune or evict: running would silently ignore them.
        for name in ("prune_eps", "evict_eps"):
            if getattr(self.config, name) is not None:
                raise ValueError(f"{name}: set on a model with attention='linear', whose layers keep a recurrent "
                                 f"state, not keys to prune or evict; set it back to None")
        # Unit q and k (and no softmax scale): |q . k| <= 1, so the state grows only with the values and the
        # gates' timescale; the Pro block's output RMSNorm restores the output's scale. CUDA autocast runs the
        # norm inside F.normalize in fp32, so q, k came out fp32 next to a bf16 v, which the op rejects: cast
        # back to the input's dtype, as apply_rope does on the FoX path.
        q, k = F.normalize(q, dim=-1).to(q.dtype), F.normalize(k, dim=-1).to(k.dtype)
        log_f = self._log_fgate(x, ctx, f_logits)
        if cache is not None:
            return cache_update(cache.attend, q, k, v, log_f, backend=self.config.attention_backend, pruning=dict,
                                at=ctx.cache_at, shift=shift)
        op = naive_gated_linear_attention if self.config.attention_backend == "naive" else gated_linear_attention
        return op(q, k, v, log_f)

    def _attend(self, x, q, k, v, ctx: SeqContext, cache, f_logits, shift=(None, None)) -> torch.Tensor:
        """shift: the last token's raw k / v candidates (None where that shift is off), for a cache to keep."""
        if self.config.attention == "linear":
            return self._attend_linear(x, q, k, v, ctx, cache, f_logits, shift)
        backend = self.config.attention_backend
        log_f = self._log_fgate(x, ctx, f_logits)
        if cache is not None:
            if log_f is None:  # plain softmax attention on a cache: c = 0 everywhere
                log_f = upcast(x.new_zeros(x.shape[0], x.shape[1], self.num_heads))
            return cache_update(cache.attend, q, k, v, log_f, backend=backend, pruning=self._pruning,
                                at=ctx.cache_at, scan=ctx.evict_scan, shift=shift)
        if log_f is None:
            # Plain causal softmax attention: SDPA reads [B, H, T, D] views of our layout without copies.
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                enable_gqa=self.num_kv_heads != self.num_heads)
            return out.transpose(1, 2)
        return forgetting_attention(q, k, v, log_f, cu_seqlens=ctx.cu_seqlens, max_seqlen=ctx.max_seqlen,
                                    backend=backend, **self._pruning())


class Block(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: FoxConfig, layer_idx: int):
        super().__init__()
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn = Attention(config, layer_idx)
        self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SwiGLU(config)

    def forward(self, x: torch.Tensor, ctx: SeqContext, cache=None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), ctx, cache)
        return x + self.mlp(self.mlp_norm(x))
