"""Per-position loss, perplexity and bootstrap bands."""
import os

import numpy as np
import pytest
import torch

from foxformer.eval import bootstrap_mean_bands, eval_loss, loss_curve, per_token_loss, smooth

from .helpers import tiny_model

PRESETS = ["fox-pro-tiny", "fox-llama-tiny", "transformer-llama-tiny"]


@pytest.mark.parametrize("preset", PRESETS)
def test_per_token_loss_equals_forward_pass(preset):
    model = tiny_model(preset)
    tokens = torch.randint(0, 97, (3, 40), generator=torch.Generator().manual_seed(1))
    want = model(tokens, labels=tokens, loss_reduction="none").loss
    got = per_token_loss(model, tokens, batch_size=2, chunk=7)  # chunks of the LM head must not change anything
    assert got.shape == (3, 39) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("preset", ["fox-pro-tiny", "transformer-llama-tiny"])
def test_per_token_loss_equals_token_by_token_decoding(preset):
    """-log p of each next token, read off a KV-cached decode one token at a time."""
    model = tiny_model(preset).double()
    tokens = torch.randint(0, 97, (1, 24), generator=torch.Generator().manual_seed(2))
    got = per_token_loss(model, tokens)[0]
    cache, want = None, []
    with torch.no_grad():
        for t in range(23):
            out = model(tokens[:, t:t + 1], past_key_values=cache, use_cache=True)
            cache = out["cache"] if "cache" in out.keys() else out.past_key_values
            want.append(-torch.log_softmax(out.logits[0, -1], -1)[tokens[0, t + 1]])
    torch.testing.assert_close(got.double(), torch.stack(want), rtol=1e-5, atol=1e-5)


def test_loss_curve_perplexity_and_smoothing():
    rng = np.random.default_rng(0)
    rows = rng.gamma(2.0, 1.0, size=(9, 31))
    c = loss_curve(rows, lengths=[1, 5, 31], smooth_window=1, n_boot=200, train_len=16)
    np.testing.assert_allclose(c.loss, rows.mean(0))
    np.testing.assert_allclose(c.smoothed, rows.mean(0))
    for l, p in zip(c.lengths, c.perplexity):
        assert p == pytest.approx(np.exp(rows.mean(0)[:l].mean()))
    assert c.positions[0] == 1 and c.positions[-1] == 31 and c.seq_len == 32
    s = c.summary()
    assert s["loss_within_train_len"] == pytest.approx(rows.mean(0)[:15].mean())
    assert s["loss_beyond_train_len"] == pytest.approx(rows.mean(0)[15:].mean())


def test_smooth_is_a_centered_moving_average():
    x = np.arange(10, dtype=float)
    np.testing.assert_allclose(smooth(x, 3)[1:-1], x[1:-1])
    assert smooth(x, 3)[0] == 0.0 and smooth(x, 3)[-1] == pytest.approx(8.5)


def test_smoothed_curve_keeps_the_first_positions_apart():
    """loss_curve.png draws L(i) on a log axis: the full window at the start averaged the first octaves of a 16K
    evaluation into one flat 3.47, where L(1) was 6.95. The window reaches at most i/4 either side of position i."""
    positions = np.arange(1, 4096)
    rows = np.tile(3.0 + 4.0 / positions, (2, 1))
    c = loss_curve(rows, smooth_window=64, n_boot=20)
    sm = np.asarray(c.smoothed)
    np.testing.assert_allclose(sm[:3], rows[0, :3])  # positions 1 to 3: nothing to either side
    assert sm[7] == pytest.approx(rows[0, 5:10].mean())  # position 8: 6 .. 10
    assert sm[999] == pytest.approx(rows[0, 999 - 32:999 + 32].mean())  # the whole window once i/4 reaches it
    assert np.all(np.diff(sm[:1000]) < 0)  # a falling L(i) still falls: no flat start


@pytest.mark.parametrize("n_rows", [1, 2, 50], ids=["one-seq", "two-seqs", "fifty-seqs"])
def test_bootstrap_bands_contain_the_mean(n_rows):
    rows = np.random.default_rng(n_rows).normal(3.0, 1.0, size=(n_rows, 40))
    lo, hi = bootstrap_mean_bands(rows, n_boot=300, seed=1)
    mean = rows.mean(0)
    assert np.all(lo <= mean) and np.all(mean <= hi)
    if n_rows == 50:  # a real band: wider than nothing, narrower than the spread of single rows
        width = hi - lo
        assert np.all(width > 0) and np.all(width < rows.std(0) * 2)


