import pytest


def _byte_dataset(tmp_path, text_lengths):
    """A prepared dataset (byte tokenizer, all in train) of documents with these numbers of text tokens."""
    import json

    from foxformer.data.preparation import PrepareConfig, prepare

    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"id": f"d{i}", "text": chr(ord("a") + i) * n}) + "\n"
                           for i, n in enumerate(text_lengths)))
    out = tmp_path / "bytes_data"
    prepare(PrepareConfig(sources=[str(src)], out_dir=str(out), tokenizer="bytes", val_fraction=0.0),
            progress=False)
    return str(out)


@pytest.mark.parametrize("text_tokens", [15, 16], ids=["eot-would-end-the-window", "text-fills-the-window"])
def test_within_docs_windows_hold_only_document_text(tmp_path, text_tokens):
    # a document of exactly seq_len tokens counting its end-of-text token gave a window whose last target
    # was that end-of-text token: not text of the document, unlike every other within-docs window
    from foxformer.eval.sequences import dataset_sequences

    data = _byte_dataset(tmp_path, [text_tokens, 40])
    rows = dataset_sequences(data, 16, 4, split="train", within_docs=True)
    assert (rows != 256).all()  # 256: the byte tokenizer's end-of-text id
    assert len(rows) == (2 if text_tokens == 16 else 1)


def test_source_sequences_start_with_the_tokenizers_bos(tmp_path):
    from foxformer.data import load_tokenizer
    from foxformer.eval.sequences import source_sequences

    (tmp_path / "doc.txt").write_text('A "quoted" line.\n' * 30)
    tok = load_tokenizer("gpt2-json")
    rows = source_sequences(str(tmp_path / "doc.txt"), tok, 16, 1)
    assert rows[0].tolist() == [50256] + tok.encode('A "quoted" line.\n' * 30)[:15]


def test_a_seq_len_past_the_split_says_the_largest_that_works(tmp_path):
    """The dataset's error ("fewer than one sequence of seq_len=100000") left the user to guess a length; within
    documents (the split shorter than seq_len), it failed the same way before the documents' lengths were read."""
    from foxformer.eval.sequences import dataset_sequences

    data = _byte_dataset(tmp_path, [15, 40])  # 57 tokens: each document ends in an end-of-text token
    with pytest.raises(ValueError, match=r"^seq_len: split 'train' of '.*' has 57 tokens, fewer than one sequence of "
                                         r"100; the largest workable seq_len is 57$"):
        dataset_sequences(data, 100, 2, split="train")
    assert dataset_sequences(data, 57, 2, split="train").shape == (1, 57)
    with pytest.raises(ValueError, match=r"has 100 text tokens \(longest: 40\)"):
        dataset_sequences(data, 100, 2, split="train", within_docs=True)
