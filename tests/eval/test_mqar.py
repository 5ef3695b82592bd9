"""`foxformer eval mqar`: the synthetic recall task's sequences, and small models that learn it on the CPU."""
import json

import numpy as np
import pytest

from foxformer.cli import main
from foxformer.data.layout import EVAL_MARK
from foxformer.eval import mqar
from foxformer.eval.mqar import IGNORE, MqarConfig, config_from, mqar_batch, parse_model, seed_table, table


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
    """The Transformer, the fixed gate and the data-dependent gate started from timescales all learn the toy
    task; the gates' reach is logged while they train (a gate that never opens is visible)."""
    out = tmp_path / "mqar"
    assert main(["eval", "mqar", "--models", "transformer-pro,fox-pro:fgate=fixed,fox-pro:fgate_bias_init=timescales",
                 "--out", str(out), "--no-progress"]) == 0
    data = json.loads((out / "mqar.json").read_text())
    cfg = MqarConfig()
    assert data["chance"] == pytest.approx(1 / 16)
    inside = cfg.eval_lengths.index(cfg.train_len)
    for model in data["models"]:
        params = [m["non_embedding_params"] for m in data["models"]]
        assert max(params) / min(params) < 1.02  # matched in parameters
        within = [row[inside] for row in model["accuracy"][:2]]  # trained pair counts at the training length
        assert min(within) > 0.8, model["label"]
    assert (out / "mqar.png").stat().st_size > 0 and (out / "mqar_training.png").stat().st_size > 0
    assert "Transformer (Pro)" in (out / "mqar.md").read_text() and "stopped" not in (out / "mqar.md").read_text()
    logged = {m["label"]: ["gate_log_f" in h for h in m["history"]] for m in data["models"]}
    assert not any(logged["Transformer (Pro)"]) and all(logged["FoX (Pro), fgate_bias_init=timescales"])
    gates = data["models"][[m["label"] for m in data["models"]].index("FoX (Pro), fgate=fixed")]["history"][-1]
    assert len(gates["gate_log_f"]) == cfg.num_layers and all(v < 0 for v in gates["gate_log_f"][0])
    # another process's results in the same folder are tabled together; another task's are refused
    assert main(["eval", "mqar", "--out", str(out), "--report-only", "--no-progress"]) == 0
    assert main(["eval", "mqar", "--out", str(out), "--report-only", "--seed", "3"]) == 2
    assert "another task" in capsys.readouterr().err


def test_table_says_which_models_a_time_limit_stopped():
    """Results of unequal training (a time limit hit at 45% of the steps) must not pass as the preset's."""
    cfg = MqarConfig(eval_lengths=[32], eval_pairs=[2])
    done = {"label": "A", "non_embedding_params": 1e5, "steps_done": cfg.steps, "accuracy": [[1.0]],
            "history": [{"step": cfg.steps, "gate_log_f": [[-0.5, -1e-3], [-0.1, -0.7]]}]}
    cut = {"label": "B", "non_embedding_params": 1e5, "steps_done": 54, "accuracy": [[0.0]], "history": []}
    text = table([done, cut], cfg)
    row_a, row_b = (line for line in text.splitlines() if line.startswith(("| A", "| B")))
    assert f"| {cfg.steps} | 1e+03 / 10 |" in row_a  # each layer's longest timescale, -1 / mean log f
    assert f"54 of {cfg.steps} (stopped)" in row_b and "Stopped early" in text and ": B." in text


