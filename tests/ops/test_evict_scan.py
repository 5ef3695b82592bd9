"""The windowed eviction scan (ops/forgetting_attn/evict_scan.py): the Triton kernel (interpreted) gives the
torch path's starts on shuffled pages, with GQA, ragged starts and the newest position as an int or on the device."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (conftest.py does it too)

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from foxformer.ops import gate_cumsum  # noqa: E402
from foxformer.ops.forgetting_attn.evict_scan import evict_scan_  # noqa: E402


def paged_c(B, Hkv, G, length, page, seed):
    """c of B x Hkv * G query heads over `length` positions (fast and slow gates), in shuffled pages."""
    g = torch.Generator().manual_seed(seed)
    H = Hkv * G
    logit = torch.randn(B, length, H, generator=g) + torch.linspace(-3, 4, H)
    c = gate_cumsum(F.logsigmoid(logit))                                    # [B, T, H] float64
    n = -(-length // page)
    table = torch.randperm(B * Hkv * n, generator=g).reshape(B, Hkv, n).to(torch.int32)
    pool = torch.full((B * Hkv * n, page, G), float("nan"), dtype=torch.float64)
    for b in range(B):
        for h in range(Hkv):
            for j in range(n):
                rows = c[b, j * page:(j + 1) * page, h * G:(h + 1) * G]
                pool[table[b, h, j], :rows.shape[0]] = rows
    return pool, table, c[:, -1].contiguous()


@pytest.mark.parametrize("strided", [False, True], ids=["table", "table-view-last-stride-2"])
@pytest.mark.parametrize("Hkv,G", [(3, 1), (2, 4)], ids=["mha", "gqa4"])
@pytest.mark.parametrize("last_on_device", [False, True], ids=["last-int", "last-tensor"])
def test_the_kernel_advances_the_starts_as_the_torch_path(Hkv, G, last_on_device, strided):
    """strided: the table a view of a wider one, the other batch row's pages between its entries (the kernel read
    them, at stride 1)."""
    B, length, page, window, delta = 2, 300, 16, 64, -6.0
    pool, table, c_last = paged_c(B, Hkv, G, length, page, seed=Hkv * 10 + G)
    if strided:
        table = torch.stack([table, table.flip(0)], dim=-1)[..., 0]
    start0 = torch.tensor([[0, 37, 250][:Hkv], [5, 290, 120][:Hkv]], dtype=torch.int64)
    last = torch.tensor([length - 1]) if last_on_device else length - 1
    got = {}
    for backend in ("torch", "triton"):
        start = start0.clone()
        evict_scan_(start, pool, table, c_last, delta, window, last, backend=backend)
        got[backend] = start
    assert torch.equal(got["torch"], got["triton"])
    assert (got["triton"] >= start0).all() and (got["triton"] <= length - 1).all()
    assert (got["triton"] > start0).any()  # the fast heads drop keys: the test exercises a real advance


def test_it_refuses_a_non_int64_start():
    pool, table, c_last = paged_c(1, 2, 1, 40, 16, seed=0)
    with pytest.raises(ValueError, match="start must be a contiguous int64"):
        evict_scan_(torch.zeros(1, 2, dtype=torch.int32), pool, table, c_last, -6.0, 8, 39)
