"""The Triton decode kernel on CUDA at long context against the torch decode path (fp32 math), and
a bf16 model decoding through it. Skipped without CUDA: `python -m pytest -q tests/gpu/test_decode_cuda.py`."""
import pytest
import torch
import torch.nn.functional as F

from foxformer.models import EvictionPolicy
from foxformer.ops import gate_cumsum
from foxformer.ops.forgetting_attn.decode import forgetting_attention_decode, torch_decode

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("Tk", [4096, 65536], ids=lambda t: f"T{t // 1024}K")
@pytest.mark.parametrize("B,Tq,Hq,Hkv,D", [(1, 1, 12, 12, 64), (32, 1, 8, 2, 128), (2, 4, 16, 4, 64)],
                         ids=["b1-mha-d64", "b32-gqa4-d128", "chunk4-gqa4"])
@pytest.mark.parametrize("ragged", [False, True], ids=["full", "ragged"])
def test_kernel_matches_torch(Tk, B, Tq, Hq, Hkv, D, ragged):
    if B * Tk > 32 * 4096 * 4:
        pytest.skip("keeps the test quick")
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, Tq, Hq, D, device="cuda", generator=g, dtype=torch.bfloat16)
    k = torch.randn(B, Tk, Hkv, D, device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn(B, Tk, Hkv, D, device="cuda", generator=g, dtype=torch.bfloat16)
    tau = torch.logspace(0.3, 4.5, Hq, device="cuda")
    c = gate_cumsum(F.logsigmoid(torch.log(torch.expm1(1 / tau)).neg().expand(B, Tk, Hq).contiguous()))
    start = torch.randint(0, Tk // 2, (B, Hkv), device="cuda", generator=g) if ragged else None
    got = forgetting_attention_decode(q, k, v, c, start, backend="triton")
    want = torch_decode(q, k, v, c, start, D ** -0.5)
    err = ((got.double() - want.double()).norm() / want.double().norm()).item()
    assert err < 1e-2, err


@pytest.mark.parametrize("dtype,D", [(torch.float32, 256), (torch.bfloat16, 512)], ids=["fp32-d256", "bf16-d512"])
def test_head_dims_past_the_tuned_tiles_fit_shared_memory(dtype, D):
    """The tuned 128-key blocks asked an H100 for 303 KB (fp32, D 192-256) and 299 KB (bf16, D 320-512) of shared
    memory against its 227 KB: OutOfResources, until the launch learned to halve its key blocks."""
    g = torch.Generator(device="cuda").manual_seed(1)
    B, Tk, Hq, Hkv = 2, 700, 8, 2
    q = torch.randn(B, 1, Hq, D, device="cuda", generator=g, dtype=dtype)
    k = torch.randn(B, Tk, Hkv, D, device="cuda", generator=g, dtype=dtype)
    v = torch.randn(B, Tk, Hkv, D, device="cuda", generator=g, dtype=dtype)
    c = gate_cumsum(F.logsigmoid(torch.randn(B, Tk, Hq, device="cuda", generator=g) + 3))
    got = forgetting_attention_decode(q, k, v, c, backend="triton")
    want = torch_decode(q.double(), k.double(), v.double(), c, None, D ** -0.5)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, atol=1e-2 if dtype == torch.bfloat16 else 1e-5, rtol=0)


@torch.no_grad()
def test_bf16_model_decodes_through_the_kernel():
    from foxformer.models import FoxForCausalLM, get_preset

    torch.manual_seed(0)
    model = FoxForCausalLM(get_preset("fox-pro-tiny", vocab_size=512, num_kv_heads=2)).cuda().bfloat16().eval()
    ids = torch.randint(0, 512, (2, 600), device="cuda")
    full = model(ids).logits.float()
    cache = model.model.new_cache()
    parts = [model(ids[:, :500], cache=cache, use_cache=True).logits.float()]
    parts += [model(ids[:, t:t + 1], cache=cache, use_cache=True).logits.float() for t in range(500, 600)]
    err = (torch.cat(parts, 1) - full).abs().max().item()
    assert err < 5e-2 * full.abs().max().item(), err


@pytest.mark.parametrize("B,Hq,Hkv", [(1, 12, 12), (4, 8, 2)], ids=["b1-mha", "b4-gqa4"])
def test_paged_kernel_matches_dense_at_64k(B, Hq, Hkv):
    """The paged kernel on shuffled 64-key pages of a 64K cache against the dense torch path."""
    Tk, D, page = 65536, 64, 64
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(B, 1, Hq, D, device="cuda", generator=g, dtype=torch.bfloat16)
    k = torch.randn(B, Tk, Hkv, D, device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn(B, Tk, Hkv, D, device="cuda", generator=g, dtype=torch.bfloat16)
    tau = torch.logspace(0.3, 4.5, Hq, device="cuda")
    c = gate_cumsum(F.logsigmoid(torch.log(torch.expm1(1 / tau)).neg().expand(B, Tk, Hq).contiguous()))
    start = torch.randint(0, Tk // 2, (B, Hkv), device="cuda", generator=g)
    n = Tk // page
    table = torch.randperm(B * Hkv * n, device="cuda", generator=g).view(B, Hkv, n).to(torch.int32)

    def pages(x):  # [B, Tk, Hkv, X] -> pool [B * Hkv * n, page, X], page i of (b, h) at table[b, h, i]
        pool = torch.empty(B * Hkv * n, page, x.shape[-1], device="cuda", dtype=x.dtype)
        return pool.index_copy_(0, table.flatten().long(), x.transpose(1, 2).reshape(B * Hkv * n, page, x.shape[-1]))

    c_pages = pages(c.view(B, Tk, Hkv, Hq // Hkv))   # the c of a kv head's query heads, float64
    got = forgetting_attention_decode(q, pages(k), pages(v), c_pages, start, page_table=table, seq_len=Tk,
                                      backend="triton")
    want = torch_decode(q, k, v, c, start, D ** -0.5)
    err = ((got.double() - want.double()).norm() / want.double().norm()).item()
    assert err < 1e-2, err


@torch.no_grad()
def test_bf16_model_with_eviction_decodes_through_the_paged_kernel():
    """Evicting caches are paged: the CUDA paged path against the torch path of the same model and cache."""
    from foxformer.models import FoxForCausalLM, get_preset

    torch.manual_seed(0)
    model = FoxForCausalLM(get_preset("fox-pro-tiny", vocab_size=512, num_kv_heads=2)).cuda().bfloat16().eval()
    for layer in model.model.layers:  # kv head 0 forgets within tokens, kv head 1 keeps all
        layer.attn.fgate.proj.bias.data.copy_(torch.tensor([-2.0, -3.0, -1.0, 6.0]))
    ids = torch.randint(0, 512, (2, 700), device="cuda")
    logits = {}
    for backend in ("triton", "torch"):
        model.config.attention_backend = backend
        cache = model.model.new_cache(EvictionPolicy(1e-4))
        parts = [model(ids[:, :300], cache=cache, use_cache=True).logits.float()]
        parts += [model(ids[:, t:t + 1], cache=cache, use_cache=True).logits.float() for t in range(300, 700)]
        logits[backend] = torch.cat(parts, 1)
        assert any(bool((layer.start > 0).any()) for layer in cache.layers)
    err = (logits["triton"] - logits["torch"]).abs().max().item()
    assert err < 5e-2 * logits["torch"].abs().max().item(), err


@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
@pytest.mark.parametrize("Hq,Hkv,D", [(12, 12, 64), (16, 2, 128)], ids=["mha-d64", "gqa8-d128"])
def test_the_one_token_cache_write_gives_the_torch_ops_bits(Hq, Hkv, D, paged):
    """ops/forgetting_attn/append.py on CUDA: k, v, c, c_last and both shift states, bit for bit (dense
    buffers, or page pools of 16 rows with each (b, h) on its own shuffled pages)."""
    from foxformer.ops.forgetting_attn.append import append_token_

    g = torch.Generator(device="cuda").manual_seed(0)
    B, cap = 3, 4099
    pages = B * Hkv * (cap // 16 + 1)
    table = torch.randperm(pages, device="cuda", generator=g).reshape(B, Hkv, -1).int() if paged else None
    k_shape, c_shape = ((pages, 16, D), (pages, 16, Hq // Hkv)) if paged else ((B, cap, Hkv, D), (B, Hq, cap))
    k, v = (torch.randn(B, 1, Hkv, D, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2))
    raw = [torch.randn(B, Hkv, D, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(2)]
    log_f = F.logsigmoid(torch.randn(B, 1, Hq, device="cuda", generator=g) * 4)
    log_f[0, 0, 0] = float("-inf")
    c_last = torch.randn(B, Hq, device="cuda", generator=g, dtype=torch.float64) * 3e4
    outs = []
    for backend in ("torch", "triton"):
        bufs = [torch.full(k_shape, float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        c_buf = torch.full(c_shape, float("nan"), device="cuda", dtype=torch.float64)
        last, states = c_last.clone(), [torch.zeros_like(r) for r in raw]
        append_token_(*bufs, c_buf, last, torch.tensor([cap - 2], device="cuda"), k, v, log_f,
                      (states[0], raw[0]), (states[1], raw[1]), page_table=table, backend=backend)
        outs.append([*bufs, c_buf, last, *states])
    for want, got in zip(*outs):
        assert torch.equal(want.nan_to_num(7.0), got.nan_to_num(7.0))
    assert torch.equal(outs[1][4], raw[0]) and torch.equal(outs[1][5], raw[1])


@pytest.mark.parametrize("G", [1, 4], ids=["mha", "gqa4"])
def test_the_eviction_scan_kernel_gives_the_torch_paths_starts(G):
    """ops/forgetting_attn/evict_scan.py on CUDA: the windowed scan over shuffled pages of 64 rows, the newest
    position on the device (as in a captured step)."""
    from foxformer.ops.forgetting_attn.evict_scan import evict_scan_

    g = torch.Generator(device="cuda").manual_seed(G)
    B, Hkv, length, page = 4, 6, 4096, 64
    H, n = Hkv * G, length // page
    logit = torch.randn(B, length, H, device="cuda", generator=g) + torch.linspace(-3, 4, H, device="cuda")
    c = gate_cumsum(F.logsigmoid(logit))                                           # [B, T, H]
    table = torch.randperm(B * Hkv * n, device="cuda", generator=g).reshape(B, Hkv, n).int()
    pool = torch.empty(B * Hkv * n, page, G, device="cuda", dtype=torch.float64)
    pool[table.long()] = c.view(B, n, page, Hkv, G).permute(0, 3, 1, 2, 4)
    start0 = torch.randint(0, length - 200, (B, Hkv), device="cuda", generator=g)
    got = []
    for backend in ("torch", "triton"):
        start = start0.clone()
        evict_scan_(start, pool, table, c[:, -1].contiguous(), -8.0, 64, torch.tensor([length - 1], device="cuda"),
                    backend=backend)
        got.append(start)
    assert torch.equal(got[0], got[1]) and (got[1] > start0).any()


@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
def test_foxformer_check_values_checks_the_decode_ops_values_on_cuda(monkeypatch, paged):
    """As every other op's: without FOXFORMER_CHECK_VALUES=1 no device sync (a NaN c at a live key gives NaN), with
    it the CPU's checks (the decode op checked no value on CUDA, even with it set)."""
    B, Tk, Hq, Hkv, D = 2, 64, 4, 2, 64
    g = torch.Generator(device="cuda").manual_seed(2)
    q = torch.randn(B, 1, Hq, D, device="cuda", generator=g, dtype=torch.bfloat16)
    k = torch.randn(B, Tk, Hkv, D, device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn(B, Tk, Hkv, D, device="cuda", generator=g, dtype=torch.bfloat16)
    c = gate_cumsum(F.logsigmoid(torch.randn(B, Tk, Hq, device="cuda", generator=g) + 3))
    c[1, 40, 3] = float("nan")
    kw = {}
    if paged:  # pages of 16 keys, one kv head's pages after another's
        k, v = (x.transpose(1, 2).reshape(B * Hkv * 4, 16, D) for x in (k, v))
        c = c.unflatten(2, (Hkv, Hq // Hkv)).transpose(1, 2).reshape(B * Hkv * 4, 16, Hq // Hkv)
        kw = dict(page_table=torch.arange(B * Hkv * 4, device="cuda", dtype=torch.int32).view(B, Hkv, 4),
                  seq_len=torch.tensor([Tk], device="cuda"))
    monkeypatch.delenv("FOXFORMER_CHECK_VALUES", raising=False)
    assert torch.isnan(forgetting_attention_decode(q, k, v, c, backend="triton", **kw)[1]).any()
    monkeypatch.setenv("FOXFORMER_CHECK_VALUES", "1")
    with pytest.raises(ValueError, match=r"c must be finite at every live key .*batch 1, position 40, head 3"):
        forgetting_attention_decode(q, k, v, c, backend="triton", **kw)
    with pytest.raises(ValueError, match="seq_len 65 must be >= Tq"):
        forgetting_attention_decode(q, k, v, c, backend="triton", **{**kw, "seq_len": Tk + 1})
