"""Gluon kernels of Forgetting Attention for Hopper (sm_90a): see fwd.py, bwd.py and launch.py.

Nothing is imported here: the modules need Triton's Gluon API, which only calls that may run on it load.
"""
