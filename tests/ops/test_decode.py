"""Decode op: the Triton kernel (interpreted) and the torch path against a float64 dense reference,
with GQA, several queries, key splits and ragged per-head start offsets (eviction)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (conftest.py does it too)

import math  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from foxformer.ops import forgetting_attention_decode, gate_cumsum, portable  # noqa: E402  (the public path: README)


def dense_reference(q, k, v, c, start, scale):
    """float64 materialised attention of the last Tq positions; keys < start[b, g] hidden."""
    B, Tq, Hq, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    G = Hq // Hkv
    kh = k.double().repeat_interleave(G, 2)
    vh = v.double().repeat_interleave(G, 2)
    s = torch.einsum("bihd,bjhd->bhij", q.double(), kh) * scale
    pos = torch.arange(Tk - Tq, Tk)
    keys = torch.arange(Tk)
    s = s + c.transpose(1, 2)[:, :, pos, None] - c.transpose(1, 2)[:, :, None, :]
    mask = (keys[None, :] <= pos[:, None])[None, None]
    if start is not None:
        mask = mask & (keys[None, None, None, :] >= start.repeat_interleave(G, 1)[:, :, None, None])
    s = s.masked_fill(~mask, float("-inf"))
    return torch.einsum("bhij,bjhd->bihd", torch.softmax(s, -1), vh)


def make(B, Tq, Tk, Hq, Hkv, D, dtype, seed=0, c_offset=0.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Tq, Hq, D, generator=g).to(dtype)
    k = torch.randn(B, Tk, Hkv, D, generator=g).to(dtype)
    v = torch.randn(B, Tk, Hkv, D, generator=g).to(dtype)
    logit = torch.randn(B, Tk, Hq, generator=g) + torch.linspace(-1, 5, Hq)
    c = gate_cumsum(torch.nn.functional.logsigmoid(logit)) + c_offset
    return q, k, v, c


CASES = {  # B, Tq, Tk, Hq, Hkv, D
    "decode-mha": (2, 1, 70, 4, 4, 16),
    "decode-gqa-d24": (1, 1, 97, 6, 2, 24),
    "chunk3-gqa": (2, 3, 50, 4, 2, 32),
    "chunk5-mqa": (1, 5, 40, 4, 1, 16),
}
TOL = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_matches_reference(case, backend):
    B, Tq, Tk, Hq, Hkv, D = CASES[case]
    q, k, v, c = make(B, Tq, Tk, Hq, Hkv, D, torch.float32)
    want = dense_reference(q, k, v, c, None, 1 / math.sqrt(D))
    got = forgetting_attention_decode(q, k, v, c, backend=backend)
    assert got.shape == q.shape and got.dtype == q.dtype
    torch.testing.assert_close(got.double(), want, rtol=0, atol=TOL[torch.float32])


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("splits", [1, 3], ids=["splits1", "splits3"])
def test_ragged_start_offsets(backend, splits):
    B, Tq, Tk, Hq, Hkv, D = 2, 2, 90, 4, 2, 16
    q, k, v, c = make(B, Tq, Tk, Hq, Hkv, D, torch.float32, seed=1)
    start = torch.tensor([[0, 37], [61, 5]])
    want = dense_reference(q, k, v, c, start, 0.3)
    kw = {"num_splits": splits} if backend == "triton" else {}
    got = forgetting_attention_decode(q, k, v, c, start, softmax_scale=0.3, backend=backend, **kw)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-5)
    # Hiding keys really changes the result (the test would pass vacuously otherwise).
    assert (got.double() - dense_reference(q, k, v, c, None, 0.3)).abs().max() > 1e-3


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_precision(dtype):
    q, k, v, c = make(1, 1, 64, 4, 2, 16, dtype, seed=2)
    want = dense_reference(q, k, v, c, None, 0.25)
    got = forgetting_attention_decode(q, k, v, c, softmax_scale=0.25, backend="triton")
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), want, rtol=0, atol=TOL[dtype])


def test_large_c_and_strided_cache_views():
    """c near -1e5 (long context) and k, v, c read as views of larger preallocated buffers."""
    B, Tk, Hq, Hkv, D, cap = 1, 45, 4, 2, 16, 64
    q, k, v, c = make(B, 1, Tk, Hq, Hkv, D, torch.float32, seed=3, c_offset=-1e5)
    k_buf = torch.zeros(B, cap, Hkv, D)
    v_buf = torch.zeros(B, cap, Hkv, D)
    c_buf = torch.zeros(B, Hq, cap, dtype=torch.float64)
    k_buf[:, :Tk], v_buf[:, :Tk], c_buf[:, :, :Tk] = k, v, c.transpose(1, 2)
    want = dense_reference(q, k, v, c, None, 0.25)
    got = forgetting_attention_decode(q, k_buf[:, :Tk], v_buf[:, :Tk], c_buf[:, :, :Tk].transpose(1, 2),
                                      softmax_scale=0.25, backend="triton", num_splits=2)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-5)


def test_bad_inputs():
    q, k, v, c = make(1, 1, 8, 4, 2, 16, torch.float32)
    with pytest.raises(ValueError, match="c must be"):
        forgetting_attention_decode(q, k, v, c[:, :, :2])
    with pytest.raises(ValueError, match="multiple"):
        forgetting_attention_decode(q[:, :, :3], k, v, c[:, :, :3])
    with pytest.raises(ValueError, match="start"):
        forgetting_attention_decode(q, k, v, c, torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="backend"):
        forgetting_attention_decode(q, k, v, c, backend="cuda")
    with pytest.raises(TypeError, match="fp64"):
        forgetting_attention_decode(q.double(), k.double(), v.double(), c, backend="triton")


def test_split_counts_are_powers_of_two_so_a_growing_cache_compiles_few_kernels():
    from foxformer.ops.forgetting_attn.decode import _pick_splits

    seen = {_pick_splits(1, 12, keys, None, interpreted=False) for keys in range(1, 70000, 7)}
    assert all(s & (s - 1) == 0 for s in seen) and len(seen) <= 8
    assert _pick_splits(2, 4, 1000, 3, interpreted=False) == 3     # an explicit count is kept


def test_key_blocks_halve_until_the_kernel_fits_shared_memory(monkeypatch):
    """fp32 at D 192-256 and bf16 above D 256 asked an H100 for more shared memory than it has (OutOfResources at
    launch): the launch retries with half the keys a block, remembers the size that fit, and names the way out
    when even the smallest block does not fit."""
    import triton

    from foxformer.ops.forgetting_attn import decode

    tried, launch = [], decode._launch

    def small_smem(*args):  # a GPU where only 32-key blocks fit: args[11] is BLOCK_N
        tried.append(args[11])
        if args[11] > 32:
            raise triton.runtime.errors.OutOfResources(args[11] * 1024, 32 * 1024, "shared memory")
        return launch(*args)

    monkeypatch.setattr(decode, "_launch", small_smem)
    monkeypatch.setattr(decode, "_FITTING_BLOCK_N", {})
    monkeypatch.setattr(decode, "_interpreted", lambda t: False)  # the GPU's block sizes (fp32: exact here too)
    tiles = decode.DecodeTiles(block_n=128)
    q, k, v, c = make(1, 1, 90, 4, 2, 16, torch.float32, seed=5)
    want = dense_reference(q, k, v, c, None, 0.25)
    for _ in range(2):
        got = decode.triton_decode(q, k, v, c, None, 0.25, None, None, 90, 90, tiles)
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    assert tried[:3] == [128, 64, 32] and tried[3:] == [32]  # the second call starts at the size that fit

    monkeypatch.setattr(decode, "_launch", lambda *a: (_ for _ in ()).throw(
        triton.runtime.errors.OutOfResources(1, 0, "shared memory")))
    with pytest.raises(ValueError, match="does not fit head dim 16 in torch.float32.*backend='torch'"):
        decode.triton_decode(q, k, v, c, None, 0.25, None, None, 90, 90, decode.DecodeTiles(block_n=64))


def test_an_explicit_split_count_past_the_key_blocks_is_clamped():
    """num_splits was taken as given: 10**6 allocated B * Hkv * 10**6 * BLOCK_M rows of partial results
    (GiBs) and launched programs with no key to read. Splits beyond ceil(Tk / BLOCK_N) add nothing."""
    from foxformer.ops.forgetting_attn.decode import DECODE_TILES, _pick_splits

    # interpreted: BLOCK_N = 16, so 90 keys are 6 blocks; on a GPU BLOCK_N = DECODE_TILES.block_n (128)
    assert _pick_splits(1, 2, 90, 6, interpreted=True) == 6
    assert _pick_splits(1, 2, 90, 7, interpreted=True) == 4  # a power of two: see _pick_splits
    assert _pick_splits(1, 2, 90, 10**6, interpreted=True) == 4
    assert _pick_splits(1, 2, 4096, 10**6, interpreted=False) == 4096 // DECODE_TILES.block_n
    assert _pick_splits(1, 2, 0, 10**6, interpreted=False) == 1
    q, k, v, c = make(1, 2, 90, 4, 2, 16, torch.float32, seed=4)
    want = dense_reference(q, k, v, c, None, 0.25)
    got = forgetting_attention_decode(q, k, v, c, softmax_scale=0.25, backend="triton", num_splits=10**6)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-5)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_negative_start_means_nothing_evicted(backend):
    """Live keys are start <= j: a negative start hides nothing. The Triton kernel used to read keys at
    negative offsets (before the cache), the torch path to slice k[:, start:] from the end."""
    B, Tq, Tk, Hq, Hkv, D = 2, 3, 40, 4, 2, 16
    q, k, v, c = make(B, Tq, Tk, Hq, Hkv, D, torch.float32, seed=4)
    start = torch.tensor([[0, -3], [5, -40]])
    want = dense_reference(q, k, v, c, start.clamp(min=0), 0.25)
    got = forgetting_attention_decode(q, k, v, c, start, softmax_scale=0.25, backend=backend)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-5)


def _bad_decode_inputs():
    q, k, v, c = make(1, 1, 8, 4, 2, 16, torch.float32)
    meta = torch.empty(1, 8, 2, 16, device="meta")
    return {
        # a float start was truncated by the Triton kernel but rounded up by the torch path's >= test
        "start-float": ((q, k, v, c, torch.tensor([[0.0, 2.5]])), TypeError, "start must be an integer"),
        "start-bool": ((q, k, v, c, torch.tensor([[False, True]])), TypeError, "start must be an integer"),
        "qk-dtypes": ((q.half(), k, v, c, None), TypeError, "q, k and v must share one dtype"),
        "v-dtype": ((q, k, v.double(), c, None), TypeError, "q, k and v must share one dtype"),
        "c-int": ((q, k, v, c.long(), None), TypeError, "c must be float64, got torch.int64"),
        # taken and cast: an fp16 c put 4e-3 into the output at 40 tokens, 2 at 16K (fp32: 1e-4 at 16K)
        **{f"c-{name}": ((q, k, v, c.to(dtype), None), TypeError,
                         rf"^c must be float64, got {dtype}: c is the cumulative sum of the log forget gates")
           for name, dtype in (("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16))},
        "k-device": ((q, meta, meta, c, None), ValueError, "one device"),
        "start-device": ((q, k, v, c, torch.zeros(1, 2, dtype=torch.long, device="meta")), ValueError, "one device"),
        "no-kv-heads": ((q, k[:, :, :0], v[:, :, :0], c, None), ValueError, "multiple"),
        # [B, H, T, D] caches were refused as "q heads (4) must be a multiple of k/v heads (8)"
        "k-v-bhtd": ((q, k.transpose(1, 2), v.transpose(1, 2), c, None), ValueError,
                     r"pass k\.transpose\(1, 2\), v\.transpose\(1, 2\)$"),
        "q-bhtd": ((q.transpose(1, 2), k, v, c, None), ValueError, r"pass q\.transpose\(1, 2\)$"),
        "c-bht": ((q, k, v, c.transpose(1, 2), None), ValueError, r"pass c\.transpose\(1, 2\)$"),
        # GQA: a c per kv head, as k and v have heads, said only the shape it must have
        "c-per-kv-head": ((q, k, v, c[:, :, :2], None), ValueError,
                          r"got \(1, 8, 2\); it has one entry per key/value head \(Hkv=2\), not per query head "
                          r"\(Hq=4\): where a group's query heads share one gate, pass c\.repeat_interleave\(2, "
                          r"dim=2\)$"),
        # a page pool without its page_table: the message gave neither the shape nor the paged form
        "k-3d-without-page-table": ((q, k[0], v[0], c, None), ValueError,
                                    r"k must be a 4-D tensor \[B, Tk, Hkv, D\] \(or, with page_table, a page pool "
                                    r"\[P, PAGE, D\]\), got shape \(8, 2, 16\)$"),
    }


@pytest.mark.parametrize("backend", ["triton", "torch", "portable"])
@pytest.mark.parametrize("case", list(_bad_decode_inputs()))
def test_bad_inputs_named(case, backend):
    """portable: a standalone export's decode op, which checked nothing (a float start, an fp16 c ran)."""
    args, exc, match = _bad_decode_inputs()[case]
    with pytest.raises(exc, match=match):
        if backend == "portable":
            portable.forgetting_attention_decode(*args)
        else:
            forgetting_attention_decode(*args, backend=backend)


