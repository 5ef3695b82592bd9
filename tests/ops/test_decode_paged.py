"""The decode op through a page table: keys scattered over shuffled pages of a shared pool (the layout of an evicting
cache) give the dense decode op's answer, with the Triton kernel (interpreted) and the torch path.
Pages before a head's start are NaN-poisoned or shared with another head: they must never be read."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (conftest.py does it too)

import pytest  # noqa: E402
import torch  # noqa: E402

from foxformer.ops import portable  # noqa: E402
from foxformer.ops.forgetting_attn.decode import forgetting_attention_decode  # noqa: E402
from foxformer.ops.forgetting_attn.paging import gather_pages  # noqa: E402

from .test_decode import dense_reference, make  # noqa: E402


def paged(q, kp, vp, cp, table, seq_len, start=None, **kw):
    """The decode op over a paged cache (the argument order of the former paged entry point)."""
    return forgetting_attention_decode(q, kp, vp, cp, start, page_table=table, seq_len=seq_len, **kw)


def paginate(k, v, c, page, start=None, seed=0, spare=3):
    """Scatter k, v [B, Tk, Hkv, D] and c [B, Tk, Hq] into shuffled pages of NaN-filled pools; the
    table entries of pages wholly before start point at one shared NaN page."""
    B, Tk, Hkv, D = k.shape
    G = c.shape[2] // Hkv
    n = -(-Tk // page)
    pool_size = B * Hkv * n + spare
    perm = torch.randperm(pool_size, generator=torch.Generator().manual_seed(seed))
    kp = torch.full((pool_size, page, D), float("nan"), dtype=k.dtype)
    vp, cp = kp.clone(), torch.full((pool_size, page, G), float("nan"), dtype=torch.float64)
    table = torch.empty(B, Hkv, n + 2, dtype=torch.int32).fill_(int(perm[-1]))   # spare columns: unused
    poison = int(perm[-1])
    for b in range(B):
        for h in range(Hkv):
            for i in range(n):
                p = int(perm[(b * Hkv + h) * n + i])
                lo, hi = i * page, min(Tk, (i + 1) * page)
                if start is not None and hi <= int(start[b, h]):
                    table[b, h, i] = poison   # a dead page: handed back to the pool, now someone else's
                    continue
                table[b, h, i] = p
                kp[p, :hi - lo] = k[b, lo:hi, h]
                vp[p, :hi - lo] = v[b, lo:hi, h]
                cp[p, :hi - lo] = c[b, lo:hi, h * G:(h + 1) * G]
    return kp, vp, cp, table


CASES = {  # B, Tq, Tk, Hq, Hkv, D, page
    "decode-mha-page16": (2, 1, 70, 4, 4, 16, 16),
    "decode-gqa-page7": (1, 1, 97, 6, 2, 24, 7),
    "chunk3-gqa-page32": (2, 3, 50, 4, 2, 32, 32),
    "chunk5-mqa-page1": (1, 5, 40, 4, 1, 16, 1),
}


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_paged_matches_dense(case, backend):
    B, Tq, Tk, Hq, Hkv, D, page = CASES[case]
    q, k, v, c = make(B, Tq, Tk, Hq, Hkv, D, torch.float32, seed=5)
    start = torch.randint(0, Tk - Tq + 1, (B, Hkv), generator=torch.Generator().manual_seed(1))
    start[0, 0] = 0
    kp, vp, cp, table = paginate(k, v, c, page, start)
    want = dense_reference(q, k, v, c, start, 0.3)
    got = paged(q, kp, vp, cp, table, Tk, start, softmax_scale=0.3, backend=backend,
                                            **({"num_splits": 3} if backend == "triton" else {}))
    assert got.shape == q.shape and got.dtype == q.dtype
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_paged_half_precision_and_large_c(dtype):
    q, k, v, c = make(1, 1, 64, 4, 2, 16, dtype, seed=2, c_offset=-1e5)
    start = torch.tensor([[20, 3]])
    kp, vp, cp, table = paginate(k, v, c, 8, start)
    want = dense_reference(q, k, v, c, start, 0.25)
    got = paged(q, kp, vp, cp, table, 64, start, softmax_scale=0.25, backend="triton")
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), want, rtol=0, atol={torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype])


def test_gather_pages_inverts_paginate():
    _, k, v, c = make(2, 1, 33, 4, 2, 8, torch.float32, seed=3)
    kp, vp, cp, table = paginate(k, v, c, 5)
    assert torch.equal(gather_pages(kp, table, 33), k)
    assert torch.equal(gather_pages(cp, table, 33).reshape(2, 33, 4), c)


def test_paged_bad_inputs():
    q, k, v, c = make(1, 1, 16, 4, 2, 8, torch.float32)
    kp, vp, cp, table = paginate(k, v, c, 4)
    with pytest.raises(ValueError, match="seq_len"):
        paged(q, kp, vp, cp, table, 100)
    with pytest.raises(ValueError, match="c must be a page pool"):
        paged(q, kp, vp, cp[..., :1], table, 16)
    with pytest.raises(ValueError, match="page_table"):
        paged(q, kp, vp, cp, table.float(), 16)
    with pytest.raises(TypeError, match="dtype"):
        paged(q.half(), kp, vp, cp, table, 16)
    with pytest.raises(ValueError, match="start"):
        paged(q, kp, vp, cp, table, 16, torch.zeros(1, 3, dtype=torch.long))


@pytest.mark.parametrize("backend", ["triton", "torch", "portable"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_a_c_pool_of_another_dtype_than_float64_is_refused(dtype, backend):
    """The paged cache's c pool is float64, as the dense one; a narrower pool was taken and cast, its bias c_i - c_j
    already short of the low bits at a few dozen tokens (portable: a standalone export's op, unchecked)."""
    q, k, v, c = make(1, 1, 16, 4, 2, 8, torch.float32)
    kp, vp, cp, table = paginate(k, v, c, 4)
    kw = {} if backend == "portable" else {"backend": backend}
    fn = portable.forgetting_attention_decode if backend == "portable" else forgetting_attention_decode
    with pytest.raises(TypeError, match=rf"^c must be float64, got {dtype}: c is the cumulative sum"):
        fn(q, kp, vp, cp.to(dtype), None, page_table=table, seq_len=16, **kw)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_entries_of_dead_pages_are_never_read(backend):
    """The docstring's contract: a released page's table entry may be anything (here past the pool). The
    torch path gathered every page from position 0 (a dense copy of the dead keys too, per layer and
    step) and failed on such an entry."""
    B, Tq, Tk, Hq, Hkv, D, page = 2, 2, 90, 4, 2, 8, 8
    q, k, v, c = make(B, Tq, Tk, Hq, Hkv, D, torch.float32, seed=6)
    start = torch.tensor([[17, 40], [8, 88]])
    kp, vp, cp, table = paginate(k, v, c, page, start)
    for b in range(B):
        for h in range(Hkv):
            table[b, h, :int(start[b, h]) // page] = 10 ** 6
    want = dense_reference(q, k, v, c, start, 0.3)
    got = paged(q, kp, vp, cp, table, Tk, start, softmax_scale=0.3, backend=backend)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-5)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_a_page_table_view_with_a_strided_last_dim_is_read_as_indexed(backend):
    """The Triton kernel read a head's pages as TABLE + j // PAGE: a table sliced out of a wider one (last stride 2)
    gave the pages of the entries in between (here the other batch row's, valid pages: a finite wrong answer)."""
    B, Tq, Tk, Hq, Hkv, D, page = 2, 2, 40, 4, 2, 16, 8
    q, k, v, c = make(B, Tq, Tk, Hq, Hkv, D, torch.float32, seed=10)
    kp, vp, cp, table = paginate(k, v, c, page)
    strided = torch.stack([table, table.flip(0)], dim=-1)[..., 0]
    assert strided.stride(-1) == 2 and torch.equal(strided, table)
    got = paged(q, kp, vp, cp, strided, Tk, softmax_scale=0.3, backend=backend)
    torch.testing.assert_close(got.double(), dense_reference(q, k, v, c, None, 0.3), rtol=0, atol=2e-5)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_a_start_past_the_first_query_is_refused_on_cpu(backend):
    """As forgetting_attention_decode: a start past Tk - Tq leaves a query no key. The torch path, which
    gathers from the first live page only, read the queries' c before that page instead."""
    q, k, v, c = make(1, 3, 33, 4, 2, 8, torch.float32)
    kp, vp, cp, table = paginate(k, v, c, 4)
    with pytest.raises(ValueError, match="start.*Tk - Tq"):
        paged(q, kp, vp, cp, table, 33, torch.tensor([[0, 32]]), backend=backend)


@pytest.mark.parametrize("entry", [-1, 99], ids=["negative", "past-the-pool"])
def test_a_live_key_on_an_unmapped_page_is_refused_on_cpu(entry):
    """A negative entry wrapped around to the pool's last page (Python indexing) and gave another page's keys
    without a word; one past the pool was a raw IndexError."""
    q, k, v, c = make(1, 1, 16, 4, 2, 8, torch.float32)
    kp, vp, cp, table = paginate(k, v, c, 4)
    table[0, 1, 2] = entry
    for backend in ("torch", "triton"):
        with pytest.raises(ValueError, match=r"page_table\[0, 1, 2\]"):
            paged(q, kp, vp, cp, table, 16, backend=backend)


@pytest.mark.parametrize("backend", ["torch", "triton", "portable"])
def test_a_non_finite_c_at_a_live_key_is_refused_and_at_a_dead_one_ignored(backend):
    """The torch path alone refused it: the Triton kernel (interpreted) and a standalone export's op returned NaN."""
    q, k, v, c = make(1, 1, 33, 4, 2, 8, torch.float32)
    start = torch.tensor([[9, 0]])
    kp, vp, cp, table = paginate(k, v, c, 4, start)
    want = dense_reference(q, k, v, c, start, 0.3)
    op = portable.forgetting_attention_decode if backend == "portable" else forgetting_attention_decode
    kw = {} if backend == "portable" else {"backend": backend}
    # position 8 of kv head 0: dead (before its start 9), on a page the call still reads
    cp[int(table[0, 0, 2]), 0] = float("nan")
    got = op(q, kp, vp, cp, start, page_table=table, seq_len=33, softmax_scale=0.3, **kw)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-5)
    cp[int(table[0, 1, 3]), 1] = float("inf")   # position 13 of kv head 1 (query heads 2 and 3): live
    with pytest.raises(ValueError, match=r"c must be finite at every live key \(gate_cumsum floors -inf gates\), "
                                         r"got inf \(2 of 132 entries, the first at batch 0, position 13, head 2\)"):
        op(q, kp, vp, cp, start, page_table=table, seq_len=33, **kw)


