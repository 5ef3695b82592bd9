"""Token sequences for evaluation: windows of a prepared dataset split, or of documents from a text source."""
from __future__ import annotations

import os
import sys
from typing import Optional

import numpy as np
import torch

from foxformer.argtypes import SettingError, setting_name


def check_sequences(seq_len: int, num: int, *, label: str = "{}") -> None:
    """Refuse a length or count no sequences can be cut to. ``label`` names the settings as argtypes.setting_name
    does: the keywords by default, "--{}" for the flags of the eval commands (--seq-len, --num-seqs)."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
        raise ValueError(f"{setting_name(label, 'seq_len')}: expected an integer >= 2 (tokens per evaluation "
                         f"sequence), got {seq_len!r}")
    if isinstance(num, bool) or not isinstance(num, int) or num < 1:
        raise ValueError(f"{setting_name(label, 'num', 'num_seqs')}: expected a positive integer, got {num!r}")


def check_data_source(source: Optional[str], within_docs: bool, *, label: str = "{}") -> None:
    """Refuse a source of the dataset's documents chosen without within_docs. ``label``: as check_sequences'."""
    if source is not None and not within_docs:
        raise ValueError(f"{setting_name(label, 'source', 'data_source')}: choosing a source's documents needs "
                         f"{setting_name(label, 'within_docs')} (windows of the concatenated split cross documents "
                         f"of every source)")


def note_fewer(found: int, seq_len: int, num: int, where: str, *, per_doc: bool) -> None:
    """A note on stderr where ``found`` sequences are fewer than the ``num`` asked for: the results hold fewer, and
    said so only in their JSON. ``per_doc``: each sequence is a document's own window (--source, --within-docs),
    whose number does not grow as --seq-len shrinks, as a split's concatenated windows do."""
    if found >= num:
        return
    how = ("each document that long gives one; a shorter --seq-len lets more documents in" if per_doc
           else "a shorter --seq-len gives more")
    print(f"note: only {found} sequence{'s' if found > 1 else ''} of {seq_len} tokens in {where} (--num-seqs {num}); "
          f"{how}", file=sys.stderr)


def _split_size(data_dir: str, split: str) -> int:
    """The tokens of ``split`` as the dataset's manifest records them; 0 where it cannot tell (TokenDataset says
    why)."""
    from foxformer.data import read_manifest

    try:
        return int(read_manifest(data_dir)["split"][split]["tokens"])
    except (TypeError, KeyError, ValueError):
        return 0


