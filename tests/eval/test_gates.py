"""Forget-gate statistics, decay / attention matrices and the capture of q, k, log f."""
import math
import os

import numpy as np
import pytest
import torch

from foxformer.eval import capture_attention, choose_heads, gate_stats, head_matrices, parse_heads
from foxformer.eval.gates import effective_length
from foxformer.models.layers import timescale_bias

from .helpers import copy_model, tiny_model


def test_fixed_gates_give_their_analytic_timescales():
    """Fixed gates f = sigmoid(b) have timescale T = 1 / -log f and mean decay exp(-d / T): D(d) < 1/e at d = T."""
    model = tiny_model("fox-llama-tiny", fgate="fixed", fgate_tmin=2.0, fgate_tmax=40.0)
    tokens = torch.randint(0, 97, (2, 120), generator=torch.Generator().manual_seed(0))
    stats = gate_stats(model, tokens, points=200)
    want = 1.0 / -torch.nn.functional.logsigmoid(timescale_bias(4, 2.0, 40.0).double()).numpy()
    for layer in range(stats.num_layers):
        np.testing.assert_allclose(stats.timescale[layer], want, rtol=1e-5)
        np.testing.assert_allclose(stats.eff_context[layer], want, rtol=0.02)
        # f = sigmoid(b) >= 0.5 for every head here (b >= 0 when T >= 1 / log 2)
        assert stats.frac_below_half[layer] == [0.0] * 4
    assert stats.has_gate and stats.tokens == 240 and stats.max_distance == 119
    assert stats.summary()["median_timescale"] == pytest.approx(float(np.median(want)), rel=1e-5)


def test_data_dependent_gate_statistics_match_a_direct_computation():
    model = tiny_model("fox-pro-tiny")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.attn.fgate.proj.weight.normal_(0.0, 0.5)
            layer.attn.fgate.proj.bias.uniform_(-1.0, 3.0)
    tokens = torch.randint(0, 97, (2, 64), generator=torch.Generator().manual_seed(1))
    stats = gate_stats(model, tokens)
    # log f of layer 0 from its gate projection on the normed embeddings (kv shift etc. do not touch the gate)
    x = model.model.layers[0].attn_norm(model.model.embed_tokens(tokens))
    log_f = torch.nn.functional.logsigmoid(model.model.layers[0].attn.fgate.proj(x)).double()[:, 1:]
    np.testing.assert_allclose(stats.mean_log_f[0], log_f.mean((0, 1)).detach().numpy(), rtol=1e-5)
    np.testing.assert_allclose(stats.frac_below_half[0], (log_f < math.log(0.5)).double().mean((0, 1)).numpy())


def test_effective_length_interpolates_and_reports_never():
    d = np.array([1, 2, 4, 8])
    decay = np.stack([np.exp(-d / 3.0), np.ones(4), np.exp(-d / 0.5)], axis=1)
    eff = effective_length(d, decay)
    assert eff[0] == pytest.approx(3.0) and eff[1] is None and eff[2] == pytest.approx(0.5)


def test_head_matrices_are_causal_distributions_with_gate_decay():
    model = tiny_model("fox-llama-tiny", fgate="fixed", fgate_tmin=2.0, fgate_tmax=40.0)
    tokens = torch.randint(0, 97, (1, 50), generator=torch.Generator().manual_seed(2))
    mats = head_matrices(model, tokens, [(0, 0), (1, 3)], max_len=30)
    f = torch.sigmoid(timescale_bias(4, 2.0, 40.0).double()).numpy()
    for m in mats:
        a, dec = m["attention"], m["decay"]
        assert a.shape == dec.shape == (30, 30)
        np.testing.assert_allclose(a.sum(-1), 1.0, rtol=1e-9)
        assert np.all(np.triu(a, 1) == 0) and np.all(np.triu(dec, 1) == 0)
        i, j = 20, 5
        assert dec[i, j] == pytest.approx(f[m["head"]] ** (i - j), rel=1e-4)


