"""Process groups, DDP / FSDP2 wrapping and full (unsharded) state dicts, so one script runs anywhere.

Launch with ``torchrun --nproc-per-node N -m foxformer.cli train ...`` (one host) or with
``--nnodes M --rdzv-backend c10d --rdzv-endpoint HOST:PORT`` on each of M hosts: WORLD_SIZE/RANK/LOCAL_RANK
come from torchrun; NCCL on CUDA, gloo on CPU. Every collective gives up after ``timeout_minutes``, and a
rank that fails leaves its message in the rendezvous store, where the ranks it leaves stuck read it: in a
collective, or before the process group starts, which waits for every rank's own checks (and a rank that fails
before it joined the job joins torchrun's store to leave it, as does one whose command line argparse refused).
It imports torch and no models (they come with transformers and triton, on first use): a rank whose host cannot
import those leaves its error too.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from foxformer.train.config import DEVICE_SPELLINGS
from foxformer.train.elastic import one_of_several


@dataclass
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    mode: str  # "none" | "ddp" | "fsdp"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


class PeerFailure(RuntimeError):
    """Another rank failed first; this one stopped because of it (the message is that rank's)."""


_STORE = None  # the rendezvous store: failure reports outlive the process group's broken connections
_FAILED_KEY = "foxformer/failed/{}"
_FAILED_COUNT = "foxformer/failed"  # how many ranks left a report
_READY_KEY = "foxformer/ready/{}"  # a rank's own checks passed: it is ready for the process group
_READY_COUNT = "foxformer/ready"
_READY_POLL_S = 0.1
_INTERRUPTED = "was interrupted (Ctrl-C)"  # what a rank that stopped on KeyboardInterrupt leaves there
# A rank whose collective broke on a peer's death may get there before the peer has written why it died
# (the peer writes before it exits, which is what breaks the connection, so the wait is short).
_REPORT_GRACE_S = 5.0
_UNREPORTED = "rank {}: could not report the failure to the other ranks"


def resolve_device(device: str | torch.device | None = None, label: str = "device") -> torch.device:
    """"auto"/None -> cuda if available else cpu; a GPU the machine does not have, or a device type other than cpu
    and cuda, is a ValueError whose message starts with ``label`` (the setting's name: "--device" for a flag).
    The one check of a device setting: every command's --device is said in its words."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        dev = None
    # torch knows more device types ('meta', 'mps', ...) than the code runs on: 'meta' ended in a traceback
    # from the first value a forward read back, 'mps' in "PyTorch is not linked with support for mps devices"
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"{label}: expected {DEVICE_SPELLINGS}, got {device!r}")
    # here, before a run or a model load starts: torch's own message comes later, as an assertion deep inside it
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{label}: {device!r} asks for a GPU, but no GPU is visible on this machine; use 'cpu', or "
                         f"'auto' (a GPU where there is one, else the CPU)")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise ValueError(f"{label}: {device!r} asks for GPU {dev.index}, but this machine has {count} visible "
                         f"GPU{'s' if count != 1 else ''} ({', '.join(f'cuda:{i}' for i in range(count))}); use one "
                         f"of those, or 'cuda' (the current one)")
    return dev


def init_distributed(device: str = "auto", parallel: str = "auto", timeout_minutes: float = 10.0) -> DistInfo:
    """Join the job's rendezvous when launched by torchrun (its store, where the ranks leave their failures); pick
    the device for this rank. The process group starts later (start_process_group), once this rank's own checks
    have passed."""
    global _STORE
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    # each rank takes the GPU of its local rank (a single process the one named, if any); resolve_device checks that
    # the machine has it
    dev = resolve_device(device)
    if dev.type == "cuda":
        if dev.index is not None and world > 1:
            raise ValueError(f"device: {device!r} names one GPU, but under torchrun (WORLD_SIZE={world}) each rank "
                             "takes the GPU of its LOCAL_RANK; use 'cuda' or 'auto'")
        dev = torch.device("cuda", local_rank if dev.index is None else dev.index)
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        timeout = datetime.timedelta(minutes=timeout_minutes)
        try:
            _STORE, rank, world = next(dist.rendezvous("env://", rank, world, timeout=timeout))
        except (ValueError, dist.DistError) as e:  # torch's words name the variable or the wait, not the launcher
            raise ValueError(f"WORLD_SIZE={world} makes this one of {world} processes, but they could not meet "
                             f"({str(e).splitlines()[0]}); start them with torchrun --nproc-per-node N -m "
                             f"foxformer.cli train ... (it sets WORLD_SIZE, RANK, MASTER_ADDR and MASTER_PORT), or "
                             f"unset WORLD_SIZE to train in one process") from None
    if world == 1:
        # one process has nothing to spread; DDP and FSDP2 would also need the process group no launcher started.
        # A run saved under torchrun records its `parallel`, and it resumes here too.
        mode = "none"
        if parallel in ("ddp", "fsdp"):
            print(f"train: parallel {parallel} spreads a run over several processes, and this is one (WORLD_SIZE "
                  f"unset or 1): it trains as a single process; for several, launch it with: torchrun "
                  f"--nproc-per-node N -m foxformer.cli train ...", file=sys.stderr)
    else:
        mode = "fsdp" if parallel == "auto" else parallel
        if mode == "none":
            raise ValueError("parallel: 'none' is not possible with WORLD_SIZE > 1; use 'ddp' or 'fsdp'")
    return DistInfo(rank=rank, world_size=world, local_rank=local_rank, device=dev, mode=mode)


def start_process_group(info: DistInfo, timeout_minutes: float, stop=None) -> None:
    """Start the process group once every rank has passed its own checks. A rank that failed them (a setting, a
    file on its host) left its error in the store: the others stop at once with it (PeerFailure), where
    init_process_group waited for that rank until the timeout (torchrun's SIGKILL, 30 s later, on one host).
    ``stop``: the run's StopSignals; its signal ends the wait by that signal (torchrun's, sent once a rank ended
    before it could leave its error, which torchrun's summary then shows)."""
    if not info.enabled or dist.is_initialized():
        return
    # two counters read per poll, whatever the number of ranks (a key per rank read by every rank was 512^2 reads)
    _STORE.set(_READY_KEY.format(info.rank), "1")
    _STORE.add(_READY_COUNT, 1)
    deadline = time.monotonic() + 60 * timeout_minutes
    while _STORE.add(_READY_COUNT, 0) < info.world_size:
        if _STORE.add(_FAILED_COUNT, 0):
            reports = _peer_failures(info.rank, info.world_size)
            failed = [p for p in reports if not p.endswith(_INTERRUPTED)]
            if failed:
                raise PeerFailure("; ".join(failed))
            if reports:  # a Ctrl-C, which torchrun passes to every rank: this one's is on its way
                raise KeyboardInterrupt
        if stop is not None and stop.requested:
            stop.end_by_signal()
        if time.monotonic() > deadline:
            waiting = [str(r) for r in range(info.world_size) if not _STORE.check([_READY_KEY.format(r)])]
            raise TimeoutError(f"rank {', '.join(waiting)} of this job did not reach the start of training within "
                               f"{timeout_minutes:g} minutes (dist_timeout_minutes): it stopped before it could say "
                               f"why, or is still loading; see its output (torchrun's summary on its host)")
        time.sleep(_READY_POLL_S)
    dev = info.device
    dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo", store=_STORE, rank=info.rank,
                            world_size=info.world_size, timeout=datetime.timedelta(minutes=timeout_minutes),
                            **({"device_id": dev} if dev.type == "cuda" else {}))


def shutdown() -> None:
    global _STORE
    if dist.is_initialized():
        dist.destroy_process_group()
    _STORE = None


def _peer_failures(rank: int, world: int) -> list[str]:
    found = []
    for r in range(world):
        key = _FAILED_KEY.format(r)
        try:
            if r != rank and _STORE.check([key]):
                found.append(_STORE.get(key).decode())
        except (RuntimeError, ValueError):  # the store went with its host: nothing more to learn
            break
    return found


@contextlib.contextmanager
def failures_reported(info: DistInfo | None = None):
    """Leave this rank's error in the store for the others; or, when a peer failed first, raise PeerFailure
    with the peer's message (what the user needs) instead of a broken-connection error. A Ctrl-C is no
    failure: a rank whose peer was interrupted first raises KeyboardInterrupt, which the command says once for
    the job (its "error: rank 0 failed: KeyboardInterrupt" line repeated rank 0's note).
    ``info``: the run's. Without it (around a whole command, from its start) the rank is torchrun's, and a rank
    that fails before it joined the job (its --config, or the run it continues, missing on its host) joins the
    store to leave its error: the others waited for it until dist_timeout_minutes. Nested, the innermost leaves
    it."""
    rank, world = (info.rank, info.world_size) if info is not None else _launched_as()
    try:
        yield
    except PeerFailure:  # already a peer's message, and the peer's to report
        raise
    except BaseException as e:
        # a report left already is an inner scope's, of this error before the command reworded it
        if world == 1 or isinstance(e, SystemExit) and not e.code or not _joined(rank, world) or _left(rank):
            raise
        mine = f"{type(e).__name__}: {e}"
        deadline = time.monotonic() + (_REPORT_GRACE_S if isinstance(e, (RuntimeError, dist.DistError)) else 0.0)
        peers = _peer_failures(rank, world)
        while not peers and time.monotonic() < deadline:
            time.sleep(0.1)
            peers = _peer_failures(rank, world)
        failed = [p for p in peers if not p.endswith(_INTERRUPTED)]
        if failed and not all(p.endswith(mine) for p in failed):  # not the error every rank ran into
            raise PeerFailure(f"{'; '.join(failed)} (rank {rank} stopped with it: {mine.splitlines()[0]})") from e
        if peers and not failed and not isinstance(e, KeyboardInterrupt):
            raise KeyboardInterrupt from e
        _leave(rank, f"rank {rank} {_INTERRUPTED}" if isinstance(e, KeyboardInterrupt)
               else f"rank {rank} failed: {mine}")
        raise


def report_early_failure(error: str) -> None:
    """Leave ``error`` in torchrun's store as this rank's failure, where the rank fails outside any scope of
    failures_reported: argparse's refusal of a command line that only its host's torchrun was given, which left
    the other hosts' ranks waiting until dist_timeout_minutes. Nothing for a process of its own, or where torchrun
    keeps no store for the job (failures_reported says which)."""
    rank, world = _launched_as()
    if world > 1 and _joined(rank, world) and not _left(rank):
        _leave(rank, f"rank {rank} failed: {error}")


def _leave(rank: int, report: str) -> None:
    """``report`` in the store for the others: its key before the count they poll, so a count they see has it."""
    try:
        _STORE.set(_FAILED_KEY.format(rank), report)
        _STORE.add(_FAILED_COUNT, 1)
    except (RuntimeError, ValueError):
        print(_UNREPORTED.format(rank), file=sys.stderr)


def _launched_as() -> tuple[int, int]:
    """This process's rank and the job's size, as torchrun gave them ((0, 1) for a process of its own)."""
    if not one_of_several():
        return 0, 1
    return int(os.environ.get("RANK", "0")), int(os.environ["WORLD_SIZE"])


def _left(rank: int) -> bool:
    """Whether this rank's report is in the store."""
    try:
        return _STORE.check([_FAILED_KEY.format(rank)])
    except (RuntimeError, ValueError):  # the store went with its host: the attempt to leave one will say so
        return False


def _joined(rank: int, world: int) -> bool:
    """Whether this rank can leave a report: it joined the job's store, or joins it now. Only torchrun's store
    is joined late: its agent keeps it for the whole job, where rank 0's (a launch by hand) goes with rank 0."""
    global _STORE
    if _STORE is None and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        try:  # the agent's store is there already: a wait means its host is gone, with the job
            _STORE = next(dist.rendezvous("env://", rank, world, timeout=datetime.timedelta(seconds=30)))[0]
        except (ValueError, RuntimeError):
            print(_UNREPORTED.format(rank), file=sys.stderr)
    return _STORE is not None


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        values = values.clone()
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def broadcast_object(obj, src: int = 0):
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gather_objects(obj, group=None) -> list:
    """``obj`` of every rank, in rank order (``[obj]`` for one process)."""
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def _fsdp_api():
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:  # torch < 2.6 keeps FSDP2 under _composable
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    return fully_shard, MixedPrecisionPolicy


def _blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks: FSDP2 shards each one so only one block's full weights exist at a time."""
    from foxformer.models.calls import backbone  # here: the module is imported before a run can fail (above)

    layers = getattr(backbone(model), "layers", None)
    if isinstance(layers, nn.ModuleList):
        return list(layers)
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    return list(max(lists, key=len)) if lists else []


def wrap_model(model: nn.Module, info: DistInfo, bf16: bool) -> nn.Module:
    """Returns the module to call for training; ``model`` itself stays the one to read state from."""
    if info.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[info.device.index] if info.device.type == "cuda" else None)
    if info.mode == "fsdp":
        fully_shard, MixedPrecisionPolicy = _fsdp_api()
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
        kwargs = {"mp_policy": mp} if mp is not None else {}
        for block in _blocks(model):
            fully_shard(block, **kwargs)
        fully_shard(model, **kwargs)
        return model
    return model