def dataset_sequences(data_dir: str, seq_len: int, num: int, *, split: str = "val",
                      within_docs: bool = False, source: Optional[str] = None, label: str = "{}",
                      within_docs_optional: bool = True) -> torch.Tensor:
    """int64 [N, seq_len] from a prepared dataset (``foxformer data prepare``), N = min(num, available).

    within_docs=False: consecutive windows of the concatenated split (documents joined by end-of-text),
    spread evenly over the split. within_docs=True: only windows that lie inside one document (long-context
    evaluation: every position really has that much context), at most one per document, longest docs first;
    a window holds text only, never the document's closing end-of-text token. ``source`` (needs within_docs):
    only documents of that source of the dataset (see TokenDataset.source_index). ``label``: as check_sequences'.
    ``within_docs_optional=False``: the caller always reads within documents (bias-shift has no --within-docs), so
    a dataset without documents of seq_len tokens is not told to drop within_docs.
    """
    check_sequences(seq_len, num, label=label)
    check_data_source(source, within_docs, label=label)
    name, source_name = setting_name(label, "seq_len"), setting_name(label, "source", "data_source")
    from foxformer.data import TokenDataset

    # A split shorter than seq_len is refused here with the largest seq_len that works (the dataset's own error
    # gives none); within documents, the check of their lengths below does that. An empty split is the dataset's
    # to explain (how to prepare one).
    size = _split_size(data_dir, split)
    if not within_docs and 2 <= size < seq_len:
        raise ValueError(f"{name}: split {split!r} of {data_dir!r} has {size} tokens, fewer than one sequence of "
                         f"{seq_len}; the largest workable {name} is {size}")
    try:
        ds = TokenDataset(data_dir, split, min(seq_len, size) if size >= 2 else seq_len)
        index = None if source is None else ds.source_index(source)
    except SettingError as e:  # the dataset's reader names the settings as its own keywords ("data", "source")
        raise _said_as(e, setting_name(label, e.field, {"source": "data_source"}.get(e.field))) from None
    if not within_docs:
        picks = np.linspace(0, len(ds) - 1, num=min(num, len(ds))).round().astype(np.int64)
        return torch.from_numpy(np.stack([ds.sequence(int(i)) for i in np.unique(picks)]))
    offsets = np.asarray(ds.doc_offsets, dtype=np.int64)
    lengths = np.diff(offsets) - 1  # text tokens: each document has an end-of-text token (or starts with a BOS)
    if source is not None:
        if ds.doc_sources is None:
            raise ValueError(f"{source_name}: {data_dir!r} was prepared before documents kept their source; prepare "
                             f"it again (the same command rebuilds it from its cached shards)")
        lengths = np.where(ds.doc_sources == index, lengths, -1)  # -1: another source's
    long_docs = np.flatnonzero(lengths >= seq_len)
    if long_docs.size == 0:
        or_else = (f"drop {setting_name(label, 'within_docs')}" if within_docs_optional else
                   "give a dataset with longer documents")
        raise ValueError(f"{name}: no document of split {split!r} in {data_dir!r}"
                         f"{'' if source is None else f' from source {source!r}'} has {seq_len} text tokens "
                         f"(longest: {max(int(lengths.max()), 0) if lengths.size else 0}); lower {name} or "
                         f"{or_else}")
    order = long_docs[np.argsort(-lengths[long_docs], kind="stable")][:num]
    rows = [np.asarray(ds.tokens[offsets[d]:offsets[d] + seq_len], dtype=np.int64) for d in sorted(order)]
    return torch.from_numpy(np.stack(rows))


def _said_as(e: SettingError, name: str, label: str = "{}") -> Exception:
    """``e``, a source reader's refusal in the API's words ("source: ..."), said after ``name``, the setting its
    caller took the source as, and the settings its reason names as ``label`` names them (the option that passes
    bad files over: ``skipped`` here, --skip-bad-files to a command); ``e`` itself where all are its own."""
    reason = e.said(lambda field: setting_name(label, "skipped", field) if field == "skip_bad_files" else
                    setting_name(label, field))
    return e if name == e.field and reason == e.reason else ValueError(f"{name}: {reason}")


def _without(label: str) -> str:
    """What an eval's option to pass a source's bad files over does, as its refusal of them offers it."""
    kept = "listed in the results" if label.startswith("--") else "put in it"
    return f"evaluate without them (they are printed, and {kept})"


# What lists the files an eval's reading of a source passed over (its notes say it)
RECORD = "the results' JSON"


class SkippedFiles(dict):
    """The files of a source that a reading with --skip-bad-files passed over, path -> problem, and ``read_whole``,
    set by the reading: whether it went to the source's end, so that they are all its bad files. An eval's reading
    stops once it has the text it needs, and the files after that point are not checked: reading them all for this
    alone could cost more than the evaluation, and a skipped_files that held only the files met was read as every
    bad file of the source."""

    read_whole = True

    def fields(self) -> dict:
        """The results' record of them: ``skipped_files``, and ``skipped_files_among``, which files they are of."""
        from foxformer.data.unreadable import READ_BEFORE_STOP

        among = "every file of the source" if self.read_whole else READ_BEFORE_STOP
        return {"skipped_files": dict(sorted(self.items())), "skipped_files_among": among}


def _passed_over(source: str, skipped: Optional[SkippedFiles], stopped: bool) -> None:
    """Record in ``skipped`` whether the reading of ``source`` went to its end (``stopped``: it did not), and say on
    stderr which files it passed over, if any."""
    from foxformer.data.unreadable import skipped_note

    if skipped is None:
        return
    skipped.read_whole = not stopped
    if skipped:
        print(f"note: {skipped_note(source, skipped, RECORD, stopped)}", file=sys.stderr)