def test_triton_backend_names_the_fix_for_a_strided_last_dim():
    q, k, v, c = make(1, 1, 8, 4, 2, 16, torch.float32)
    v = torch.cat([v, v], dim=-1)[..., ::2]
    with pytest.raises(ValueError, match=r"v must have a contiguous last dim .*pass v\.contiguous\(\), or use "
                                         r"backend='torch'"):
        forgetting_attention_decode(q, k, v, c, backend="triton")


def test_head_dim_1_with_any_last_stride():
    """D = 1 tensors are contiguous whatever their last stride (see test_triton_interface.py)."""
    q, k, v, c = make(1, 2, 30, 4, 2, 1, torch.float32, seed=5)
    q = q[..., 0][:, None].clone().permute(0, 2, 3, 1)   # [B, 1, Tq, Hq] -> [B, Tq, Hq, 1], last stride Tq * Hq
    assert q.is_contiguous() and q.stride(-1) != 1
    want = dense_reference(q, k, v, c, None, 0.5)
    got = forgetting_attention_decode(q, k, v, c, softmax_scale=0.5, backend="triton")
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-5)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_no_queries_give_an_empty_output(backend):
    # the torch path used to crash in torch.cat of an empty list while the Triton path returned [B, 0, Hq, D]
    q, k, v, c = make(2, 1, 20, 4, 2, 16, torch.float32, seed=6)
    got = forgetting_attention_decode(q[:, :0], k, v, c, backend=backend)
    assert got.shape == (2, 0, 4, 16) and got.dtype == q.dtype


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("with_start", [False, True], ids=["no-start", "start"])
def test_zero_size_batch_gives_an_empty_output(backend, with_start):
    # the torch path took start.min() of an empty [0, Hkv] start: RuntimeError
    q, k, v, c = make(1, 1, 20, 4, 2, 16, torch.float32, seed=6)
    start = torch.zeros(0, 2, dtype=torch.long) if with_start else None
    got = forgetting_attention_decode(q[:0], k[:0], v[:0], c[:0], start, backend=backend)
    assert got.shape == (0, 1, 4, 16) and got.dtype == q.dtype


