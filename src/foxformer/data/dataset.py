"""Fixed-length sequences over a prepared token array, in a data order that is a pure function of the step.

Documents are already concatenated with an end-of-document token between them (see prepare.py), so the
sequence ``i`` is simply ``tokens[i*T : (i+1)*T]``. The training order is a per-epoch permutation seeded by
``(seed, epoch)``; sample ``g`` of the run is sequence ``perm[epoch][g % n]`` with ``epoch = g // n``.
Because nothing depends on iteration history, a resumed run (or a run on another number of ranks)
sees exactly the same sequences for the same global step.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from ..argtypes import SettingError

from .preparation import (FORMAT, is_dataset, read_manifest, recorded_tokenizer_files, run_or_model_folder,
                          split_damage, tokenizer_change)
from .sources import holds_documents
from .tokenizer import moved_hint, same_tokenizer, unknown_spec


def no_dataset(path: str, flag: str | None = "--data") -> str:
    """Why ``path``, which holds no manifest.json, is no prepared dataset, and the command that makes one (then
    to be given as ``flag``, where the command takes the dataset by one): the reason, which the caller says after
    the setting that named the path. Text given as --data: the advice for an
    empty folder would name it as --out, and `data prepare` would then fail on a file, or write SymPy's source
    (its default) beside the user's documents; a path that is not there likewise needs --source."""
    # a run's metrics.jsonl made it "a folder of documents", and the advice was to tokenize the run
    if taken := run_or_model_folder(path):
        return (f"{path!r} is {taken[1]} (it holds {taken[0]}), not a prepared dataset: give the folder "
                f"`foxformer data prepare --out` wrote (a run's config.yaml names the one it trained on: data_dir)")
    # `--data data_cache`, the parent of the dataset meant, was told to prepare a new dataset there
    if inside := _datasets_in(path):
        named = ", ".join(inside[:3]) + (f" and {len(inside) - 3} more" if len(inside) > 3 else "")
        then = f": {flag} {inside[0]}" if flag else ""
        return f"{path!r} holds prepared datasets ({named}) rather than being one; give one of them{then}"
    if os.path.isfile(path) or holds_documents(path):
        what = "a file" if os.path.isfile(path) else "a folder of documents"
        stem = os.path.splitext(os.path.basename(os.path.abspath(path)))[0]
        then = f" and pass {flag} data_cache/{stem}" if flag else ""
        return (f"{path!r} is {what}, not a prepared dataset; tokenize it first with `foxformer data prepare "
                f"--source {path} --out data_cache/{stem}`{then}")
    if not os.path.exists(path):
        return (f"{path!r} does not exist; prepare a dataset there from your text with `foxformer data "
                f"prepare --source TEXT --out {path}` (TEXT: a file, a folder or a built-in corpus)")
    return (f"{path!r} has no manifest.json; run `foxformer data prepare --out {path}` first (an interrupted "
            f"prepare leaves no manifest)")


def _datasets_in(path: str) -> list[str]:
    """The prepared datasets directly inside the folder ``path``, sorted ([] for anything else)."""
    try:
        entries = list(os.scandir(path))
    except OSError:  # not a folder, not there, or unreadable: the other reasons tell
        return []
    return sorted(e.path for e in entries if e.is_dir() and is_dataset(e.path))


def _too_long(manifest: dict, data_dir: str, seq_len: int, splits: tuple[str, ...]) -> str:
    """Why ``seq_len`` is refused for the first of ``splits``, naming each of them it is too long for with the most
    that fits it, and the most that fits them all; an empty one among them is named too, with how to fill it (its
    own refusal would otherwise come only once the length is fixed)."""
    sizes = {s: int(manifest["split"][s]["tokens"]) for s in dict.fromkeys(splits)}
    short = {s: n for s, n in sizes.items() if 0 < n < seq_len}
    said = " and ".join(f"the {n} tokens of split {s!r}" for s, n in short.items())
    most = min(short.values())
    each = (f" to fit {'both' if len(short) == 2 else 'them all'} (split "
            f"{', '.join(f'{s!r} takes at most {n}' for s, n in short.items())})") if len(short) > 1 else ""
    empty = "".join(f"; and split {s!r} holds no tokens{_empty_advice(manifest, s)}"
                    for s, n in sizes.items() if not n)
    return f"{seq_len} is more than {said} of {data_dir!r}: give at most {most}{each}, or prepare more text{empty}"


