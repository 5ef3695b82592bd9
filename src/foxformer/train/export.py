"""A run's weights as a Hugging Face model folder: at the end of training, and by `foxformer export-hf`."""

from __future__ import annotations

from ..paths import check_export_dir, export_writer
from .card import training_facts


def export_hf(model_cfg, model_sd: dict, out: str, run_dir: str | None = None, step: int | None = None) -> str:
    """Save a full state dict as a Hugging Face model directory (``from_pretrained`` loads it; with
    ``trust_remote_code=True`` also where foxformer is not installed, and with its tokenizer files); its model card
    says how ``run_dir`` trained it up to ``step``, the checkpoint's (default: the run's last logged step)."""
    from ..models import FoxForCausalLM
    from ..models.card import write_card

    earlier = check_export_dir(out, "export")
    model = FoxForCausalLM(model_cfg)
    model.load_state_dict(model_sd, strict=True)
    with export_writer(out, earlier) as tmp:
        model.save_pretrained(tmp)
        if run_dir is not None:
            write_card(tmp, model_cfg, training_facts(run_dir, step), replace=True)
    return out
