"""`foxformer data prepare`: documents -> memory-mapped token arrays, a document index and a manifest.

Output directory layout::

    shards/<key>/tokens.bin, docs.npy, ids.json, done.json   one tokenized source (cache; reruns skip it, and a
                                                              finished prepare removes those it no longer reads)
    train.bin, train.idx.npy, train.src.npy                   tokens of the training documents, each followed
    val.bin,   val.idx.npy,   val.src.npy                     by the end-of-document token; idx = int64 [n_docs+1];
                                                              src = int16 [n_docs], each document's source index
    manifest.json                                             written last: its presence means "complete"
    .lock                                                     locked while a prepare writes (another is refused)

Every file is written under a temporary name and renamed into place, and the manifest is removed before
anything it describes is replaced, so an interrupted run never leaves files that a later run trusts.
"""

from __future__ import annotations

import array
import hashlib
import json
import numbers
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from ..argtypes import SettingError
from ..paths import check_output_dir, folder_lock, replaced_atomically, write_json
from ..progress import progress_bar
from .digests import CACHE_FILE as DIGESTS, DigestCache
from .layout import FORMAT, MANIFEST, MODEL_FOLDERS, SHARDS
from .sources import (CONTENT_PREFIX, Blanks, by_file_times, describe_source, iter_documents, readable_left,
                      refused_whole, source_kind, unreadable_files)
from .tokenizer import GPT2_SPEC, canonical_name, load_tokenizer, older_tokenizer_files, tokenizer_files
from .unreadable import drop_list, refusal

DEFAULT_SOURCES = ("builtin:sympy",)
# A longer document is encoded in parts of about this many characters (Tokenizer.encode_pieces): its ids as one
# list of Python ints took about 40 bytes a token
PIECE_CHARS = 1 << 20
# The split files are written this many documents at a time (see _write_split)
WRITE_CHUNK_DOCS = 1 << 18


@dataclass
class PrepareConfig:
    """What to prepare. ``max_tokens_per_source`` keeps whole documents until the cap is reached.
    ``leave_out``: sources (specs among ``sources``) whose documents are dropped from the training split
    after the split is drawn, so that the validation split is the one the full mix has (leave-one-domain-out:
    train without a domain, evaluate on its held-out documents as the full-mix models are).
    ``skip_bad_files``: a source's files that cannot be read as text (see unreadable.py) are passed over, said and
    listed in the manifest (``skipped_files`` of their source), where without it the source is refused for them."""

    sources: list[str] = field(default_factory=lambda: list(DEFAULT_SOURCES))
    out_dir: str = "data_cache/default"
    tokenizer: str = GPT2_SPEC
    val_fraction: float = 0.05
    seed: int = 0
    max_tokens_per_source: int | None = None
    text_field: str = "text"
    leave_out: list[str] = field(default_factory=list)
    skip_bad_files: bool = False

    def validate(self) -> None:
        if not self.sources or not all(isinstance(s, str) and s for s in self.sources):
            raise SettingError("sources", f"expected a non-empty list of source specs, got {self.sources!r}")
        # each document's source index is int16 (the splits' .src.npy): more wrapped around, after the tokenizing
        if len(self.sources) > np.iinfo(np.int16).max + 1:
            raise SettingError("sources", f"{len(self.sources)} sources, more than the {np.iinfo(np.int16).max + 1} a "
                                          f"dataset records; give the files' folders as sources (a folder is one "
                                          f"source)")
        unknown = [s for s in self.leave_out if s not in self.sources]
        if unknown:
            raise SettingError("leave_out", lambda name: f"{unknown} are not among the sources {self.sources}; give "
                                                         f"a source exactly as passed to {name('sources')}")
        if len(set(self.leave_out)) >= len(set(self.sources)):
            raise SettingError("leave_out", "every source is left out; the training split would be empty")
        if not 0.0 <= self.val_fraction < 1.0:
            raise SettingError("val_fraction", f"expected a number in [0, 1), got {self.val_fraction!r}")
        # numpy refuses it only when the split is drawn, after every source was tokenized
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral) or self.seed < 0:
            raise SettingError("seed", f"expected a non-negative integer, got {self.seed!r}")
        if self.max_tokens_per_source is not None and self.max_tokens_per_source <= 0:
            raise SettingError("max_tokens_per_source", f"expected a positive integer or None, got "
                                                        f"{self.max_tokens_per_source!r}")
        if not isinstance(self.skip_bad_files, bool):  # "false" from a config file would skip them
            raise SettingError("skip_bad_files", f"expected True or False, got {self.skip_bad_files!r}")


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def _atomic_save_npy(path: str, arr: np.ndarray) -> None:
    # a file object: np.save would add .npy to the temporary's name
    with replaced_atomically(path) as tmp, open(tmp, "wb") as f:
        np.save(f, arr)