def test_attention_of_copy_model_points_at_the_copied_position():
    """At a repeated token the hand-built induction head attends to the token after its earlier occurrence."""
    tokens = torch.tensor([[5, 9, 3, 7, 11, 12, 13, 7]])
    a = head_matrices(copy_model(16), tokens, [(0, 0)])[0]["attention"]
    assert a[7].argmax() == 4 and a[7, 4] > 0.99
    forgetful = head_matrices(copy_model(16, forget_all=True), tokens, [(0, 0)])[0]
    assert forgetful["attention"][7, 7] > 0.99 and forgetful["decay"][7, 4] < 1e-30


def test_transformer_has_no_gate_but_attention_matrices():
    model = tiny_model("transformer-llama-tiny")
    tokens = torch.randint(0, 97, (1, 20), generator=torch.Generator().manual_seed(3))
    stats = gate_stats(model, tokens)
    assert not stats.has_gate and stats.summary() == {"name": "model", "has_gate": False}
    mats = head_matrices(model, tokens, choose_heads(stats, 2))
    assert len(mats) == 2 and np.all(np.tril(mats[0]["decay"]) == np.tril(np.ones((20, 20))))
    np.testing.assert_allclose(mats[0]["attention"].sum(-1), 1.0, rtol=1e-9)


def test_capture_restores_the_model():
    model = tiny_model("fox-pro-tiny")
    tokens = torch.randint(0, 97, (1, 16))
    before = model(tokens).logits
    with capture_attention(model, qk_layers=[1]) as rec:
        inside = model(tokens).logits
    assert rec[1]["q"].shape == (1, 16, 4, 16) and rec[0]["log_f"].shape == (1, 16, 4) and "q" not in rec[0]
    assert all("_attend" not in layer.attn.__dict__ for layer in model.model.layers)
    torch.testing.assert_close(before, inside)


@pytest.mark.parametrize("spec, want", [("0:1,3:2", [(0, 1), (3, 2)]), ("", None), (None, None)],
                         ids=["two-heads", "empty", "none"])
def test_parse_heads(spec, want):
    assert parse_heads(spec) == want


def test_bad_heads_fail_clearly():
    with pytest.raises(ValueError, match="layer:head"):
        parse_heads("0-1")
    with pytest.raises(ValueError, match="outside"):
        head_matrices(tiny_model("fox-llama-tiny"), torch.zeros(1, 8, dtype=torch.long), [(5, 0)])
    with pytest.raises(TypeError, match="foxformer model"):
        gate_stats(torch.nn.Linear(2, 2), torch.zeros(1, 8, dtype=torch.long))


@pytest.mark.parametrize("max_len", [0, -5, 2.5], ids=["zero", "negative", "fractional"])
def test_bad_matrix_length_fails_clearly(max_len):
    # 0 crashed with an IndexError deep in the model; -5 silently showed all but the last 5 tokens
    with pytest.raises(ValueError, match="matrix_len"):
        head_matrices(tiny_model("fox-llama-tiny"), torch.zeros(1, 8, dtype=torch.long), [(0, 0)], max_len=max_len)


@pytest.mark.parametrize("names", [("a b", "a_b"), ("x/y", "x?y")], ids=["space-vs-underscore", "two-symbols"])
def test_labels_that_share_a_plot_file_name_are_refused(tmp_path, names):
    # plot file names go through safe_name: the second model's plots silently overwrote the first one's
    from foxformer.eval.outputs import save_gates

    tokens = torch.randint(0, 97, (1, 24), generator=torch.Generator().manual_seed(0))
    analyses = []
    for seed, name in enumerate(names):
        model = tiny_model("fox-pro-tiny", seed=seed)
        analyses.append((gate_stats(model, tokens, name=name), model, tokens))
    with pytest.raises(ValueError, match="same file names"):
        save_gates(analyses, str(tmp_path), matrix_len=16)
    assert list(tmp_path.iterdir()) == []


