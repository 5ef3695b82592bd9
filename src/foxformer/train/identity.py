"""Fingerprints of what a run computes (its data, each step's batch, the weights it starts from) and the checks
that every rank of a job computes the same thing: a rank that differs trains something else without a word."""

from __future__ import annotations

import dataclasses
import hashlib
import zlib

import numpy as np
import torch

from ..data.dataset import TokenDataset
from .config import TrainConfig
from .distributed import gather_objects

CHECKSUM_MOD = 2**31 - 1


def batch_checksum(x: torch.Tensor, first: int) -> int:
    """A checksum of which token sequences a step trains on and where in the step's batch: sequence ``i``
    of ``x`` (position ``first + i`` in the step) contributes crc32(tokens) * (position + 1). Summed over
    ranks modulo CHECKSUM_MOD, it is the same for any world size that reads the same data in the same order."""
    rows = x.cpu().numpy()
    return sum(zlib.crc32(rows[i].tobytes()) * (first + i + 1) for i in range(rows.shape[0])) % CHECKSUM_MOD


def data_identity(train_ds: TokenDataset, val_ds: TokenDataset) -> str:
    """A fingerprint of a prepared dataset's contents, not of its path (data may move between resumes):
    tokenizer, split sizes, document offsets and a strided sample of the training tokens."""
    h = hashlib.sha256(train_ds.manifest["tokenizer"].encode())
    for ds in (train_ds, val_ds):
        h.update(np.asarray([ds.tokens.size], dtype=np.int64).tobytes())
        h.update(np.ascontiguousarray(ds.doc_offsets, dtype=np.int64).tobytes())
    stride = max(1, train_ds.tokens.size // 4096)  # a few MiB of reads even for billions of tokens
    h.update(np.ascontiguousarray(train_ds.tokens[::stride], dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


# What only rank 0 does (console, metrics), and where each host keeps the data (compared by its contents instead).
_PER_RANK_KEYS = ("progress", "log_every", "tensorboard", "data_dir")


def check_ranks_agree(cfg: TrainConfig, data_id: str) -> None:
    """Each torchrun launch (one a host) reads its own command line, and each rank would train what its own said:
    another lr or schedule on one host diverges its replica without a word, another out_dir splits the checkpoints."""
    mine = {**{k: v for k, v in dataclasses.asdict(cfg).items() if k not in _PER_RANK_KEYS}, "data": data_id}
    ranks = gather_objects((mine, cfg.data_dir))
    shown = []
    for key in mine:
        other = next((i for i, (r, _) in enumerate(ranks) if r[key] != ranks[0][0][key]), None)
        if other is None:
            continue
        if key == "data":
            shown.append(f"the data (rank 0 reads {ranks[0][1]!r}, rank {other} {ranks[other][1]!r}, which holds "
                         f"other tokens)")
        else:
            shown.append(f"{key} (rank 0: {ranks[0][0][key]!r}, rank {other}: {ranks[other][0][key]!r})")
    if not shown:
        return
    raise ValueError(f"the ranks of this job were started with different settings: {'; '.join(shown)}; start every "
                     f"process with the same flags and config (on several hosts, the same command on each), or each "
                     f"trains something else (nothing was written)")


def _weights_identity(state_dict: dict) -> str:
    """A fingerprint of a state dict's contents: names, shapes and a strided sample of each tensor (a few MiB of
    reads even for billions of parameters; any two training steps differ throughout)."""
    h = hashlib.sha256()
    for name in sorted(state_dict):
        flat = state_dict[name].detach().reshape(-1)
        h.update(f"{name}:{tuple(state_dict[name].shape)}".encode())
        h.update(flat[::max(1, flat.numel() // 4096)].to(torch.float64).numpy().tobytes())
    return h.hexdigest()[:16]


def check_same_weights(init_from: str, state_dict: dict, step: int | None) -> None:
    """Each rank reads init_from itself, and FSDP2 keeps each rank's shard of what that rank read: a run that
    committed a checkpoint while the ranks read it (or another folder of that name on each host) trained a mix
    of two models without a word."""
    ranks = gather_objects((_weights_identity(state_dict), step))
    other = next((r for r, (identity, _) in enumerate(ranks) if identity != ranks[0][0]), None)
    if other is None:
        return
    steps = (f" (rank 0 read the checkpoint of step {ranks[0][1]}, rank {other} that of step {ranks[other][1]})"
             if ranks[0][1] != ranks[other][1] else "")
    raise ValueError(f"init_from: the ranks of this job read different weights from {init_from!r}{steps}: a run that "
                     f"saved a checkpoint meanwhile, or another folder of that name on each host; name one checkpoint "
                     f"(--init-from RUN/checkpoints/step_N) on storage all hosts share (nothing was trained)")
