"""scripts/issue20_doc.py keeps the parts of docs/results.md's issue-20 section that the bundles it is given do not
cover: a later GPU call's bundle updates its own parts, while the figures of bundles that are gone (with an earlier
session's machine) stay as they were generated."""
import json
import os
import shutil

import pytest

from .eval.helpers import save_loss_unplotted

ROOT = os.path.join(os.path.dirname(__file__), os.pardir)


@pytest.fixture(scope="module")
def doc_script(load_script):
    return load_script("issue20_doc")


def _section(mod, text):
    return text[text.index(mod.BEGIN):text.index(mod.END) + len(mod.END)]


def test_the_published_section_is_rebuilt_unchanged_from_its_own_units(doc_script):
    text = open(os.path.join(ROOT, doc_script.DOC)).read()
    units, summary, provenance = doc_script.old_units(text)
    assert {"eval_pro", "lodo_eval_src_prose", "mqar"} <= set(units) and len(provenance) >= 8
    assert doc_script._assemble([], {}, (units, summary, provenance)) == _section(doc_script, text)


def test_a_new_bundle_replaces_its_own_units_and_keeps_the_rest(doc_script, tmp_path):
    text = open(os.path.join(ROOT, doc_script.DOC)).read()
    old = doc_script.old_units(text)
    bundle = tmp_path / "lodo_rest_s1"
    bundle.mkdir()
    (bundle / "commit.txt").write_text("abc1234")
    new_body = ["#### the mix's held-out prose documents", "", "NEW TABLE", ""]
    new_line = "- the mix's held-out prose documents, trained without prose, FoX (Pro) - Transformer (Pro) (3 seeds): x"
    out = doc_script._assemble([str(bundle)], {"lodo_eval_src_prose": (new_body, [new_line])}, old)
    units, summary, provenance = doc_script.old_units(out + "\n")
    assert units["lodo_eval_src_prose"] == new_body and summary["lodo_eval_src_prose"] == [new_line]
    assert {uid: body for uid, body in units.items() if uid != "lodo_eval_src_prose"} == \
        {uid: body for uid, body in old[0].items() if uid != "lodo_eval_src_prose"}
    assert summary["eval_pro"] == old[1]["eval_pro"]
    assert provenance["lodo_rest_s1"] == "- lodo_rest_s1 (bundle folder): commit abc1234"
    assert list(provenance)[:-1] == list(old[2])          # the earlier bundles keep their lines, in order
    order = [out.index(doc_script.UNIT.format(uid)) for uid in doc_script.ORDER if uid in units]
    assert order == sorted(order)


def test_parts_no_bundle_ever_gave_are_pending(doc_script):
    out = doc_script._assemble([], {}, ({}, {}, {}))
    assert out.count("Pending:") == 3 + len(doc_script.ABLATIONS) and "issue20:unit" not in out


def _noprose_run(bundle, model, seed, offset, texts):
    """A run of the no-prose pair as scripts/reproduce.sh leaves it: config.yaml, and loss.json per text."""
    import numpy as np
    import yaml

    from foxformer.eval.loss import loss_curve

    run = bundle / "runs" / f"{model}-small_s{seed}"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"preset": f"{model}-small", "data_dir": "repro/gpt2_noprose"}))
    shared = np.random.default_rng(99).normal(0, 0.3, size=(6, 1))
    for text in texts:
        rows = 4.0 + offset + shared + np.random.default_rng(seed).normal(0, 0.02, size=(6, 63))
        save_loss_unplotted([loss_curve(rows, name=model, train_len=16, n_boot=20)], str(run / text),
                            {"data": "d", "split": "val", "seq_len": 64, "num_seqs": 6, "tokens_sha256": text})


