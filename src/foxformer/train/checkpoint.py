"""Atomic, verified checkpoints: ``<run>/checkpoints/step_XXXXXXXX/`` plus a ``latest`` pointer.

A checkpoint directory is assembled under a temporary name, every file fsynced, a ``meta.json`` with the
size and sha256 of each file written last, and only then renamed into place; ``latest`` is replaced
atomically after that. A crash at any moment therefore leaves either the previous checkpoint or the new
one as ``latest``, never a half-written one. Loading re-checks sizes and hashes.

Two formats share this commit: "full" (``model.pt`` / ``optim.pt``, unsharded, written by rank 0) and
"sharded" (torch.distributed.checkpoint files written by every rank, ``train/sharded.py``); ``meta.json``
names the format and lists every file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil

import numpy as np
import torch

from ..data.layout import MANIFEST
from ..data.preparation import is_dataset, run_or_model_folder
from ..paths import write_text

CKPT_DIR = "checkpoints"
LATEST = "latest"
FILES = ("model.pt", "optim.pt", "rng.pt", "state.json")
# What a sharded checkpoint holds besides its shard files (__<rank>_<n>.distcp), which .metadata indexes.
SHARDED_FILES = (".metadata", "rng.pt", "state.json")
FORMATS = ("full", "sharded")


class CheckpointError(ValueError):
    """A checkpoint that is missing, incomplete or corrupted (the message states the fact; what to do depends on
    the command that met it, which adds its advice)."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint that could not be written (a full disk, a folder that turned read-only)."""


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_file(path: str) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def checkpoint_root(run_dir: str) -> str:
    return os.path.join(run_dir, CKPT_DIR)


def check_not_in_a_run(out_dir: str) -> None:
    """ValueError where ``out_dir`` is a checkpoint of a run, or its checkpoints folder: a run trained there
    mixed its files with the checkpoint's, and went when the run's keep_last removed that checkpoint."""
    given, parent = os.path.normpath(out_dir), os.path.dirname(os.path.abspath(out_dir))
    if os.path.isfile(os.path.join(given, "meta.json")):
        run, what = os.path.dirname(os.path.dirname(given)) or os.path.dirname(parent), "a checkpoint"
    elif os.path.basename(given) == CKPT_DIR and os.path.isfile(os.path.join(parent, "config.yaml")):
        run, what = os.path.dirname(given) or parent, "the checkpoints folder"
    else:
        return
    raise ValueError(f"out_dir: {out_dir!r} is {what} of the run {run}, not a run folder; continue that run with "
                     f"--out {run} (plus --resume CHECKPOINT to go back to one), or start a new run from a "
                     f"checkpoint's weights with --init-from CHECKPOINT --out NEW_DIR")


def data_or_model_folder(folder: str) -> tuple[str, str] | None:
    """(the file that tells, what ``folder`` is) where it holds no run (no config.yaml) but a prepared dataset or a
    Hugging Face model, the two folders a run's path is mixed up with (data.preparation.run_or_model_folder, seen
    from the run's side); else None."""
    if os.path.isfile(os.path.join(folder, "config.yaml")):
        return None
    if is_dataset(folder):
        return MANIFEST, "a prepared dataset"
    return run_or_model_folder(folder)


def check_not_data_or_model(out_dir: str, what_dir: str = "out_dir") -> None:
    """ValueError where ``out_dir``, holding no run (no config.yaml), is a prepared dataset or a Hugging Face model
    folder: `--out DATA` (the two flags swapped) or `--out RUN/hf` trained a run into it, its checkpoints and
    export mixed with the dataset's shards or the model's files. ``what_dir`` names the setting in the message."""
    if (taken := data_or_model_folder(out_dir)) is None:
        return
    held, what = taken
    hint = "the dataset goes to --data" if held == MANIFEST else "to train on from its weights, pass it as --init-from"
    raise ValueError(f"{what_dir}: {out_dir!r} is {what} (it holds {held}), not a run folder: name a new folder for "
                     f"the run; {hint}")


def list_checkpoints(run_dir: str) -> list[str]:
    root = checkpoint_root(run_dir)
    if not os.path.isdir(root):
        return []
    return sorted(os.path.join(root, d) for d in os.listdir(root) if d.startswith("step_"))


def checkpoints_held(run_dir: str) -> str:
    """What ``run_dir`` holds in checkpoints, for a message refusing one it lacks: a path copied from an earlier
    note (where a stopped run was saved) may name one that keep_last has removed since."""
    names = ", ".join(os.path.basename(c) for c in list_checkpoints(run_dir)) or "none"
    return f"{checkpoint_root(run_dir)} holds {names}; a run keeps only its newest keep_last"


