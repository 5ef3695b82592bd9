#!/usr/bin/env bash
# Create .venv (if missing) and install foxformer with its test tools. Idempotent.
# torch is pinned first so that pip takes the CPU build that lies on CPU-only machines of our CI
# (on a GPU machine the same pin gets the CUDA build from PyPI).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[dev,eval]"