# B, Tq, Tk, start: a start past a query's own position (Tk - Tq + i) left that row no key, so NaN
_STARTS_PAST_A_QUERY = {
    "past-the-only-query": (1, 1, 20, [[0, 20]]),
    "past-the-first-of-a-chunk": (2, 3, 20, [[0, 0], [18, 4]]),
}


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("case", list(_STARTS_PAST_A_QUERY))
def test_a_start_past_a_query_is_refused_on_cpu(case, backend):
    B, Tq, Tk, start = _STARTS_PAST_A_QUERY[case]
    q, k, v, c = make(B, Tq, Tk, 4, 2, 16, torch.float32, seed=7)
    with pytest.raises(ValueError, match="start"):
        forgetting_attention_decode(q, k, v, c, torch.tensor(start), backend=backend)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_a_start_at_the_first_query_is_accepted(backend):
    B, Tq, Tk, Hq, Hkv, D = 1, 3, 20, 4, 2, 16
    q, k, v, c = make(B, Tq, Tk, Hq, Hkv, D, torch.float32, seed=8)
    start = torch.tensor([[Tk - Tq, 0]])          # the first query sees only its own key
    got = forgetting_attention_decode(q, k, v, c, start, softmax_scale=0.25, backend=backend)
    torch.testing.assert_close(got.double(), dense_reference(q, k, v, c, start, 0.25), rtol=0, atol=2e-5)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("scale", [float("nan"), float("inf"), float("-inf"), "0.5", torch.tensor(0.5)],
                         ids=["nan", "inf", "-inf", "str", "tensor"])