def test_seed_table_spreads_each_cell_over_seeds_and_refuses_another_task(tmp_path, capsys):
    cfg = MqarConfig(eval_lengths=[32, 64], eval_pairs=[2, 16])
    dirs = []
    for seed, (acc_a, steps_b) in enumerate([(1.0, 120), (0.5, 60), (0.0, 120)]):
        d = tmp_path / f"mqar_s{seed}"
        d.mkdir()
        models = [{"label": "A", "steps_done": cfg.steps, "accuracy": [[acc_a, 1.0], [None, 0.25]]},
                  {"label": "B", "steps_done": steps_b, "accuracy": [[0.0, 0.0], [None, 0.0]]}]
        task = MqarConfig(eval_lengths=[32, 64], eval_pairs=[2, 16], seed=seed).task()
        (d / "mqar.json").write_text(json.dumps({"task": task, "models": models}))
        dirs.append(str(d))
    text = seed_table(dirs)
    row_a, row_b = (line for line in text.splitlines() if line.startswith(("| A", "| B")))
    # cells 2@32, 2@64, 16@64 (16 pairs do not fit 32 tokens); A's 2@32 reads 1.0, 0.5, 0.0 over the seeds
    assert row_a == f"| A | 3 | {cfg.steps} | 0.50 ± 0.50 | 1.00 ± 0.00 | 0.25 ± 0.00 |"
    assert row_b.startswith(f"| B | 3 | 60 of {cfg.steps} (stopped) |")
    assert "seeds [0, 1, 2]" in text
    other = tmp_path / "other"
    other.mkdir()
    (other / "mqar.json").write_text(json.dumps({"task": MqarConfig(seed=5).task(), "models": []}))
    with pytest.raises(ValueError, match="another task"):
        seed_table(dirs + [str(other)])
    with pytest.raises(ValueError, match="repeat"):
        seed_table(dirs + dirs[:1])
    # the command pools them: mqar_seeds.md in --out, nothing trained
    from foxformer.cli import main
    assert main(["eval", "mqar", "--pool", *dirs, "--out", str(tmp_path / "pooled")]) == 0
    assert (tmp_path / "pooled" / "mqar_seeds.md").read_text() == text
    # only the table, as `foxformer eval --help` says (it said every subcommand wrote JSON and plots), and the mark
    # by which a source folder's walk passes over the folder: the table is Markdown, read as a document
    assert sorted(f.name for f in (tmp_path / "pooled").iterdir()) == [EVAL_MARK, "mqar_seeds.md"]
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    assert "`mqar --pool` writes only its table, mqar_seeds.md" in " ".join(capsys.readouterr().out.split())
    # a refused pooling left the earlier table empty (the file was opened before the table was made)
    assert main(["eval", "mqar", "--pool", *dirs, str(other), "--out", str(tmp_path / "pooled")]) == 2
    assert (tmp_path / "pooled" / "mqar_seeds.md").read_text() == text
    assert main(["eval", "mqar", "--pool", *dirs, "--out", str(tmp_path / "pooled")]) == 0
    assert f"note: replacing {tmp_path / 'pooled' / 'mqar_seeds.md'} (written " in capsys.readouterr().err


def test_a_rerun_of_another_task_into_the_same_out_is_refused_before_training(tmp_path, capsys, monkeypatch):
    """It trained every model, overwrote the earlier task's result files with its own, then refused the folder."""
    out = tmp_path / "mqar"
    base = ["eval", "mqar", "--models", "transformer-pro", "--out", str(out), "--no-progress"]
    assert main(base + ["--steps", "12"]) == 0
    earlier = (out / "models" / "transformer-pro.json").read_text()
    capsys.readouterr()
    assert main(base + ["--steps", "13"]) == 2
    assert "another task" in capsys.readouterr().err
    assert (out / "models" / "transformer-pro.json").read_text() == earlier
    assert "replacing" not in capsys.readouterr().err  # the first run wrote into an empty folder
    # the same task again replaces the model's result and the report, and says so, as the other eval commands do
    # (the model trained as before: its training is the earlier one's result)
    monkeypatch.setattr(mqar, "run_model", lambda *args, **kwargs: json.loads(earlier)["result"])
    assert main(base + ["--steps", "12"]) == 0
    err = capsys.readouterr().err
    for path in (out / "models" / "transformer-pro.json", out / "mqar.json"):
        assert f"note: replacing {path} (written " in err, err


