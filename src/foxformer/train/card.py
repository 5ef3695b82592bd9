"""How a run trained, as the rows of its export's model card (models/card.py): read from the run dir alone
(config.yaml, metrics.jsonl, and the data's manifest while the data is still where the run read it)."""
from __future__ import annotations

import os

from ..data.preparation import read_manifest
from .config import SAVED_CONFIG, read_yaml
from .metrics import read_metrics


def training_facts(run_dir: str) -> dict:
    """{label: value} for the card's Training table; {} for a folder that is no run dir."""
    path = os.path.join(run_dir, SAVED_CONFIG)
    cfg = read_yaml(path) if os.path.exists(path) else None
    if not isinstance(cfg, dict):
        return {}
    derived = cfg.get("derived") or {}
    records = read_metrics(run_dir)
    last = {kind: next((r for r in reversed(records) if r.get("kind") == kind), {}) for kind in ("train", "eval")}
    facts = {"started from": cfg.get("init_from") or f"preset `{cfg.get('preset')}`"
             + (f" with {cfg['model']}" if cfg.get("model") else "")}
    manifest = read_manifest(cfg["data_dir"]) if cfg.get("data_dir") else None
    if manifest:
        train_tokens = manifest["split"]["train"].get("tokens")
        facts["data"] = (", ".join(f"`{s['spec']}`" for s in manifest.get("sources", []) if "spec" in s)
                         + (f" ({train_tokens:,} training tokens, tokenizer `{manifest['tokenizer']}`)"
                            if train_tokens else ""))
    if last["train"]:
        step, planned = last["train"]["step"], derived.get("total_steps")
        # a run stopped early (a time limit, a signal) read as a whole one: its learning rate never decayed
        steps = (f"{step:,} of {planned:,} planned steps (stopped before the end of its schedule)"
                 if isinstance(planned, int) and step < planned else f"{step:,} steps")
        facts["trained"] = (f"{steps}, {last['train']['tokens']:,} tokens at context {cfg.get('context')} "
                            f"({cfg.get('batch_tokens'):,} tokens a step)")
    facts["optimizer"] = (f"AdamW, peak lr {cfg.get('lr')} ({cfg.get('schedule')} schedule), weight decay "
                          f"{cfg.get('weight_decay')}, seed {cfg.get('seed')}")
    if last["eval"].get("val_loss") is not None:
        facts["validation loss"] = (f"{last['eval']['val_loss']:.4f} nats per token (held-out documents of the "
                                    f"training data)")
    if derived.get("device"):
        parallel = derived.get("parallel")
        facts["hardware"] = (f"{derived.get('world_size', 1)} x {derived['device']}"
                             + (f" ({parallel})" if parallel not in (None, "none") else ""))
    if derived.get("commit"):
        facts["foxformer commit"] = f"`{derived['commit']}`"
    return facts
