"""Shifting the forget-gate bias at inference, and measuring what it does beyond the training length.

A positive shift s raises every gate logit, f = sigmoid(logit + s) moves towards 1, decay slows and
the effective context lengthens (the FoX paper's suggestion for length extrapolation).
"""
from __future__ import annotations

import contextlib
from typing import Optional, Sequence

import torch

from foxformer.argtypes import setting_name
from foxformer.models.calls import backbone, fox_blocks
from foxformer.models.config import FoxConfig
from foxformer.models.official import OFFICIAL_TYPES


def check_forget_gates(model, purpose: str, name: str = "the model") -> None:
    """ValueError unless ``model`` is a foxformer model with forget gates, naming its kind: a sweep on a Transformer
    failed at its first nonzero shift, after the data had loaded and the zero shift's pass had run. ``purpose``: what
    needs the gates (the command or function); ``name``: the model as the user gave it."""
    config = getattr(model, "config", None)
    if not hasattr(backbone(model), "new_cache"):
        _refuse_kind(purpose, name, getattr(config, "model_type", None), type(model).__name__)
    _check_gates(config, purpose, name)


def check_saved_forget_gates(saved: Optional[dict], purpose: str, name: str = "the model") -> None:
    """check_forget_gates from a model's saved config (train.loading.saved_config), before its weights load or, for
    a Hub id, download. What the config cannot tell is left to check_forget_gates on the loaded model: no config, a
    checkpoint of the paper's own code (its gates known once converted), a config FoxConfig refuses (the load says
    why)."""
    if saved is None or saved.get("model_type") in OFFICIAL_TYPES:
        return
    kind = saved.get("model_type")
    if kind != FoxConfig.model_type:
        classes = saved.get("architectures")
        named = classes[0] if isinstance(classes, list) and classes and isinstance(classes[0], str) else "config.json"
        _refuse_kind(purpose, name, kind if isinstance(kind, str) else None, named)
    try:
        config = FoxConfig.from_dict(saved)
    except (ValueError, TypeError):
        return
    _check_gates(config, purpose, name)


def _refuse_kind(purpose: str, name: str, kind: Optional[str], named: str) -> None:
    raise ValueError(f"{purpose} needs a foxformer model with forget gates (FoX); {name} is "
                     f"{'a ' + kind if kind else 'no foxformer'} model ({named})")


def _check_gates(config, purpose: str, name: str) -> None:
    if not config.has_fgate:
        raise ValueError(f"{purpose} needs a model with forget gates (FoX), whose bias it shifts; {name} is a "
                         f"Transformer without them (attention={config.attention!r}, fgate={config.fgate!r})")


def _gates(model) -> list:
    return [block.attn.fgate for block in fox_blocks(model, "fgate_bias_shift")]


def _per_layer(shift, num_layers: int, name: str = "fgate_bias_shift") -> list:
    if isinstance(shift, torch.Tensor):
        shift = shift.detach().cpu().double()
        if shift.dim() == 0:
            return [float(shift)] * num_layers
        if shift.dim() in (1, 2) and shift.shape[0] == num_layers:
            return list(shift)
        raise ValueError(f"{name}: a tensor must be a scalar, [num_layers={num_layers}] or "
                         f"[num_layers, num_heads], got shape {tuple(shift.shape)}")
    if isinstance(shift, (int, float)) and not isinstance(shift, bool):
        return [float(shift)] * num_layers
    if isinstance(shift, Sequence) and len(shift) == num_layers:
        return list(shift)
    raise ValueError(f"{name}: expected a float, a list of {num_layers} (one per layer) or a nested "
                     f"list [num_layers][num_heads], got {shift!r}")


