"""The Training rows of an export's model card (train/card.py), read from a run dir's files alone."""
import json

import yaml

from foxformer.train.card import training_facts


def _run(tmp_path, records) -> str:
    run = tmp_path / "run"
    run.mkdir()
    cfg = {"preset": "fox-pro-tiny", "context": 32, "batch_tokens": 128, "lr": 1e-3, "schedule": "cosine",
           "weight_decay": 0.1, "seed": 0, "derived": {"total_steps": 10}}
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(run)


def test_a_step_between_logged_ones_and_before_any_eval(tmp_path):
    """A checkpoint at step 3 of a run logged at 2, 4 and 10 with evals at 5 and 10: its tokens are three steps'
    (no train record at 3), and no eval had measured it, which the card says rather than borrowing a later one."""
    run = _run(tmp_path, [{"kind": "train", "step": s, "tokens": 128 * s, "loss": 1.0} for s in (2, 4, 10)]
               + [{"kind": "eval", "step": s, "tokens": 128 * s, "val_loss": v} for s, v in ((5, 2.5), (10, 2.25))])
    facts = training_facts(run, 3)
    assert facts["trained"] == ("3 of 10 planned steps (an earlier checkpoint of a run logged to step 10), 384 tokens "
                                "at context 32 (128 tokens a step)")
    assert facts["validation loss"] == "not measured by step 3 (no eval logged at or before it)"
    assert training_facts(run, 7)["validation loss"].startswith("2.5000 nats per token at step 5 ")
    last = training_facts(run)
    assert last["trained"].startswith("10 steps, 1,280 tokens")
    assert last["validation loss"].startswith("2.2500 nats per token at step 10 ")