def latest_checkpoint(run_dir: str) -> str | None:
    """The newest checkpoint: the one ``latest`` points to, or a newer step folder (a save killed between
    its atomic rename and the pointer update); None for a run without checkpoints. Raises if the pointer
    dangles."""
    pointer = os.path.join(checkpoint_root(run_dir), LATEST)
    found = list_checkpoints(run_dir)
    newest = found[-1] if found else None
    if not os.path.exists(pointer):
        return newest
    with open(pointer) as f:
        name = f.read().strip()
    path = os.path.join(checkpoint_root(run_dir), name)
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint: {pointer} points to {name!r}, which is missing (existing: "
                              f"{[os.path.basename(p) for p in found]})")
    # step folder names are zero-padded, so they sort by step
    return newest if os.path.basename(newest) > name else path


def _write_pointer(root: str, name: str) -> None:
    write_text(os.path.join(root, LATEST), name + "\n")
    _fsync_dir(root)  # the rename itself on disk, not only the pointer's bytes


def adopt_checkpoint(run_dir: str, path: str, step: int) -> list[str]:
    """Make the run continue the lineage of ``path`` (the checkpoint of step ``step`` it resumes from).

    Step folders of ``run_dir`` newer than ``step`` belong to an abandoned lineage (``resume=<older
    checkpoint>``): they are renamed ``abandoned-step_N`` (kept for inspection, but no longer found by
    :func:`latest_checkpoint` or pruned by ``keep_last``) and ``latest`` points at ``path`` when it is one
    of this run's checkpoints. Returns the new paths of the folders set aside."""
    root = checkpoint_root(run_dir)
    moved = []
    for old in list_checkpoints(run_dir):
        name = os.path.basename(old)
        if not name[len("step_"):].isdigit() or int(name[len("step_"):]) <= step:
            continue
        dest, n = os.path.join(root, f"abandoned-{name}"), 1
        while os.path.exists(dest):  # abandoned twice
            n += 1
            dest = os.path.join(root, f"abandoned-{name}-{n}")
        os.replace(old, dest)
        moved.append(dest)
    if os.path.isdir(root) and os.path.samefile(os.path.dirname(os.path.abspath(path)), root):
        _write_pointer(root, os.path.basename(os.path.abspath(path)))
    elif moved and os.path.exists(os.path.join(root, LATEST)):  # the pointer may name a folder set aside
        remaining = list_checkpoints(run_dir)
        if remaining:
            _write_pointer(root, os.path.basename(remaining[-1]))
        else:
            os.remove(os.path.join(root, LATEST))
    return moved


def clear_staging(run_dir: str) -> None:
    """Delete the leftovers of saves that crashed part-way (their folders never became step folders)."""
    root = checkpoint_root(run_dir)
    for d in os.listdir(root) if os.path.isdir(root) else []:
        if d.startswith(".tmp-"):
            shutil.rmtree(os.path.join(root, d), ignore_errors=True)


def write_failure(run_dir: str, step: int, error: BaseException) -> CheckpointWriteError:
    """The error to raise for checkpoint ``step``, whose writing failed with ``error`` (a full disk: torch.save
    raises RuntimeError '... unexpected pos'; no permission: OSError; DCP gathers each rank's into a
    CheckpointException): one line naming the folder and the reason. The partial folders (.tmp-*) are removed
    first, to give the space back; the checkpoints before it stay."""
    clear_staging(run_dir)
    failures = getattr(error, "failures", None)  # DCP's CheckpointException: {rank: (exception, traceback)}
    if failures:
        error = next(iter(failures.values()))[0]
    text = str(error).strip().removeprefix("checkpoint: ")
    reason = error.strerror if isinstance(error, OSError) and error.strerror else (
        text.splitlines()[-1] if text else type(error).__name__)
    return CheckpointWriteError(f"checkpoint: step {step} could not be written ({checkpoint_root(run_dir)}): {reason}; "
                                f"free disk space or make the folder writable, then resume (the checkpoints before "
                                f"this one are intact)")


@contextlib.contextmanager
def write_errors(run_dir: str, step: int):
    """Around the saving of checkpoint ``step``: a failed write becomes :func:`write_failure`'s
    CheckpointWriteError (a save in the background reports its own so through the writer's wait)."""
    try:
        yield
    except (OSError, RuntimeError) as e:
        raise write_failure(run_dir, step, e) from e


def staging_dir(run_dir: str, step: int, owner: str) -> str:
    """Where checkpoint ``step`` is assembled before its commit; ``owner`` keeps concurrent writers apart
    (a process id, or a name every rank of one job agrees on)."""
    return os.path.join(checkpoint_root(run_dir), f".tmp-{step_dir_name(step)}-{owner}")


def hash_files(folder: str, names) -> dict:
    """{name: {size, sha256}} of files in ``folder``, each fsynced first (they must be on disk before the
    meta.json that vouches for them)."""
    out = {}
    for name in names:
        path = os.path.join(folder, name)
        _fsync_file(path)
        out[name] = {"size": os.path.getsize(path), "sha256": _sha256(path)}
    return out


def write_small_files(folder: str, step: int, state: dict) -> None:
    """rng.pt (this process's generators) and state.json, common to both formats."""
    torch.save(rng_state(), os.path.join(folder, "rng.pt"))
    with open(os.path.join(folder, "state.json"), "w") as f:
        json.dump({**state, "step": step}, f, indent=2)