@pytest.mark.parametrize("n_seqs", [1, 3], ids=["one-seq", "three-seqs"])
def test_one_sequence_draws_no_bootstrap_band(n_seqs, tmp_path, monkeypatch):
    """With one sequence every resample is that sequence: loss_curve.png drew a zero-width "95% bootstrap band",
    which read as a curve known exactly."""
    from foxformer.eval import plots
    from foxformer.eval.outputs import save_loss

    figures, save = {}, plots.save_figure

    def capture(fig, path):
        figures[os.path.basename(path)] = fig
        return save(fig, path)

    monkeypatch.setattr(plots, "save_figure", capture)
    rows = np.random.default_rng(0).normal(3.0, 0.5, size=(n_seqs, 63))
    save_loss([loss_curve(rows, name="m", n_boot=50)], str(tmp_path))
    loss_ax, ppl_ax = figures["loss_curve.png"].axes[0], figures["perplexity.png"].axes[0]
    bands = [len(ax.collections) for ax in (loss_ax, ppl_ax)]
    if n_seqs == 1:
        assert bands == [0, 0]
        assert "no interval: 1 sequence" in loss_ax.get_title() and "bootstrap band" not in loss_ax.get_title()
        assert ppl_ax.get_legend().get_texts()[0].get_text() == "m (1 sequence: no interval)"
    else:
        assert bands == [1, 1] and "95% bootstrap band" in loss_ax.get_title()


@pytest.mark.parametrize("train_len", [32, None], ids=["known", "unknown"])
def test_the_loss_title_tells_of_dashes_only_where_they_are_drawn(train_len, tmp_path, monkeypatch):
    """An HF folder without --train-len has no training length: loss_curve.png drew no line, yet its title read
    "dashed: train length"."""
    from foxformer.eval import plots
    from foxformer.eval.outputs import save_loss

    figures = {}

    def capture(fig, path):
        figures[os.path.basename(path)] = fig
        return path

    monkeypatch.setattr(plots, "save_figure", capture)
    rows = np.random.default_rng(0).normal(3.0, 0.5, size=(3, 63))
    save_loss([loss_curve(rows, name="m", train_len=train_len, n_boot=20)], str(tmp_path))
    ax = figures["loss_curve.png"].axes[0]
    dashed = [line for line in ax.lines if line.get_linestyle() == "--"]
    assert len(dashed) == (1 if train_len else 0)
    assert ("dashed: train length" in ax.get_title()) == bool(train_len)
    assert ax.get_title().endswith(")") and ax.get_title().count("(") == ax.get_title().count(")")


def test_bootstrap_band_of_eval_loss_contains_curve():
    model = tiny_model("fox-llama-tiny")
    tokens = torch.randint(0, 97, (6, 33), generator=torch.Generator().manual_seed(3))
    c = eval_loss(model, tokens, n_boot=100, progress=False)
    assert np.all(np.asarray(c.smoothed_lo) <= np.asarray(c.smoothed) + 1e-12)
    assert np.all(np.asarray(c.smoothed) <= np.asarray(c.smoothed_hi) + 1e-12)
    assert np.all(np.asarray(c.perplexity_lo) <= np.asarray(c.perplexity) * (1 + 1e-12))
    assert c.lengths == [1, 2, 4, 8, 16, 32]


@pytest.mark.parametrize("bad, err, match", [
    (torch.zeros(2, 1, dtype=torch.long), ValueError, "at least 2"),
    (torch.zeros(2, 8), TypeError, "integer token ids"),
    (torch.full((1, 8), 500), ValueError, "outside the model's vocabulary"),
    (torch.zeros(1, 2, 8, dtype=torch.long), ValueError, r"\[batch, seq\]"),
    ([1, 2, 3], TypeError, "torch.Tensor"),
], ids=["too-short", "float-ids", "id-beyond-vocab", "3d", "list"])
def test_bad_tokens_fail_clearly(bad, err, match):
    with pytest.raises(err, match=match):
        per_token_loss(tiny_model("fox-llama-tiny"), bad)


