import pytest

from foxformer.data.preparation import PrepareConfig, prepare
from foxformer.train.config import TrainConfig


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    """Byte-level tokens: GPT-2's 50,257-entry vocabulary made the embedding, the output layer and AdamW's state
    of the tiny models ~60 times their layers, and most of every training test's time."""
    out = tmp_path_factory.mktemp("data") / "pydoc"
    prepare(PrepareConfig(sources=["builtin:pydoc"], out_dir=str(out), tokenizer="bytes", val_fraction=0.1),
            progress=False)
    return str(out)


@pytest.fixture
def make_cfg(data_dir, tmp_path):
    """A tiny, fast run: 4 sequences of 32 tokens per step on the tiny FoX (Pro)."""

    def make(**kw) -> TrainConfig:
        base = dict(preset="fox-pro-tiny", data_dir=data_dir, out_dir=str(tmp_path / "run"), context=32,
                    batch_tokens=128, max_steps=8, lr=3e-3, eval_tokens=128, checkpoint_every_tokens=256,
                    eval_every_tokens=512, tensorboard=False, export_hf=False, progress=False)
        base.update(kw)
        return TrainConfig(**base)

    return make
