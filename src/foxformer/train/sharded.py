"""Writing and resuming checkpoints in either format, and converting sharded ones without gathering them.

"sharded" (the default under torchrun): every rank writes its own shards through
torch.distributed.checkpoint (DCP), asynchronously, so training goes on while the files are written; DCP
records each tensor's global shape, so a run saved on N processes resumes on M (DDP or FSDP2 alike).
The commit is checkpoint.py's: the ranks hash their share of the files, rank 0 writes meta.json and
renames the folder into place, so a save that dies part-way is never found. "full": the unsharded state
gathered on rank 0 (one process, or by choice).

Checkpoint traffic runs on its own gloo group: async save's thread must not interleave collectives with
training's on one group, and DCP's async save needs a CPU backend even when training runs on NCCL.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import struct
import sys
import uuid
import warnings
from concurrent.futures import Future, ThreadPoolExecutor

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from ..paths import check_export_dir, export_writer
from ..progress import progress_bar
from . import checkpoint as ckpt
from .card import training_facts
from .distributed import DistInfo, full_state_dicts, gather_objects, load_full_state_dicts

# DCP warns on every call without a process group, which is how one process saves and loads on purpose.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

MODEL, OPTIM = "model", "optim"  # top-level keys of the DCP state: DCP names tensors "model.<fqn>"
# Tensors read per DCP call when converting: bounds the converter's memory (the largest tensor may exceed it).
CONVERT_BATCH_BYTES = 1 << 30


def resolve_format(fmt: str, info: DistInfo) -> str:
    """"auto": sharded under torchrun (no rank gathers the whole state), full for one process."""
    if fmt == "auto":
        return "sharded" if info.enabled else "full"
    return fmt


def checkpoint_group(info: DistInfo, timeout_minutes: float):
    """The gloo group checkpoints use (every rank must call this, in the same order); None for one process."""
    if not info.enabled:
        return None
    return dist.new_group(backend="gloo", timeout=datetime.timedelta(minutes=timeout_minutes))


def _not_one_folder(run_dir: str, what: str) -> ValueError:
    return ValueError(f"out_dir: the processes of this job do not see one folder {run_dir!r} (a local disk on each "
                      f"host?): {what}; every process writes its part of each checkpoint there and reads all of them "
                      f"to resume, so give --out a folder on storage all hosts share, at the same path on each "
                      f"(nothing was trained)")


def check_same_resume(run_dir: str, path: str | None, info: DistInfo, group) -> None:
    """Every rank must resume from the one checkpoint: a rank that found none (or another) went on while the
    others waited for it in the resume's collectives, until the timeout ended the job with gloo's words."""
    if not info.enabled:
        return
    paths = gather_objects(path, group)
    other = next((r for r, p in enumerate(paths) if p != paths[0]), None)
    if other is not None:
        raise _not_one_folder(run_dir, f"they find different checkpoints to resume from in it (rank 0: "
                                       f"{paths[0] or 'none'}, rank {other}: {paths[other] or 'none'})")


def check_shared_run_dir(run_dir: str, info: DistInfo, group) -> None:
    """Stop a job whose ranks write into different folders of one name before it trains (rank 0 holds the run's
    lock): its sharded checkpoints failed only at the first save, an interval into the run, with advice about
    disk space."""
    if not info.enabled:
        return
    probe = None
    if info.is_main:
        # a name no rank looked up before (network file systems cache a lookup that failed); under checkpoints/,
        # where a save clears what a crash here would leave
        probe = os.path.join(ckpt.checkpoint_root(run_dir), f".tmp-ranks-{uuid.uuid4().hex}")
        os.makedirs(probe)
    probe = gather_objects(probe, group)[0]
    seen = gather_objects((os.path.isdir(probe), socket.gethostname()), group)
    if info.is_main:
        os.rmdir(probe)
    blind = [f"rank {r} on host {host}" for r, (ok, host) in enumerate(seen) if not ok]
    if blind:
        shown = ", ".join(blind[:4]) + (f" and {len(blind) - 4} more" if len(blind) > 4 else "")
        raise _not_one_folder(run_dir, f"{shown} {'does' if len(blind) == 1 else 'do'} not see what rank 0 on "
                                       f"host {seen[0][1]} creates in it")


class CheckpointWriter:
    """Saves checkpoints of a run; with ``async_save`` at most one sharded save is in flight, and the next
    save (or leaving the ``with`` block) waits for its commit first."""

    def __init__(self, run_dir: str, info: DistInfo, fmt: str, async_save: bool, keep_last: int, group):
        self.run_dir, self.info, self.fmt, self.async_save = run_dir, info, fmt, async_save
        self.keep_last, self.group = keep_last, group
        self._pending: tuple[int, Future] | None = None
        self._executor: ThreadPoolExecutor | None = None

    def __enter__(self) -> CheckpointWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.wait()
        except Exception as e:
            if exc_type is None:
                raise
            # the run failed anyway: its own error is the one to report. After Ctrl-C, the note on where the run
            # stands names the last checkpoint written; a save the other ranks left unfinished is no news
            if not issubclass(exc_type, KeyboardInterrupt):
                print(f"{e} (while the run stopped with {exc_type.__name__})", file=sys.stderr)
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)

    def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
        self.wait()
        if self.fmt == "full":
            msd, osd = full_state_dicts(model, optimizer, self.info)
            if self.info.is_main:
                ckpt.save_checkpoint(self.run_dir, step, msd, osd, state, self.keep_last)
            if self.info.enabled:
                dist.barrier(group=self.group)
            return
        msd, osd = get_state_dict(model, optimizer)
        tmp = ckpt.staging_dir(self.run_dir, step, "sharded")  # one name for all ranks
        if self.info.is_main:
            os.makedirs(ckpt.checkpoint_root(self.run_dir), exist_ok=True)
            ckpt.clear_staging(self.run_dir)
            os.makedirs(tmp)
            ckpt.write_small_files(tmp, step, state)
        if self.info.enabled:
            dist.barrier(group=self.group)  # the folder exists, and no rank writes before its cleaning
        kwargs = dict(checkpoint_id=tmp, process_group=self.group)  # no group: DCP works in this process alone
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="foxformer-checkpoint")
        if self.async_save:
            # returns once this rank's shards are copied (staged) to host memory; DCP's thread writes them
            upload = dcp.async_save({MODEL: msd, OPTIM: osd}, **kwargs)
            upload = getattr(upload, "upload_completion", upload)  # newer torch may return both futures
            self._pending = (step, self._executor.submit(lambda: self._commit(step, tmp, upload.result())))
        else:  # the same path, waited for at once
            self._pending = (step, self._executor.submit(
                lambda: self._commit(step, tmp, dcp.save({MODEL: msd, OPTIM: osd}, **kwargs))))
            self.wait()

    def wait(self) -> str | None:
        """Block until the save in flight is committed; returns its folder (None if none was in flight).
        Raises CheckpointWriteError if it failed (its partial folder removed; the previous checkpoint stays the
        latest)."""
        if self._pending is None:
            return None
        (step, future), self._pending = self._pending, None
        try:
            return future.result()
        except (Exception, CheckpointException) as e:  # DCP's is a BaseException
            raise ckpt.write_failure(self.run_dir, step, e) from e

    def _commit(self, step: int, tmp: str, metadata) -> str:
        """Every rank hashes its share of the files; rank 0 vouches for them all and renames the folder."""
        files = sorted({".metadata", *ckpt.SHARDED_FILES, *(s.relative_path for s in metadata.storage_data.values())})
        try:
            mine, error = ckpt.hash_files(tmp, files[self.info.rank::self.info.world_size]), None
        except OSError as e:
            mine, error = {}, f"rank {self.info.rank}: {e}"
        parts = gather_objects((mine, error), self.group)
        outcome = None
        if self.info.is_main:
            errors = [err for _, err in parts if err]
            if errors:
                outcome = ckpt.CheckpointError(f"checkpoint: hashing {tmp} failed: {'; '.join(errors)}")
            else:
                merged = {name: h for part, _ in parts for name, h in part.items()}
                outcome = ckpt.commit_checkpoint(self.run_dir, step, tmp, merged, self.keep_last, "sharded")
        outcome = gather_objects(outcome, self.group)[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


class ResumePoint:
    """A verified checkpoint to resume from: its state.json and RNG now, its tensors once the model exists."""

    def __init__(self, path: str, info: DistInfo, group):
        self.path, self.info, self.group = path, info, group
        # ranks share the hashing of a sharded checkpoint; any rank's finding stops them all
        try:
            self.format = ckpt.checkpoint_format(path)
            if self.format == "full":
                self._model_sd, self._optim_sd, self.rng, self.state = ckpt.load_checkpoint(path)
            else:
                ckpt.verify_checkpoint(path, (info.rank, info.world_size))
                self.rng, self.state = ckpt.read_small_files(path)
            error = None
        except ckpt.CheckpointError as e:
            error = str(e)
        errors = [e for e in gather_objects(error, group) if e]
        if errors:
            raise ckpt.CheckpointError(errors[0])

    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Load the weights and optimizer state into ``model`` (already wrapped for DDP / FSDP2) whatever
        the world size that saved them."""
        if self.format == "full":
            load_full_state_dicts(model, optimizer, self._model_sd, self._optim_sd, self.info)
            del self._model_sd, self._optim_sd
            return
        msd, osd = get_state_dict(model, optimizer)
        state = {MODEL: msd, OPTIM: osd}
        dcp.load(state, checkpoint_id=self.path, process_group=self.group)
        set_state_dict(model, optimizer, model_state_dict=state[MODEL], optim_state_dict=state[OPTIM])


