"""Random inputs and error measures shared by the op tests."""
from __future__ import annotations

import torch
import torch.nn.functional as F

# Per input dtype: allowed relative error (norm of difference over norm of reference).
REL_TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def make_inputs(B, Tq, Tk, Hq, Hkv, D, dtype=torch.float64, gate="mixed", seed=0):
    """q, k, v, log_fgate on CPU; gate: a float (constant log f), "mixed", or "realistic"."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Tq, Hq, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, Tk, Hkv, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, Tk, Hkv, D, generator=g, dtype=torch.float64)
    if gate == "mixed":
        # every regime the op must survive: f ~ 1, ~1e-4 decay, strong decay, near-cut and cut
        choices = torch.tensor([0.0, -1e-4, -5.0, -30.0, float("-inf"), -0.7])
        log_f = choices[torch.randint(0, len(choices), (B, Tk, Hq), generator=g)].double()
        log_f = torch.where(torch.rand(B, Tk, Hq, generator=g) < 0.5,
                            F.logsigmoid(torch.randn(B, Tk, Hq, generator=g, dtype=torch.float64) * 2 + 2),
                            log_f)
    else:
        log_f = torch.full((B, Tk, Hq), float(gate), dtype=torch.float64)
    gate_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    return [t.to(dtype) for t in (q, k, v)] + [log_f.to(gate_dtype)]


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double(), ref.double()
    assert torch.isfinite(x).all(), "non-finite values in result"
    # the floor keeps exact zeros (a length-1 segment's dq) from dividing rounding noise by 0
    denom = max(ref.norm().item(), 1e-3 * ref.numel() ** 0.5)
    return (x - ref).norm().item() / denom


def run_with_grads(fn, q, k, v, log_f, seed=1, lse_weight=0.0, **kw):
    """Forward + backward of fn on leaf copies; returns out, lse, dq, dk, dv, dlog_f."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, log_f)]
    out, lse = fn(*leaves, return_lse=True, **kw)
    g = torch.Generator().manual_seed(seed)
    do = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.dtype)
    loss = (out.double() * do.double()).sum()
    if lse_weight:
        dl = torch.randn(lse.shape, generator=g, dtype=torch.float64)
        loss = loss + lse_weight * (lse.double() * dl).sum()
    loss.backward()
    return [out.detach(), lse.detach()] + [t.grad for t in leaves]


def grad_of_grad(fn, q, k, v, log_f, **kw):
    """Differentiate dq (taken with create_graph=True) again; returns the second-order dk."""
    q, k, v, log_f = [t.detach().clone().requires_grad_() for t in (q, k, v, log_f)]
    out = fn(q, k, v, log_f, **kw)
    dq, = torch.autograd.grad(out.double().square().sum(), q, create_graph=True)
    dk, = torch.autograd.grad(dq.double().square().sum(), k)
    return dk