def test_a_page_table_with_a_row_per_query_head_is_named():
    """One row per query head (Hq, not Hkv) read as G = 1 query head per kv head: the message blamed c alone."""
    q, k, v, c = make(1, 1, 16, 4, 2, 8, torch.float32)
    kp, vp, cp, table = paginate(k, v, c, 4)
    with pytest.raises(ValueError, match=r"c must be a page pool \[P, PAGE, G\] \(G = Hq // Hkv = 4 // 4\) = .*; Hkv "
                                         r"is page_table's dim 1, one row of pages per kv head"):
        paged(q, kp, vp, cp, table.repeat_interleave(2, dim=1), 16)
    with pytest.raises(ValueError, match=r"q heads \(4\) must be a multiple of k/v heads \(3\); Hkv is "
                                         r"page_table's dim 1"):
        paged(q, kp, vp, cp, table[:, [0, 1, 1]], 16)


def test_decode_refuses_integer_inputs_and_bad_options():
    q, k, v, c = make(1, 1, 16, 4, 2, 8, torch.float32)
    with pytest.raises(TypeError, match="floating"):
        forgetting_attention_decode((q * 3).long(), (k * 3).long(), (v * 3).long(), c)
    with pytest.raises(ValueError, match="num_splits"):
        forgetting_attention_decode(q, k, v, c, num_splits=-1)
    with pytest.raises(ValueError, match=r"^backend must be one of \('auto', 'triton', 'torch'\), got 'naive'$"):
        forgetting_attention_decode(q, k, v, c, backend="naive")
    # in the words of forgetting_attention's own check, the closest name offered
    with pytest.raises(ValueError, match=r"got 'trition' \(did you mean 'triton'\?\)$"):
        forgetting_attention_decode(q, k, v, c, backend="trition")
