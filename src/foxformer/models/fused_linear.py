"""One matrix product for the Linear layers that read the same input.

In one-token decode steps (``FusedLinears``): at batch 1 a decode step's products have one row, and on an H200 each
costs one launch of about 4 us however wide it is: the batch-1 profile of FoX (Pro) 125M at 32K
(docs/bench/history.md, "CUDA-graph decoding") counts 15 matrix-product kernels a layer, 0.64 of a 1.98 ms step,
seven of them for the projections of the attention's input alone (q, k, v, the output gate, the forget gate, the two
token-shift gates). ``FusedLinears`` runs such a group as one product over a concatenated copy of the weights. The
copy is not a parameter (it is in no state dict, and no gradient reaches it: callers use it without gradients only),
and it is made again whenever a source changed: a weight written in place (an optimizer step, ``load_state_dict``),
replaced or moved, or a layer swapped for another module or given hooks.

In training and prefill (``joint_linear``, FoxConfig.joint_input_projections, and joint_gate_projections for the
gates' products alone): the weights are concatenated in the graph, so gradients reach each of them. The FoX (Pro)
125M training step's profile at 16K (thirty-second session, docs/bench/profile_model_headdims_7f71b0f/) spends 5.5 ms
of its 300 on the three 12-column gate projections (cuBLAS's sm_80 ``align2`` kernels, 45 to 62 us each, forward and
backward), and sums seven input gradients.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn


def _rewired(lin: nn.Module) -> bool:
    """Whether calling ``lin`` runs more than its class's forward: hooks of its own, or a forward set on the
    instance (how accelerate's offloading wraps a layer). A product that does not call the layer would skip them."""
    return bool(lin._forward_pre_hooks or lin._forward_hooks or lin._backward_pre_hooks or lin._backward_hooks
                or "forward" in vars(lin))


def _plain(lin: nn.Module) -> bool:
    """A Linear whose forward is nn.Linear's (not a subclass that computes something else, e.g. an adapter, nor
    a rewired layer) with plain (not sharded) tensors."""
    return (isinstance(lin, nn.Linear) and type(lin).forward is nn.Linear.forward and not _rewired(lin)
            and all(type(p.data) is torch.Tensor for p in lin.parameters(recurse=False)))


def _shareable(linears: Sequence[nn.Linear]) -> bool:
    """Plain Linear layers (_plain) whose parameters share one dtype and device."""
    params = [p for lin in linears for p in (lin.weight, lin.bias) if p is not None]
    return (all(_plain(lin) for lin in linears)
            and all(p.dtype == params[0].dtype and p.device == params[0].device for p in params))


def _concat(linears: Sequence[nn.Linear], pad: int = 0) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(weight [sum of out_features + pad, in_features], bias or None): the layers' weights one above the other,
    then pad rows of zeros; bias-free layers (and the pad) get zeros in the bias when any layer has one."""
    weight = torch.cat([lin.weight for lin in linears] + [linears[0].weight.new_zeros(pad, linears[0].in_features)])
    if all(lin.bias is None for lin in linears):
        return weight, None
    return weight, torch.cat([lin.weight.new_zeros(lin.out_features) if lin.bias is None else lin.bias
                              for lin in linears] + [linears[0].weight.new_zeros(pad)])


# Output columns of a joint product are padded to a multiple of 8: rows of 16 bytes in bf16, the alignment of
# cuBLAS's Hopper kernels (the 12-column gate products, rows of 24 bytes, ran on its sm_80 align2 kernels). The
# unpadded joint product of 1665dd7 (3,108 columns, rows of 6,216 bytes) bought FoX (Pro) 125M nothing on the H200
# (206.6K tokens/s against 206.8K, docs/bench/history.md, twentieth session).
JOINT_COLUMNS = 8


def joint_linear(x: torch.Tensor, linears: Sequence[nn.Linear]) -> tuple[torch.Tensor, ...]:
    """``(a(x), b(x), ...)`` by one product over the layers' weights concatenated in the graph (gradients reach each
    weight), its output padded to a multiple of JOINT_COLUMNS columns; the results are views of that output. Layers
    that cannot share a product (not plain Linear layers, or parameters of several dtypes or devices) run one by
    one."""
    if len(linears) < 2 or not _shareable(linears):
        return tuple(lin(x) for lin in linears)
    sizes = [lin.out_features for lin in linears]
    pad = -sum(sizes) % JOINT_COLUMNS
    return F.linear(x, *_concat(linears, pad)).split(sizes + [pad], dim=-1)[:len(linears)]


class FusedLinears:
    """``fused(x, (a, b, c))`` is ``(a(x), b(x), c(x))`` computed by one product (bias-free layers get zeros in
    the concatenated bias). Layers that cannot share a product (not plain Linear layers, or weights of several
    dtypes or devices) run one by one."""

    def __init__(self) -> None:
        self._weight: Optional[torch.Tensor] = None
        self._bias: Optional[torch.Tensor] = None
        self._key: Optional[tuple] = None

    @torch.compiler.disable  # host-side bookkeeping: under torch.compile it stays eager (one graph break)
    def weights(self, linears: Sequence[nn.Linear]) -> Optional[tuple[torch.Tensor, Optional[torch.Tensor]]]:
        """(weight [sum of out_features, in_features], bias or None) of ``linears``, made again when a source
        changed; None where they cannot share a product."""
        params = [p for lin in linears for p in (lin.weight, lin.bias) if p is not None]
        # _rewired in the key: a hook added after the copy was made must stop the fusion
        key = (tuple((id(lin), _rewired(lin)) for lin in linears)
               + tuple((p.data_ptr(), p._version) for p in params))
        if key != self._key:
            if not _shareable(linears):
                return None
            with torch.no_grad():
                self._weight, self._bias = _concat(linears)
            self._key = key
        return self._weight, self._bias

    def nbytes(self) -> int:
        """Bytes the concatenated copy holds (0 before the first fused product)."""
        return sum(t.numel() * t.element_size() for t in (self._weight, self._bias) if t is not None)

    def __call__(self, x: torch.Tensor, linears: Sequence[nn.Linear]) -> tuple[torch.Tensor, ...]:
        fused = self.weights(linears)
        if fused is None:
            return tuple(lin(x) for lin in linears)
        return F.linear(x, *fused).split([lin.out_features for lin in linears], dim=-1)