@contextlib.contextmanager
def grad_sync(wrapped: nn.Module, info: DistInfo, sync: bool):
    """Skip gradient communication on all but the last micro-batch of an accumulation."""
    if info.mode == "ddp" and not sync:
        with wrapped.no_sync():
            yield
    elif info.mode == "fsdp":
        wrapped.set_requires_gradient_sync(sync)
        yield
    else:
        yield


def full_state_dicts(model: nn.Module, optimizer: torch.optim.Optimizer, info: DistInfo) -> tuple[dict, dict]:
    """Unsharded model and optimizer state on CPU, keyed by parameter name (complete on rank 0)."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    if info.mode == "fsdp":
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    else:
        opts = StateDictOptions(full_state_dict=True)
    msd = get_model_state_dict(model, options=opts)
    osd = get_optimizer_state_dict(model, optimizer, options=opts)
    if info.mode != "fsdp":
        msd = {k: v.detach().to("cpu", copy=True) for k, v in msd.items()}
        osd = _to_cpu(osd)
    return msd, osd


def _to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    return obj


def load_full_state_dicts(model: nn.Module, optimizer: torch.optim.Optimizer, model_sd: dict, optim_sd: dict,
                          info: DistInfo) -> None:
    """Every rank passes the full state; FSDP2 keeps only its shard."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)

    opts = StateDictOptions(full_state_dict=True, strict=True)
    set_model_state_dict(model, model_sd, options=opts)
    set_optimizer_state_dict(model, optimizer, optim_sd, options=opts)