def test_a_lodo_rest_bundle_updates_the_prose_and_go_units_only(doc_script, tmp_path, monkeypatch):
    """What the next call of `issue20.sh lodo-rest` brings (the no-prose pair, three seeds, evaluated on the
    left-out prose and on Go only), given alone: those two units are regenerated with three seeds, every other
    unit and summary line of the published section stays."""
    monkeypatch.setattr(doc_script, "OUT", str(tmp_path / "out"))
    bundle = tmp_path / "lodo_rest"
    for seed in range(3):
        for model, offset in (("fox-pro", 0.1), ("transformer-pro", 0.0)):
            _noprose_run(bundle, model, seed, offset, ("eval_src_prose", "eval_ood_go"))
    (bundle / "commit.txt").write_text("abc1234")
    text = open(os.path.join(ROOT, doc_script.DOC)).read()
    old = doc_script.old_units(text)
    units, summary, provenance = doc_script.old_units(doc_script.section([str(bundle)], old) + "\n")
    fresh = {"lodo_eval_src_prose", "lodo_eval_ood_go"}
    earlier = {uid + doc_script.EARLIER for uid in fresh}
    assert {uid: body for uid, body in units.items() if uid not in fresh | earlier | {"lodo"}} == \
        {uid: body for uid, body in old[0].items() if uid not in fresh | earlier | {"lodo"}}
    for uid in fresh:
        assert units[uid] != old[0][uid]
        [line] = summary[uid]
        assert "(3 seeds)" in line and "**+0.1" in line        # FoX (Pro) 0.1 behind, an interval that excludes 0
        assert units[uid][-1] == doc_script.INPUTS.format(" ".join(
            f"lodo_rest/{m}-small_s{s}" for m in ("fox-pro", "transformer-pro") for s in range(3)))
    assert summary["lodo_eval"] == old[1]["lodo_eval"] and provenance["lodo_rest"].endswith("commit abc1234")


def test_seeds_from_two_calls_are_compared_together_through_the_kept_inputs(doc_script, tmp_path, monkeypatch):
    """`lodo-rest 0` in one session, `lodo-rest "1 2"` in another: the first run keeps its bundle's inputs
    (slimmed) under inputs/, the second, given only the new bundle, compares all three seeds."""
    monkeypatch.setattr(doc_script, "OUT", str(tmp_path / "out"))
    first, second = tmp_path / "lodo_rest_s0", tmp_path / "lodo_rest_s12"
    for bundle, seeds in ((first, (0,)), (second, (1, 2))):
        for seed in seeds:
            for model, offset in (("fox-pro", 0.1), ("transformer-pro", 0.0)):
                _noprose_run(bundle, model, seed, offset, ("eval_src_prose", "eval_ood_go"))
        (bundle / "commit.txt").write_text(f"commit of {bundle.name}")
    text = open(os.path.join(ROOT, doc_script.DOC)).read()
    text = doc_script.update(text, [str(first)])
    assert "(1 seed)" in doc_script.old_units(text)[1]["lodo_eval_ood_go"][0]
    kept = tmp_path / "out" / "inputs" / "lodo_rest_s0" / "runs" / "fox-pro-small_s0"
    model = json.loads((kept / "eval_ood_go" / "loss.json").read_text())["models"][0]
    assert "bin_edges" in model and (kept / "config.yaml").exists()
    shutil.rmtree(first)  # the machine that unpacked it is gone
    text = doc_script.update(text, [str(second)])
    units, summary, provenance = doc_script.old_units(text)
    for uid in ("lodo_eval_src_prose", "lodo_eval_ood_go"):
        assert "(3 seeds)" in summary[uid][0]
        # the published part the first call replaced stays once, beside; the first call's own is pooled, not kept
        assert text.count(doc_script.UNIT.format(uid + doc_script.EARLIER)) == 1
        assert not any("(1 seed)" in line and "lodo_rest" in line for line in units[uid + doc_script.EARLIER])
    assert provenance["lodo_rest_s0"].endswith("commit of lodo_rest_s0")      # read from the kept inputs
    assert provenance["lodo_rest_s12"].endswith("commit of lodo_rest_s12")


