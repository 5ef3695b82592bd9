"""`foxformer eval mqar`: the synthetic recall task's sequences, and small models that learn it on the CPU."""
import json

import numpy as np
import pytest

from foxformer.cli import main
from foxformer.eval.mqar import IGNORE, MqarConfig, config_from, mqar_batch, parse_model


def test_batches_hold_pairs_then_each_key_queried_once_before_its_value():
    cfg = MqarConfig()
    x, y = mqar_batch(np.random.default_rng(0), 8, 64, 4, cfg)
    assert x.shape == y.shape == (8, 64)
    for row, target in zip(x.numpy(), y.numpy()):
        keys, values = row[0:8:2], row[1:8:2]
        assert len(set(keys)) == 4 and (keys < cfg.num_keys).all()
        assert ((values >= cfg.num_keys) & (values < cfg.num_keys + cfg.num_values)).all()
        queries = np.flatnonzero(target != IGNORE)
        assert len(queries) == 4 and (queries >= 8).all()
        answer = dict(zip(keys, values))
        for q in queries:  # the query key, its value as the target and as the next input
            assert target[q] == answer[row[q]] == row[q + 1]
        rest = np.setdiff1d(np.arange(8, 64), np.concatenate([queries, queries + 1]))
        assert (row[rest] >= cfg.num_keys + cfg.num_values).all()  # fillers only, never a key


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="did you mean 'fox-pro'"):
        parse_model("fox-por")
    with pytest.raises(ValueError, match="train_pairs"):
        MqarConfig(train_pairs=[20])  # 4 tokens a pair do not fit 32
    with pytest.raises(ValueError, match="preset"):
        config_from("huge")


def test_cli_trains_models_that_recall_far_above_chance(tmp_path, capsys):
    out = tmp_path / "mqar"
    assert main(["eval", "mqar", "--models", "transformer-pro,fox-pro:fgate=fixed", "--out", str(out),
                 "--no-progress"]) == 0
    data = json.loads((out / "mqar.json").read_text())
    cfg = MqarConfig()
    assert data["chance"] == pytest.approx(1 / 16)
    inside = cfg.eval_lengths.index(cfg.train_len)
    for model in data["models"]:
        params = [m["non_embedding_params"] for m in data["models"]]
        assert max(params) / min(params) < 1.02  # matched in parameters
        within = [row[inside] for row in model["accuracy"][:2]]  # trained pair counts at the training length
        assert min(within) > 0.8, model["label"]
    assert (out / "mqar.png").stat().st_size > 0 and "Transformer (Pro)" in (out / "mqar.md").read_text()
    # another process's results in the same folder are tabled together; another task's are refused
    assert main(["eval", "mqar", "--out", str(out), "--report-only", "--no-progress"]) == 0
    assert main(["eval", "mqar", "--out", str(out), "--report-only", "--seed", "3"]) == 2
    assert "another task" in capsys.readouterr().err
