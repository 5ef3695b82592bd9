"""The held-out evaluation a run does every eval_every_tokens, and the autocast its steps share with it."""

from __future__ import annotations

import contextlib
import math

import numpy as np
import torch

from ..data.dataset import TokenDataset
from ..ops.forgetting_attn.checks import NonFiniteValueError
from .config import TrainConfig
from .distributed import DistInfo, all_reduce_sum
from .divergence import diverged
from .metrics import GateMeans, forget_gate_means


def autocast(device: torch.device, bf16: bool):
    """bf16 autocast for a bf16 run's forwards, training and held-out alike (their losses are then comparable)."""
    if not bf16:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


@torch.no_grad()
def evaluate(model: torch.nn.Module, val: TokenDataset, n_seqs: int, micro_batch: int, info: DistInfo,
             bf16: bool, gates: GateMeans | None = None) -> tuple[float, np.ndarray]:
    """Mean validation loss and per-position loss L(i) (fp64 [T-1]) over ``n_seqs`` sequences spread evenly
    over the validation split (so that many documents, not just the first, are represented), through the LM head
    in chunks whatever the training step does: the [B, T, V] fp32 logits of 8 x 4K tokens (6 GiB) ran a run out
    of memory at its first evaluation beside three others on an H100 (forty-third session, without --fused-loss).
    ``gates``: the forget_gate_means of the block around the call, told which rows of each forward count.

    The sequences are the same for any world size, so a run resumed on another number of ranks goes on with
    comparable validation losses (rounding their count to a multiple of the ranks gave others, and another
    loss for the same weights). Every rank runs as many forwards (FSDP's gathers need it): a rank with fewer
    sequences fills its last rows with copies that are left out of the sums.
    """
    world = info.world_size
    # Raising here stopped the run at its first evaluation, before the checkpoint, on every resume.
    n_seqs = max(1, min(n_seqs, len(val)))
    chosen = np.linspace(0, len(val) - 1, n_seqs).round().astype(int)
    mine = [int(j) for j in chosen[info.rank::world]]
    counted = len(mine)
    mine += [int(chosen[0])] * (-(-n_seqs // world) - counted)
    was_training = model.training
    model.eval()
    sums = torch.zeros(val.seq_len - 1, dtype=torch.float64, device=info.device)
    for i in range(0, len(mine), micro_batch):
        idx = mine[i:i + micro_batch]
        real = max(0, min(len(idx), counted - i))  # the copies come last
        if gates is not None:
            gates.rows = real
        x = torch.from_numpy(np.stack([val.sequence(j) for j in idx])).to(info.device)
        with autocast(info.device, bf16):
            per_tok = model(x, labels=x, loss_reduction="none", return_logits=False).loss  # [B, T-1]
        sums += per_tok[:real].double().sum(0)
    if gates is not None:
        gates.rows = None
    model.train(was_training)
    per_pos = (all_reduce_sum(sums) / n_seqs).cpu().numpy()
    return float(per_pos.mean()), per_pos


def validation_record(model: torch.nn.Module, val: TokenDataset, n_seqs: int, micro_batch: int, info: DistInfo,
                      bf16: bool, cfg: TrainConfig, step: int, tokens: int) -> dict:
    """The run's "eval" metrics record after step ``step``: the validation loss and the forget gates' means."""
    try:
        with forget_gate_means(model) as gates:
            loss, _ = evaluate(model, val, n_seqs, micro_batch, info, bf16, gates)
    except NonFiniteValueError as e:
        raise diverged(cfg, step, f"the validation forward pass overflowed ({e.what})") from None
    if not math.isfinite(loss):  # a model that gives NaN on held-out text is no checkpoint to keep
        raise diverged(cfg, step, f"the validation loss is {loss:g}")
    rec = {"kind": "eval", "step": step, "tokens": tokens, "val_loss": loss}
    log_f = gates.result(all_reduce_sum)
    if log_f is not None:  # [layers][heads]: the gates' course over training (eval compare's training.png)
        rec["gate_log_f"] = log_f
    return rec