def test_a_part_replaced_without_all_its_runs_stays_beside_as_an_earlier_call(doc_script):
    """An old comparison whose runs the new one does not read (its inputs were never kept) is not overwritten: it
    stays as UID@earlier, marked, its figure dropped; one whose runs the new one reads is simply replaced."""
    inputs = doc_script.INPUTS.format
    old_body = ["#### Go source (not in the mix)", "", "OLD TABLE", "", "![loss difference](x.png)", "",
                inputs("a/r_s0")]
    old = ({"lodo_eval_ood_go": old_body}, {"lodo_eval_ood_go": ["- Go (1 seed): +0.4"]}, {})
    new = {"lodo_eval_ood_go": (["#### Go source (not in the mix)", "", "NEW", "", inputs("b/r_s1 b/r_s2")],
                                ["- Go (2 seeds): -0.1"])}
    units, summary, _ = doc_script.old_units(doc_script._assemble([], new, old) + "\n")
    assert units["lodo_eval_ood_go@earlier"] == [
        "#### Go source (not in the mix): an earlier call, not pooled with the rows above (its inputs were not kept)",
        "", "OLD TABLE", "", inputs("a/r_s0")]
    assert summary["lodo_eval_ood_go@earlier"] == ["- earlier call, not pooled: Go (1 seed): +0.4"]
    new["lodo_eval_ood_go"][0][-1] = inputs("a/r_s0 b/r_s1 b/r_s2")
    units, _, _ = doc_script.old_units(doc_script._assemble([], new, old) + "\n")
    assert set(units) == {"lodo_eval_ood_go", "lodo"}


def test_runs_a_time_guard_stopped_are_named_with_their_steps(doc_script, tmp_path):
    """A run whose training ended before its planned tokens (config total_tokens / batch_tokens) is listed with its
    steps; one that finished, or one without a training record, is not."""
    import yaml

    def run(name, steps, total=45_000_000, record=True):
        d = tmp_path / "bundle" / "runs" / name
        (d / "eval_ood_go").mkdir(parents=True)
        (d / "config.yaml").write_text(yaml.safe_dump({"total_tokens": total, "batch_tokens": 131072}))
        if record:
            (d / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "step": 10}) + "\n"
                                             + json.dumps({"kind": "end", "step": steps}) + "\n")
        return str(d / "eval_ood_go" / "loss.json")

    paths = [run("fox-pro-small_s1", 319), run("transformer-pro-small_s1", 344),
             run("fox-pro-small_s2", 5, record=False)]
    early = ["fox-pro-small_s1 (319 of 344 steps)"]
    assert doc_script.stopped_early(paths) == early
    assert doc_script.stopped_early([os.path.dirname(os.path.dirname(paths[0]))]) == early   # a run folder itself


def _ablation_run(bundle, fgate, seed, offset, preset="fox-llama-small", key="fgate", lr=None):
    """A run of `issue20.sh ablation` (or `headdim`: ``key="head_dim"``; or `lr`: ``key=None`` and the rate): config
    with its model override or learning rate, a training record, loss.json of the mix."""
    import numpy as np
    import yaml

    from foxformer.eval.loss import loss_curve

    run = bundle / "runs" / (f"{preset}_{key}-{fgate}_s{seed}" if key else f"{preset}_s{seed}")
    run.mkdir(parents=True)
    cfg = {"preset": preset, "data_dir": "repro/gpt2", "total_tokens": 45_000_000, "batch_tokens": 131072}
    cfg.update({"model": {key: fgate}} if key else {}, **({"lr": lr} if lr is not None else {}))
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"kind": "eval", "step": 100, "tokens": 13_107_200, "val_loss": 4.0 + offset},
        {"kind": "end", "step": 344, "tokens": 45_088_768, "val_loss": 3.5 + offset})))
    shared = np.random.default_rng(99).normal(0, 0.3, size=(6, 1))
    rows = 4.0 + offset + shared + np.random.default_rng(seed).normal(0, 0.02, size=(6, 63))
    save_loss_unplotted([loss_curve(rows, name=run.name, train_len=16, n_boot=20)], str(run / "eval"),
                        {"data": "d", "split": "val", "seq_len": 64, "num_seqs": 6, "tokens_sha256": "mix"})


