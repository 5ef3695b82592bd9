"""Forgetting Attention as a layer for any model (the drop-in counterpart of ``foxformer.forgetting_attention``).

    layer = ForgettingAttention(hidden_size=1024, num_heads=16)      # the Pro form; pro=False: FoX (LLaMA)
    y = layer(x)                                                      # x, y [batch, seq, hidden_size]
    y = layer(x_packed, cu_seqlens=cu, max_seqlen=m)                  # packed documents, batch 1

It is the attention of foxformer's own blocks (models.layers.Attention), built from plain arguments: the same
parameters (q_proj, k_proj, v_proj, o_proj, fgate.proj, and with ``pro`` q_norm, k_norm, o_norm, g_proj,
k_shift.proj, v_shift.proj), the same kernels (Gluon on H100 / H200, Triton elsewhere, the exact torch backend
on a CPU). It holds no cache: for decoding, use FoxForCausalLM (its cache keeps the running gate sum).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Optional

import torch

from ..argtypes import did_you_mean
from ..ops.forgetting_attn.checks import check_max_seqlen
from .config import FOREIGN_NAMES, ConfigError, FoxConfig
from .layers import Attention, SeqContext, packed_starts

# The FoxConfig fields of the arguments the config names otherwise; the others are fields of their own name. The
# layer's config is built through this table, and FoxConfig's refusals are re-said by it in the words the user
# typed: backend="flash" was refused as "FoxConfig.attention_backend", pro="yes" as "FoxConfig.qk_norm"; and a
# keyword named as FoxConfig names it (attention_backend="gluon") is answered with the argument that sets it.
_FIELDS = {"pro": ("qk_norm", "output_gate", "output_norm", "kv_shift"), "backend": ("attention_backend",),
           "eps": ("rms_norm_eps",)}
_ARGUMENT = {field: argument for argument, fields in _FIELDS.items() for field in fields}
_FIELD_WORD = re.compile(r"\b(" + "|".join(_ARGUMENT) + r")\b")


def _in_arguments(error: ConfigError) -> ConfigError:
    """FoxConfig's refusal as the layer's, each field it names (its prefix's too) as the argument that set it."""
    def say(text: str) -> str:
        return _FIELD_WORD.sub(lambda m: _ARGUMENT[m.group(1)], text)

    return ConfigError(say(error.reason), *error.fields,
                       where="ForgettingAttention: " + say(error.where.removeprefix("FoxConfig.")))


def _unknown_keywords(given: dict, arguments: list[str]) -> TypeError:
    """The layer's refusal of keywords it does not take. Was Python's "got an unexpected keyword argument
    'attention_backend'": a name of FoxConfig's (or another library's, or Hugging Face's) is answered with the
    layer's argument that sets that field (through _FIELDS), any other with the closest argument and all of them."""
    fields = {f.name for f in dataclasses.fields(FoxConfig)}
    said, unmatched = [], False
    for key, value in given.items():
        field = FOREIGN_NAMES.get(key) or FoxConfig.attribute_map.get(key) or key
        argument = _ARGUMENT.get(field, field if field in arguments else None)
        whose = "FoxConfig's name" if key in fields else f"another library's name of FoxConfig's {field}"
        if argument is not None:
            sets = _FIELDS.get(argument, ())
            also = f", which sets {', '.join(sets[:-1])} and {sets[-1]} together" if len(sets) > 1 else ""
            said.append(f"no argument {key} ({whose}): the layer's is {argument}{also}, as in {argument}={value!r}")
        else:
            unmatched = True
            why = (" (a FoxConfig field the layer does not take)" if key in fields else
                   f" ({whose}, which the layer does not take)" if field in fields else did_you_mean(key, arguments))
            said.append(f"no argument {key}{why}")
    listed = f"; its arguments: {', '.join(arguments)}" if unmatched else ""
    return TypeError(f"ForgettingAttention: {'; '.join(said)}{listed}")


class ForgettingAttention(Attention):
    """Causal softmax attention with a data-dependent forget gate: x [B, T, hidden_size] -> [B, T, hidden_size].

    hidden_size, num_heads: the input width and the query heads. num_kv_heads: key / value heads (GQA; None:
        num_heads). head_dim: None means hidden_size // num_heads.
    pro: the Pro block's additions: QK-norm (one weight shared by the heads, as in the paper's models), an
        output gate, a per-head output RMSNorm and data-dependent key / value token shift (the paper's best
        model); False gives FoX (LLaMA)'s attention.
    fgate: "data_dependent" (f_t = sigmoid(w . x_t + b) per head), "data_independent" (a learnt b), "fixed" or
        "none" (no gate: causal softmax attention, the Transformer baseline).
    fgate_bias_init: "zero" or "timescales" (FoxConfig); None: the paper's choice for the kind.
    backend: the op's backend ("auto", "gluon", "triton", "torch", "naive").
    prune_eps: skip (query, key) tiles the gate has provably erased (forgetting_attention's prune_eps).
    eps: RMSNorm eps of the QK-norm and output norm.
    Any other keyword is a TypeError naming the argument meant (attention_backend=: FoxConfig's name of backend).
    """

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: Optional[int] = None,
                 head_dim: Optional[int] = None, *, pro: bool = True, fgate: str = "data_dependent",
                 fgate_bias_init: Optional[str] = None, backend: str = "auto", prune_eps: Optional[float] = None,
                 eps: float = 1e-6, **unknown):
        arguments = dict(hidden_size=hidden_size, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                         pro=pro, fgate=fgate, fgate_bias_init=fgate_bias_init, backend=backend, prune_eps=prune_eps,
                         eps=eps)
        if unknown:
            raise _unknown_keywords(unknown, list(arguments))
        fields = {field: value for name, value in arguments.items() for field in _FIELDS.get(name, (name,))}
        # FoxConfig validates every argument; vocab_size and num_layers do not apply to one layer
        try:
            config = FoxConfig(vocab_size=1, num_layers=1, attention="forgetting", **fields)
        except ConfigError as e:
            raise _in_arguments(e) from None
        super().__init__(config, layer_idx=0)

    def forward(self, x: torch.Tensor, cu_seqlens: Optional[torch.Tensor] = None,
                max_seqlen: Optional[int] = None) -> torch.Tensor:
        """x [B, T, hidden_size] -> [B, T, hidden_size]. cu_seqlens int32 [N + 1]: x holds N documents packed
        into one row (B = 1) at these offsets; none attends to, or shifts in, another's tokens. max_seqlen: the
        longest (computed from cu_seqlens when None, at the cost of a device sync); only with cu_seqlens (a
        ValueError without)."""
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.config.hidden_size:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"ForgettingAttention: x must be [batch, seq, {self.config.hidden_size}], got {shape}")
        if x.shape[0] == 0 or x.shape[1] == 0:
            raise ValueError(f"ForgettingAttention: x must hold at least one token in each of at least one row, got "
                             f"{tuple(x.shape)}")
        weight = self.q_proj.weight
        if x.dtype != weight.dtype and not torch.is_autocast_enabled(x.device.type):
            raise TypeError(f"ForgettingAttention: x is {x.dtype} but the layer's weights are {weight.dtype}: move "
                            f"the layer with .to({x.dtype}) or run it under torch.autocast")
        check_max_seqlen(cu_seqlens, max_seqlen)  # dropped without a word, and x's documents attended to each other
        ctx = SeqContext()
        if cu_seqlens is not None:
            starts, _ = packed_starts(cu_seqlens, x.shape[0], x.shape[1], x.device)
            if max_seqlen is None:
                max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
            ctx = SeqContext(starts=starts, cu_seqlens=cu_seqlens.to(x.device), max_seqlen=max_seqlen)
        return super().forward(x, ctx)
