"""One optimizer step: its learning rate, the micro-batches' forwards and backwards, clipping and the update.

What ranks agree on after it (the loss, the data checksum, a stop) is one collective in the loop, not here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..data.dataset import TokenDataset
from ..ops.forgetting_attn.checks import NonFiniteValueError
from .config import TrainConfig
from .distributed import DistInfo, grad_sync
from .divergence import diverged
from .identity import CHECKSUM_MOD, batch_checksum
from .optim import learning_rate
from .plan import Plan
from .validation import autocast


@dataclass
class StepResult:
    loss_sum: torch.Tensor   # this rank's micro-batch losses, summed; still on the device
    crc: int                 # this rank's data checksum (< CHECKSUM_MOD)
    grad_norm: torch.Tensor  # before clipping, whole (a DTensor's full tensor)
    lr: float


def check_gradients_arrived(model: torch.nn.Module) -> None:
    """A run whose backward reaches no parameter would train for hours with a flat loss; stop at step 1."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    if trainable and all(p.grad is None for p in trainable):
        raise RuntimeError("no gradient reached any parameter in the first step (the loss is not connected to "
                           "the model); if --compile is on, retry without it and report the torch version")


def train_step(runner, wrapped: torch.nn.Module, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               dataset: TokenDataset, plan: Plan, step: int, tokens: int, info: DistInfo, bf16: bool,
               loss_kwargs: dict, cfg: TrainConfig, first: bool = False) -> StepResult:
    """Step ``step + 1`` (``tokens`` trained before it) on this rank's slice of the step's samples.
    ``runner``: what the micro-batches call (``wrapped``, maybe compiled); ``wrapped``: the DDP / FSDP2 module
    whose gradient sync the last micro-batch turns on; ``first``: the run's first step in this process."""
    device = info.device
    lr = learning_rate(tokens + cfg.batch_tokens, cfg)
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss_sum = torch.zeros((), device=device)
    base = step * plan.seqs_per_step + info.rank * plan.seqs_per_rank
    crc = 0
    for m in range(plan.accum):
        x = dataset.batch(base + m * plan.micro_batch, plan.micro_batch)
        crc = (crc + batch_checksum(x, base + m * plan.micro_batch - step * plan.seqs_per_step)) % CHECKSUM_MOD
        x = x.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else x
        try:
            with grad_sync(wrapped, info, sync=m == plan.accum - 1), autocast(device, bf16):
                loss = runner(x, labels=x, **loss_kwargs).loss
            (loss / plan.accum).backward()
        except NonFiniteValueError as e:  # the attention ops' value check, before the loss could show it
            raise diverged(cfg, step + 1, f"the forward pass overflowed ({e.what})") from None
        loss_sum += loss.detach()
    if first:
        check_gradients_arrived(model)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else 1e30)
    if hasattr(grad_norm, "full_tensor"):
        grad_norm = grad_norm.full_tensor()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return StepResult(loss_sum=loss_sum, crc=crc, grad_norm=grad_norm, lr=lr)
