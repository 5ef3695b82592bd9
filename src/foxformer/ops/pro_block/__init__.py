"""The Pro block's elementwise extras as fused ops: the token shift with the QK-norm (shift_norm) and the output
norm with the output gate (gate_norm), Triton kernels and exact PyTorch references."""
from .interface import gate_norm, shift_norm
from .reference import gate_norm_reference, shift_norm_reference

__all__ = ["gate_norm", "gate_norm_reference", "shift_norm", "shift_norm_reference"]
