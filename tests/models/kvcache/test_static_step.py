"""The static decode step (models.kvcache.graphs: what CUDA graphs capture and replay) without capture, on the
CPU: the same tokens and logits as the eager path, for FoX with and without eviction, the Transformer
baselines and the recurrent baseline; greedy and seeded sampling; one row and left-padded batches; beam search
reordering the cache; storage that grows; the memory report against the tensors really allocated."""
from types import SimpleNamespace

import pytest
import torch

from foxformer.infer import GenerationConfig, stream_tokens
from foxformer.models.kvcache import DenseKV, EvictionPolicy, PagedKV, RecurrentState
from foxformer.models.modeling import CACHE_FIELD

from .conftest import make_model, tokens

FAST = [-3.0, -3.0, 8.0, -3.0]  # heads 0, 1, 3 forget within a few tokens, head 2 keeps everything
MODELS = {  # preset, overrides, evict_eps
    "fox-pro": ("fox-pro-tiny", dict(num_kv_heads=2), None),
    "fox-pro-evicting": ("fox-pro-tiny", dict(num_kv_heads=2), 1e-6),
    "transformer-llama-rope": ("transformer-llama-tiny", {}, None),
    "transformer-pro": ("transformer-pro-tiny", {}, None),
    "linear-pro": ("linear-pro-tiny", {}, None),
}


def _model(name):
    preset, overrides, eps = MODELS[name]
    return make_model(preset, gate_bias=FAST if preset.startswith("fox") else None, **overrides), eps


def _stream(model, prompt, decode, **options):
    state = {}
    cfg = GenerationConfig(max_new_tokens=24, decode=decode, **options)
    return torch.stack(list(stream_tokens(model, prompt, cfg, state)), 1), state["cache"]


@pytest.mark.parametrize("name", list(MODELS), ids=list(MODELS))
@pytest.mark.parametrize("batch", [1, 3])
def test_static_steps_give_the_eager_tokens(name, batch):
    model, eps = _model(name)
    prompt = tokens(batch, 20, seed=batch)
    sample = dict(temperature=1.3, top_k=40, seed=5) if batch == 3 else dict(temperature=0)
    eager, _ = _stream(model, prompt, "eager", evict_eps=eps, **sample)
    static, cache = _stream(model, prompt, "static", evict_eps=eps, **sample)
    assert torch.equal(static, eager)
    assert cache.graphs is not None and cache.graphs.captures == 0 and cache.decode_note is None
    if eps is not None:
        assert all(isinstance(layer, PagedKV) and bool((layer.start > 0).any()) for layer in cache.layers)


@torch.no_grad()
@pytest.mark.parametrize("name", ["fox-pro-evicting", "transformer-llama-rope", "linear-pro"])
def test_static_steps_give_the_eager_logits_bit_for_bit(name):
    """Same kernels on the same storage: the eager step passes the whole buffers and the host's length, the
    static one the device's."""
    model, eps = _model(name)
    ids = tokens(2, 40, seed=4)
    logits = {}
    for decode in ("eager", "static"):
        cache = model.model.new_cache(None if eps is None else EvictionPolicy(eps), total_len=40, decode=decode)
        out = [model(ids[:, :25], cache=cache, use_cache=True).logits]
        out += [model(ids[:, t:t + 1], cache=cache, use_cache=True).logits for t in range(25, 40)]
        logits[decode] = torch.cat(out, 1)
    assert torch.equal(logits["static"], logits["eager"])


@torch.no_grad()
@pytest.mark.parametrize("name", ["fox-pro", "fox-pro-evicting"])
def test_static_steps_through_the_triton_cache_kernels_give_the_eager_logits(name, monkeypatch):
    """The GPU's path for a static step's writes (ops/forgetting_attn/append.py: k, v, c and the shift
    states, dense or paged) and for an evicting layer's scan (evict_scan.py), run interpreted: the eager logits
    bit for bit, and the same starts."""
    import functools

    from foxformer.models.kvcache import base, paged
    from foxformer.ops.forgetting_attn.append import append_token_
    from foxformer.ops.forgetting_attn.evict_scan import evict_scan_

    model, eps = _model(name)
    ids = tokens(2, 40, seed=9)
    logits, starts = {}, {}
    for decode in ("eager", "static"):
        if decode == "static":
            monkeypatch.setattr(base, "append_token_", functools.partial(append_token_, backend="triton"))
            monkeypatch.setattr(paged, "evict_scan_", functools.partial(evict_scan_, backend="triton"))
        cache = model.model.new_cache(None if eps is None else EvictionPolicy(eps), total_len=40, decode=decode)
        out = [model(ids[:, :25], cache=cache, use_cache=True).logits]
        out += [model(ids[:, t:t + 1], cache=cache, use_cache=True).logits for t in range(25, 40)]
        logits[decode] = torch.cat(out, 1)
        starts[decode] = [layer.start.clone() for layer in cache.layers if isinstance(layer, PagedKV)]
    assert torch.equal(logits["static"], logits["eager"])
    assert all(torch.equal(a, b) for a, b in zip(starts["static"], starts["eager"]))
    if eps is not None:
        assert any(bool((s > 0).any()) for s in starts["static"])


