"""Against the FoX paper's own model class, where a copy of their code is at hand (FOX_OFFICIAL_SRC, default
.official/src: see scripts/official_gpu_check.py; skipped otherwise). Their forward needs CUDA, so on the CPU
this checks what does not run it: our official-layout checkpoints have exactly their parameter names and shapes,
and a model of theirs, saved with their own config.to_dict(), converts to logits equal to the fp64 forward of
official_reference.py on their weights."""
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from foxformer.models.official import load_official

from .official_reference import FOX, VARIANTS, official_config, official_logits, random_state

SRC = Path(os.environ.get("FOX_OFFICIAL_SRC", Path(__file__).resolve().parents[2] / ".official" / "src"))
FOX_VARIANTS = [name for name, v in VARIANTS.items() if v["model_type"] == FOX]


@pytest.fixture(scope="module")
def their_classes():
    if not SRC.is_dir():
        pytest.skip(f"no copy of the paper's code at {SRC} (set FOX_OFFICIAL_SRC)")
    added = [str(SRC), str(SRC.parent / "site")]  # site: einops, which their code imports
    sys.path[:0] = added
    try:
        from forgetting_transformer.model.forgetting_transformer.configuration_forgetting_transformer import \
            ForgettingTransformerConfig
        from forgetting_transformer.model.forgetting_transformer.modeling_forgetting_transformer import \
            ForgettingTransformerForCausalLM
    except ImportError as e:
        pytest.skip(f"their code does not import here ({e})")
    finally:
        del sys.path[:len(added)]
    return ForgettingTransformerConfig, ForgettingTransformerForCausalLM


def _theirs(their_classes, variant):
    config_cls, model_cls = their_classes
    cfg = {k: v for k, v in official_config(variant).items() if k != "model_type"}
    torch.manual_seed(0)
    try:
        return model_cls(config_cls(**cfg, fuse_cross_entropy=False)).eval()
    except AttributeError as e:  # tied embeddings: their _tied_weights_keys is a list, transformers 5 wants a dict
        pytest.skip(f"their class does not build {variant} with this transformers ({e})")


@pytest.mark.parametrize("variant", FOX_VARIANTS)
def test_our_official_layout_is_theirs(their_classes, variant):
    ours = random_state(official_config(variant))
    theirs = _theirs(their_classes, variant).state_dict()
    if official_config(variant)["tie_word_embeddings"]:
        theirs.pop("lm_head.weight")
    assert {k: tuple(v.shape) for k, v in theirs.items()} == {k: tuple(v.shape) for k, v in ours.items()}


@pytest.mark.parametrize("variant", FOX_VARIANTS)
def test_a_model_of_theirs_converts(their_classes, variant, tmp_path):
    model = _theirs(their_classes, variant)
    state = random_state(official_config(variant), seed=5)
    model.load_state_dict(state, strict=False)
    config = model.config.to_dict()
    (tmp_path / "config.json").write_text(json.dumps(config, default=str))
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    ids = torch.randint(0, config["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(4))
    ref = official_logits(config, model.state_dict(), ids)
    with torch.no_grad():
        assert (load_official(str(tmp_path)).double()(ids).logits - ref).abs().max() < 1e-5