def _empty_advice(manifest: dict, split: str) -> str:
    """How to get documents into ``split``, which holds none ("" where there is nothing to say): an empty val split
    comes from `data prepare --val-fraction 0`, or from a single document (the split holds out whole documents,
    and never the only one)."""
    if split != "val":
        return ""
    if manifest["split"].get("val_fraction", 0) > 0 and manifest.get("docs") == 1:
        return ("; the dataset is one document, and the split holds out whole documents: give `data prepare` several "
                "(a folder of .txt files, one document each, or a .jsonl file with one per line), or point --data at a "
                "dataset with a validation split")
    return ("; the dataset has no validation documents: prepare it again with --val-fraction above 0, or point --data "
            "at a dataset with a validation split")


class TokenizerMismatch(SettingError):
    """A dataset tokenized with ``found`` where ``expected`` was asked for. The fix it gives, leaving the tokenizer
    out, is for a caller who gave ``expected``; a command that took it from a file re-says it (train.cli)."""

    def __init__(self, field: str, data_dir: str, found: str, expected: str):
        self.data_dir, self.found, self.expected = data_dir, found, expected
        super().__init__(field, f"{data_dir!r} was tokenized with {found!r} but the run expects tokenizer "
                                f"{expected!r}; leave the tokenizer out to use the dataset's, or prepare the data "
                                f"again with --tokenizer {expected}")