_MANIFEST_KEYS = ("format", "tokenizer", "vocab_size", "eot_id", "dtype", "sources", "docs", "tokens")


def is_dataset(folder: str) -> bool:
    """Whether ``folder`` holds a prepared dataset (its manifest)."""
    return os.path.isfile(os.path.join(folder, MANIFEST))


def read_manifest(out_dir: str) -> dict | None:
    path = os.path.join(out_dir, MANIFEST)
    if not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        data = f.read()
    try:
        manifest = json.loads(data)
    except ValueError as e:  # also bytes that are not UTF-8
        raise ValueError(f"data: {path} is damaged ({e}); prepare the dataset again (with --force)") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("split"), dict):
        raise ValueError(f"data: {path} is not a prepared dataset's manifest (no 'split'); prepare the dataset "
                         f"again (with --force)")
    # what the commands read from it: another tool's manifest.json (or an edited one) ended in a KeyError traceback
    missing = [key for key in _MANIFEST_KEYS if key not in manifest] + \
              [f"split.{name}.{key}" for name in ("train", "val") for key in ("file", "tokens", "docs")
               if not isinstance(manifest["split"].get(name), dict) or key not in manifest["split"][name]]
    if missing:
        raise ValueError(f"data: {path} is not a complete prepared dataset's manifest (it lacks {', '.join(missing)}); "
                         f"prepare the dataset again (with --force)")
    return manifest


def recorded_tokenizer_files(manifest: dict) -> str | None:
    """The fingerprint of the tokenizer folder the dataset of ``manifest`` was prepared with (tokenizer_files, or
    older_tokenizer_files in older datasets); None for other tokenizers, and datasets older still."""
    return (manifest.get("request") or {}).get("tokenizer_files")


def tokenizer_change(manifest: dict, spec: str) -> str | None:
    """How the tokenizer ``spec`` differs from the one the dataset of ``manifest`` was prepared with, when both
    bear one name (another name is the caller's to refuse), in words; None when nothing is seen to differ. A
    folder's tokenizer is compared by the content of its files (tokenizer_files): another tokenizer saved there
    since gives its ids to other tokens. A dataset prepared before the content was recorded holds the folder's file
    paths and times (older_tokenizer_files): the same ones show the folder untouched; other ones cannot tell a
    folder saved again, moved or copied from another tokenizer, so they are refused too. A dataset prepared before
    any of it was recorded, or a folder that is not there (the spec read elsewhere), is taken at its name."""
    recorded = recorded_tokenizer_files(manifest)
    if not recorded or canonical_name(spec) != manifest["tokenizer"]:
        return None
    content = recorded.startswith(CONTENT_PREFIX)
    now = (tokenizer_files if content else older_tokenizer_files)(spec)
    if now is None or now == recorded:
        return None
    if content:
        return f"the files of the tokenizer {manifest['tokenizer']!r} changed since the data was prepared with it " \
               f"(another tokenizer saved in its folder: the data's ids may stand for other tokens in it)"
    return f"the files of the tokenizer {manifest['tokenizer']!r} changed since the data was prepared with it, or " \
           f"their times or place did: that dataset records its tokenizer folder by its files' paths and times " \
           f"(an older foxformer), which cannot tell the folder saved again, moved or copied from another tokenizer"


def split_damage(out_dir: str, manifest: dict, split: str, arrays: dict | None = None) -> str | None:
    """How the files of ``split`` disagree with the manifest, in words; None when they agree. A cut-short token
    file (a full disk, a partial copy) or a document index of another build would give sequences and document
    boundaries that are not the documents'. ``arrays``: a dict that receives the document and source indexes
    read for the check ("index", "sources"), so that the dataset does not read them again."""
    info = manifest["split"][split]
    path = os.path.join(out_dir, info["file"])
    want = info["tokens"] * np.dtype(manifest["dtype"]).itemsize
    if not os.path.exists(path):
        return f"{path} is missing"
    if os.path.getsize(path) != want:
        return f"{path} has {os.path.getsize(path)} bytes, the manifest expects {want}"
    arrays = {} if arrays is None else arrays
    for key, shape in (("index", (info["docs"] + 1,)), ("sources", (info["docs"],))):
        if key not in info:  # datasets written before the source index was kept
            continue
        name = os.path.join(out_dir, info[key])
        try:
            arrays[key] = np.load(name)
        except (OSError, ValueError) as e:
            return f"{name} cannot be read ({e})"
        if arrays[key].shape != shape:
            return f"{name} holds {arrays[key].shape[0] if arrays[key].ndim else 0} entries, the manifest's " \
                   f"{info['docs']} documents need {shape[0]}"
    offsets = arrays.get("index")
    if offsets is not None and (offsets[0] != 0 or offsets[-1] != info["tokens"] or (np.diff(offsets) < 0).any()):
        return f"{os.path.join(out_dir, info['index'])} does not index the {info['tokens']} tokens of {path}"
    sources = arrays.get("sources")
    if sources is not None and sources.size and not 0 <= sources.min() <= sources.max() < len(manifest["sources"]):
        return f"{os.path.join(out_dir, info['sources'])} names sources the manifest does not have"
    return None