def test_the_gate_ablations_of_three_seeds_get_their_own_unit(doc_script, tmp_path, monkeypatch):
    """`issue20.sh ablation N` bundles: the three gates apart from the seed calls' FoX (LLaMA), compared against the
    data-dependent gate; the other units of the published section stay."""
    monkeypatch.setattr(doc_script, "OUT", str(tmp_path / "out"))
    bundle = tmp_path / "ablation"
    for seed in range(3):
        for fgate, offset in (("data_dependent", 0.0), ("data_independent", 0.3), ("fixed", 0.3)):
            _ablation_run(bundle, fgate, seed, offset)
    runs = doc_script.find_runs([str(bundle)])
    kinds = doc_script.ABLATIONS["ablation_llama"][3]
    assert {kind: len(r) for kind, r in runs.items()} == {kind: 3 for kind in kinds}
    text = open(os.path.join(ROOT, doc_script.DOC)).read()
    old = doc_script.old_units(text)
    units, summary, _ = doc_script.old_units(doc_script.section([str(bundle)], old) + "\n")

    def others(us):
        return {uid: body for uid, body in us.items() if not uid.startswith("ablation_llama")}
    assert others(units) == others(old[0])
    if "ablation_llama" in old[0]:  # the published unit read runs these bundles lack: kept beside, not pooled
        assert "ablation_llama@earlier" in units
    lines = summary["ablation_llama"]
    assert len(lines) == 2 and all("(3 seeds)" in line and "**+0.3" in line for line in lines)
    assert "data-independent gate - FoX (LLaMA), data-dependent gate" in lines[0]


def test_the_pending_ablation_notes_name_their_commands(doc_script):
    out = doc_script._assemble([], {}, ({}, {}, {}))
    assert "`bash scripts/issue20.sh ablation 0`" in out and '`bash scripts/issue20.sh headdim "0 1"`' in out
    assert '`bash scripts/issue20.sh lr 1e-3 "0 1"`' in out
    assert "`bash scripts/issue20.sh proablation 0`" in out and "`bash scripts/issue20.sh headdim125 0`" in out


def _head_dim_section(doc_script, tmp_path, monkeypatch, preset, offset_128):
    """`issue20.sh headdim` / `headdim125` bundles of three seeds (head dim 128's loss offset_128 above 64's), the
    section rebuilt from them: (runs by kind, the published units, the new units, the new summary lines)."""
    monkeypatch.setattr(doc_script, "OUT", str(tmp_path / "out"))
    bundle = tmp_path / "headdim"
    for seed in range(3):
        for dim, offset in ((64, 0.0), (128, offset_128)):
            _ablation_run(bundle, dim, seed, offset, preset=preset, key="head_dim")
    old = doc_script.old_units(open(os.path.join(ROOT, doc_script.DOC)).read())
    units, summary, _ = doc_script.old_units(doc_script.section([str(bundle)], old) + "\n")
    return doc_script.find_runs([str(bundle)]), old, units, summary


def test_the_head_dims_of_three_seeds_get_their_own_unit(doc_script, tmp_path, monkeypatch):
    """`issue20.sh headdim SEEDS` bundles: FoX (Pro) at head dim 128 against the preset's 64, both named in their specs
    and so apart from the seed calls' FoX (Pro); the gate ablations' published unit stays as it was."""
    runs, old, units, summary = _head_dim_section(doc_script, tmp_path, monkeypatch, "fox-pro-small", 0.2)
    assert sorted(runs) == ["fox-pro:head_dim=128", "fox-pro:head_dim=64"]
    assert units["ablation_llama"] == old[0]["ablation_llama"]
    lines = summary["headdim_pro"]
    assert len(lines) == 1 and "(3 seeds)" in lines[0] and "**+0.2" in lines[0]
    assert lines[0].startswith("- head dim (Pro block), FoX (Pro), head dim 128 - FoX (Pro), head dim "
                                                "64 (the preset) (3 seeds)")
    assert units["headdim_pro"][0].startswith("### Head dim (Pro block): held-out documents")


def test_the_125m_head_dims_stay_apart_from_the_small_ones(doc_script, tmp_path, monkeypatch):
    """`issue20.sh headdim125 N` bundles: FoX (Pro) 125M at both head dims are kinds of their own (the preset's size
    kept), so neither joins the small models' head-dim unit, which stays as published."""
    runs, old, units, summary = _head_dim_section(doc_script, tmp_path, monkeypatch, "fox-pro-125m", -0.1)
    assert sorted(runs) == ["fox-pro-125m:head_dim=128", "fox-pro-125m:head_dim=64"]
    assert units["headdim_pro"] == old[0]["headdim_pro"]
    (line,) = summary["headdim_pro_125m"]
    assert line.startswith("- head dim at 125M (Pro block), FoX (Pro) 125M, head dim 128 - FoX (Pro) 125M, head dim 64 "
                           "(the preset) (3 seeds)") and "**-0.1" in line


