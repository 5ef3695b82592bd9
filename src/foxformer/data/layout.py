"""The names `data prepare` writes into a dataset's folder, the mark eval commands leave in theirs, and what tells
such folders from others: a source folder's walk passes over a dataset (its manifest and token files are no documents)
and an eval output folder (its results' JSON was read as JSON Lines), and refuses a model's folder."""

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


# Left by eval commands in each folder they write results in (eval/outputs.mark_output_folder): a mark rather than the
# results' names (loss.json, niah.json, ...), since bias-shift's --out names its file as the user likes, mqar writes
# one per model, and a folder of documents may hold a loss.json of its own. Hidden, as the walk leaves such a name
# out in silence: the folder given as a source is read, mark or not.
EVAL_MARK = ".foxformer-eval"


def eval_output_folder(folder: str) -> bool:
    """Whether an eval command has written its results in ``folder`` (its EVAL_MARK)."""
    return os.path.isfile(os.path.join(folder, EVAL_MARK))


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
