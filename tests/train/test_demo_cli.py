import json
import os

import pytest

from foxformer.cli import main


def test_train_cli_writes_resolved_config_and_summary(data_dir, tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"preset: fox-pro-tiny\ndata_dir: {data_dir}\ncontext: 32\nbatch_tokens: 128\n"
                   f"tensorboard: false\nexport_hf: false\n")
    out = str(tmp_path / "cli-run")
    rc = main(["train", "--config", str(cfg), "--out", out, "--max-steps", "2", "--lr", "1e-3", "--eval-tokens", "64",
               "--no-progress"])
    assert rc == 0
    printed = capsys.readouterr().out
    summary = json.loads(printed[printed.index("{\n"):])
    assert summary["step"] == 2 and summary["world_size"] == 1
    assert os.path.exists(os.path.join(out, "config.yaml"))
    assert main(["train", "--config", str(cfg), "--out", out, "--set", "lrr=1"]) == 2
    assert "did you mean 'lr'" in capsys.readouterr().err
    assert main(["export-hf", out, "--out", str(tmp_path / "hf")]) == 0
    assert os.path.exists(tmp_path / "hf" / "config.json")


def test_demo_end_to_end_small(tmp_path, capsys):
    from foxformer.demo import run_demo

    out = str(tmp_path / "demo")
    summary = run_demo(out=out, minutes=0.02, device="cpu", progress=False, sources=["builtin:pydoc"],
                       overrides={"context": 64, "batch_tokens": 256, "micro_batch_size": 4, "eval_tokens": 256})
    assert set(summary["models"]) == {"fox-pro-tiny", "transformer-pro-tiny"}
    for m in summary["models"].values():
        assert m["step"] >= 4 and m["val_loss"] < 5.8  # below the uniform 257-way loss (5.55 + margin)
    report = open(os.path.join(out, "report.md")).read()
    assert "FoX (Pro)" in report and "Transformer (Pro)" in report and "demo.png" in report
    assert os.path.getsize(os.path.join(out, "demo.png")) > 10_000
    data = json.load(open(os.path.join(out, "demo_summary.json")))
    assert len(data["per_position"]["fox-pro-tiny"]) == 63
    # no bar without progress: transformers' weight-loading bar came through when the demo read its exports
    assert "Loading weights" not in capsys.readouterr().err


@pytest.mark.parametrize("flag,value", [
    pytest.param("minutes", "inf", id="minutes-inf"), pytest.param("minutes", "nan", id="minutes-nan"),
    pytest.param("minutes", "0", id="minutes-zero"), pytest.param("context", "0", id="context-zero"),
    pytest.param("context", "-8", id="context-negative"), pytest.param("context", "1", id="context-one"),
    pytest.param("device", "cuda", id="device-without-gpu"), pytest.param("tokenizer", "nope", id="tokenizer")])
def test_demo_refuses_a_bad_setting_by_its_flag_before_any_work(tmp_path, capsys, monkeypatch, flag, value):
    """The demo's errors named run_demo's keyword ("error: minutes: ..."), not the flag the user typed; `--context
    1` and `--device cuda` on a machine without a GPU failed only after the data preparation (the latter as torch's
    assertion)."""
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    out = tmp_path / "demo"
    assert main(["demo", f"--{flag}", value, "--out", str(out), "--no-progress"]) == 2
    assert f"error: --{flag}: " in capsys.readouterr().err
    assert not out.exists()


def test_demo_names_out_for_a_folder_it_cannot_write(tmp_path, capsys):
    """The data preparation's refusal of the demo's data folder said "out_dir", a name the demo has no flag for."""
    taken = tmp_path / "a-file"
    taken.write_text("")
    assert main(["demo", "--out", str(taken), "--device", "cpu", "--no-progress"]) == 2
    assert f"error: --out: '{taken / 'data-bytes'}' cannot be created" in capsys.readouterr().err


@pytest.mark.parametrize("context, batch", [(300, 8100), (256, 8192), (20000, 20000)])
def test_demo_fits_its_batch_to_another_context(tmp_path, monkeypatch, context, batch):
    """`demo --context 300` failed after preparing the data and probing the speed, with "batch_tokens: 8192 is
    not a multiple of context=300 ... give 8100": a setting the demo has no flag for."""
    from foxformer import demo

    planned = {}

    def plan(out, minutes, device, geo, vocab_size, log):
        planned.update(geo)
        raise KeyboardInterrupt  # enough: what follows is training

    monkeypatch.setattr(demo, "_plan", plan)
    with pytest.raises(KeyboardInterrupt):
        demo.run_demo(out=str(tmp_path / "demo"), minutes=0.1, device="cpu", progress=False,
                      sources=["builtin:pydoc"], overrides={"context": context})
    assert (planned["context"], planned["batch_tokens"], planned["micro_batch_size"]) == (context, batch, 0)
    from foxformer.train.config import TrainConfig

    TrainConfig(preset="fox-pro-tiny", context=context, batch_tokens=batch, micro_batch_size=0,
                max_steps=1).validate()


