import os
import re

import numpy as np
import pytest

from foxformer.data.dataset import TokenDataset
from foxformer.data.preparation import PrepareConfig, prepare


@pytest.fixture
def data_dir(tmp_path, jsonl_xz):
    prepare(PrepareConfig(sources=[jsonl_xz], out_dir=str(tmp_path / "d"), val_fraction=0.2), progress=False)
    return str(tmp_path / "d")


def test_sequences_tile_the_token_stream(data_dir):
    ds = TokenDataset(data_dir, "train", 16)
    stream = np.asarray(ds.tokens, dtype=np.int64)
    assert len(ds) == stream.size // 16
    for i in (0, 1, len(ds) - 1):
        np.testing.assert_array_equal(ds.sequence(i), stream[16 * i:16 * (i + 1)])
    assert (stream == ds.eot_id).sum() == ds.manifest["split"]["train"]["docs"]


def test_order_is_a_function_of_the_sample_index(data_dir):
    a, b = TokenDataset(data_dir, "train", 16, seed=1), TokenDataset(data_dir, "train", 16, seed=1)
    n = len(a)
    # One epoch visits each sequence once; the next epoch uses another order; random access equals iteration.
    firsts = {tuple(a.sample(g)) for g in range(n)}
    assert len(firsts) == len({tuple(a.sequence(i)) for i in range(n)})
    np.testing.assert_array_equal(a.batch(n - 2, 4).numpy(), np.stack([b.sample(g) for g in range(n - 2, n + 2)]))
    assert [tuple(a.sample(g)) for g in range(n)] != [tuple(a.sample(n + g)) for g in range(n)]


def test_rolling_is_a_deterministic_rotation(data_dir):
    plain = TokenDataset(data_dir, "train", 16)
    rolled = TokenDataset(data_dir, "train", 16, roll=True, seed=5)
    shifts = set()
    for i in range(len(plain)):
        p, r = plain.sequence(i), rolled.sequence(i)
        shift = next(s for s in range(16) if np.array_equal(np.roll(p, s), r))
        shifts.add(shift)
        np.testing.assert_array_equal(r, rolled.sequence(i))
    assert len(shifts) > 1


def test_wrong_tokenizer_is_refused(data_dir):
    with pytest.raises(ValueError, match="tokenized with 'gpt2'.*tiktoken:cl100k_base"):
        TokenDataset(data_dir, "train", 16, expect_tokenizer="tiktoken:cl100k_base")


def test_unprepared_or_damaged_data(tmp_path, data_dir):
    # a path that is not there: the advice names --source (`data prepare --out` alone prepares SymPy's code)
    missing = str(tmp_path / "nothing")
    with pytest.raises(ValueError, match=re.escape(f"does not exist; prepare a dataset there from your text with "
                                                   f"`foxformer data prepare --source TEXT --out {missing}`")):
        TokenDataset(missing, "train", 16)
    os.makedirs(missing)
    with pytest.raises(ValueError, match="no manifest"):
        TokenDataset(missing, "train", 16)
    with open(f"{data_dir}/train.bin", "ab") as f:
        f.write(b"\x00\x00")
    with pytest.raises(ValueError, match="damaged"):
        TokenDataset(data_dir, "train", 16)


def test_too_long_context_is_a_clear_error(data_dir):
    # named as the caller's setting: training's error said "data: ... seq_len=", where its user gave --context
    with pytest.raises(ValueError, match=r"^context: 1000000 is more than the \d+ tokens of split 'val' of .*: give "
                                         r"at most \d+, or prepare more text$"):
        TokenDataset(data_dir, "val", 10**6, length="context")


@pytest.mark.parametrize("past", ["both", "val"], ids=["past-both-splits", "past-val-only"])
def test_a_context_past_several_splits_names_them_all(data_dir, past):
    """Training refused a context past both splits for the train split alone: the user gave its most, and was
    refused again for the val split's."""
    train, val = (TokenDataset(data_dir, s, 2).tokens.size for s in ("train", "val"))
    assert val < train
    if past == "both":
        with pytest.raises(ValueError) as refused:
            TokenDataset(data_dir, "train", train + 1, length="context", also=("val",))
        assert str(refused.value) == (
            f"context: {train + 1} is more than the {train} tokens of split 'train' and the {val} tokens of split "
            f"'val' of {data_dir!r}: give at most {val} to fit both (split 'train' takes at most {train}, 'val' takes "
            f"at most {val}), or prepare more text")
    else:  # a length that fits the train split leaves the val split to its own refusal, which names it alone
        assert len(TokenDataset(data_dir, "train", val + 1, also=("val",))) >= 1
        with pytest.raises(ValueError) as refused:
            TokenDataset(data_dir, "val", val + 1, length="context")
        assert str(refused.value) == (f"context: {val + 1} is more than the {val} tokens of split 'val' of "
                                      f"{data_dir!r}: give at most {val}, or prepare more text")