@pytest.mark.parametrize("name", ["fox-pro", "fox-pro-evicting", "transformer-llama-rope"])
@pytest.mark.parametrize("kind", ["left-padded-greedy", "beam3"])
def test_hf_generate_through_static_steps(name, kind):
    """Hugging Face generate drives the same step: left padding (positions from the mask) and beam search
    (the cache reordered every step, in place for dense layers)."""
    model, eps = _model(name)
    model.config.evict_eps = eps
    rows = [tokens(1, 19, seed=3)[0], tokens(1, 6, seed=4)[0], tokens(1, 12, seed=5)[0]]
    ids = torch.zeros(3, 19, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, 19 - len(r):], mask[i, 19 - len(r):] = r, 1
    opts = dict(attention_mask=mask, max_new_tokens=12, pad_token_id=0, return_dict_in_generate=True,
                **(dict(do_sample=False) if kind.endswith("greedy") else dict(num_beams=3, do_sample=False)))
    seqs = {}
    for decode in ("eager", "static"):
        cache = model.model.new_cache("config", total_len=19 + 11, decode=decode)
        out = model.generate(ids, **{CACHE_FIELD: cache}, **opts)
        seqs[decode] = out.sequences
    assert torch.equal(seqs["static"], seqs["eager"])


def test_static_steps_grow_storage_that_was_not_sized_for_them():
    """Without a length hint a dense buffer doubles: the step makes room first (and a captured graph would be
    captured anew: the version moves)."""
    model, _ = _model("fox-pro")
    ids = tokens(1, 60, seed=2)
    want = model(ids).logits
    cache = model.model.new_cache(decode="static")
    got = [model(ids[:, :10], cache=cache, use_cache=True).logits]
    versions = {cache.version}
    for t in range(10, 60):
        got.append(model(ids[:, t:t + 1], cache=cache, use_cache=True).logits)
        versions.add(cache.version)
    torch.testing.assert_close(torch.cat(got, 1), want, rtol=1e-9, atol=1e-9)
    assert len(versions) == 3 and cache[0].capacity == 64  # 16 -> 32 -> 64


def _allocated(layer) -> int:
    """Bytes of the tensors a layer's storage really holds."""
    if isinstance(layer, RecurrentState):
        tensors = [layer.state]
    elif isinstance(layer, DenseKV):
        tensors = [layer.k_buf, layer.v_buf, layer.c_buf]
    else:
        p = layer.pages
        tensors = [p.k_pages, p.v_pages, p.c_pages, p.table]
    return sum(t.untyped_storage().nbytes() for t in tensors)


@pytest.mark.parametrize("name", ["fox-pro", "fox-pro-evicting", "linear-pro"])
def test_the_memory_report_matches_the_allocations(name):
    model, eps = _model(name)
    _, cache = _stream(model, tokens(2, 150, seed=6), "static", evict_eps=eps, temperature=0)
    report = cache.memory_report()
    assert report["allocated_bytes"] == sum(_allocated(layer) for layer in cache.layers) > 0
    # the one-token steps' fused copy of each layer's input projections (a bias for every output row where
    # any of them has one: the forget gate's), reported on its own
    fused = 0
    for block in model.model.layers:
        linears = list(block.attn._input_linears().values())
        rows = sum(lin.out_features for lin in linears)
        biased = any(lin.bias is not None for lin in linears)
        fused += rows * (linears[0].in_features + biased) * linears[0].weight.element_size()
    assert report["fused_weights_bytes"] == fused > 0
    if eps is not None:
        assert report["live_bytes"] < report["no_eviction_bytes"] and report["kept_fraction"] < 0.6


def test_auto_on_the_cpu_falls_back_quietly_and_a_cache_asked_for_graphs_with_one_note():
    """"auto" quietly records why it decoded eagerly on the CPU; a cache asked for graphs (what transformers'
    cache_implementation="static" asks on any device) says it, once."""
    import warnings

    from foxformer.models.calls import fresh_cache

    model, _ = _model("fox-pro")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        eager, cache = _stream(model, tokens(1, 8), "auto", temperature=0)
    assert cache.decode_note == "decoding eagerly: CUDA graphs need a CUDA device" and cache.graphs is None
    cache = fresh_cache(model, 12, decode="graphs")
    with pytest.warns(UserWarning, match="decoding eagerly: CUDA graphs need a CUDA device") as record:
        for step in tokens(1, 8).split(1, dim=1):
            model(input_ids=step, cache=cache, use_cache=True)
    assert len(record) == 1
    with pytest.raises(ValueError, match="decode: expected one of"):
        GenerationConfig(decode="fast").validate()


