import pytest

from foxformer.train.config import TrainConfig, load_config, parse_count, parse_overrides
from foxformer.train.optim import learning_rate, param_groups


def test_schedule_warmup_then_cosine_in_tokens():
    cfg = TrainConfig(lr=1.0, min_lr_ratio=0.1, batch_tokens=1000, context=100, total_tokens=100_000,
                      warmup_tokens=10_000)
    assert learning_rate(5_000, cfg) == pytest.approx(0.5)
    assert learning_rate(10_000, cfg) == pytest.approx(1.0)
    assert learning_rate(55_000, cfg) == pytest.approx(0.55)
    assert learning_rate(100_000, cfg) == pytest.approx(0.1)
    values = [learning_rate(t, cfg) for t in range(10_000, 100_001, 1000)]
    assert all(a >= b for a, b in zip(values, values[1:]))


@pytest.mark.parametrize("text,value", [("512Ki", 524288), ("16K", 16000), ("1.5M", 1_500_000), (4096, 4096)],
                         ids=["Ki", "K", "decimal-M", "int"])
def test_parse_count(text, value):
    assert parse_count(text, "x") == value


@pytest.mark.parametrize("text,value", [("1e6", 10**6), ("2.5e9", 2_500_000_000), ("1E3", 1000)],
                         ids=["1e6", "decimal-exponent", "upper-case-E"])
def test_parse_count_scientific_notation(text, value):
    # YAML 1.1 reads 1e6 (no dot) as the string "1e6"
    assert parse_count(text, "x") == value


def test_yaml_numbers_that_yaml_reads_as_strings(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("total_tokens: 1e6\nmax_steps: 1e3\nseed: '7'\nkeep_last: '3'\nlog_every: '5'\n"
                    "micro_batch_size: '2'\nvocab_size: '320'\ncontext: 128\nbatch_tokens: 1024\n")
    cfg = load_config(str(path))
    assert (cfg.total_tokens, cfg.max_steps, cfg.seed, cfg.keep_last) == (10**6, 1000, 7, 3)
    assert (cfg.log_every, cfg.micro_batch_size, cfg.vocab_size) == (5, 2, 320)
    assert all(type(v) is int for v in (cfg.max_steps, cfg.seed, cfg.keep_last, cfg.log_every,
                                        cfg.micro_batch_size, cfg.vocab_size))


def test_overrides_and_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("preset: fox-pro-125m\ncontext: 16Ki\nbatch_tokens: 512Ki\ntotal_tokens: 1Gi\n"
                    "model: {attention_backend: torch}\n")
    cfg = load_config(str(path), parse_overrides(["lr=2e-3", "model.hidden_size=128", "compile=true"]))
    assert (cfg.context, cfg.batch_tokens, cfg.total_tokens) == (16384, 524288, 2**30)
    assert cfg.lr == 2e-3 and cfg.compile is True
    assert cfg.model == {"attention_backend": "torch", "hidden_size": 128}
    assert cfg.warmup == 2**30 // 10


def test_no_weight_decay_on_norms_biases_and_gates():
    from foxformer.models import FoxForCausalLM, get_preset

    model = FoxForCausalLM(get_preset("fox-pro-tiny", vocab_size=128))
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    no = {names[id(p)] for p in no_decay["params"]}
    yes = {names[id(p)] for p in decay["params"]}
    assert any("fgate" in n for n in no) and any("norm" in n for n in no) and any(n.endswith("bias") for n in no)
    assert not any("fgate" in n or "norm" in n or n.endswith("bias") for n in yes)
    assert any("mlp.gate_proj" in n for n in yes) and any("q_proj" in n for n in yes)
    assert len(no) + len(yes) == len(names)


@pytest.mark.parametrize("key", ["max_minutes", "grad_clip", "lr", "weight_decay", "peak_flops"])
@pytest.mark.parametrize("raw", ["nan", ".nan", ".inf"], ids=["nan", "yaml-nan", "inf"])
def test_non_finite_numbers_are_refused(key, raw):
    # max_minutes=nan never ended the run (elapsed > nan is False), grad_clip=nan switched clipping off
    with pytest.raises(ValueError, match=key):
        load_config(overrides=parse_overrides([f"{key}={raw}", "max_steps=1"]))


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:1"])
def test_device_takes_one_gpu_of_several(device):
    assert TrainConfig(total_tokens=1000, device=device).device == device


@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:x", "cpu:0", 1])
def test_device_spelling_is_checked(device):
    with pytest.raises(ValueError, match="cuda:N"):
        TrainConfig(total_tokens=1000, device=device)


def test_one_named_gpu_under_torchrun_is_refused(monkeypatch):
    """Each torchrun rank takes the GPU of its LOCAL_RANK: a device naming one GPU would put every rank on it."""
    import torch

    from foxformer.train import distributed
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="LOCAL_RANK"):
        distributed.init_distributed("cuda:1")