@pytest.mark.parametrize("preset, warmup", [("toy", 10), ("mid", 50)])
def test_steps_below_the_warm_up_name_the_steps_flag(preset, warmup, tmp_path, capsys):
    """`--steps 5` was refused with "lr / warmup_steps: ...": the command has no flag for the warm-up."""
    assert main(["eval", "mqar", "--preset", preset, "--steps", str(warmup - 1), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: --steps: expected at least {warmup}, the steps over which the learning rate warms up, "
                   f"got {warmup - 1}")
    assert not (tmp_path / "m").exists()
    with pytest.raises(ValueError, match="^lr: expected a positive learning rate, got 0.0$"):
        MqarConfig(lr=0.0)
    with pytest.raises(ValueError, match="^warmup_steps: expected a non-negative integer, got -1$"):
        MqarConfig(warmup_steps=-1)


def test_a_bad_override_of_a_later_model_is_refused_before_the_first_trains(tmp_path, capsys):
    out = tmp_path / "mqar"
    assert main(["eval", "mqar", "--models", "transformer-pro,fox-pro:fgate=fixd", "--steps", "12", "--out", str(out),
                 "--no-progress"]) == 2
    assert "fgate" in capsys.readouterr().err
    assert not out.exists()


def test_models_flag_takes_several_overrides_of_one_model_and_refuses_a_repeat(tmp_path, capsys):
    """The second override of "fox-llama:fgate=fixed,rope=true" was read as a model kind 'rope=true'."""
    from foxformer.argtypes import model_specs

    assert model_specs("fox-llama:fgate=fixed,rope=true,transformer-pro,fox-pro:fgate=fixed") == [
        "fox-llama:fgate=fixed,rope=true", "transformer-pro", "fox-pro:fgate=fixed"]
    out = tmp_path / "mqar"
    assert main(["eval", "mqar", "--models", "fox-pro:fgate=fixed,fgate_tmax=64", "--steps", "12", "--out", str(out),
                 "--no-progress"]) == 0
    assert "FoX (Pro), fgate=fixed, fgate_tmax=64 |" in (out / "mqar.md").read_text()
    with pytest.raises(ValueError, match="more than once"):
        MqarConfig(models=["fox-pro", "fox-pro"])


def test_a_model_may_have_its_own_depth_and_width_but_not_the_task_s_vocabulary():
    """`--models fox-pro:num_layers=3` failed in "bad override (sized_config() got multiple values for argument
    'num_layers')": the task's depth and width are a model's defaults, which its spec may override (sized at its
    own size: heads and the Pro MLP width follow), while the vocabulary and positions are the task's."""
    from foxformer.models import sized_config

    cfg = MqarConfig()
    deeper = mqar.model_config("fox-pro:num_layers=3,hidden_size=128", cfg)
    assert deeper.to_dict() == sized_config("fox-pro", 3, 128, vocab_size=cfg.vocab_size,
                                            max_position_embeddings=deeper.max_position_embeddings).to_dict()
    with pytest.raises(ValueError, match=r"^models fox-pro:vocab_size=3: vocab_size is the task's \(num_keys \+ "
                                         r"num_values \+ num_fillers: 36\); leave it out$"):
        mqar.model_config("fox-pro:vocab_size=3", cfg)


def test_a_stopped_model_is_marked_in_the_plots_and_the_json_and_the_seed_is_stated(tmp_path, monkeypatch):
    """The plots showed a model stopped at 45% of its steps under its plain label, beside the finished ones."""
    import matplotlib.axes

    from foxformer.eval import mqar

    labels, titles = [], []
    real_plot, real_title = matplotlib.axes.Axes.plot, matplotlib.figure.Figure.suptitle
    monkeypatch.setattr(matplotlib.axes.Axes, "plot",
                        lambda self, *a, **k: (labels.append(k.get("label")), real_plot(self, *a, **k))[1])
    monkeypatch.setattr(matplotlib.figure.Figure, "suptitle",
                        lambda self, t, **k: (titles.append(t), real_title(self, t, **k))[1])
    cfg = MqarConfig(eval_lengths=[32], eval_pairs=[2], seed=4)
    (tmp_path / "models").mkdir()
    for label, done in (("A", cfg.steps), ("B", 54)):
        result = {"model": label, "label": label, "non_embedding_params": 1e5, "steps_done": done, "train_s": 1.0,
                  "accuracy": [[0.5]], "history": [{"step": done, "loss": 1.0, "accuracy": 0.5, "pairs": 2}]}
        (tmp_path / "models" / f"{label}.json").write_text(json.dumps({"task": cfg.task(), "result": result}))
    data = mqar.report(str(tmp_path), cfg)
    assert [m["stopped"] for m in data["models"]] == [False, True]
    assert "A" in labels and f"B (stopped at 54 of {cfg.steps} steps)" in labels and "B" not in labels
    assert len(titles) == 2 and all(f"{cfg.steps} steps, seed 4" in t for t in titles)
    assert "seed 4, 32 sequences a cell" in (tmp_path / "mqar.md").read_text()
