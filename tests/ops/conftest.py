"""Run Triton kernels through the interpreter on CPU.

triton.jit decides at decoration time whether a kernel is interpreted, so the variable must be set
before any foxformer kernel module is imported, i.e. before test modules are collected.
"""
import os

import torch  # noqa: E402

if not torch.cuda.is_available():  # on a GPU machine the kernels compile for the device
    os.environ.setdefault("TRITON_INTERPRET", "1")
