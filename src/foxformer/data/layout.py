"""The names `data prepare` writes into a dataset's folder, the mark eval commands leave in theirs, and what tells
such folders from others: a source folder's walk passes over a dataset (its manifest and token files are no documents)
and an eval output folder (its results' JSON was read as JSON Lines; one written before the mark, by what that JSON
holds), and refuses a model's folder."""

from __future__ import annotations

import json
import os
from typing import Callable

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


# The top-level keys that each kind of eval results' JSON always holds, as eval's writers write them: by these a
# folder that an eval wrote into before EVAL_MARK existed is told, never by its files' names (a folder of documents
# may hold a loss.json of its own). tests/eval/test_out_in_source.py has the real writers' files told by them.
EVAL_RESULT_KEYS = (
    frozenset({"command", "models", "plots"}),  # eval/outputs.py's shared layout: eval loss, niah, gates; mqar.json
    frozenset({"runs", "positions", "reference", "rows", "plots"}),  # compare.json
    frozenset({"task", "config", "device", "result"}),  # mqar's result of one model (its models/ folder)
    frozenset({"evict_eps", "loss", "loss_evicted", "kept_fraction", "by_position"}),  # eviction.json
    frozenset({"shifts", "train_len", "loss_within", "loss_beyond", "binned_loss"}),  # bias-shift
    frozenset({"results", "versions", "foxformer"}),  # eval harness, with foxformer's version
)
# No results file of eval's is near this size; a user's big JSON document is not read whole to learn that
_RESULTS_AT_MOST = 256 * 2**20


def eval_results_file(path: str) -> bool:
    """Whether ``path`` is a JSON file of eval results (EVAL_RESULT_KEYS): in a folder of older results, or one
    left among the user's documents, whose refusal as JSON Lines says what it is. Its first line is "{", as eval
    writes its JSON indented: a JSON Lines file of documents is told apart from its first two bytes, not read
    whole."""
    try:
        if os.path.getsize(path) > _RESULTS_AT_MOST:
            return False
        with open(path, "rb") as f:
            if f.read(2) not in (b"{\n", b"{\r"):
                return False
            f.seek(0)
            data = json.load(f)
    except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
        return False
    return isinstance(data, dict) and any(keys <= data.keys() for keys in EVAL_RESULT_KEYS)


def eval_results_in(folder: str, documents: Callable[[str], bool]) -> list[str]:
    """Where ``folder`` holds no EVAL_MARK but an eval command wrote its results in it before the mark existed, the
    files that tell it (its JSON files of eval results, EVAL_RESULT_KEYS; paths under ``folder``); else []. Only
    where nothing else could be meant: every file in it that a walk reads as documents (``documents`` of a file's
    name) is such a JSON file or its Markdown table (compare.md beside compare.json), and every folder in it is an
    eval output folder too (mqar's models/). A folder of the user's documents that holds an eval's loss.json is
    read as before, the folder given as a source likewise."""
    told, tables, folders = [], [], []
    try:
        with os.scandir(folder) as entries:  # in the order listed: a folder of documents is left at its first one
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                if entry.is_dir():  # a link to a folder: the walk reads where it leads, no part of the results
                    if entry.is_symlink():
                        return []
                    folders.append(entry.name)
                elif not documents(entry.name):
                    continue
                elif entry.name.endswith(".md"):
                    tables.append(entry.name)
                elif entry.name.endswith(".json") and eval_results_file(entry.path):
                    told.append(entry.name)
                else:
                    return []
    except OSError:  # the walk says that a folder cannot be read, in its own words
        return []
    if not told or any(f"{name[:-len('.md')]}.json" not in told for name in tables):
        return []
    told.sort()
    for name in sorted(folders):
        inner = os.path.join(folder, name)
        if eval_output_folder(inner):
            continue
        below = eval_results_in(inner, documents)
        if not below:
            return []
        told += [os.path.join(name, f) for f in below]
    return told


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
