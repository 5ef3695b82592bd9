"""The GPU a Triton launch runs on: the current one (triton.runtime.jit reads driver.active.get_current_device()),
not the one its tensors lie on, and torch.library.custom_op bodies run under no device guard. A model on cuda:1
while cuda:0 was current launched its kernels on GPU 0 with pointers into GPU 1. Each launcher here makes its
first tensor argument's GPU current for the call, as FlashAttention's interface does."""
from __future__ import annotations

import contextlib
import functools

import torch


def gpu_of(t: torch.Tensor):
    """A context in which ``t``'s GPU is the current one (nothing to do on the CPU or on the current GPU)."""
    if t.is_cuda and t.get_device() != torch.cuda.current_device():
        return torch.cuda.device(t.device)
    return contextlib.nullcontext()


def on_gpu_of_inputs(launcher):
    """``launcher`` run with its first tensor argument's GPU current (gpu_of)."""
    @functools.wraps(launcher)
    def run(*args, **kwargs):
        first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        with contextlib.nullcontext() if first is None else gpu_of(first):
            return launcher(*args, **kwargs)
    return run
