"""A tokenizer folder named by its absolute path, then moved with its project: the dataset recorded the old path,
and the same tokenizer at its new path was refused by name."""
import shutil

import pytest

from foxformer.data import TokenDataset, load_tokenizer
from foxformer.data.tokenizer import same_tokenizer, tokenizer_files

from .helpers import word_dataset, word_tokenizer


@pytest.fixture
def moved(tmp_path):
    """(data dir, tokenizer folder, the path the dataset recorded) after the project holding both moved."""
    (tmp_path / "old").mkdir()
    _, tok = word_dataset(tmp_path / "old")
    shutil.move(tmp_path / "old", tmp_path / "new")
    return str(tmp_path / "new" / "words"), str(tmp_path / "new" / "tok"), tok


@pytest.mark.parametrize("given", ["path", "hf-name"])
def test_the_moved_folder_given_by_its_new_path_is_the_same_tokenizer(moved, given):
    data, tok, old = moved
    spec = tok if given == "path" else f"hf:{tok}"
    ds = TokenDataset(data, "train", 32, expect_tokenizer=spec)
    assert ds.manifest["tokenizer"] == f"hf:{old}" and len(ds) > 0
    assert same_tokenizer(f"hf:{old}", spec, ds.manifest["request"]["tokenizer_files"])


def test_another_tokenizer_in_the_moved_folder_is_refused_in_one_line(moved):
    data, tok, old = moved
    word_tokenizer(tok, {"a": 2, "b": 1})  # the same words, other ids: nothing but the content tells them apart
    with pytest.raises(ValueError) as e:
        TokenDataset(data, "train", 32, expect_tokenizer=tok)
    msg = str(e.value)
    assert "\n" not in msg and f"was tokenized with 'hf:{old}' but the run expects tokenizer {tok!r}" in msg
    assert f"the tokenizer folder {old} is no longer there: if it moved, pass its new path with --tokenizer" in msg


def test_the_recorded_folder_that_is_gone_says_which_flag_points_to_it(moved):
    data, tok, old = moved
    with pytest.raises(ValueError, match=rf"tokenizer: the tokenizer folder {old} is no longer there: if it moved, "
                                         rf"pass its new path with --tokenizer"):
        load_tokenizer(f"hf:{old}")
    assert len(TokenDataset(data, "train", 32)) > 0  # the tokens need no tokenizer to be read


def test_two_folders_are_compared_by_content_and_other_names_by_name(tmp_path):
    word_tokenizer(tmp_path / "a", {"a": 1, "b": 2})
    word_tokenizer(tmp_path / "b", {"a": 1, "b": 2})
    word_tokenizer(tmp_path / "c", {"a": 2, "b": 1})
    a, b, c = (str(tmp_path / n) for n in "abc")
    assert same_tokenizer(f"hf:{a}", b) and not same_tokenizer(f"hf:{a}", c)
    assert same_tokenizer("hf:/nowhere/tok", b, tokenizer_files(a))  # the recorded fingerprint stands for it
    assert not same_tokenizer("hf:/nowhere/tok", b) and not same_tokenizer("gpt2", "bytes")
    assert same_tokenizer("gpt2", "tiktoken:gpt2")