class TokenDataset:
    """Sequences of ``seq_len`` tokens from one split of a prepared dataset.

    ``roll=True`` rotates each sequence by a random offset fixed by ``(seed, epoch, index)`` (the FoX paper's
    trick so that every position is equally hard on average). ``length``: the setting ``seq_len`` is, as the
    error of a split shorter than one sequence names it (training's ``context``); ``data`` likewise the setting
    ``data_dir`` is, as the dataset's other refusals name it (training's ``data_dir``, which its command re-says as
    --data). ``also``: the other splits the caller reads at the same ``seq_len`` (training's val beside its train):
    a length too long for this split is refused naming those it is too long for as well, as one refusal (the user
    who gave the train split's most was refused again for the val split's).
    """

    def __init__(self, data_dir: str, split: str = "train", seq_len: int = 2048, *, roll: bool = False,
                 seed: int = 0, expect_tokenizer: str | None = None, vocab_size: int | None = None,
                 length: str = "seq_len", data: str = "data", also: tuple[str, ...] = ()):
        if split not in ("train", "val"):
            raise ValueError(f"split: expected 'train' or 'val', got {split!r}")
        if not isinstance(seq_len, int) or seq_len < 2:
            raise ValueError(f"seq_len: expected an integer >= 2, got {seq_len!r}")
        manifest = read_manifest(data_dir)  # None for a file too (no manifest.json under it)
        if manifest is None:
            raise SettingError(data, no_dataset(data_dir))
        if manifest.get("format") != FORMAT:
            raise SettingError(data, f"{data_dir!r} has format {manifest.get('format')!r}, expected {FORMAT!r}")
        # the manifest holds the loaded tokenizer's name ("tiktoken:gpt2" is stored as "gpt2"); a folder of the
        # same content elsewhere is the same tokenizer (the project or the folder moved)
        files = recorded_tokenizer_files(manifest)
        if expect_tokenizer is not None and not same_tokenizer(manifest["tokenizer"], expect_tokenizer, files):
            gone = moved_hint(manifest["tokenizer"], files)
            if not gone and (unknown := unknown_spec(expect_tokenizer)):
                raise SettingError("tokenizer", unknown)
            if not gone:
                raise TokenizerMismatch(data, data_dir, manifest["tokenizer"], expect_tokenizer)
            raise SettingError(data, f"{data_dir!r} was tokenized with {manifest['tokenizer']!r} but the run "
                                     f"expects tokenizer {expect_tokenizer!r} (another tokenizer); {gone}")
        change = None if expect_tokenizer is None else tokenizer_change(manifest, expect_tokenizer)
        if change:
            raise SettingError(data, f"{data_dir!r}: {change}; prepare the data again with --force (the same "
                                     f"`foxformer data prepare` command), or save the tokenizer the data was made "
                                     f"with back in its folder")
        if vocab_size is not None and manifest["vocab_size"] > vocab_size:
            raise SettingError(data, f"{data_dir!r} uses a tokenizer with {manifest['vocab_size']} ids but the "
                                     f"model's vocab_size is {vocab_size}")
        info = manifest["split"][split]
        self.manifest = manifest
        self.split, self.seq_len, self.roll, self.seed = split, seq_len, roll, seed
        path = os.path.join(data_dir, info["file"])
        dtype = np.dtype(manifest["dtype"])
        arrays: dict = {}
        damage = split_damage(data_dir, manifest, split, arrays)
        if damage:
            raise SettingError(data, f"{damage}; the dataset is damaged, prepare it again (the same `foxformer "
                                     f"data prepare` command rebuilds it)")
        self.tokens = np.memmap(path, dtype=dtype, mode="r") if info["tokens"] else np.zeros(0, dtype)
        self.doc_offsets = arrays["index"]
        # each document's index into manifest["sources"] (None for datasets prepared before it was kept)
        self.doc_sources = arrays.get("sources")
        self.n_sequences = int(self.tokens.size // seq_len)
        if self.n_sequences == 0 and self.tokens.size:  # the length is the mistake, more often than the data
            raise SettingError(length, _too_long(manifest, data_dir, seq_len, (split, *also)))
        if self.n_sequences == 0:
            raise SettingError(data, f"split {split!r} of {data_dir!r} has 0 tokens, fewer than one sequence of "
                                     f"seq_len={seq_len}{_empty_advice(manifest, split)}")
        self._perm_cache: dict[int, np.ndarray] = {}

    def source_index(self, name: str) -> int:
        """The index in the manifest's sources of the source ``name``: its spec, or a part of it that names
        one source only ("prose" for ../shared/data/prose.jsonl.xz)."""
        specs = [s["spec"] for s in self.manifest["sources"]]
        hits = [i for i, spec in enumerate(specs) if spec == name] or \
               [i for i, spec in enumerate(specs) if name in spec]
        if len(hits) != 1:
            raise SettingError("source", f"{name!r} names {'no' if not hits else 'more than one'} source of "
                                         f"this dataset; its sources are {specs}")
        return hits[0]

    @property
    def longest_document(self) -> int:
        """The text tokens of the split's longest document (its end-of-document token or BOS not counted)."""
        return int(np.diff(self.doc_offsets).max()) - 1 if self.doc_offsets.size > 1 else 0

    @property
    def eot_id(self) -> int:
        return int(self.manifest["eot_id"])

    def __len__(self) -> int:
        return self.n_sequences

    def sequence(self, index: int, epoch: int = 0) -> np.ndarray:
        """Tokens of sequence ``index`` as int64 [T]."""
        if not 0 <= index < self.n_sequences:
            raise IndexError(f"sequence index {index} out of range [0, {self.n_sequences})")
        seq = np.asarray(self.tokens[index * self.seq_len:(index + 1) * self.seq_len], dtype=np.int64)
        if self.roll:
            shift = int(np.random.default_rng([self.seed, epoch, index]).integers(self.seq_len))
            seq = np.roll(seq, shift)
        return seq

    def _permutation(self, epoch: int) -> np.ndarray:
        perm = self._perm_cache.get(epoch)
        if perm is None:
            perm = np.random.default_rng([self.seed, 0x5EED, epoch]).permutation(self.n_sequences)
            self._perm_cache = {epoch: perm}  # one epoch at a time is all a run needs
        return perm

    def sample(self, global_index: int) -> np.ndarray:
        """The ``global_index``-th training sample of the run (shuffled, epochs repeat with a new order)."""
        epoch, pos = divmod(int(global_index), self.n_sequences)
        return self.sequence(int(self._permutation(epoch)[pos]), epoch)

    def batch(self, start: int, count: int) -> torch.Tensor:
        """Samples ``start .. start+count-1`` of the run as int64 [count, T]."""
        return torch.from_numpy(np.stack([self.sample(start + i) for i in range(count)]))

    def eval_batch(self, start: int, count: int) -> torch.Tensor:
        """Sequences ``start .. start+count-1`` in storage order (validation), int64 [count, T]."""
        return torch.from_numpy(np.stack([self.sequence(i) for i in range(start, start + count)]))
