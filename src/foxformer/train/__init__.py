"""Training: config, AdamW + token schedule, atomic checkpoints, DDP/FSDP2, and the loop.

Names are imported on first use (see foxformer._lazy): `foxformer train --help` needs none of them.
"""
from .._lazy import lazy_exports

_EXPORTS = {"CheckpointError": ".checkpoint", "latest_checkpoint": ".checkpoint", "load_checkpoint": ".checkpoint",
            "save_checkpoint": ".checkpoint", "TrainConfig": ".config", "load_config": ".config",
            "evaluate": ".validation", "train": ".loop"}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = list(_EXPORTS)