def _check_left(what: str, source: str, skipped: Optional[SkippedFiles], docs: int, label: str) -> None:
    """Refuse ``source`` where --skip-bad-files passed over files of it and no document (``docs``: those read) was
    left: the refusal of too little text that followed sent the user to a shorter --seq-len for a source whose
    every file was bad."""
    from foxformer.data.unreadable import listed
    from foxformer.paths import BINARY

    if skipped and not docs:
        others = " and its other files hold none" if os.path.isdir(source) else ""
        convert = "" if all(problem.startswith(BINARY) for problem in skipped.values()) else \
            "convert them to UTF-8 (iconv -f ITS_ENCODING -t utf-8) or "
        raise ValueError(f"{what}: no document of {source!r} is left: its {len(skipped)} file(s) that cannot be read "
                         f"as text were passed over ({setting_name(label, 'skipped', 'skip_bad_files')}){others}; "
                         f"{convert}give another source. Passed over: {listed(skipped)}")


def check_out_apart(source: str, folder: Optional[str], what: str = "source", label: str = "{}") -> None:
    """Refuse ``folder``, where a command writes its results, where it is the source folder ``source`` itself
    (``what``: the setting that names it): the results' JSON would be read as a document of it by the next run. A
    folder inside the source is passed over by its reading, and said (_note_out)."""
    if folder is not None and os.path.isdir(source) and os.path.realpath(source) == os.path.realpath(folder):
        raise ValueError(f"{setting_name(label, 'folder', 'out')}: {folder!r} is the {what} folder itself, every "
                         f"file of which is read: the results written there would be read as its documents by the "
                         f"next run; name a folder inside it (the reading passes over that) or elsewhere")


def _note_out(source: str, folder: Optional[str]) -> None:
    """Say that the reading of ``source`` passes over ``folder``, the output folder, where it lies inside."""
    from foxformer.data.sources import passes_over

    if passes_over(source, folder):
        print(f"note: {source}: the output folder {folder} in it is not read as documents", file=sys.stderr)


def _after_reading(source: str, folder: Optional[str], what: str, skipped: Optional[SkippedFiles], docs: int,
                   stopped: bool, left_out: dict, text_field: str, label: str) -> None:
    """What both readings do once a source is read: drop an earlier refusal's list from ``folder`` (the output
    folder), refuse a source of nothing but passed-over files (_check_left; ``docs``: the documents read), say what
    the walk left out (``left_out``: reading_notes' fields) and which files it passed over (``stopped``: it ended
    before the source did)."""
    from foxformer.data.sources import reading_notes
    from foxformer.data.unreadable import drop_list

    if folder is not None:
        drop_list(folder)
    _check_left(what, source, skipped, docs, label)
    for note in reading_notes({"spec": source, **left_out}, text_field):
        print(f"note: {note}", file=sys.stderr)
    _passed_over(source, skipped, stopped)


