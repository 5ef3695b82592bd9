"""Every Triton kernel of the op asks for FMA contraction at launch (tiles.LAUNCH_OPTIONS): Triton 3.9 warns that
3.10 turns it off by default, which would slow the attention loops without a word. The interpreter hands each
launch's options to InterpretedFunction.run, so recording them covers the kernels the GPU runs; the Gluon kernels'
compiled flag is checked in test_gluon_hopper.py."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (conftest.py does it too)

import inspect  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from foxformer import forgetting_attention  # noqa: E402
from foxformer.ops import gate_cumsum  # noqa: E402
from foxformer.ops.forgetting_attn import (append, bwd, decode, evict_scan, fwd, pruning, scan,  # noqa: E402
                                                tiles)
from foxformer.ops.forgetting_attn.append import append_token_  # noqa: E402
from foxformer.ops.forgetting_attn.decode import forgetting_attention_decode  # noqa: E402
from foxformer.ops.forgetting_attn.evict_scan import evict_scan_  # noqa: E402

MODULES = (append, bwd, decode, evict_scan, fwd, pruning, scan, tiles)


def _launched_kernels():
    """Kernels a launcher calls: module-level Triton functions named *_kernel (helpers they call are inlined)."""
    return {f"{m.__name__}.{name}" for m in MODULES for name, obj in inspect.getmembers(m)
            if isinstance(obj, InterpretedFunction) and name.endswith("_kernel") and obj.fn.__module__ == m.__name__}


def test_every_kernel_launch_asks_for_fma_contraction(monkeypatch):
    seen = {}
    run = InterpretedFunction.run

    def recording_run(self, *args, **kwargs):
        seen[f"{self.fn.__module__}.{self.fn.__name__}"] = kwargs.get("enable_fp_fusion")
        return run(self, *args, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", recording_run)
    g = torch.Generator().manual_seed(0)
    B, T, Hq, Hkv, D = 1, 40, 4, 2, 16
    q = torch.randn(B, T, Hq, D, generator=g).to(torch.bfloat16).requires_grad_()
    k, v = (torch.randn(B, T, Hkv, D, generator=g).to(torch.bfloat16).requires_grad_() for _ in range(2))
    log_f = F.logsigmoid(torch.randn(B, T, Hq, generator=g) - 2).requires_grad_()
    forgetting_attention(q, k, v, log_f, backend="triton", prune_eps=1e-3).sum().backward()

    c = gate_cumsum(log_f.detach())                                            # [B, T, Hq] float64
    forgetting_attention_decode(q[:, -1:].detach(), k.detach(), v.detach(), c, backend="triton")
    page, n_pages = 8, T // 8
    table = torch.arange(B * Hkv * n_pages, dtype=torch.int32).reshape(B, Hkv, n_pages)
    kp = k.detach().transpose(1, 2).reshape(-1, page, D).contiguous()
    cp = c.view(B, T, Hkv, Hq // Hkv).transpose(1, 2).reshape(-1, page, Hq // Hkv).contiguous()
    start = torch.zeros(B, Hkv, dtype=torch.int64)
    forgetting_attention_decode(q[:, -1:].detach(), kp, kp, cp, start, page_table=table, seq_len=T, backend="triton")
    evict_scan_(start, cp, table, c[:, -1].contiguous(), -3.0, 16, T - 1, backend="triton")
    buf = torch.zeros(B, T + 1, Hkv, D, dtype=torch.bfloat16)
    append_token_(buf, buf.clone(), torch.zeros(B, Hq, T + 1, dtype=torch.float64), c[:, -1].contiguous(),
                  torch.tensor([T]), k[:, -1:].detach(), v[:, -1:].detach(), log_f[:, -1:].detach(), backend="triton")

    assert _launched_kernels() <= set(seen), f"not launched by this test: {_launched_kernels() - set(seen)}"
    assert {name: opt for name, opt in seen.items() if opt is not True} == {}