def test_the_pro_ablations_read_the_lr_calls_fox_pro_as_their_reference(doc_script, tmp_path, monkeypatch):
    """`issue20.sh proablation N` bundles hold the four ablated models only; their reference is FoX (Pro) at lr 1e-3
    from the `lr` calls' bundles, so that the unit needs both and compares each ablation against it."""
    monkeypatch.setattr(doc_script, "OUT", str(tmp_path / "out"))
    lr_bundle, abl_bundle = tmp_path / "lr1e-3", tmp_path / "proablation"
    ablated = {"qk_norm": 0.1, "output_gate": 0.2, "output_norm": 0.0, "kv_shift": 0.3}
    for seed in range(3):
        _ablation_run(lr_bundle, None, seed, 0.0, preset="fox-pro-small", key=None, lr=1e-3)
        for key, offset in ablated.items():
            _ablation_run(abl_bundle, False, seed, offset, preset="fox-pro-small", key=key, lr=1e-3)
    runs = doc_script.find_runs([str(lr_bundle), str(abl_bundle)])
    assert sorted(runs) == sorted(doc_script.ABLATIONS["ablation_pro"][3])
    old = doc_script.old_units(open(os.path.join(ROOT, doc_script.DOC)).read())
    only_ablated = doc_script.old_units(doc_script.section([str(abl_bundle)], old) + "\n")
    # Without its reference the unit is not formed: the document's own (pending, or published from kept inputs) stays.
    assert only_ablated[0].get("ablation_pro") == old[0].get("ablation_pro")
    assert only_ablated[1].get("ablation_pro") == old[1].get("ablation_pro")
    units, summary, _ = doc_script.old_units(doc_script.section([str(lr_bundle), str(abl_bundle)], old) + "\n")
    assert units["lr_pro"] == old[0]["lr_pro"]    # the Transformer (Pro) at 1e-3 is not in these bundles
    lines = summary["ablation_pro"]
    assert len(lines) == 4 and all("(3 seeds)" in line for line in lines)
    assert "FoX (Pro) without QK-norm - FoX (Pro), lr 1e-3 (3 seeds): mean loss over 16K tokens **+0.1" in lines[0]
    assert "**+0.3" in lines[3] and "without the key/value shift" in lines[3]
    assert units["ablation_pro"][0].startswith("### Pro-block ablations at lr 1e-3: held-out documents")


def test_a_new_mqar_seed_keeps_the_published_table_beside_it(doc_script, tmp_path, monkeypatch):
    """The published MQAR table pooled seeds whose folders were never kept: a call of another seed makes a unit that
    names what it read and leaves the published one beside it (not replaced by a one-seed table), its figures in a
    folder of the seed's own."""
    from foxformer.eval.mqar import MqarConfig

    monkeypatch.setattr(doc_script, "OUT", str(tmp_path / "out"))
    d = tmp_path / "mqar_call" / "mqar_s3"
    d.mkdir(parents=True)
    task = MqarConfig(seed=3).task()
    (d / "mqar.json").write_text(json.dumps({"task": task, "models": []}))
    (d / "mqar.md").write_text("| model | steps |\n|---|---|\n| FoX (Pro) | 3000 |\n")
    old = doc_script.old_units(open(os.path.join(ROOT, doc_script.DOC)).read())
    units, _, _ = doc_script.old_units(doc_script.section([str(d.parent)], old) + "\n")
    assert "<!-- issue20:inputs mqar_call/mqar_s3 -->" in units["mqar"]
    assert any("/mqar_s3/mqar.png)" in line for line in units["mqar"])
    assert units["mqar@earlier"][0].endswith("an earlier call, not pooled with the rows above (its inputs were not "
                                             "kept)")
    assert any("mean ± standard deviation over seeds [0, 1, 2]" in line for line in units["mqar@earlier"])
    assert os.path.exists(tmp_path / "out" / "mqar_s3" / "mqar.json")