def document_token_stream(source: str, tokenizer, *, min_tokens: int, enough: Optional[int] = None,
                          max_docs: Optional[int] = None, separator: Optional[int] = None, what: str = "source",
                          fix: str = "give a source with more text", text_field: str = "text",
                          skipped: Optional[SkippedFiles] = None, label: str = "{}",
                          folder: Optional[str] = None) -> list[int]:
    """Token ids of a text source's documents joined (by ``separator`` if given) until ``enough`` (default
    ``min_tokens``) are collected. ``source``: a spec of ``foxformer.data.iter_documents`` (file, directory,
    builtin:...), ``text_field`` its JSONL field / Parquet column of the text. Fewer than ``min_tokens``, or a
    source that cannot be read, is refused in one line: ``what`` names the option, ``fix`` says what to do; the
    source's files that cannot be read as text all at once (``folder``: the output folder, where a list longer
    than the error shows is written whole), or where ``skipped`` (a SkippedFiles) is given, passed over, said and
    put in it, as iter_documents does. ``folder`` inside a source folder is passed over, and said; the source
    folder itself is refused as it (check_out_apart). What a folder's walk left out (files of other kinds, datasets
    and eval output folders in it) is said on stderr, in the notes `data prepare` gives. ``label``: as
    check_sequences'."""
    from foxformer.data import iter_documents
    from foxformer.data.sources import left_out_of, refused_whole

    enough = min_tokens if enough is None else max(enough, min_tokens)
    check_out_apart(source, folder, what, label)
    _note_out(source, folder)
    ids: list[int] = []
    stopped, docs = False, 0
    try:
        with refused_whole(source, text_field, out_dir=folder, without=_without(label), folder=folder):
            for doc in iter_documents(source, text_field, out_dir=folder, skipped=skipped):
                if max_docs is not None and docs >= max_docs:
                    stopped = True
                    break
                docs += 1
                ids.extend(tokenizer.encode(doc.text))
                if separator is not None:
                    ids.append(separator)
                if len(ids) >= enough:
                    stopped = True
                    break
        left_out = left_out_of(source, folder)
    except SettingError as e:  # `niah --haystack` was refused as "source:"
        raise _said_as(e, what, label) from None
    # the folders and files its walk passed over are said as source_sequences says them: an older output folder of
    # niah's own was passed over without a word
    _after_reading(source, folder, what, skipped, docs, stopped, left_out, text_field, label)
    if len(ids) < min_tokens:
        raise ValueError(f"{what}: {source!r} holds {len(ids)} tokens, {min_tokens} are needed; {fix}")
    return ids


def source_sequences(source: str, tokenizer, seq_len: int, num: int, text_field: str = "text", *,
                     label: str = "{}", skipped: Optional[SkippedFiles] = None,
                     folder: Optional[str] = None) -> torch.Tensor:
    """int64 [N, seq_len]: the first ``seq_len`` tokens of each document with at least that many tokens (a
    tokenizer's BOS first, for those that have one), read until there are ``num``. ``text_field``: the JSONL field
    / Parquet column of the text. ``label``: as check_sequences'. What reading the source left out (empty documents
    among those read, a folder's files of other kinds) is said on stderr, in the notes `data prepare` gives. Its
    files that cannot be read as text are refused all at once (``folder``: the output folder, where a list longer
    than the error shows is written whole), or where ``skipped`` (a SkippedFiles) is given, passed over, said and
    put in it, as iter_documents does. ``folder`` inside a source folder is passed over, and said; the source
    folder itself is refused as it (check_out_apart)."""
    check_sequences(seq_len, num, label=label)
    from foxformer.data import iter_documents
    from foxformer.data.sources import Blanks, left_out_of, refused_whole
    from foxformer.data.tokenizer import start_ids

    check_out_apart(source, folder, setting_name(label, "source"), label)
    _note_out(source, folder)
    rows, blanks = [], Blanks()
    try:
        with refused_whole(source, text_field, out_dir=folder, without=_without(label), folder=folder):
            for doc in iter_documents(source, text_field, out_dir=folder, skipped=skipped):
                if blanks.skip(doc):
                    continue
                ids = start_ids(tokenizer) + tokenizer.encode(doc.text)
                if len(ids) >= seq_len:
                    rows.append(ids[:seq_len])
                    if len(rows) >= num:
                        break
        left_out = left_out_of(source, folder)
    except SettingError as e:  # the source's reader names its setting as the API does ("source")
        raise _said_as(e, setting_name(label, e.field), label) from None
    stopped = len(rows) >= num  # the rest of the source was not read: its empty documents are not counted
    _after_reading(source, folder, setting_name(label, "source"), skipped, blanks.read, stopped,
                   {**blanks.fields(stopped), **left_out}, text_field, label)
    if not rows:
        name = setting_name(label, "seq_len")
        raise ValueError(f"{name}: no document of {source!r} has {seq_len} tokens; lower {name} or use a source "
                         f"with longer documents")
    return torch.tensor(rows, dtype=torch.int64)