def set_fgate_bias_shift(model, shift, label: str = "{}") -> list[Optional[torch.Tensor]]:
    """Set the inference-time gate-logit shift of every layer; returns the previous shifts (for restore).

    shift: a float (whole model), a list / tensor [num_layers] (per layer) or [num_layers][num_heads]
    (per layer and head); None entries or 0 mean no shift. Layers without a forget gate must get 0.
    label: how errors name the setting (argtypes.setting_name): the keyword, or "--{}" a command's flag.
    """
    name = setting_name(label, "fgate_bias_shift")
    gates = _gates(model)
    values = _per_layer(shift, len(gates), name)
    # a list's (or tensor's) entry is named by its layer: "expected ..., got 3" said neither which layer nor what
    whole = isinstance(shift, (int, float)) or (isinstance(shift, torch.Tensor) and shift.dim() == 0)
    previous = [None if g is None else g.bias_shift for g in gates]
    try:
        for i, (gate, value) in enumerate(zip(gates, values)):
            value = 0.0 if value is None else value
            if gate is None:
                if bool(torch.as_tensor(value, dtype=torch.float64).ne(0).any()):
                    raise ValueError(f"{name}: layer {i} has no forget gate (softmax attention); "
                                     f"its shift must be 0")
                continue
            gate.set_bias_shift(value, name if whole else f"{name}[{i}]")
    except Exception:
        # A value rejected at layer i must not leave layers < i shifted: the caller gets the error and
        # no context manager is entered to undo them.
        for gate, value in zip(gates, previous):
            if gate is not None:
                gate.set_bias_shift(0.0 if value is None else value)
        raise
    return previous


@contextlib.contextmanager
def fgate_bias_shift(model, shift):
    """Context manager: the shift holds inside the block and the previous one comes back after it."""
    previous = set_fgate_bias_shift(model, shift)
    try:
        yield model
    finally:
        for gate, value in zip(_gates(model), previous):
            if gate is not None:
                gate.set_bias_shift(0.0 if value is None else value)


class HeldShift:
    """A shift held by the gates only inside ``with`` blocks (each forward of one generation), the model's own one
    outside them: a paused generation's shift does not reach another generation of the same model, nor the
    caller's forwards between its tokens. Checked (as set_fgate_bias_shift checks it, ``label`` as it names
    the setting) when made."""

    def __init__(self, model, shift, label: str = "{}") -> None:
        self.gates = _gates(model)
        own = [None if gate is None else gate.swap_bias_shift(None) for gate in self.gates]
        try:
            set_fgate_bias_shift(model, shift, label)
        finally:
            self.tensors = [None if gate is None else gate.swap_bias_shift(value)
                            for gate, value in zip(self.gates, own)]
        self.own: list = []

    def __enter__(self) -> "HeldShift":
        self.own = [None if gate is None else gate.swap_bias_shift(value)
                    for gate, value in zip(self.gates, self.tensors)]
        return self

    def __exit__(self, *exc) -> None:
        # read back: a forward moves a gate's shift to the device of its input
        self.tensors = [None if gate is None else gate.swap_bias_shift(value)
                        for gate, value in zip(self.gates, self.own)]


def bias_shift_sweep(model, tokens, shifts: Sequence[float], *, train_len: Optional[int] = None,
                     bins: int = 16, batch_size: int = 1, progress: bool = False) -> dict:
    """Per-token loss under each uniform shift in ``shifts``.

    tokens: int64 [N, T] evaluation sequences (T beyond the training length to see extrapolation).
    Returns {"shifts", "mean_loss", "loss_within" (positions < train_len), "loss_beyond" (>= train_len),
    "bin_edges", "binned_loss" [len(shifts)][bins]} as plain lists (JSON-ready). A model without forget gates is
    refused before any pass (check_forget_gates).
    """
    from foxformer.eval.loss import per_token_loss

    check_forget_gates(model, "bias_shift_sweep")
    if not shifts:
        raise ValueError("shifts: expected at least one value")
    # bins=0 wrote a result and a plot with no bin at all
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins: expected a positive number of position bins, got {bins!r}")
    result = {"shifts": [float(s) for s in shifts], "train_len": train_len, "mean_loss": [], "loss_within": [],
              "loss_beyond": [], "binned_loss": []}
    edges = None
    for s in shifts:
        with fgate_bias_shift(model, float(s)):
            loss = per_token_loss(model, tokens, batch_size=batch_size, progress=progress).double()
        mean = loss.mean(0)                                   # [T-1]
        T1 = mean.shape[0]
        if edges is None:
            edges = torch.linspace(0, T1, bins + 1).round().long().tolist()
            result["bin_edges"] = edges
        result["mean_loss"].append(float(mean.mean()))
        if train_len is not None and 0 < train_len < T1:
            result["loss_within"].append(float(mean[:train_len].mean()))
            result["loss_beyond"].append(float(mean[train_len:].mean()))
        else:
            result["loss_within"].append(float(mean.mean()))
            result["loss_beyond"].append(None)
        result["binned_loss"].append([float(mean[a:b].mean()) for a, b in zip(edges[:-1], edges[1:]) if b > a])
    return result
