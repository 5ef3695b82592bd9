"""The one-token cache write (ops/forgetting_attn/append.py): the Triton kernel (interpreted) gives the
torch path's bits, writes only the position asked for, and refuses mismatched shapes."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (conftest.py does it too)

import pytest  # noqa: E402
import torch  # noqa: E402

from foxformer.ops.forgetting_attn.append import append_token_  # noqa: E402


def buffers(B, cap, Hq, Hkv, D, dtype):
    """NaN-poisoned buffers, so that a write to the wrong place shows and an unwritten one stays NaN."""
    k_buf = torch.full((B, cap, Hkv, D), float("nan"), dtype=dtype)
    return k_buf, k_buf.clone(), torch.full((B, Hq, cap), float("nan"), dtype=torch.float64)


@pytest.mark.parametrize("B,Hq,Hkv,D", [(1, 4, 4, 64), (3, 6, 2, 24), (2, 8, 1, 16)],
                         ids=["mha-d64", "gqa3-d24-batch3", "mqa8-d16"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_the_kernel_writes_the_torch_paths_bits_at_the_position_only(B, Hq, Hkv, D, dtype):
    g = torch.Generator().manual_seed(0)
    cap, pos = 11, 7
    k = torch.randn(B, 1, Hkv, D, generator=g).to(dtype)
    v = torch.randn(B, 1, Hkv, D, generator=g).to(dtype)
    log_f = torch.nn.functional.logsigmoid(torch.randn(B, 1, Hq, generator=g) * 3)
    log_f[0, 0, 0] = float("-inf")      # a sequence start: clamped at the floor
    if Hq > 1:
        log_f[-1, 0, -1] = -3e4         # below the floor
    c_last = torch.randn(B, Hq, generator=g, dtype=torch.float64) * 1e4  # large |c|: float64 all the way
    at = torch.tensor([pos])
    outs = {}
    for backend in ("torch", "triton"):
        k_buf, v_buf, c_buf = buffers(B, cap, Hq, Hkv, D, dtype)
        last = c_last.clone()
        append_token_(k_buf, v_buf, c_buf, last, at, k, v, log_f, backend=backend)
        outs[backend] = (k_buf, v_buf, c_buf, last)
    for ref, got in zip(outs["torch"], outs["triton"]):
        assert torch.equal(ref.nan_to_num(123.0), got.nan_to_num(123.0))
    k_buf, v_buf, c_buf, last = outs["triton"]
    assert torch.equal(k_buf[:, pos], k[:, 0]) and torch.equal(v_buf[:, pos], v[:, 0])
    assert torch.equal(c_buf[:, :, pos], last)
    assert last[0, 0] == c_last[0, 0] - 1e4
    others = [t for t in range(cap) if t != pos]
    assert k_buf[:, others].isnan().all() and c_buf[:, :, others].isnan().all()


def test_it_refuses_mismatched_shapes_and_dtypes():
    k_buf, v_buf, c_buf = buffers(2, 8, 4, 2, 16, torch.float32)
    k = torch.zeros(2, 1, 2, 16)
    at, last, log_f = torch.tensor([3]), torch.zeros(2, 4, dtype=torch.float64), torch.zeros(2, 1, 4)
    with pytest.raises(ValueError, match="k and v"):
        append_token_(k_buf, v_buf, c_buf, last, at, k[:, :, :1], k, log_f)
    with pytest.raises(ValueError, match="log_f"):
        append_token_(k_buf, v_buf, c_buf, last, at, k, k, log_f[..., :3])
    with pytest.raises(TypeError, match="float64"):
        append_token_(k_buf, v_buf, c_buf.float(), last, at, k, k, log_f)
    with pytest.raises(ValueError, match="backend"):
        append_token_(k_buf, v_buf, c_buf, last, at, k, k, log_f, backend="cuda")


@pytest.mark.parametrize("strided", [False, True], ids=["table", "table-view-last-stride-2"])
@pytest.mark.parametrize("Hq,Hkv", [(4, 4), (6, 2)], ids=["mha", "gqa3"])
def test_a_paged_write_lands_in_each_heads_page_with_the_torch_paths_bits(Hq, Hkv, strided):
    """Page pools [P, PAGE, D] / c [P, PAGE, G]: (b, h) writes row at % PAGE of page table[b, h, at // PAGE];
    the table maps each (b, h) to its own, shuffled pages. A table viewed out of a wider one (its entries between
    the other batch row's pages) was read at stride 1 by the kernel, which wrote to those pages."""
    g = torch.Generator().manual_seed(1)
    B, D, page, n_pages, pos = 2, 16, 4, 3, 9                 # position 9: the third page, row 1
    pool = B * Hkv * n_pages + 2
    table = torch.randperm(pool, generator=g)[:B * Hkv * n_pages].reshape(B, Hkv, n_pages).to(torch.int32)
    if strided:
        table = torch.stack([table, table.flip(0)], dim=-1)[..., 0]
    k = torch.randn(B, 1, Hkv, D, generator=g).to(torch.bfloat16)
    v = torch.randn(B, 1, Hkv, D, generator=g).to(torch.bfloat16)
    raw = torch.randn(B, Hkv, D, generator=g).to(torch.bfloat16)
    log_f = torch.nn.functional.logsigmoid(torch.randn(B, 1, Hq, generator=g))
    c_last = torch.randn(B, Hq, generator=g, dtype=torch.float64) * 100
    outs = {}
    for backend in ("torch", "triton"):
        kp = torch.full((pool, page, D), float("nan"), dtype=torch.bfloat16)
        vp, cp = kp.clone(), torch.full((pool, page, Hq // Hkv), float("nan"), dtype=torch.float64)
        last, state = c_last.clone(), torch.zeros_like(raw)
        append_token_(kp, vp, cp, last, torch.tensor([pos]), k, v, log_f, (state, raw), page_table=table,
                      backend=backend)
        outs[backend] = (kp, vp, cp, last, state)
    for ref, got in zip(outs["torch"], outs["triton"]):
        assert torch.equal(ref.nan_to_num(123.0), got.nan_to_num(123.0))
    kp, vp, cp, last, state = outs["triton"]
    pages = table[:, :, pos // page].long()                    # [B, Hkv]
    assert torch.equal(kp[pages, pos % page], k[:, 0]) and torch.equal(vp[pages, pos % page], v[:, 0])
    assert torch.equal(cp[pages, pos % page].reshape(B, Hq), last) and torch.equal(state, raw)
    assert kp.isnan().any(-1).sum() == (pool * page - B * Hkv) and cp.isnan().all(-1).sum() == pool * page - B * Hkv


def test_it_refuses_a_bad_position_or_gate_on_the_cpu():
    """A position outside the storage was a raw index_copy_ error; a positive or NaN log_f corrupted c_last."""
    k_buf, v_buf, c_buf = buffers(2, 8, 4, 2, 16, torch.float32)
    k = torch.zeros(2, 1, 2, 16)
    last, log_f = torch.zeros(2, 4, dtype=torch.float64), torch.zeros(2, 1, 4)
    for at in (torch.tensor([8]), torch.tensor([-1])):
        with pytest.raises(ValueError, match="outside the storage"):
            append_token_(k_buf, v_buf, c_buf, last, at, k, k, log_f)
    for at in (3, torch.tensor([3], dtype=torch.int32), torch.tensor([3, 4])):
        with pytest.raises(TypeError, match="at must be an int64 tensor of one element"):
            append_token_(k_buf, v_buf, c_buf, last, at, k, k, log_f)
    for bad, match in ((0.5, "<= 0"), (float("nan"), "NaN")):
        with pytest.raises(ValueError, match=match):
            append_token_(k_buf, v_buf, c_buf, last, torch.tensor([3]), k, k, torch.full((2, 1, 4), bad))
    assert not last.any()


def test_a_paged_write_refuses_an_unmapped_page():
    pool = torch.zeros(5, 4, 16)
    c_pool = torch.zeros(5, 4, 2, dtype=torch.float64)
    table = torch.tensor([[[0, 1], [2, -1]]], dtype=torch.int32)     # [B 1, Hkv 2, 2 pages of 4]
    k, last, log_f = torch.zeros(1, 1, 2, 16), torch.zeros(1, 4, dtype=torch.float64), torch.zeros(1, 1, 4)
    append_token_(pool, pool.clone(), c_pool, last, torch.tensor([3]), k, k, log_f, page_table=table)
    with pytest.raises(ValueError, match="not mapped"):
        append_token_(pool, pool.clone(), c_pool, last, torch.tensor([4]), k, k, log_f, page_table=table)
    with pytest.raises(ValueError, match="past the page table"):
        append_token_(pool, pool.clone(), c_pool, last, torch.tensor([8]), k, k, log_f, page_table=table)
