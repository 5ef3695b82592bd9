"""A word-level Hugging Face tokenizer saved in a folder, and a dataset prepared with it: what the tests of a
tokenizer saved again in its folder (other ids under the same name) start from."""
import json

import pytest

from foxformer.data.preparation import PrepareConfig, prepare
from foxformer.data.tokenizer import tiktoken_encoding


def word_tokenizer(folder, vocab: dict) -> None:
    """A word-level Hugging Face tokenizer of ``vocab`` (and "</s>" as eos) saved in ``folder``."""
    pytest.importorskip("tokenizers")
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel(vocab={"[UNK]": 0, **vocab}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_special_tokens([AddedToken("</s>", special=True)])
    PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", unk_token="[UNK]").save_pretrained(folder)


def word_dataset(tmp_path) -> tuple[str, str]:
    """(data dir, tokenizer folder): 40 documents of 20 words "a" and "b", prepared with the word tokenizer
    {"a": 1, "b": 2} (half of them validation), enough for sequences of 32 tokens in both splits."""
    src = tmp_path / "words.jsonl"
    src.write_text("".join(json.dumps({"text": " ".join("ab"[(i + j) % 3 == 0] for j in range(20))}) + "\n"
                           for i in range(40)))
    tok, data = tmp_path / "tok", tmp_path / "words"
    word_tokenizer(tok, {"a": 1, "b": 2})
    prepare(PrepareConfig(sources=[str(src)], out_dir=str(data), tokenizer=str(tok), val_fraction=0.5),
            progress=False)
    return str(data), str(tok)


def gpt2_ranks_with(monkeypatch, constructor: str):
    """An encoding with GPT-2's ranks (offline) and the pattern and special tokens of tiktoken's ``constructor``:
    the pre-tokenizer regexes of the newer encodings (possessive quantifiers, case classes) must run in HF too."""
    import tiktoken
    import tiktoken_ext.openai_public as public

    ranks = tiktoken_encoding("gpt2")._mergeable_ranks
    monkeypatch.setattr(public, "load_tiktoken_bpe", lambda *args, **kwargs: ranks)
    return tiktoken.Encoding(**getattr(public, constructor)())
