"""Input validation for gated linear attention (the shared helpers live in forgetting_attention.checks).

Unlike Forgetting Attention, q, k and v cover the same positions (there is no key cache: a running
state carries the past), and v may have its own head dim.
"""
from __future__ import annotations

from ..forgetting_attn.checks import (_FLOAT_DTYPES, _require_tensor, check_gate_values, check_layout,
                                      check_one_device, check_qkv_tensors, per_kv_head_hint)


def check_inputs(q, k, v, log_fgate, initial_state, return_final_state, chunk_size) -> None:
    """ValueError / TypeError naming the argument for any call the implementations cannot serve."""
    check_qkv_tensors(q, k, v, log_fgate, "log_fgate")
    B, T, Hq, Dk = q.shape
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k and v must agree in batch, seq and heads, got {tuple(k.shape)} and {tuple(v.shape)}")
    check_layout(q, k, log_fgate, "log_fgate")
    if k.shape[:2] != (B, T):
        raise ValueError(f"k and v must be [batch, seq] = {(B, T)} like q, got {tuple(k.shape[:2])}")
    if k.shape[3] != Dk:
        raise ValueError(f"head_dim mismatch: q has {Dk}, k has {k.shape[3]}")
    Hkv, Dv = k.shape[2], v.shape[3]
    if T == 0 or Dk == 0 or Dv == 0:
        raise ValueError(f"seq and head dims must be positive, got T={T}, Dk={Dk}, Dv={Dv}")
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"query heads ({Hq}) must be a multiple of key/value heads ({Hkv})")
    if log_fgate.shape != (B, T, Hq):
        raise ValueError(f"log_fgate must be [batch, seq, Hq] = {(B, T, Hq)}, got {tuple(log_fgate.shape)}"
                         f"{per_kv_head_hint(log_fgate, 'log_fgate', B, T, Hq, Hkv)}")
    if log_fgate.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"log_fgate must be a floating tensor, got {log_fgate.dtype}")
    if initial_state is not None:
        _require_tensor(initial_state, "initial_state")
        if initial_state.shape != (B, Hq, Dk, Dv):
            raise ValueError(f"initial_state must be [batch, Hq, Dk, Dv] = {(B, Hq, Dk, Dv)}, "
                             f"got {tuple(initial_state.shape)}")
        if initial_state.dtype not in _FLOAT_DTYPES:
            raise TypeError(f"initial_state must be a floating tensor, got {initial_state.dtype}")
    check_one_device(q=q, k=k, v=v, log_fgate=log_fgate, initial_state=initial_state)
    if not isinstance(return_final_state, bool):
        raise TypeError(f"return_final_state must be True or False, got {return_final_state!r}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    check_gate_values(log_fgate, "log_fgate")