@pytest.mark.parametrize("instrument", ["per_token_loss", "eval_loss", "gate_stats"])
def test_no_sequences_are_refused_by_every_instrument(instrument):
    """Zero rows failed inside torch.cat (eval_loss), and gate_stats reported a FoX model as having no gate."""
    import foxformer.eval as ev

    with pytest.raises(ValueError, match=r"tokens: no sequences \(shape \(0, 16\)\); give at least one"):
        getattr(ev, instrument)(tiny_model("fox-pro-tiny"), torch.zeros(0, 16, dtype=torch.long))


@pytest.mark.parametrize("kwargs, match", [
    (dict(seed=-1), "seed"), (dict(smooth_window=-3), "smooth_window"), (dict(smooth_window=0), "smooth_window"),
    (dict(n_boot=0), "n_boot"), (dict(confidence=95.0), "confidence"),
], ids=["negative-seed", "negative-window", "zero-window", "zero-resamples", "percent-confidence"])
def test_bad_curve_arguments_fail_before_the_model_runs(kwargs, match, monkeypatch):
    # a negative seed failed with numpy's unnamed "expected non-negative integer", a negative window was taken
    # as "no smoothing", and all of them only after every sequence had gone through the model
    import foxformer.eval.loss as loss_mod

    def no_model(*a, **k):
        raise AssertionError("the model ran before the arguments were checked")

    monkeypatch.setattr(loss_mod, "per_token_loss", no_model)
    with pytest.raises(ValueError, match=match):
        loss_mod.eval_loss(tiny_model("fox-llama-tiny"), torch.zeros(1, 8, dtype=torch.long), progress=False,
                           **kwargs)
    with pytest.raises(ValueError, match=match):
        loss_curve(np.ones((2, 10)), **kwargs)


def test_a_context_length_beyond_the_sequences_is_refused_before_the_model_runs(monkeypatch):
    """`eval loss --seq-len 512 --lengths 1Ki` read every sequence through the model, then failed."""
    from foxformer.eval import loss

    monkeypatch.setattr(loss, "per_token_loss", lambda *a, **k: pytest.fail("the model ran"))
    with pytest.raises(ValueError, match=r"lengths: context lengths must lie in \[1, 39\] \(seq_len - 1\), got \[40\]"):
        eval_loss(tiny_model(), torch.zeros(2, 40, dtype=torch.long), lengths=[8, 40], progress=False)


def test_bad_curve_arguments_fail_clearly():
    rows = np.ones((2, 10))
    with pytest.raises(ValueError, match="lengths"):
        loss_curve(rows, lengths=[11])
    with pytest.raises(ValueError, match="confidence"):
        loss_curve(rows, confidence=1.5)
    with pytest.raises(ValueError, match="NaN"):
        loss_curve(np.full((2, 10), np.nan))


@pytest.mark.parametrize("write", ["figure", "json", "text"])
def test_a_write_interrupted_part_way_keeps_the_previous_file_and_no_temporary(write, tmp_path, monkeypatch):
    """A Ctrl-C while savefig wrote left a truncated PNG under the final name (the JSON's temporary stayed too;
    a report's open(path, "w") emptied the earlier one at once)."""
    import matplotlib.figure

    from foxformer.eval import plots
    from foxformer.paths import write_json, write_text

    path = tmp_path / {"figure": "loss_curve.png", "json": "loss.json", "text": "report.md"}[write]
    path.write_bytes(b"earlier, complete")

    def half_then_ctrl_c(target, *args, **kwargs):
        with open(target, "wb") as f:
            f.write(b"\x89PNG half")
        raise KeyboardInterrupt

    if write == "figure":
        monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, target, **kw: half_then_ctrl_c(target))
        with pytest.raises(KeyboardInterrupt):
            plots.save_figure(plots.plt.figure(), str(path))
    else:
        monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(KeyboardInterrupt()))
        with pytest.raises(KeyboardInterrupt):
            if write == "json":
                write_json(path, {"mean_loss": 1.0})
            else:
                write_text(path, "# report\n")
    assert path.read_bytes() == b"earlier, complete"
    assert os.listdir(tmp_path) == [path.name]
