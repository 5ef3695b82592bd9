"""The names `data prepare` writes into a dataset's folder, and what tells such a folder from others: a source
folder's walk passes over one (its manifest and token files are no documents), and refuses a model's folder."""

from __future__ import annotations

import json
import os

from ..paths import LOCK_FILE

FORMAT = "foxformer-tokens-v1"
MANIFEST = "manifest.json"
SHARDS = "shards"


def prepared_dataset(folder: str) -> bool:
    """Whether ``folder`` is a prepared dataset: its manifest says this format, or a prepare is writing it or was
    cut short (its lock beside the shards, the manifest not yet written). A user's own manifest.json is not one."""
    if os.path.isfile(os.path.join(folder, LOCK_FILE)) and os.path.isdir(os.path.join(folder, SHARDS)):
        return True
    if not os.path.isfile(os.path.join(folder, MANIFEST)):
        return False
    try:
        with open(os.path.join(folder, MANIFEST), "rb") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == FORMAT


# What a training run's folder (train/loop.py) and a Hugging Face model's (save_pretrained) are called, their config
# and what they hold beside it: a folder of documents may hold a config file of its own, and is read all the same.
MODEL_FOLDERS = (("a training run's folder", "config.yaml", ("metrics.jsonl", "checkpoints")),
                 ("a Hugging Face model folder", "config.json",
                  ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")))


def model_folder(folder: str) -> str | None:
    """What ``folder`` is, and the files that tell ("a training run's folder (it holds config.yaml, metrics.jsonl)"),
    where it is a run's or a model's folder; else None."""
    for what, config, beside in MODEL_FOLDERS:
        held = [name for name in (config, *beside) if os.path.exists(os.path.join(folder, name))]
        if held[:1] == [config] and len(held) > 1:
            return f"{what} (it holds {', '.join(held)})"
    return None


def saved_hf_dataset(folder: str) -> list[str] | None:
    """Where ``folder`` is a Hugging Face dataset written by `save_to_disk` (its rows in .arrow files, which a source
    folder's walk does not read), the names of its splits: those its dataset_dict.json lists for a DatasetDict, []
    for one Dataset (state.json and dataset_info.json); else None."""
    listing = os.path.join(folder, "dataset_dict.json")
    if os.path.isfile(listing):  # looked for, not opened blindly: every folder a walk meets is asked
        try:
            with open(listing, "rb") as f:
                splits = json.load(f).get("splits")
            return [str(s) for s in splits] if isinstance(splits, list) else []
        except (OSError, ValueError, AttributeError):
            pass
    if all(os.path.isfile(os.path.join(folder, name)) for name in ("state.json", "dataset_info.json")):
        return []
    return None