def test_linear_attention_matrices_are_the_weights_the_op_gives_the_values():
    """Gated linear attention has no softmax: A[i, j] = (q_i . k_j) exp(c_i - c_j) with unit q, k, so that
    o_i = sum_j A[i, j] v_j, what the layer computes (a softmax over the scores would be another model)."""
    from foxformer.ops import gated_linear_attention

    model = tiny_model("linear-pro-tiny")
    tokens = torch.randint(0, 97, (1, 24), generator=torch.Generator().manual_seed(4))
    layer, head = 1, 2
    a = head_matrices(model, tokens, [(layer, head)])[0]["attention"]
    with torch.no_grad(), capture_attention(model, qk_layers=[layer]) as rec:
        model(tokens)
    q, k = (torch.nn.functional.normalize(rec[layer][x].double(), dim=-1) for x in ("q", "k"))
    v = torch.randn(q.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    out = gated_linear_attention(q, k, v, rec[layer]["log_f"].double())
    np.testing.assert_allclose(a @ v[0, :, head].numpy(), out[0, :, head].numpy(), rtol=1e-7, atol=1e-10)


def test_linear_attention_plots_show_the_magnitude_of_signed_weights(tmp_path, monkeypatch):
    """The matrix plots start their colour scale at 0 (probabilities): negative weights would vanish."""
    from foxformer.eval import outputs

    drawn = {}
    monkeypatch.setattr(outputs.plots, "plot_matrices",
                        lambda panels, path, **kw: drawn.setdefault(os.path.basename(path), panels) and path)
    model = tiny_model("linear-pro-tiny")
    tokens = torch.randint(0, 97, (1, 24), generator=torch.Generator().manual_seed(0))
    outputs.save_gates([(gate_stats(model, tokens, name="lin"), model, tokens)], str(tmp_path), heads=[(0, 1)])
    (label, shown), = drawn["gates_lin_attention.png"]
    signed = head_matrices(model, tokens, [(0, 1)])[0]["attention"]
    assert (signed < 0).any() and label == "|A| L0 H1"
    np.testing.assert_array_equal(shown, np.abs(signed))


def _saved_figures(monkeypatch) -> dict:
    """The figures save_gates draws, by file name, as they are saved."""
    from foxformer.eval import outputs

    figures = {}
    save = outputs.plots.save_figure
    monkeypatch.setattr(outputs.plots, "save_figure",
                        lambda fig, path: figures.setdefault(os.path.basename(path), fig) and save(fig, path))
    return figures


def test_every_gate_plot_says_what_its_colours_and_lines_are(tmp_path, monkeypatch):
    """The colour bars of the decay and attention matrices had no label, and the per-head decay curves no legend
    (save_gates gave no names): each colour bar now names its quantity and unit, each line plot has a legend."""
    from foxformer.eval import outputs

    figures = _saved_figures(monkeypatch)
    model = tiny_model("fox-pro-tiny")
    tokens = torch.randint(0, 97, (1, 32), generator=torch.Generator().manual_seed(0))
    stats = gate_stats(model, tokens, name="fox")
    outputs.save_gates([(stats, model, tokens)], str(tmp_path), heads=[(0, 1), (1, 0)])
    assert sorted(figures) == sorted(f"gates_fox_{k}.png" for k in
                                     ("decay", "attention", "timescale", "eff_context", "decay_curves"))
    assert all((tmp_path / name).exists() for name in figures)
    bars = {name: [ax.get_ylabel() for ax in fig.axes if ax.get_label() == "<colorbar>"]
            for name, fig in figures.items()}
    assert bars["gates_fox_decay.png"] == ["log10 decay F [fraction kept]"] * 2
    assert bars["gates_fox_attention.png"] == ["log10 attention weight [probability]"] * 2
    assert bars["gates_fox_timescale.png"] == ["log10 timescale [tokens]"]
    assert bars["gates_fox_eff_context.png"] == ["log10 effective context [tokens]"]
    (curves,) = figures["gates_fox_decay_curves.png"].axes
    legend = [t.get_text() for t in curves.get_legend().get_texts()]
    assert legend == [f"layer {i}" for i in range(stats.num_layers)] + ["1/e"]
    assert len(curves.get_lines()) == stats.num_layers * len(stats.timescale[0]) + 1
    assert "[tokens]" in curves.get_xlabel()


@pytest.mark.parametrize("scale, label", [("log", "log10 attention weight [probability]"),
                                          ("linear", "attention weight [probability]")])
def test_attention_matrices_are_drawn_on_the_scale_asked_for(tmp_path, monkeypatch, scale, label):
    """On the linear scale nearly all of a row's weight sits on the diagonal, and the rest was one dark colour
    (a Transformer's spread-out attention and FoX's local one looked alike): log is the default."""
    from foxformer.eval import outputs

    figures = _saved_figures(monkeypatch)
    model = tiny_model("transformer-pro-tiny")
    tokens = torch.randint(0, 97, (1, 32), generator=torch.Generator().manual_seed(0))
    outputs.save_gates([(gate_stats(model, tokens, name="tf"), model, tokens)], str(tmp_path), heads=[(0, 1)],
                       attention_scale=scale)
    panel, bar = figures["gates_tf_attention.png"].axes
    assert bar.get_ylabel() == label
    shown = panel.get_images()[0]
    weights = head_matrices(model, tokens, [(0, 1)])[0]["attention"]
    if scale == "log":
        assert shown.get_clim() == (-6, 0)
        np.testing.assert_allclose(shown.get_array()[5, :6], np.log10(np.clip(weights[5, :6], 1e-6, None)))
    else:
        assert shown.get_clim() == (0.0, pytest.approx(weights.max()))


def test_log_scale_reaches_linear_attention_weights_above_one():
    """|A| of gated linear attention may exceed 1, which a log scale topped at 0 showed as one colour."""
    from foxformer.eval.plots import matrices_figure

    m = np.tril(np.full((4, 4), 1e-3))
    m[3, 0] = 100.0
    fig = matrices_figure([("|A|", m)], label="|weight|", log_scale=True)
    assert fig.axes[0].get_images()[0].get_clim() == (-6, pytest.approx(2.0))


@pytest.mark.parametrize("n", [256, 5])
def test_matrix_panels_mark_token_positions_on_both_axes(n):
    """The decay and attention matrices had no ticks: nothing said which tokens a panel spans, nor how far apart
    two of its points are. A few whole token positions now mark both axes, inside the matrix."""
    from foxformer.eval.plots import matrices_figure

    fig = matrices_figure([("A", np.tril(np.ones((n, n))))], label="weight")
    panel = fig.axes[0]
    fig.canvas.draw()
    for labels, limits, along in ((panel.get_xticklabels(), panel.get_xlim(), 0),
                                  (panel.get_yticklabels(), panel.get_ylim(), 1)):
        shown = [t.get_text() for t in labels if min(limits) <= t.get_position()[along] <= max(limits)]
        assert 2 <= len(shown) <= 4 and shown[0] == "0"
        assert all(0 <= int(t) <= n - 1 for t in shown)
    assert (panel.get_xlabel(), panel.get_ylabel()) == ("key position j", "query position i")


def test_head_grid_numbers_and_title_stay_readable():
    """Every number was written in cyan, which vanished on the pale end of the colour map, and the effective
    context plot's title ran past a 4-head figure over its colour bar's label."""
    import matplotlib.colors as mcolors
    import matplotlib.pyplot as plt

    from foxformer.eval.plots import head_grid_figure

    title = "fox: effective context length (decay < 1/e; 255 = beyond the text)"
    fig = head_grid_figure(np.array([[1.0, 3.0, 10.0, 300.0]]), title=title, label="tokens", log=True)
    ax = fig.axes[0]
    colours = {t.get_text(): mcolors.to_hex(t.get_color()) for t in ax.texts}
    assert colours["1.00"] == "#ffffff" and colours["300"] == "#000000"  # the dark end and the pale end
    fig.canvas.draw()
    shown = ax.title.get_window_extent()
    assert ax.title.get_text().replace("\n", " ") == title
    assert shown.x1 <= ax.get_window_extent().x1 + 1 and shown.x0 >= 0
    plt.close(fig)
