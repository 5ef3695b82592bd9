"""The names `data prepare` writes into a dataset's folder, and what tells such a folder from others: a source
folder's walk passes over one (its manifest and token files are no documents)."""

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
