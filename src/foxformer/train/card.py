"""How a run trained, as the rows of its export's model card (models/card.py): read from the run dir alone
(config.yaml, metrics.jsonl, and the data's manifest while the data is still where the run read it)."""
from __future__ import annotations

import os

from ..data.preparation import read_manifest
from .config import SAVED_CONFIG, read_yaml
from .metrics import read_metrics


def training_facts(run_dir: str, step: int | None = None) -> dict:
    """{label: value} for the card's Training table; {} for a folder that is no run dir. ``step``: the exported
    checkpoint's, which the rows on training and validation describe (default: the run's last logged step)."""
    path = os.path.join(run_dir, SAVED_CONFIG)
    cfg = read_yaml(path) if os.path.exists(path) else None
    if not isinstance(cfg, dict):
        return {}
    derived = cfg.get("derived") or {}
    records = read_metrics(run_dir)
    last = next((r for r in reversed(records) if r.get("kind") == "train"), {})
    facts = {"started from": cfg.get("init_from") or f"preset `{cfg.get('preset')}`"
             + (f" with {cfg['model']}" if cfg.get("model") else "")}
    manifest = read_manifest(cfg["data_dir"]) if cfg.get("data_dir") else None
    if manifest:
        train_tokens = manifest["split"]["train"].get("tokens")
        facts["data"] = (", ".join(f"`{s['spec']}`" for s in manifest.get("sources", []) if "spec" in s)
                         + (f" ({train_tokens:,} training tokens, tokenizer `{manifest['tokenizer']}`)"
                            if train_tokens else ""))
    if step is None and last:
        step = last["step"]
    if step is not None:
        facts["trained"] = _trained(cfg, records, step, last.get("step", step))
    facts["optimizer"] = (f"AdamW, peak lr {cfg.get('lr')} ({cfg.get('schedule')} schedule), weight decay "
                          f"{cfg.get('weight_decay')}, seed {cfg.get('seed')}")
    if step is not None:
        # a later eval measured weights this checkpoint never held
        val = next((r for r in reversed(records) if r.get("kind") == "eval" and r.get("val_loss") is not None
                    and r.get("step", 0) <= step), None)
        facts["validation loss"] = (f"{val['val_loss']:.4f} nats per token at step {val['step']:,} (held-out "
                                    f"documents of the training data)" if val else
                                    f"not measured by step {step:,} (no eval logged at or before it)")
    if derived.get("device"):
        parallel = derived.get("parallel")
        facts["hardware"] = (f"{derived.get('world_size', 1)} x {derived['device']}"
                             + (f" ({parallel})" if parallel not in (None, "none") else ""))
    if derived.get("commit"):
        facts["foxformer commit"] = f"`{derived['commit']}`"
    return facts


def _trained(cfg: dict, records: list[dict], step: int, last_step: int) -> str:
    """The "trained" row of a checkpoint at ``step`` of a run logged up to ``last_step``."""
    planned = (cfg.get("derived") or {}).get("total_steps")
    early = isinstance(planned, int) and step < planned
    steps = f"{step:,} of {planned:,} planned steps" if early else f"{step:,} steps"
    if step < last_step:
        steps += f" (an earlier checkpoint of a run logged to step {last_step:,})"
    elif early:
        # a run stopped early (a time limit, a signal) read as a whole one: its learning rate never decayed
        steps += " (stopped before the end of its schedule)"
    at = next((r for r in reversed(records) if r.get("kind") == "train" and r.get("step") == step), None)
    # a step between two logged ones: the run's fixed tokens a step, which the row states, count its tokens
    tokens = at["tokens"] if at else step * cfg.get("batch_tokens", 0)
    return f"{steps}, {tokens:,} tokens at context {cfg.get('context')} ({cfg.get('batch_tokens'):,} tokens a step)"