@pytest.mark.parametrize("decode", ["graphs", "compiled"])
def test_graphs_asked_for_a_model_on_the_cpu_are_refused_at_the_call(decode):
    """They decoded eagerly, said only in a note at the end (the CLI's summary line)."""
    from foxformer.infer import generate

    model, _ = _model("fox-pro")
    said = (f"decode: {decode!r} replays CUDA graphs, which need a CUDA device, and the model runs on cpu; use "
            f"'auto' (graphs where they can run, eager here), 'static' or 'eager'")
    with pytest.raises(ValueError) as caught:
        generate(model, tokens(1, 8), decode=decode)  # before the stream is iterated
    assert str(caught.value) == said
    with pytest.raises(ValueError) as caught:
        _stream(model, tokens(1, 8), decode)
    assert str(caught.value) == said
    GenerationConfig(decode=decode).validate()  # where the model runs is not known: not refused


@pytest.mark.parametrize("name", ["fox-pro", "fox-pro-evicting", "transformer-llama-rope", "linear-pro"])
@pytest.mark.parametrize("decode", ["eager", "static"])
def test_a_left_padded_batch_through_foxformer_generate_gives_each_rows_tokens(name, decode):
    from foxformer.infer import generate

    model, eps = _model(name)
    rows = [tokens(1, 17, seed=7)[0], tokens(1, 5, seed=8)[0]]
    ids, mask = torch.zeros(2, 17, dtype=torch.long), torch.zeros(2, 17, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, 17 - len(r):], mask[i, 17 - len(r):] = r, 1
    opts = dict(max_new_tokens=10, temperature=0, evict_eps=eps, decode=decode, prefill_chunk=6)
    batch = torch.stack(list(generate(model, ids, attention_mask=mask, **opts)), 1)
    for i, r in enumerate(rows):
        assert batch[i].tolist() == list(generate(model, r.tolist(), **opts)), f"row {i}"



class _FakeCache:
    """What DecodeGraphs.run touches of a FoxCache."""
    policy, version, decode, decode_note = None, 0, "graphs", None

    def prepare_step(self):
        pass

    def sync_step_at(self, device):
        pass

    def advance(self, n):
        pass


@pytest.fixture
def fake_graphs(monkeypatch):
    """DecodeGraphs without a GPU: torch.cuda.CUDAGraph and torch.cuda.graph replaced by fakes that record the
    pool each capture is given (state["pools"]) and raise when state["fail"] is set."""
    from foxformer.models.kvcache import graphs

    state = {"pools": [], "fail": None}

    class FakeGraph:
        def __init__(self):
            self.handle = object()

        def pool(self):
            return self.handle

        def replay(self):
            pass

    class FakeCapture:
        def __init__(self, graph, pool=None):
            state["pools"].append(pool)

        def __enter__(self):
            if state["fail"]:
                raise RuntimeError(state["fail"])
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(graphs.torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(graphs.torch.cuda, "graph", FakeCapture)
    runner, cache = graphs.DecodeGraphs(), _FakeCache()
    x, positions = torch.zeros(1, 1, 4), torch.zeros(1, 1, dtype=torch.long)

    def run():
        return runner.run(lambda x, p, c, scan: x + 1, cache, x, positions, scan=False, capture=True)

    return state, runner, cache, run


def test_a_cache_whose_storage_moved_is_captured_in_a_fresh_pool(fake_graphs):
    """Once the cache's storage moves, the next capture gets no pool. Capturing into the pool of graphs that
    were all dropped tripped torch's caching allocator (an internal assert on the H200, which then failed every
    later CUDA test of the process)."""
    state, runner, cache, run = fake_graphs
    run()                    # warm-up: eager
    run()                    # first capture, a new pool
    run()                    # replay
    cache.version = 1        # the storage moved (a dense buffer doubled)
    run()                    # captured again
    assert runner.captures == 2
    assert state["pools"] == [None, None]


def test_a_failed_capture_decodes_eagerly_with_one_note(fake_graphs, monkeypatch):
    from foxformer.models.kvcache import graphs

    state, runner, cache, run = fake_graphs
    monkeypatch.setattr(graphs, "graph_blocker", lambda config, x, mode: None)  # as on a GPU
    cache.graphs = runner
    config = SimpleNamespace(attention="softmax", attention_backend="auto")
    assert graphs.step_kind(cache, config, torch.zeros(1, 1, 4)) == "graphs"
    state["fail"] = "operation not permitted when stream is capturing"
    run()
    with pytest.warns(UserWarning, match="decoding eagerly: capturing the step in a CUDA graph failed "
                                         r"\(operation not permitted"):
        assert torch.equal(run(), torch.ones(1, 1, 4))  # the step's eager result
    assert cache.decode_note.startswith("decoding eagerly: capturing the step")
    # later steps do not try again: the model's step_kind sends them down the eager path
    assert graphs.step_kind(cache, config, torch.zeros(1, 1, 4)) is None