def test_a_context_past_the_train_split_names_an_empty_val_split_too(tmp_path):
    """A single document leaves the val split empty: a too-long context was refused first, and once fixed, the
    empty val split; both are said at once."""
    doc = tmp_path / "one.txt"
    doc.write_text("One document only. " * 20)  # 380 bytes, and the end-of-document token: 381 ids
    prepare(PrepareConfig(sources=[str(doc)], out_dir=str(tmp_path / "d"), tokenizer="bytes"), progress=False)
    with pytest.raises(ValueError, match=r"^context: 4096 is more than the 381 tokens of split 'train' of .*: give "
                                         r"at most 381, or prepare more text; and split 'val' holds no tokens; the "
                                         r"dataset is one document, "):
        TokenDataset(str(tmp_path / "d"), "train", 4096, length="context", also=("val",))


@pytest.mark.parametrize("spec", ["gpt2", "tiktoken:gpt2"], ids=["gpt2", "tiktoken-alias"])
def test_tokenizer_aliases_of_the_manifest_name_are_accepted(data_dir, spec):
    # prepare stores the loaded tokenizer's name: "tiktoken:gpt2" is written as "gpt2"
    assert len(TokenDataset(data_dir, "train", 16, expect_tokenizer=spec)) > 0


def test_a_tokenizer_directory_matches_its_hf_name(tmp_path):
    import json

    from foxformer.data.tokenizer import canonical_name

    tok_dir = tmp_path / "my tok"
    tok_dir.mkdir()
    assert canonical_name(str(tok_dir)) == f"hf:{tok_dir}"
    assert canonical_name("hf:some/name") == "hf:some/name" and canonical_name("bytes") == "bytes"
    data = tmp_path / "d"
    data.mkdir()
    manifest = {"format": "foxformer-tokens-v1", "tokenizer": f"hf:{tok_dir}", "vocab_size": 100, "eot_id": 0,
                "dtype": "uint16", "sources": [], "docs": 1, "tokens": 4,
                "split": {"train": {"file": "train.bin", "index": "train.idx.npy", "docs": 1, "tokens": 4},
                          "val": {"file": "val.bin", "docs": 0, "tokens": 0}}}
    (data / "manifest.json").write_text(json.dumps(manifest))
    np.arange(4, dtype=np.uint16).tofile(os.path.join(data, "train.bin"))
    np.save(os.path.join(data, "train.idx.npy"), np.array([0, 4]))
    assert len(TokenDataset(str(data), "train", 2, expect_tokenizer=str(tok_dir))) == 2


@pytest.mark.parametrize("damage", ["cut-tokens", "cut-index", "other-index", "manifest"])
def test_a_damaged_dataset_is_refused_and_prepare_rebuilds_it(tmp_path, jsonl_xz, damage):
    """The loader's advice for a cut-short token file, "prepare it again", did nothing: prepare returned the
    manifest of the same request without looking at its files, also with --force. A document index that did not
    match its tokens was loaded as it was, and a cut-short one or a damaged manifest.json was numpy's or json's
    error naming no file."""
    import json

    cfg = PrepareConfig(sources=[jsonl_xz], out_dir=str(tmp_path / "d"), val_fraction=0.2, tokenizer="bytes")
    prepare(cfg, progress=False)
    files = {n: (tmp_path / "d" / n).read_bytes() for n in ("train.bin", "train.idx.npy", "val.bin")}
    target = {"cut-tokens": "train.bin", "cut-index": "train.idx.npy", "other-index": "train.idx.npy",
              "manifest": "manifest.json"}[damage]
    path = tmp_path / "d" / target
    if damage == "other-index":
        np.save(path, np.array([0, 5]))
    else:
        path.write_bytes(path.read_bytes()[:-8])
    said = {"cut-tokens": f"{path} has {len(files['train.bin']) - 8} bytes, the manifest expects "
                          f"{len(files['train.bin'])}",
            "cut-index": f"{path} cannot be read", "other-index": f"{path} holds 2 entries, the manifest's",
            "manifest": f"{path} is damaged"}[damage]
    with pytest.raises(ValueError, match=re.escape(f"data: {said}")):
        TokenDataset(cfg.out_dir, "train", 16)
    if damage == "manifest":
        with pytest.raises(ValueError, match="with --force"):
            prepare(cfg, progress=False)
    m = prepare(cfg, force=damage == "manifest", progress=False)
    assert json.loads((tmp_path / "d" / "manifest.json").read_text())["tokens"] == m["tokens"]
    assert {n: (tmp_path / "d" / n).read_bytes() for n in files} == files
    assert len(TokenDataset(cfg.out_dir, "train", 16)) > 0 and os.path.exists(path)