@pytest.mark.parametrize("master,said", [(None, "MASTER_ADDR expected"), ("127.0.0.1", "1/2 clients joined")])
def test_world_size_without_a_launcher_says_to_use_torchrun(monkeypatch, master, said):
    """WORLD_SIZE set by hand (or left from another job): torch's own errors named a variable or a wait, not
    torchrun; the second process never comes, so rank 0 waits for it until the timeout."""
    import socket

    from foxformer.train import distributed
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    if master is not None:
        with socket.socket() as s:
            s.bind((master, 0))
            port = s.getsockname()[1]
        monkeypatch.setenv("MASTER_ADDR", master)
        monkeypatch.setenv("MASTER_PORT", str(port))
    with pytest.raises(ValueError, match=rf"WORLD_SIZE=2 makes this one of 2 processes, but they could not meet "
                                         rf"\(.*{said}.*\); start them with torchrun --nproc-per-node N .* or "
                                         rf"unset WORLD_SIZE to train in one process"):
        distributed.init_distributed("cpu", timeout_minutes=0.02)


@pytest.mark.parametrize("device,index", [("cuda", 0), ("cuda:1", 1)])
def test_a_single_process_takes_the_named_gpu(monkeypatch, device, index):
    import torch

    from foxformer.train import distributed
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setenv("WORLD_SIZE", "1")
    info = distributed.init_distributed(device)
    assert info.device == torch.device("cuda", index) and chosen == [info.device]


def test_batch_tokens_off_the_context_names_the_nearest_multiple():
    from foxformer.train.config import TrainConfig

    with pytest.raises(ValueError, match=r"3000 is not a multiple of context=256 \(a step holds whole sequences\): "
                                         r"give 3072"):
        TrainConfig(context=256, batch_tokens=3000, max_steps=1, data_dir="d", out_dir="o").validate()


@pytest.mark.parametrize("device, conflict", [("cpu", False), ("cuda", True)], ids=["cpu", "cuda"])
def test_precision_auto_and_its_resolved_value_resume_alike(device, conflict):
    """A CPU run saved with precision auto refused `--precision fp32`, the precision it had computed in."""
    from foxformer.train.config import resume_conflicts

    saved = TrainConfig(max_steps=1, data_dir="d", out_dir="o", device=device)
    new = TrainConfig(max_steps=1, data_dir="d", out_dir="o", device=device, precision="fp32")
    assert ("precision" in resume_conflicts(saved, new)) is conflict


def test_a_model_gradient_checkpointing_override_points_to_activation_checkpointing():
    """`--model gradient_checkpointing=true` was saved in the run's model config and exported, while the loop set
    every layer's flag from activation_checkpointing (false): the run trained without it."""
    with pytest.raises(ValueError, match="activation_checkpointing"):
        load_config(None, {"max_steps": 1, **parse_overrides(["model.gradient_checkpointing=true"])})
    assert TrainConfig(max_steps=1, activation_checkpointing=True).activation_checkpointing
