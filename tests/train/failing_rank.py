"""`foxformer train` with one rank made to fail: ``python failing_rank.py RANK STEP <train args>`` (under torchrun).

Rank RANK raises right after its optimizer step STEP, the way a real fault (a bad node, a NaN check, an
out-of-memory) would stop one process while the others wait for it in a collective.
"""
import os
import sys

from foxformer.cli import main
from foxformer.train import loop

fail_rank, fail_step = int(sys.argv[1]), int(sys.argv[2])
real_train = loop.train


def train(cfg, **kwargs):
    def hook(step, record):
        if int(os.environ.get("RANK", "0")) == fail_rank and step == fail_step:
            raise RuntimeError(f"simulated fault on rank {fail_rank} after step {step}")

    return real_train(cfg, hook=hook, **kwargs)


loop.train = train
sys.exit(main(["train", *sys.argv[3:]]))