def _shard_key(info, cfg: PrepareConfig, folder_files: str | None) -> str:
    """The shard folder's name of the source ``info`` (a SourceInfo) tokenized as ``cfg`` asks."""
    parts = [info.spec, info.fingerprint, cfg.tokenizer, cfg.max_tokens_per_source, cfg.text_field]
    # each only where set: the shards made before it keep their keys and are taken up again, where a source of
    # the line-break rule gets a new one (its older shard's texts kept their "\r")
    parts += [folder_files] if folder_files else []
    parts += [info.newlines] if info.newlines else []
    blob = json.dumps(parts)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _pid_alive(pid: int) -> bool:
    if os.name != "posix":  # pragma: no cover - os.kill(pid, 0) would terminate the process on Windows
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it runs, as another user
        return True
    return True


def _remove_stale_tmp(folder: str, names: tuple[str, ...] | None = None) -> None:
    """Delete the ``<name>.tmp-PID[...]`` files and folders in ``folder`` of runs that were killed part-way: those
    of PIDs no longer running (and of this process: an earlier, interrupted call); a live PID may be a prepare
    running right now. ``names``: only temporaries of these (an out_dir may hold the user's other files)."""
    if not os.path.isdir(folder):
        return
    for entry in os.listdir(folder):
        name, sep, rest = entry.rpartition(".tmp-")
        pid = rest.split(".", 1)[0]
        if not sep or not pid.isdigit() or names is not None and name not in names:
            continue
        if int(pid) == os.getpid() or not _pid_alive(int(pid)):
            path = os.path.join(folder, entry)
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.remove(path)


def _token_array(toks, tok, dtype: np.dtype, spec: str, doc) -> np.ndarray:
    """``toks`` in the token arrays' dtype. Ids outside the tokenizer's vocabulary would wrap around in it (or end
    in numpy's OverflowError): the model would read other tokens than the text's."""
    ids = np.asarray(toks)
    if ids.size and (ids.min() < 0 or ids.max() >= tok.vocab_size):
        bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
        raise SettingError("tokenizer", f"{tok.name} gave the id {bad} for the document {doc.id!r} of {spec!r}, "
                                        f"outside its vocabulary of {tok.vocab_size} ids; the token arrays ({dtype}) "
                                        f"cannot hold it")
    return ids.astype(dtype, copy=False)


def _tokenize_source(spec: str, shard_dir: str, cfg: PrepareConfig, tok, progress: bool) -> dict:
    """Tokenize one source into ``shard_dir`` (skipped when its done-marker exists). A source of no non-empty
    document gives an empty shard: _build refuses the sources only where none has a document."""
    done_path = os.path.join(shard_dir, "done.json")
    if os.path.exists(done_path):
        with open(done_path) as f:
            info = json.load(f)
        _check_skipped(info, cfg)
        return info
    tmp_dir = f"{shard_dir}.tmp-{os.getpid()}"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    os.makedirs(tmp_dir)
    try:
        with refused_whole(spec, cfg.text_field, cfg.out_dir, progress, folder=cfg.out_dir,
                           others=len(cfg.sources) > 1):
            info = _write_shard(spec, tmp_dir, cfg, tok, progress)
    except BaseException:
        # a Ctrl-C, or a file of the source that cannot be read: the tokens written so far (up to the source's
        # size) stayed in OUT/shards until the next prepare into that folder, which may never come
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    shutil.rmtree(shard_dir, ignore_errors=True)
    os.replace(tmp_dir, shard_dir)
    return info