def test_bad_softmax_scale_is_rejected_like_forgetting_attention(scale, backend):
    """softmax_scale went unchecked: NaN / inf gave an all-NaN output, a string failed deep inside."""
    q, k, v, c = make(1, 1, 20, 2, 1, 16, torch.float32)
    with pytest.raises(TypeError, match="softmax_scale must be a finite float or None"):
        forgetting_attention_decode(q, k, v, c, softmax_scale=scale, backend=backend)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("as_tensor", [False, True], ids=["int", "device-tensor"])
def test_seq_len_reads_a_prefix_of_preallocated_storage(backend, as_tensor):
    """A static cache passes its whole buffers and the number of positions held (a device tensor inside a
    CUDA graph): the positions past seq_len, here NaN, are never read, and the queries are its last Tq."""
    B, Tq, Tk, Hq, Hkv, D, cap = 2, 2, 45, 4, 2, 16, 80
    q, k, v, c = make(B, Tq, Tk, Hq, Hkv, D, torch.float32, seed=9)
    k_buf, v_buf = torch.full((B, cap, Hkv, D), float("nan")), torch.full((B, cap, Hkv, D), float("nan"))
    c_buf = torch.full((B, Hq, cap), float("nan"), dtype=torch.float64)
    k_buf[:, :Tk], v_buf[:, :Tk], c_buf[:, :, :Tk] = k, v, c.transpose(1, 2)
    start = torch.tensor([[0, 30], [12, 3]])
    seq_len = torch.tensor([Tk]) if as_tensor else Tk
    got = forgetting_attention_decode(q, k_buf, v_buf, c_buf.transpose(1, 2), start, seq_len=seq_len,
                                      softmax_scale=0.25, backend=backend)
    torch.testing.assert_close(got.double(), dense_reference(q, k, v, c, start, 0.25), rtol=0, atol=2e-5)
    with pytest.raises(ValueError, match="seq_len 81 must be"):
        forgetting_attention_decode(q, k_buf, v_buf, c_buf.transpose(1, 2), seq_len=cap + 1, backend=backend)