@pytest.mark.parametrize("tokenizer, unit", [("bytes", "nats/byte"), ("gpt2", "nats/token")])
def test_demo_plot_gives_the_loss_per_byte_or_per_token(tmp_path, monkeypatch, tokenizer, unit):
    """The CPU demo's byte-level losses were labelled nats/token, beside a report that says nats per byte."""
    import matplotlib.figure

    from foxformer import demo

    drawn = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: drawn.append(fig))
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "step": 1, "tokens": 64, "val_loss": 2.0}) + "\n")
    results = {p: {"out_dir": str(run), "per_position": [3.0, 2.5, 2.0, 1.8], "val_loss": 2.0} for p in demo.MODELS}
    demo._plot(str(tmp_path), results, tokenizer)
    assert [ax.get_ylabel() for ax in drawn[0].axes] == [f"loss ({unit})", f"validation loss L(i) ({unit})"]
    # the tokens in millions, as the report's curve (matplotlib's own ticks put a "1e6" in the corner)
    assert drawn[0].axes[0].get_xlabel() == "training tokens [M]"
    assert list(drawn[0].axes[0].lines[0].get_xdata()) == [64 / 1e6]


@pytest.mark.parametrize("asked, gpu", [("cuda:1", 1), ("cuda", None)])
def test_demo_probes_trains_and_evaluates_on_the_gpu_it_was_given(tmp_path, monkeypatch, asked, gpu):
    """run_demo(device="cuda:1") kept only the type: it probed, trained and evaluated on cuda:0. Every place the demo
    puts a model or a run gets the GPU named (no GPU here: what it would pass down is recorded instead)."""
    import torch

    import foxformer.data.dataset
    import foxformer.data.preparation
    import foxformer.train.distributed
    import foxformer.train.loop
    import foxformer.train.validation
    from foxformer import demo
    from foxformer.models import FoxForCausalLM

    placed = []

    class Model:
        def to(self, device):
            placed.append(("eval model", str(torch.device(device))))
            return self

    def train(cfg):
        placed.append(("train", cfg.device))
        return {"out_dir": str(tmp_path / cfg.preset), "hf_dir": "unused"}

    def evaluate(model, val, n, mbs, info, bf16):
        placed.append(("evaluate", str(info), bf16))
        return 3.0, torch.ones(4)

    def resolve(device, label="device"):
        assert device == asked
        return torch.device(asked)

    monkeypatch.setattr(foxformer.train.distributed, "resolve_device", resolve)
    monkeypatch.setattr(foxformer.train.distributed, "init_distributed", lambda device, mode: str(torch.device(device)))
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: placed.append(("current", str(device))))
    monkeypatch.setattr(foxformer.data.preparation, "prepare", lambda cfg, progress: {"vocab_size": 50257})
    monkeypatch.setattr(demo, "_probe_step",
                        lambda preset, geo, device, vocab: placed.append(("probe", device)) or (lambda: 8192))
    monkeypatch.setattr(foxformer.train.loop, "train", train)
    monkeypatch.setattr(FoxForCausalLM, "from_pretrained", classmethod(lambda cls, path: Model()))
    monkeypatch.setattr(foxformer.data.dataset, "TokenDataset", lambda *a, **k: None)
    monkeypatch.setattr(foxformer.train.validation, "evaluate", evaluate)
    monkeypatch.setattr(demo, "_plot", lambda out, results, tokenizer: "demo.png")
    monkeypatch.setattr(demo, "_report", lambda *a: "report.md")
    summary = demo.run_demo(out=str(tmp_path / "demo"), minutes=0.1, device=asked, progress=False)
    said = asked if gpu is not None else "cuda"
    probes = [("probe", said)] * 2
    runs = [(step, said) if step != "evaluate" else (step, said, True) for step in ("train", "eval model", "evaluate")]
    assert placed == [("current", "cuda:1")] * (gpu is not None) + probes + runs * 2
    # the GPU's defaults (GPT-2 tokens, 2048-token context), and a plan another GPU of the machine keeps
    assert (summary["plan"]["device"], summary["plan"]["tokenizer"], summary["plan"]["context"]) == ("cuda", "gpt2",
                                                                                                    2048)