def _write_shard(spec: str, tmp_dir: str, cfg: PrepareConfig, tok, progress: bool) -> dict:
    """The shard of one source written into ``tmp_dir`` (tokens.bin, docs.npy, ids.json, done.json); its done.json's
    record."""
    dtype = token_dtype(tok.vocab_size)
    # 8 bytes a document, and the ids straight to their file: as Python lists, ~10M tiny documents held gigabytes
    offsets, n_docs, n_tokens = array.array("q", [0]), 0, 0
    bar = progress_bar(desc=f"tokenize {spec}", unit="tok", unit_scale=True, wanted=progress)
    with open(os.path.join(tmp_dir, "tokens.bin"), "wb") as out, \
            open(os.path.join(tmp_dir, "ids.json"), "w", encoding="utf-8") as ids_out:
        ids_out.write("[")
        batch, batch_chars = [], 0
        bos = None if tok.bos_id is None else np.asarray([tok.bos_id], dtype=dtype).tobytes()
        eot = np.asarray([tok.eot_id], dtype=dtype).tobytes()

        def flush() -> bool:
            nonlocal n_tokens, n_docs, batch_chars
            short = iter(tok.encode_batch([d.text for d in batch if len(d.text) <= PIECE_CHARS]))
            for doc in batch:
                pieces = [next(short)] if len(doc.text) <= PIECE_CHARS else tok.encode_pieces(doc.text, PIECE_CHARS)
                # One token beside the text: the end-of-text separator, or the BOS of a tokenizer that starts
                # sequences with one (gpt2-json's BOS is its end-of-text token too: a document's BOS ends the last).
                if bos is not None:
                    out.write(bos)
                size = 1
                for toks in pieces:
                    arr = _token_array(toks, tok, dtype, spec, doc)
                    out.write(arr.tobytes())
                    size += arr.size
                    bar.update(arr.size)
                if bos is None:
                    out.write(eot)
                bar.update(1)
                n_tokens += size
                offsets.append(n_tokens)
                ids_out.write((", " if n_docs else "") + json.dumps(doc.id))  # json.dump's form of the list
                n_docs += 1
                if cfg.max_tokens_per_source and n_tokens >= cfg.max_tokens_per_source:
                    return True
            batch.clear()
            batch_chars = 0
            return False

        capped, blanks, skipped = False, Blanks(), {} if cfg.skip_bad_files else None
        for doc in iter_documents(spec, cfg.text_field, cfg.out_dir, skipped):
            if blanks.skip(doc):
                continue
            batch.append(doc)
            batch_chars += len(doc.text)
            # by count for the threads of a batch encode, by size so that 32 long documents are not all held
            if (len(batch) >= 32 or batch_chars >= 8 * PIECE_CHARS) and flush():
                capped = True
                break
        if not capped and batch:
            flush()
        ids_out.write("]")
        out.flush()
        os.fsync(out.fileno())
    bar.close()
    np.save(os.path.join(tmp_dir, "docs.npy"), np.frombuffer(offsets, dtype=np.int64))
    info = {"spec": spec, "docs": n_docs, "tokens": int(n_tokens), **blanks.fields(stopped=capped),
            **({"skipped_files": dict(sorted(skipped.items()))} if skipped else {})}
    with open(os.path.join(tmp_dir, "done.json"), "w") as f:
        json.dump(info, f)
    return info


def _check_skipped(record: dict, cfg: PrepareConfig) -> None:
    """The refusal of a source for the files its shard or manifest ``record`` says were skipped, unless ``cfg``
    skips them too: a dataset or shard prepared with skip_bad_files, taken up by a prepare without it, holds what
    that one refuses. The record lists them all (the same request, so the same files): none is read again."""
    if record.get("skipped_files") and not cfg.skip_bad_files:
        raise refusal(record["spec"], record["skipped_files"], folder=cfg.out_dir)