def _decode_on(backend):
    """The decode op of ``backend``: "portable" is a standalone export's (which takes no backend)."""
    if backend == "portable":
        return portable.forgetting_attention_decode
    return lambda *args, **kw: forgetting_attention_decode(*args, backend=backend, **kw)


@pytest.mark.parametrize("backend", ["triton", "torch", "portable"])
@pytest.mark.parametrize("bad", [float("nan"), float("-inf")])
def test_a_non_finite_c_at_a_live_key_is_refused_on_every_path(backend, bad):
    """Only the torch path refused it: the Triton kernel (interpreted) and a standalone export's op returned NaN.
    Before a head's start the key is dead and its c may be anything."""
    q, k, v, c = make(2, 1, 30, 4, 2, 16, torch.float32)
    start = torch.tensor([[0, 6], [0, 0]])
    c[0, 5, 2:] = bad  # kv head 1 of row 0: dead there
    torch.testing.assert_close(_decode_on(backend)(q, k, v, c, start, softmax_scale=0.25).double(),
                               dense_reference(q, k, v, c, start, 0.25), rtol=0, atol=2e-5)
    c[1, 7, 1] = bad
    with pytest.raises(ValueError, match=rf"c must be finite at every live key .*got {bad} \(1 of 240 entries, the "
                                         rf"first at batch 1, position 7, head 1\)"):
        _decode_on(backend)(q, k, v, c, start)


