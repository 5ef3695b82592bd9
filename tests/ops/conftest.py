"""Run Triton kernels through the interpreter on CPU.

triton.jit decides at decoration time whether a kernel is interpreted, so the variable must be set
before any foxformer kernel module is imported, i.e. before test modules are collected.
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
