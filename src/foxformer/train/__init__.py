"""Training: config, AdamW + token schedule, atomic checkpoints, DDP/FSDP2, and the loop."""
from .checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint
from .config import TrainConfig, load_config
from .loop import evaluate, train

__all__ = ["CheckpointError", "latest_checkpoint", "load_checkpoint", "save_checkpoint", "TrainConfig",
           "load_config", "evaluate", "train"]