def model_tensor_specs(path: str) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """{parameter name: (shape, dtype)} of a verified sharded checkpoint, from DCP's metadata alone."""
    metadata = dcp.FileSystemReader(path).read_metadata()
    prefix = MODEL + "."
    return {key[len(prefix):]: (entry.size, entry.properties.dtype)
            for key, entry in metadata.state_dict_metadata.items()
            if key.startswith(prefix) and isinstance(entry, TensorStorageMetadata)}


def _read_model_tensors(path: str, names: list[str], specs: dict) -> dict[str, torch.Tensor]:
    """Whole tensors ``names`` of a sharded checkpoint, in this process alone (DCP reads only their bytes)."""
    want = {name: torch.empty(specs[name][0], dtype=specs[name][1]) for name in names}
    dcp.load({MODEL: want}, checkpoint_id=path, no_dist=True)
    return want


def read_model_state_dict(path: str) -> dict[str, torch.Tensor]:
    """The full model state dict of a checkpoint of either format, verified, on the CPU."""
    meta = ckpt.verify_checkpoint(path)
    if meta.get("format", "full") == "full":
        return torch.load(os.path.join(path, "model.pt"), map_location="cpu", weights_only=True)
    specs = model_tensor_specs(path)
    return _read_model_tensors(path, sorted(specs), specs)


_SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
                       torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
                       torch.uint8: "U8", torch.bool: "BOOL"}


def _nbytes(spec: tuple[torch.Size, torch.dtype]) -> int:
    return int(torch.Size(spec[0]).numel()) * torch.empty((), dtype=spec[1]).element_size()


def _write_safetensors(file: str, specs: dict, batches) -> None:
    """A safetensors file written tensor by tensor: the header comes from the shapes alone, then each batch
    of ``batches`` (dicts of tensors, in sorted name order) is appended and dropped."""
    header, offset = {}, 0
    for name in sorted(specs):
        shape, dtype = specs[name]
        nbytes = _nbytes(specs[name])
        header[name] = {"dtype": _SAFETENSORS_DTYPES[dtype], "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the format aligns the data to 8 bytes
    with open(file, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for batch in batches:
            for name in sorted(batch):
                f.write(batch[name].contiguous().reshape(-1).view(torch.uint8).numpy())
        f.flush()
        os.fsync(f.fileno())


def export_hf_sharded(model_cfg, path: str, out: str, run_dir: str | None = None, progress: bool = False) -> str:
    """Convert sharded checkpoint ``path`` to a Hugging Face folder (one model.safetensors) holding at most
    CONVERT_BATCH_BYTES of tensors (or the largest tensor) in memory at a time; its model card says how
    ``run_dir`` trained it up to the checkpoint's step. ``progress``: a bar over the bytes written
    (progress.progress_bar); off by default, as a library call draws nothing of its own."""
    from ..models import FoxForCausalLM
    from ..models.card import write_card

    step = ckpt.verify_checkpoint(path)["step"]
    specs = model_tensor_specs(path)
    with torch.device("meta"):  # the structure only: config files and the names HF expects
        model = FoxForCausalLM(model_cfg)
    expected = set(model.state_dict())
    if model_cfg.tie_embeddings:  # save_pretrained stores a tied weight once
        expected.discard("lm_head.weight")
        specs.pop("lm_head.weight", None)
    if set(specs) != expected:
        missing, unexpected = sorted(expected - set(specs)), sorted(set(specs) - expected)
        raise ckpt.CheckpointError(f"checkpoint: {path!r} does not hold this model: missing {missing[:5]}, "
                                   f"unexpected {unexpected[:5]}")
    batches, batch, size = [], [], 0
    for name in sorted(specs):
        nbytes = _nbytes(specs[name])
        if batch and size + nbytes > CONVERT_BATCH_BYTES:
            batches.append(batch)
            batch, size = [], 0
        batch.append(name)
        size += nbytes
    batches.append(batch)
    earlier = check_export_dir(out, "export")
    with export_writer(out, earlier) as tmp:
        model.save_pretrained(tmp, state_dict={})  # config.json and generation_config.json, no weights
        if run_dir is not None:
            write_card(tmp, model_cfg, training_facts(run_dir, step), replace=True)
        # a 760M model is gigabytes read from the shards and written batch by batch, minutes with nothing said
        total = sum(_nbytes(spec) for spec in specs.values())
        with progress_bar(total=total, desc="export", unit="B", unit_scale=True, wanted=progress) as bar:
            _write_safetensors(os.path.join(tmp, "model.safetensors"), specs, _batches_read(path, batches, specs, bar))
    return out


def _batches_read(path: str, batches: list[list[str]], specs: dict, bar):
    """The tensors of each of ``batches`` read from sharded checkpoint ``path``, ``bar`` counting a batch's bytes
    once it was written (the caller's next request)."""
    for names in batches:
        yield _read_model_tensors(path, names, specs)
        bar.update(sum(_nbytes(specs[name]) for name in names))