def commit_checkpoint(run_dir: str, step: int, tmp: str, files: dict, keep_last: int, fmt: str = "full") -> str:
    """Vouch for the files of ``tmp`` (``files`` from :func:`hash_files`) in meta.json, rename ``tmp`` to
    step ``step``'s folder, point ``latest`` at it and delete all but the newest ``keep_last``."""
    root = checkpoint_root(run_dir)
    final = os.path.join(root, step_dir_name(step))
    with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump({"step": step, "format": fmt, "files": files}, f, indent=2)
    _fsync_file(os.path.join(tmp, "meta.json"))
    _fsync_dir(tmp)
    if os.path.exists(final):  # the same step saved again after a resume: swap it out, then drop the old one
        trash = os.path.join(root, f".tmp-old-{step_dir_name(step)}-{os.getpid()}")
        os.replace(final, trash)
        os.replace(tmp, final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _write_pointer(root, step_dir_name(step))
    for old in list_checkpoints(run_dir)[:-keep_last] if keep_last > 0 else []:
        if os.path.abspath(old) != os.path.abspath(final):
            shutil.rmtree(old, ignore_errors=True)
    return final


def save_checkpoint(run_dir: str, step: int, model_sd: dict, optim_sd: dict, state: dict, keep_last: int) -> str:
    """Write full checkpoint ``step`` atomically, point ``latest`` at it, delete all but the newest ``keep_last``."""
    os.makedirs(checkpoint_root(run_dir), exist_ok=True)
    clear_staging(run_dir)
    tmp = staging_dir(run_dir, step, str(os.getpid()))
    os.makedirs(tmp)
    torch.save(model_sd, os.path.join(tmp, "model.pt"))
    torch.save(optim_sd, os.path.join(tmp, "optim.pt"))
    write_small_files(tmp, step, state)
    return commit_checkpoint(run_dir, step, tmp, hash_files(tmp, FILES), keep_last)


def read_meta(path: str) -> dict:
    """meta.json of checkpoint ``path``; raises CheckpointError when there is none (the save never completed)."""
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint: {path!r} does not exist")
    meta_path = os.path.join(path, "meta.json")
    if not os.path.exists(meta_path):
        raise CheckpointError(f"checkpoint: {path!r} has no meta.json (incomplete save?); it cannot be trusted")
    try:
        with open(meta_path) as f:
            meta = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"checkpoint: {meta_path} is corrupted ({e})") from e
    if meta.get("format", "full") not in FORMATS:
        raise CheckpointError(f"checkpoint: {meta_path} names an unknown format {meta.get('format')!r}")
    return meta


def checkpoint_format(path: str) -> str:
    """"full" or "sharded" (checkpoints from before the sharded format have no "format": full)."""
    return read_meta(path).get("format", "full")


def verify_checkpoint(path: str, part: tuple[int, int] = (0, 1)) -> dict:
    """Check the files against meta.json; returns the parsed meta. Raises CheckpointError with the reason.

    ``part=(i, n)`` hashes only every n-th file from the i-th (n ranks share the reading of a sharded
    checkpoint); the list of files is checked for completeness in every part."""
    meta = read_meta(path)
    listed = meta.get("files", {})
    required = SHARDED_FILES if meta.get("format", "full") == "sharded" else FILES
    names = sorted(set(required) | set(listed))
    for name in names:
        if name not in listed or not os.path.exists(os.path.join(path, name)):
            raise CheckpointError(f"checkpoint: {path!r} is missing {name}")
    index, count = part
    for name in names[index::count]:
        file, want = os.path.join(path, name), listed[name]
        if os.path.getsize(file) != want["size"] or _sha256(file) != want["sha256"]:
            raise CheckpointError(f"checkpoint: {file} is corrupted (size/sha256 differ from meta.json)")
    return meta


def read_small_files(path: str) -> tuple[dict, dict]:
    """(rng, state) of a checkpoint (verify it first)."""
    rng = torch.load(os.path.join(path, "rng.pt"), map_location="cpu", weights_only=False)
    with open(os.path.join(path, "state.json")) as f:
        state = json.load(f)
    return rng, state


def load_checkpoint(path: str) -> tuple[dict, dict, dict, dict]:
    """(model_sd, optim_sd, rng, state) of a verified checkpoint, tensors on CPU."""
    if verify_checkpoint(path).get("format", "full") != "full":
        raise CheckpointError(f"checkpoint: {path!r} is sharded; read it with foxformer.train.sharded "
                              f"(read_model_state_dict, or resume it with foxformer train)")
    model_sd = torch.load(os.path.join(path, "model.pt"), map_location="cpu", weights_only=True)
    optim_sd = torch.load(os.path.join(path, "optim.pt"), map_location="cpu", weights_only=True)
    return (model_sd, optim_sd, *read_small_files(path))