def test_the_gate_bias_shift_on_other_texts_gets_a_unit_and_is_kept(doc_script, tmp_path, monkeypatch):
    """`BIAS_SHIFT_OOD=1` (lodo-rest): FoX (Pro)'s bias-shift sweep on Go per seed becomes a table, a summary line with
    the seeds' mean change from shift 0 and a figure; archive() keeps the means, and a later run reads them back."""
    import yaml

    monkeypatch.setattr(doc_script, "OUT", str(tmp_path / "out"))
    bundle = tmp_path / "lodo_rest_shift"
    shifts = [-1.0, -0.5, 0.0, 0.5, 1.0, 2.0]
    for seed in range(3):
        run = bundle / "runs" / f"fox-pro-small_s{seed}"
        (run / "bias_shift_ood_go").mkdir(parents=True)
        (run / "config.yaml").write_text(yaml.safe_dump({"preset": "fox-pro-small", "data_dir": "c/gpt2_noprose"}))
        loss = [4.0 + 0.01 * seed + 0.05 * (s - 0.5) ** 2 for s in shifts]   # lowest at +0.5 in every seed
        (run / "bias_shift_ood_go" / "bias_shift.json").write_text(json.dumps(
            {"shifts": shifts, "train_len": 4096, "mean_loss": loss, "loss_within": loss, "loss_beyond": loss,
             "binned_loss": [[0.0] * 16] * len(shifts), "seq_len": 16384, "num_seqs": 8}))
    units: dict = {}
    doc_script._bias_shifts(doc_script.find_runs([str(bundle)]), units)
    body, [line] = units["bias_shift_ood"]
    assert line.startswith("- gate-bias shift on Go source, FoX (Pro), no prose (3 seeds): mean loss change")
    assert "+0.5: -0.013 ± 0.000" in line and "+2: +0.100 ± 0.000" in line and "+0:" not in line
    rows = [r for r in body if r.startswith("| FoX (Pro), no prose")]
    assert len(rows) == 3 and all(r.split(" | ")[6] == "**" + r.split(" | ")[6].strip("*") + "**" for r in rows)
    assert os.path.exists(tmp_path / "out" / "bias_shift_ood.png")

    doc_script.archive([str(bundle)])
    kept = tmp_path / "out" / "inputs" / bundle.name / "runs" / "fox-pro-small_s0" / "bias_shift_ood_go"
    assert "binned_loss" not in json.loads((kept / "bias_shift.json").read_text())
    again: dict = {}
    doc_script._bias_shifts(doc_script.find_runs([str(tmp_path / "out" / "inputs" / bundle.name)]), again)
    assert again["bias_shift_ood"][1] == [line]


def test_the_gate_bias_shift_on_the_mix_splits_at_the_training_length(doc_script, tmp_path, monkeypatch):
    """`issue20.sh bias125` (reproduce.sh's in-mix sweep into RUN/bias_shift_mix): FoX (Pro) 125M's seeds become their
    own unit, each cell the loss within / beyond the training length, the summary the change beyond it; the OOD
    unit is not made from it."""
    import yaml

    monkeypatch.setattr(doc_script, "OUT", str(tmp_path / "out"))
    bundle = tmp_path / "bias125"
    shifts = [-1.0, 0.0, 1.0, 4.0]
    for seed in range(2):
        run = bundle / "runs" / f"fox-pro-125m_s{seed}"
        (run / "bias_shift_mix").mkdir(parents=True)
        (run / "config.yaml").write_text(yaml.safe_dump({"preset": "fox-pro-125m", "data_dir": "c/gpt2"}))
        within = [2.5 + 0.1 * s * s + 0.01 * seed for s in shifts]
        beyond = [w - 0.02 + 0.01 * s for w, s in zip(within, shifts)]
        (run / "bias_shift_mix" / "bias_shift.json").write_text(json.dumps(
            {"shifts": shifts, "train_len": 4096, "mean_loss": within, "loss_within": within, "loss_beyond": beyond,
             "seq_len": 16384, "num_seqs": 8}))
    units: dict = {}
    doc_script._bias_shifts(doc_script.find_runs([str(bundle)]), units)
    assert set(units) == {"bias_shift_mix"}
    body, [line] = units["bias_shift_mix"]
    assert body[0] == "### The gate-bias shift on the mix's held-out documents"
    assert line.startswith("- gate-bias shift on the mix's held-out documents, FoX (Pro) 125M (2 seeds): loss beyond "
                           "the training length change from shift 0 at -1: +0.090 ± 0.000")
    assert "+4: +1.640 ± 0.000" in line
    rows = [r for r in body if r.startswith("| FoX (Pro) 125M |")]
    assert len(rows) == 2 and "| **2.500 / 2.480** |" in rows[0]
    assert os.path.exists(tmp_path / "out" / "bias_shift_mix.png")