def test_a_tokenizer_folder_saved_again_since_the_data_is_refused(tmp_path):
    """The run's tokenizer was compared with the dataset's by name only: another tokenizer saved in the folder
    between `data prepare` and `train` went unnoticed, and the run was recorded with a tokenizer whose ids stood
    for other tokens than the data's."""
    import json

    from .helpers import word_dataset, word_tokenizer

    data, tok = word_dataset(tmp_path)
    for spec in (tok, f"hf:{tok}"):
        assert len(TokenDataset(data, "train", 32, expect_tokenizer=spec)) > 0
    word_tokenizer(tok, {"b": 1, "a": 2})
    for spec in (tok, f"hf:{tok}"):
        with pytest.raises(ValueError, match=rf"the files of the tokenizer {re.escape(repr(f'hf:{tok}'))} changed "
                                             rf"since the data was prepared with it .*prepare the data again with "
                                             rf"--force.*or save the tokenizer the data was made with back"):
            TokenDataset(data, "train", 32, expect_tokenizer=spec)
    assert len(TokenDataset(data, "train", 32)) > 0  # its ids alone, as evaluation on --data reads them
    # a dataset prepared before the folder's fingerprint was recorded: compared by name, as then
    manifest = json.loads((tmp_path / "words" / "manifest.json").read_text())
    del manifest["request"]["tokenizer_files"]
    (tmp_path / "words" / "manifest.json").write_text(json.dumps(manifest))
    assert len(TokenDataset(data, "train", 32, expect_tokenizer=tok)) > 0


def test_a_tokenizer_folder_saved_again_or_moved_with_the_same_content_is_accepted(tmp_path, monkeypatch):
    """The folder's fingerprint was its files' absolute paths and mtimes: the same tokenizer saved again, or the
    project folder moved or copied, refused a dataset made with that very tokenizer. Content decides now."""
    import pathlib
    import shutil

    from .helpers import word_dataset, word_tokenizer

    os.makedirs(tmp_path / "home" / "project")
    monkeypatch.chdir(tmp_path / "home" / "project")  # the tokenizer named from the project's root, as "tok"
    data, tok = word_dataset(pathlib.Path("."))
    word_tokenizer(tok, {"a": 1, "b": 2})  # the same tokenizer saved again: new mtimes, the same bytes
    assert len(TokenDataset(data, "train", 32, expect_tokenizer=tok)) > 0
    shutil.copytree(tmp_path / "home", tmp_path / "copy")  # copytree keeps mtimes; the absolute paths are others
    shutil.move(tmp_path / "home", tmp_path / "moved")
    for where in ("copy", "moved"):
        monkeypatch.chdir(tmp_path / where / "project")
        assert len(TokenDataset(data, "train", 32, expect_tokenizer=tok)) > 0
    word_tokenizer(tok, {"a": 2, "b": 1})  # other content under the same name is still refused
    with pytest.raises(ValueError, match="the files of the tokenizer 'hf:tok' changed since the data was prepared"):
        TokenDataset(data, "train", 32, expect_tokenizer=tok)


def test_a_dataset_that_recorded_its_tokenizer_folder_by_file_times_is_checked_by_them(tmp_path):
    """Datasets prepared before the content fingerprint hold the folder's paths and mtimes: untouched, they keep
    working; touched, nothing can tell the same tokenizer from another, so they are refused with what to do."""
    import json

    from foxformer.data.tokenizer import older_tokenizer_files

    from .helpers import word_dataset, word_tokenizer

    data, tok = word_dataset(tmp_path)
    path = os.path.join(data, "manifest.json")
    manifest = json.loads(open(path).read())
    manifest["request"]["tokenizer_files"] = older_tokenizer_files(tok)
    open(path, "w").write(json.dumps(manifest))
    assert len(TokenDataset(data, "train", 32, expect_tokenizer=tok)) > 0
    word_tokenizer(tok, {"a": 1, "b": 2})  # even the same tokenizer: its times changed
    with pytest.raises(ValueError, match=r"changed since the data was prepared with it, or their times or place did: "
                                         r"that dataset records its tokenizer folder by its files' paths and times "
                                         r"\(an older foxformer\).*; prepare the data again with --force"):
        TokenDataset(data, "train", 32, expect_tokenizer=tok)
