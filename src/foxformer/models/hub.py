"""Model folders named by a Hugging Face Hub repository id: one place decides what counts as an id and downloads it.

Loading (``load_model``, so eval, generate and ``train --init-from``) and ``convert official`` accept
``owner/name`` where no such local path exists; the files land in the Hub cache (``HF_HOME``), so a second use
reads them from disk, and ``HF_HUB_OFFLINE=1`` uses only what is cached.
"""
from __future__ import annotations

import os
import re

_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")
# what a model folder needs: configs, weights (single or sharded, with their index), tokenizer files, remote code
MODEL_FILES = ["*.json", "*.safetensors", "*.bin", "*.txt", "*.py", "*.model", "*.tiktoken"]


def is_hub_id(src: str) -> bool:
    """True for ``owner/name`` that names no local path. Where ``owner`` is a local folder (``runs/fox``) the
    name is taken for a mistyped path, not sent to the Hub."""
    return _HUB_ID.fullmatch(src) is not None and not os.path.exists(src) and not os.path.isdir(src.split("/")[0])


def download(repo_id: str, files: list[str] = MODEL_FILES) -> str:
    """The local folder of the Hub repository ``repo_id``, holding its ``files`` (patterns; default: its model
    files; ["config.json"] reads what a model is before its weights download). Raises OSError saying why (no
    network, no such repository, a private one without a token): callers add what the user can do."""
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(repo_id, allow_patterns=files)
    except Exception as e:  # network, authentication, missing repository: each ends the load alike
        # the first line only: huggingface_hub's messages run over several (the CLI's errors are one line)
        why = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
        raise OSError(f"the Hub download of {repo_id} failed ({type(e).__name__}: {why})") from e