def test_runs_at_another_learning_rate_are_their_own_kind(doc_script, tmp_path, monkeypatch):
    """`issue20.sh lr 1e-3 SEEDS`: the Pro pair's runs at 1e-3 stay apart from the seed calls' runs at the recipe's
    2e-3 (same preset, same run names) and get their own unit; a run at 2e-3 keeps the plain kind."""
    monkeypatch.setattr(doc_script, "OUT", str(tmp_path / "out"))
    bundle = tmp_path / "lr"
    for seed in range(3):
        for preset, offset in (("transformer-pro-small", 0.0), ("fox-pro-small", -0.1)):
            _ablation_run(bundle, None, seed, offset, preset=preset, key=None, lr=1e-3)
    _ablation_run(tmp_path / "recipe", None, 0, 0.0, preset="fox-pro-small", key=None, lr=2e-3)
    runs = doc_script.find_runs([str(bundle), str(tmp_path / "recipe")])
    assert {kind: len(r) for kind, r in runs.items()} == {"fox-pro@lr=0.001": 3, "transformer-pro@lr=0.001": 3,
                                                         "fox-pro": 1}
    old = doc_script.old_units(open(os.path.join(ROOT, doc_script.DOC)).read())
    units, summary, _ = doc_script.old_units(doc_script.section([str(bundle)], old) + "\n")
    assert summary["lr_pro"] == ["- lr 1e-3, FoX (Pro), lr 1e-3 - Transformer (Pro), lr 1e-3 (3 seeds): mean loss over "
                                 + summary["lr_pro"][0].split("mean loss over ")[1]]
    assert "**-0.1" in summary["lr_pro"][0] and units["eval_pro"] == old[0]["eval_pro"]


def test_the_static_gates_bias_shift_is_labelled_as_their_ablation(doc_script, tmp_path, monkeypatch):
    """`issue20.sh biasstatic`: the LLaMA block's data-independent and fixed gates, bias-shifted on the mix without
    their loss on it (their ablation calls have that), get the ablation's labels in the bias-shift unit, and their
    runs do not enter the ablation unit (no loss on the mix to pool twice)."""
    import yaml

    monkeypatch.setattr(doc_script, "OUT", str(tmp_path / "out"))
    bundle = tmp_path / "biasstatic"
    shifts = [-1.0, 0.0, 4.0]
    for gate in ("data_independent", "fixed"):
        run = bundle / "runs" / f"fox-llama-small_fgate-{gate}_s1"
        (run / "bias_shift_mix").mkdir(parents=True)
        (run / "config.yaml").write_text(yaml.safe_dump(
            {"preset": "fox-llama-small", "model": {"fgate": gate}, "data_dir": "c/gpt2"}))
        (run / "bias_shift_mix" / "bias_shift.json").write_text(json.dumps(
            {"shifts": shifts, "train_len": 4096, "mean_loss": [3.2, 3.1, 4.5], "loss_within": [3.2, 3.1, 4.5],
             "loss_beyond": [3.1, 3.0, 4.4], "seq_len": 16384, "num_seqs": 8}))
    runs = doc_script.find_runs([str(bundle)])
    units: dict = {}
    doc_script._bias_shifts(runs, units)
    body, lines = units["bias_shift_mix"]
    assert [r.split(" | ")[0] for r in body if r.startswith("| FoX (LLaMA)")] == [
        "| FoX (LLaMA), data-independent gate", "| FoX (LLaMA), fixed gate"]
    assert all("(1 seed)" in line for line in lines), lines
    ablation_units: dict = {}
    doc_script._ablations(runs, ablation_units, [], {os.path.abspath(bundle)})
    assert ablation_units == {}