@pytest.mark.parametrize("backend", ["triton", "torch", "portable"])
@pytest.mark.parametrize("lengths", [torch.tensor([30, 21]), [30, 21]], ids=["tensor", "list"])
def test_a_length_per_row_is_refused_with_the_left_padded_way_to_decode_ragged_rows(backend, lengths):
    """flash_attn_with_kvcache's cache_seqlens [B] was 'must be an int or a one-element integer tensor' (a list: no
    word of a list). The way the message gives, rows ending at one position with start = each row's padding,
    decodes each row as it would alone."""
    q, k, v, c = make(2, 1, 30, 4, 2, 16, torch.float32)
    with pytest.raises((ValueError, TypeError), match=r"seq_len is the one length of every row .*left padding\) and "
                                                      r"pass start\[b\] = row b's padding"):
        _decode_on(backend)(q, k, v, c, seq_len=lengths)
    pad = 30 - 21
    alone = _decode_on(backend)(q[1:], k[1:, pad:], v[1:, pad:], c[1:, pad:], softmax_scale=0.25)
    start = torch.tensor([[0, 0], [pad, pad]])
    both = _decode_on(backend)(q, k, v, c, start, softmax_scale=0.25)
    torch.testing.assert_close(both[1:], alone, rtol=0, atol=2e-6)


def test_a_numpy_seq_len_is_told_to_pass_an_int():
    q, k, v, c = make(1, 1, 30, 4, 2, 16, torch.float32)
    with pytest.raises(TypeError, match=r"seq_len must be None, an int or a one-element integer tensor, got "
                                        r"numpy\.int64; pass int\(seq_len\)$"):
        forgetting_attention_decode(q, k, v, c, seq_len=np.int64(20))
    with pytest.raises(TypeError, match=r"got float$"):
        forgetting_attention_decode(q, k, v, c, seq_len=20.0)


def test_the_forward_only_kernel_warns_where_a_gradient_was_asked():
    """The Triton decode returns an output without a gradient: a loss built on it lost that part of its gradient
    without a word. It warns (a sampling loop without torch.no_grad() wants the values only, so no error); the
    torch path is differentiable, and under no_grad nothing is said."""
    import warnings

    q, k, v, c = make(1, 1, 20, 2, 2, 16, torch.float32)
    q.requires_grad_(True)
    with pytest.warns(UserWarning, match="forward only.*no gradient"):
        out = forgetting_attention_decode(q, k, v, c, backend="triton")
    assert not out.requires_grad
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            forgetting_attention_decode(q, k, v, c, backend="triton")
        out = forgetting_attention_decode(q, k, v, c, backend="torch")
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