def _split_documents(n_docs: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Shuffle documents (to mix sources) and hold out whole documents for validation."""
    order = np.random.default_rng(seed).permutation(n_docs)
    n_val = int(round(val_fraction * n_docs))
    if val_fraction > 0 and n_docs >= 2:
        n_val = max(n_val, 1)
    n_val = min(n_val, n_docs - 1)  # also for a single document: training never loses its only one
    return order[n_val:], order[:n_val]


def _write_split(out_dir: str, name: str, picks: np.ndarray, shards: list[tuple[np.memmap, np.ndarray]],
                 doc_table: np.ndarray, dtype: np.dtype, progress: bool) -> dict:
    """{name}.bin, its document index and each document's source index (doc_table[:, 0])."""
    path = os.path.join(out_dir, f"{name}.bin")
    # numpy, not a list of Python ints (~40 bytes a document: gigabytes at ~10M tiny documents), and worked out a
    # chunk of documents at a time (each takes a few arrays of its own while its places are looked up)
    offsets = np.zeros(len(picks) + 1, dtype=np.int64)
    bar = progress_bar(total=len(picks), desc=f"write {name}", unit="doc", wanted=progress)
    # streamed a chunk at a time into the temporary, which replaces the file once whole
    with replaced_atomically(path) as tmp, open(tmp, "wb") as out:
        for first in range(0, len(picks), WRITE_CHUNK_DOCS):
            chunk = doc_table[picks[first:first + WRITE_CHUNK_DOCS]]
            starts, ends = np.empty(len(chunk), dtype=np.int64), np.empty(len(chunk), dtype=np.int64)
            for s, (_, offs) in enumerate(shards):
                mine = chunk[:, 0] == s
                starts[mine], ends[mine] = offs[chunk[mine, 1]], offs[chunk[mine, 1] + 1]
            np.cumsum(ends - starts, out=offsets[first + 1:first + 1 + len(chunk)])
            offsets[first + 1:first + 1 + len(chunk)] += offsets[first]
            for s, a, b in zip(chunk[:, 0], starts, ends):
                piece = np.asarray(shards[s][0][a:b], dtype=dtype)
                out.write(memoryview(piece))  # no copy: a long document's tokens twice over in memory
            bar.update(len(chunk))
        out.flush()
        os.fsync(out.fileno())
    bar.close()
    _atomic_save_npy(os.path.join(out_dir, f"{name}.idx.npy"), offsets)
    _atomic_save_npy(os.path.join(out_dir, f"{name}.src.npy"), doc_table[picks, 0].astype(np.int16))
    return {"file": f"{name}.bin", "index": f"{name}.idx.npy", "sources": f"{name}.src.npy", "docs": int(len(picks)),
            "tokens": int(offsets[-1])}


def _request_changes(old: dict, new: dict, name) -> str:
    """What differs between two prepare requests, in words: the same sources whose files changed read as "the
    same request" when only the specs were shown. ``name``: how a setting is named (SettingError.said)."""
    said = []
    old_sources = {s["spec"]: s.get("fingerprint") for s in old.get("sources", [])}
    new_sources = {s["spec"]: s.get("fingerprint") for s in new.get("sources", [])}
    if list(old_sources) != list(new_sources):
        said.append(f"{name('sources')} {list(old_sources)} then, {list(new_sources)} now")
    else:
        changed = [spec for spec in new_sources if old_sources[spec] != new_sources[spec]]
        by_times = [spec for spec in changed if by_file_times(str(old_sources[spec]))]
        by_content = [spec for spec in changed if spec not in by_times]
        if by_content:
            said.append(f"the files of {', '.join(map(repr, by_content))} changed since (their content, or which "
                        f"files there are)")
        if by_times:
            said.append(f"the files of {', '.join(map(repr, by_times))} changed since, or their times or place did: "
                        f"that dataset records its sources by their files' paths and times (an older foxformer), "
                        f"which cannot tell files touched, moved or copied from changed ones")
    for key in sorted((set(old) | set(new)) - {"sources"}):
        if old.get(key) == new.get(key) or key == "tokenizer_files" and old.get("tokenizer") != new.get("tokenizer"):
            continue  # another tokenizer is said as such, not by its folder's fingerprint
        said.append(f"the files of the tokenizer {new['tokenizer']!r} changed since" if key == "tokenizer_files" else
                    f"{name(key)} {_value_said(old.get(key))} then, {_value_said(new.get(key))} now")
    return "; ".join(said) or "a request recorded by another version"


def _value_said(value) -> str:
    # None is a setting left out, which a command line cannot spell (and a request recorded before the setting was)
    return "unset" if value is None else repr(value)


def prepare(cfg: PrepareConfig, *, force: bool = False, progress: bool = True, note=None) -> dict:
    """Build (or reuse) the token arrays described by ``cfg``; returns the manifest.

    A complete output built from the same request is reused untouched; a different request in the same
    directory is refused unless ``force`` (then the old dataset stays whole until the new sources are tokenized).
    ``note``: called with one line where a dataset of this request in an older form is rebuilt (the same command
    rebuilds it without ``force``, and said nothing of why it ran again).
    """
    cfg.validate()
    check_output_dir(cfg.out_dir, "out_dir")
    _check_not_run_or_model(cfg.out_dir)
    for spec in cfg.sources:
        _check_out_dir_apart(cfg.out_dir, spec)
    # the sources' digests, kept in the dataset's folder for the next prepare (which reads unchanged files no more)
    digests = DigestCache(os.path.join(cfg.out_dir, DIGESTS), progress)
    infos = [describe_source(s, digests, cfg.out_dir) for s in cfg.sources]
    for info in infos:
        if info.unreadable and not cfg.skip_bad_files:  # a link to nothing: the files that do not decode too
            bad = unreadable_files(info.spec, cfg.text_field, cfg.out_dir, progress)
            raise refusal(info.spec, bad, folder=cfg.out_dir,
                          rest=len(cfg.sources) > 1 or readable_left(info.spec, bad, cfg.out_dir))
    try:
        manifest = _prepare(cfg, infos, force, progress, note)
    except KeyboardInterrupt:  # the bare "interrupted" left it unsaid whether a rerun starts over
        raise KeyboardInterrupt(f"the sources tokenized in full are kept in {os.path.join(cfg.out_dir, SHARDS)}: "
                                f"the same `foxformer data prepare` command goes on from them") from None
    for source in manifest["sources"]:  # a dataset of this request prepared with skip_bad_files, reused
        _check_skipped(source, cfg)
    digests.save()
    drop_list(cfg.out_dir)
    # what this walk passed over, not what the walk that built a reused dataset did (a dataset since added)
    for source, info in zip(manifest["sources"], infos):
        if info.skipped:
            source["skipped_datasets"] = list(info.skipped)
        if info.outputs:
            source["skipped_outputs"] = list(info.outputs)
        if info.outputs_by_files:
            source["outputs_by_files"] = {folder: list(told) for folder, told in info.outputs_by_files}
    return manifest


def run_or_model_folder(folder: str) -> tuple[str, str] | None:
    """(the file that tells, what ``folder`` is) where it is a training run's folder or a Hugging Face model folder
    and holds no dataset, else None: the two folders a dataset's path is mixed up with."""
    if is_dataset(folder):
        return None
    for what, name, _ in MODEL_FOLDERS:  # the config alone: a dataset written there would be mixed in with either
        if os.path.isfile(os.path.join(folder, name)):
            return name, what
    return None


def _check_not_run_or_model(out_dir: str) -> None:
    """ValueError where ``out_dir``, holding no dataset, is a training run's folder or a Hugging Face model folder:
    `--out RUN` wrote the dataset's shards and splits among the run's checkpoints, or the model's files."""
    if taken := run_or_model_folder(out_dir):
        raise SettingError("out_dir", f"{out_dir!r} is {taken[1]} (it holds {taken[0]}), not a dataset folder: name "
                                      f"a new folder for the dataset, e.g. data_cache/NAME")


def _prepare(cfg: PrepareConfig, infos: list, force: bool, progress: bool, note) -> dict:
    first: dict[str, str] = {}
    read_by: dict[str, str] = {}
    copy_of: dict[bytes, tuple[str, str]] = {}
    for info in infos:  # each copy of a document would be split on its own: one in train, one in validation
        # a folder and a file in it (or two nested folders): its documents were read twice, in silence
        for path in info.files:
            if read_by.setdefault(path, info.spec) != info.spec:
                raise SettingError("sources", f"{read_by[path]!r} and {info.spec!r} both read {path}; a file read "
                                              f"twice would put copies of its documents in both train and validation: "
                                              f"give each file through one source only")
        if info.fingerprint in first:
            raise SettingError("sources", f"{info.spec!r} is {first[info.fingerprint]!r} again (or a copy: the same "
                                          f"files and content); a source given twice would put copies of its documents "
                                          f"in both train and validation")
        first[info.fingerprint] = info.spec
        # a file's copy under another name (notes.jsonl and notes (1).jsonl): its fingerprint is another, its
        # documents were read twice all the same. Sources of one file only: two folders may share files (two
        # repositories' licence, a vendored library), and refusing them would refuse real corpora.
        for path, digest in zip(info.files, info.digests) if len(info.files) == 1 else ():
            if os.path.getsize(path) and copy_of.setdefault(digest, (info.spec, path))[0] != info.spec:
                raise SettingError("sources", f"{path} (of {info.spec!r}) holds the same bytes as "
                                              f"{copy_of[digest][1]} (of {copy_of[digest][0]!r}): its documents would "
                                              f"be read twice, and a copy could land in train and another in "
                                              f"validation; leave one of them out")
    # a source's line-break rule only where it changed its texts: the requests of the others, and so their
    # datasets, stay those of before the rule
    request = {"sources": [{"spec": i.spec, "fingerprint": i.fingerprint, **({"newlines": i.newlines} if i.newlines
                                                                              else {})} for i in infos],
               "tokenizer": cfg.tokenizer, "val_fraction": cfg.val_fraction, "seed": cfg.seed,
               "max_tokens_per_source": cfg.max_tokens_per_source, "text_field": cfg.text_field}
    if cfg.leave_out:  # absent otherwise: datasets prepared before the option keep matching their request
        request["leave_out"] = list(cfg.leave_out)
    folder_files = tokenizer_files(cfg.tokenizer)
    if folder_files:  # likewise: for a tokenizer folder only (a tokenizer saved again there is another request)
        request["tokenizer_files"] = folder_files
    older_requests = _older_requests(request, infos, cfg.tokenizer)
    reused, _, _ = _existing_dataset(cfg.out_dir, request, older_requests, force)
    if reused is not None:
        return reused
    tok = load_tokenizer(cfg.tokenizer)  # a bad spec fails here, before out_dir is touched
    # Two prepares at once into one folder each wrote the other's files over its own and both said they were done:
    # a train.bin of one request under the other's index and manifest. The second is refused while the first runs.
    with folder_lock(cfg.out_dir, "out_dir"):
        # again, under the lock: a prepare that held it may have written the same dataset, or another one
        reused, replace, older = _existing_dataset(cfg.out_dir, request, older_requests, force)
        if reused is not None:
            return reused
        if older and note is not None:
            note(f"{cfg.out_dir!r} holds a dataset prepared by an older foxformer ({older}): rebuilding it")
        return _build(cfg, infos, request, tok, progress, replace)


def _older_requests(request: dict, infos: list, tokenizer: str) -> list[tuple[dict, str]]:
    """``request`` in each form older datasets recorded it, as it reads now: source files by their paths, sizes and
    nanosecond mtimes, and whole-second ones before; a tokenizer folder by its files' paths and times, and not at
    all before. A dataset of one of them was prepared from sources and a tokenizer untouched since (or edited
    within the second): the same command rebuilds it in the current form, where another request is refused. So is
    one of before the sources' line-break rule (sources.NEWLINES), whose texts may hold "\\r" tokens. Each form
    comes with what sets it apart, in words ("" for the request itself)."""
    older = [i.older_fingerprints or (i.fingerprint,) * 2 for i in infos]  # builtin and hf: one form all along
    times, rule = any(i.older_fingerprints for i in infos), any(i.newlines for i in infos)
    by_times = ["its sources recorded by their files' paths and times"] if times else []
    before_rule = ["before line breaks in JSONL, Parquet and hf: texts were read as \\n"] if rule else []
    sources = [(request["sources"], [])]
    sources += [([{"spec": i.spec, "fingerprint": fps[k]} for i, fps in zip(infos, older)], by_times + before_rule)
                for k in (0, 1)]
    sources.append(([{"spec": i.spec, "fingerprint": i.fingerprint} for i in infos], before_rule))
    folder = [({}, [])]
    if "tokenizer_files" in request:
        folder = [({}, ["no record of its tokenizer folder's files"]),
                  ({"tokenizer_files": request["tokenizer_files"]}, []),
                  ({"tokenizer_files": older_tokenizer_files(tokenizer)},
                   ["its tokenizer folder recorded by its files' paths and times"])]
    rest = {k: v for k, v in request.items() if k not in ("sources", "tokenizer_files")}
    return [({**rest, "sources": s, **f}, "; ".join(s_why + f_why)) for s, s_why in sources for f, f_why in folder]


def _check_out_dir_apart(out_dir: str, spec: str) -> None:
    """ValueError when ``out_dir`` is the source ``spec`` or a folder that holds it: the dataset's files were
    written among the documents (its manifest.json over a source of that name), and read as documents by a prepare
    of that folder. A dataset inside a source folder is fine: the folder's walk passes over it.

    Both paths as given and resolved: resolved alone, a source reached through a symlink inside ``out_dir``
    (out/corpus leading elsewhere) was not held by it, and the dataset took the folder of the link."""
    if source_kind(spec) != "file" or not os.path.exists(spec):
        return
    for source, out in ((os.path.abspath(spec), os.path.abspath(out_dir)),
                        (os.path.realpath(spec), os.path.realpath(out_dir))):
        if source == out or source.startswith(out.rstrip(os.sep) + os.sep):
            break
    else:
        return
    said = "is the source folder" if source == out else f"holds the source {spec!r}"
    instead = os.path.join(spec, "prepared") if os.path.isdir(spec) else "data_cache/NAME"
    raise SettingError("out_dir", f"{out_dir!r} {said}: the dataset's files (manifest.json, shards/, train.bin, "
                                  f"...) would be written among the documents; give the dataset a folder of its "
                                  f"own, e.g. {instead!r}")


def _existing_dataset(out_dir: str, request: dict, older_requests: list[tuple[dict, str]],
                      force: bool) -> tuple[dict | None, bool, str]:
    """(the manifest of the dataset in ``out_dir`` when it is complete and of ``request``, whether a manifest is
    there to remove before building, what sets its request apart where it is one of ``older_requests``, else "");
    ValueError for another request's dataset unless ``force``."""
    try:
        old = read_manifest(out_dir)
    except ValueError:
        if not force:
            raise
        return None, True, ""  # removed, as a different request's would be
    if old is None:
        return None, False, ""
    # rebuilt (same request: no --force needed): a dataset written before the per-document source index, one
    # whose files no longer match it (the dataset loader's advice, "prepare it again", did nothing), and one
    # whose request is in the older form (its tokens may be those of an earlier edit, or an earlier tokenizer)
    if old.get("request") == request and all("sources" in old["split"][n] and not split_damage(out_dir, old, n)
                                             for n in ("train", "val")):
        return old, False, ""
    older = next((why for form, why in older_requests if form == old.get("request")), None)
    if not force and older is None:
        recorded = old.get("request") or {}
        raise SettingError("out_dir", lambda name: f"{out_dir!r} already holds a dataset prepared from a different "
                                                   f"request ({_request_changes(recorded, request, name)}); use "
                                                   f"another directory, or pass {name('force')} to replace it")
    return None, True, older or ""


def _build(cfg: PrepareConfig, infos: list, request: dict, tok, progress: bool, replace: bool) -> dict:
    """Tokenize the sources of ``infos`` (reusing finished shards), write the splits, then the manifest.
    ``replace``: the manifest there is removed once the sources are tokenized, before the splits it describes are
    written over (a source that fails to read leaves the dataset there as it was)."""
    _remove_stale_tmp(os.path.join(cfg.out_dir, SHARDS))
    # a run killed while it wrote the splits left their temporaries (a split's size each) beside them, for good
    _remove_stale_tmp(cfg.out_dir, (MANIFEST, *(f"{split}.{ext}" for split in ("train", "val")
                                                for ext in ("bin", "idx.npy", "src.npy"))))
    dtype = token_dtype(tok.vocab_size)
    shard_infos, shards = [], []
    for s_idx, info in enumerate(infos):
        shard_dir = os.path.join(cfg.out_dir, SHARDS,
                                 _shard_key(info, cfg, request.get("tokenizer_files")))
        meta = _tokenize_source(info.spec, shard_dir, cfg, tok, progress)
        shard_infos.append({**meta, "fingerprint": info.fingerprint, "shard": os.path.relpath(shard_dir, cfg.out_dir),
                            **({"left_out_files": dict(info.left_out)} if info.left_out else {})})
        # an empty file cannot be mapped
        toks = np.memmap(os.path.join(shard_dir, "tokens.bin"), dtype=dtype, mode="r") if meta["tokens"] else \
            np.zeros(0, dtype)
        offs = np.load(os.path.join(shard_dir, "docs.npy"))
        if offs[-1] != toks.size:
            raise ValueError(f"shard {shard_dir} is inconsistent (index says {offs[-1]} tokens, file has {toks.size}); "
                             f"delete it and rerun")
        shards.append((toks, offs))
    # a source of no document (a whitespace file beside others) adds none, with the note a folder's empty files
    # get, as it would were it one of a folder's files; where no source has one, there is no dataset to make
    if not any(info["docs"] for info in shard_infos):
        specs = ", ".join(repr(info["spec"]) for info in shard_infos)
        empty = sum(info.get("empty_docs", 0) for info in shard_infos)
        unread = sum(len(info.get("skipped_files", ())) for info in shard_infos)
        unread = f"; {unread} file(s) that cannot be read as text skipped" if unread else ""
        raise SettingError("sources", f"{specs} yielded no non-empty documents ({empty} empty or only "
                                      f"whitespace{unread})")
    # [n_docs, 2]: each document's (source, document in its source), 16 bytes a document
    doc_table_arr = np.concatenate([np.stack([np.full(len(offs) - 1, s_idx), np.arange(len(offs) - 1)], axis=1)
                                    for s_idx, (_, offs) in enumerate(shards)]).astype(np.int64, copy=False)
    train_docs, val_docs = _split_documents(len(doc_table_arr), cfg.val_fraction, cfg.seed)
    left_out = [i for i, info in enumerate(infos) if info.spec in cfg.leave_out]
    train_docs = train_docs[~np.isin(doc_table_arr[train_docs, 0], left_out)]
    if not len(train_docs):  # the split keeps one training document, of any source: it may be a left-out one's
        kept = [info.spec for i, info in enumerate(infos) if i not in left_out]
        n_kept = int((~np.isin(doc_table_arr[:, 0], left_out)).sum())
        raise SettingError("leave_out", f"the training split would be empty: the {n_kept} document(s) of {kept} all "
                                        f"fell in the validation split (a fraction of {cfg.val_fraction}, seed "
                                        f"{cfg.seed}); give those sources more documents, or another seed")
    if replace:
        os.remove(os.path.join(cfg.out_dir, MANIFEST))
    splits = {name: _write_split(cfg.out_dir, name, picks, shards, doc_table_arr, dtype, progress)
              for name, picks in (("train", train_docs), ("val", val_docs))}
    manifest = {
        "format": FORMAT,
        "tokenizer": tok.name,
        "vocab_size": tok.vocab_size,
        "eot_id": tok.eot_id,
        "dtype": dtype.name,
        "sources": shard_infos,
        "split": {"by": "document", "val_fraction": cfg.val_fraction, "seed": cfg.seed, **splits},
        "docs": int(len(doc_table_arr)),
        "tokens": int(sum(s["tokens"] for s in splits.values())),
        "request": request,
        "config": asdict(cfg),
        "created_unix": time.time(),
    }
    write_json(os.path.join(cfg.out_dir, MANIFEST), manifest, sort_keys=True)
    _prune_shards(cfg.out_dir, {os.path.basename(info["shard"]) for info in shard_infos})
    return manifest


def _prune_shards(out_dir: str, kept: set[str]) -> None:
    """Delete the shards of ``out_dir`` that its manifest no longer names (a source edited, another tokenizer):
    each kept a copy of its source's tokens for good. Called with the folder lock held, once the manifest is
    written: a prepare that fails before it still has them to reuse."""
    folder = os.path.join(out_dir, SHARDS)
    for entry in os.listdir(folder):
        # only shard keys: temporaries are _remove_stale_tmp's, and the folder holds nothing else of ours
        if entry not in kept and re.fullmatch(r"[0-9a-f]{16}", entry) and os.path.isdir(os.path.join(folder, entry)):
            shutil.rmtree(os.path.join(folder, entry))
