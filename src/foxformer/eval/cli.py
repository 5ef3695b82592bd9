"""`foxformer eval {loss,niah,harness,eviction,compare,mqar}`, `foxformer analyze gates` and `foxformer report`."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

from foxformer.argtypes import distinct, floats, ints, length, lengths, model_specs, no_progress_arg, words
from foxformer.json_text import print_json
from foxformer.paths import check_output_dir

# How the API's checks name a setting in this module's errors (argtypes.setting_name): by its flag.
FLAGS = "--{}"


def _model_args(p: argparse.ArgumentParser, several: bool = True) -> None:
    p.add_argument("models", nargs="+" if several else 1, metavar="MODEL",
                   help="run dir, RUN/checkpoints/step_N, Hugging Face folder or Hub id owner/name"
                        + (" (several: side by side)" if several else ""))
    if several:
        p.add_argument("--names", type=words, default=None,
                       help="comma-separated labels for the models (default: their folders' names)")
    else:  # one model: the flag of the other commands, so that scripts pass it to all of them
        p.add_argument("--names", type=words, default=None, metavar="NAME",
                       help="label of the model in the results (default: its folder's name)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU) | fp32 | bf16 | fp16")
    p.add_argument("--attention-backend", default=None,
                   help="override the attention backend of the model" + ("s" if several else ""))
    p.add_argument("--train-len", type=length, default=None,
                   help="training context length, e.g. 2048 or 2Ki (read from the run's config.yaml when omitted)")
    p.add_argument("--out", default=None, help="output folder (default: RUN_DIR/eval for one run dir, else runs/eval)")
    no_progress_arg(p, "loading the weights, the evaluation's own")


def _text_field_arg(p: argparse.ArgumentParser, when: str, default: str | None = "text") -> None:
    p.add_argument("--text-field", default=default, help=f"{when}the JSONL field / Parquet column of the text "
                                                         f"(default: text)")


def skip_bad_files_arg(p: argparse.ArgumentParser, source: str) -> None:
    """--skip-bad-files, as `data prepare` takes it, for the text a command reads from ``source`` (its flag)."""
    p.add_argument("--skip-bad-files", action="store_true",
                   help=f"pass over the files of {source} that cannot be read as text rather than refuse it for "
                        f"them: they are printed, and listed under skipped_files in the results; reading stops once "
                        f"it has enough text, so these are the bad files met until then (skipped_files_among says "
                        f"whether that was every file)")


def _text_args(p: argparse.ArgumentParser, seq_len: int, num: int) -> None:
    p.add_argument("--data", default=None,
                   help="prepared dataset dir (foxformer data prepare; default: the one the runs trained on, if they "
                        "share it)")
    # None: left out, which --source may be given with (see text_flags)
    p.add_argument("--split", default=None, choices=("train", "val"), help="split of --data (default: val)")
    p.add_argument("--within-docs", action="store_true",
                   help="only windows inside one document (every position has real context)")
    p.add_argument("--data-source", default=None, metavar="SOURCE",
                   help="with --data --within-docs: only documents of this source of the dataset (its spec or a "
                        "part naming one source, e.g. prose)")
    p.add_argument("--source", default=None,
                   help="text source instead of --data: file/dir (.txt/.jsonl[.xz]) or builtin:pydoc|sympy|stdlib")
    _text_field_arg(p, "with --source: ", default=None)
    skip_bad_files_arg(p, "--source")
    p.add_argument("--tokenizer", default=None, help="tokenizer for --source (default: the run's, else gpt2)")
    p.add_argument("--seq-len", type=length, default=seq_len, help="tokens per sequence, e.g. 4096 or 4Ki")
    p.add_argument("--num-seqs", type=int, default=num, help="number of sequences")


def _load_models(args):
    from foxformer.train.loading import distinct_names, load_model

    if args.names is not None and len(args.names) != len(args.models):
        raise ValueError(f"--names: got {len(args.names)} names for {len(args.models)} models")
    given = args.names or distinct_names(args.models)
    out = [load_model(path, device=args.device, dtype=args.dtype, train_len=args.train_len, name=name,
                      attention_backend=args.attention_backend, progress=not args.no_progress, label=FLAGS,
                      among_others=len(args.models) > 1)
           for path, name in zip(args.models, given)]
    names = [m.name for m in out]
    for i, m in enumerate(out):  # duplicate labels would overwrite each other's plots
        if names.count(m.name) > 1:
            m.name = f"{m.name}#{i}"
    return out


def _out_dir(args, models) -> str:
    from .outputs import default_out_dir

    if args.out:  # checked by _run before the work
        return args.out
    out = default_out_dir(models)
    check_output_dir(out, "--out")  # the default is known once the models load, before the work
    return out


def _tokenizer(args, models):
    from foxformer.data import load_tokenizer
    from foxformer.train.loading import tokenizer_spec

    # one tokenization feeds every model: tokenizer_spec refuses models trained on different ones
    spec = tokenizer_spec(models, getattr(args, "tokenizer", None))
    return load_tokenizer(spec), spec


def _runs_data(models) -> str | None:
    """The one prepared dataset every model's run trained on, where it still exists (else None)."""
    from foxformer.data.preparation import is_dataset

    dirs = {m.data_dir for m in models}
    if len(dirs) != 1 or None in dirs:
        return None
    data = dirs.pop()
    return data if is_dataset(data) else None


def _no_runs_data(models) -> str:
    """Why _runs_data found no dataset, where the runs tell: `eval loss A B` of runs trained on different datasets
    asked for --data or --source as if it had not looked."""
    dirs = sorted({m.data_dir for m in models if m.data_dir})
    if len(dirs) > 1:
        return f" (the runs trained on different datasets: {', '.join(dirs)})"
    if len(dirs) == 1 and all(m.data_dir for m in models):
        return f" (the dataset the {'runs' if len(models) > 1 else 'run'} trained on, {dirs[0]}, is not there)"
    return ""


def text_flags(args) -> tuple[str, str]:
    """The split and the text field of the text an eval command or bias-shift reads, "val" and "text" where left
    out. A flag of the other kind of text is refused, naming both: --split, --within-docs and --data-source read a
    --data dataset, --text-field the text of --source (a dataset holds tokens); each was dropped without a word.
    --data-source without --within-docs is refused too, and an --out that is the --source folder itself. Commands
    call it before their models load (minutes for large ones): none of these refusals needs them."""
    from .sequences import check_data_source, check_out_apart

    if args.data and args.source:
        raise ValueError("pass either --data or --source, not both")
    if args.source:
        given = [flag for flag in ("split", "within_docs", "data_source") if getattr(args, flag, None)]
        if given:
            flag = f"--{given[0].replace('_', '-')}"
            raise ValueError(f"{flag}: reads a --data dataset, and --source {args.source!r} is text; leave {flag} out")
        check_out_apart(args.source, getattr(args, "out", None), "--source", FLAGS)
    else:
        for flag in ("text_field", "skip_bad_files"):
            if getattr(args, flag, None) not in (None, False):
                flag = f"--{flag.replace('_', '-')}"
                raise ValueError(f"{flag}: reads --source text, and "
                                 + (f"--data {args.data!r} holds tokens already" if args.data else
                                    "no --source is given") + f"; leave {flag} out")
    check_data_source(getattr(args, "data_source", None), getattr(args, "within_docs", False), label=FLAGS)
    return args.split or "val", args.text_field or "text"


def skipping(args):
    """What the reading of a command's --source or --haystack puts the files it passes over in: a SkippedFiles with
    --skip-bad-files, else None (it refuses the source for them)."""
    from .sequences import SkippedFiles

    return SkippedFiles() if args.skip_bad_files else None


def skipped_files(skipped) -> dict:
    """The files of a source that --skip-bad-files passed over, as the results record them (SkippedFiles.fields);
    {} without the flag."""
    return {} if skipped is None else skipped.fields()


def _sequences(args, models, out: str):
    """The sequences of the text the flags name, and where they came from; ``args.split`` and ``args.text_field``
    as text_flags settled them. ``out``: the output folder, where a refusal of more bad files of --source than its
    error shows lists them all."""
    from foxformer.data.preparation import read_manifest
    from foxformer.train.loading import check_data_tokenizer

    from .sequences import dataset_sequences, note_fewer, source_sequences

    split, text_field = args.split, args.text_field
    if args.data:
        check_data_tokenizer(args.data, models, args.tokenizer, label=FLAGS)
        tokens = dataset_sequences(args.data, args.seq_len, args.num_seqs, split=split,
                                   within_docs=args.within_docs, source=args.data_source, label=FLAGS)
        # as a --source's: eval compare names the tokenizers of evaluations whose losses are per different tokens
        where = {"data": args.data, "split": split, "within_docs": args.within_docs,
                 "tokenizer": read_manifest(args.data)["tokenizer"]}
        where = {**where, "data_source": args.data_source} if args.data_source else where
    elif args.source:
        tok, spec = _tokenizer(args, models)
        skipped = skipping(args)
        tokens = source_sequences(args.source, tok, args.seq_len, args.num_seqs, text_field, label=FLAGS,
                                  skipped=skipped, folder=out)
        where = {"source": args.source, "tokenizer": spec, **skipped_files(skipped)}
    elif data := _runs_data(models):
        args.data = data
        print(f"note: --data {args.data} (the dataset the runs trained on; its {split} split)", file=sys.stderr)
        return _sequences(args, models, out)
    else:
        raise ValueError(f"pass --data DIR (a prepared dataset) or --source SPEC (text) to evaluate on"
                         f"{_no_runs_data(models)}")
    note_fewer(len(tokens), args.seq_len, args.num_seqs, args.data or args.source,
               per_doc=bool(args.source or args.within_docs))
    return tokens, where


def _cmd_loss(args) -> dict:
    from .compare import tokens_fingerprint
    from .loss import check_batch_size, check_curve_args, context_lengths, eval_loss
    from .outputs import note_replacing, save_loss, written
    from .sequences import check_sequences

    # before loading any model (eval_loss checks them again, naming its keywords)
    check_sequences(args.seq_len, args.num_seqs, label=FLAGS)
    check_curve_args(args.smooth, args.n_boot, args.confidence, args.seed, positions=args.seq_len - 1, label=FLAGS)
    check_batch_size(args.batch_size, label=FLAGS)
    context_lengths(args.lengths, args.seq_len - 1, label=FLAGS)
    args.split, args.text_field = text_flags(args)
    models = _load_models(args)
    out = _out_dir(args, models)
    tokens, where = _sequences(args, models, out)
    curves = [eval_loss(m.model, tokens, name=m.name, train_len=m.train_len, batch_size=args.batch_size,
                        lengths=args.lengths, smooth_window=args.smooth, n_boot=args.n_boot,
                        confidence=args.confidence, seed=args.seed, progress=not args.no_progress) for m in models]
    settings = {**where, "seq_len": int(tokens.shape[1]), "num_seqs": int(tokens.shape[0]),
                "models": [m.path for m in models], "n_boot": args.n_boot, "confidence": args.confidence,
                "tokens_sha256": tokens_fingerprint(tokens)}
    note_replacing(os.path.join(out, "loss.json"))
    data = save_loss(curves, out, settings)
    return {**written(out, ["loss.json"], data["plots"]), "models": [m["summary"] for m in data["models"]]}


def _cmd_niah(args) -> dict:
    from foxformer.data import load_tokenizer
    from foxformer.train.loading import RUN_CONFIG, named_tokenizer_spec, run_dir_of

    from .niah import HAYSTACK_ROOM, check_grid, check_room, niah_grid
    from .outputs import note_replacing, save_niah, written
    from .sequences import check_out_apart, document_token_stream

    check_grid(args.lengths, args.depths, args.modes, args.needles, args.seeds, args.max_new_tokens, label=FLAGS)
    # a run folder read as text met its metrics.jsonl, refused for a missing 'text' field that sent users to
    # --text-field; refused before the models load
    if os.path.isdir(args.haystack) and (run := run_dir_of(args.haystack)) is not None:
        raise ValueError(f"--haystack: {args.haystack!r} is a training run ({os.path.join(run, RUN_CONFIG)}), not "
                         f"text; give text to hide the needles in (a .txt/.jsonl file, a folder of them, or "
                         f"builtin:pydoc, the default), and the run itself as the model")
    check_out_apart(args.haystack, args.out, "--haystack", FLAGS)
    # --lengths too short for the needle and question, refused before the models load: their tokens are the
    # tokenizer's, loaded first where it can be told (one it cannot load is refused as it is after them)
    early = None
    if named := named_tokenizer_spec(args.models, getattr(args, "tokenizer", None)):
        with contextlib.suppress(ValueError, OSError, ImportError):
            early = load_tokenizer(named)
    if early is not None:
        check_room(early, args.lengths, args.modes, args.needles, args.seeds, label=FLAGS)
    models = _load_models(args)
    out = _out_dir(args, models)
    tok, spec = _tokenizer(args, models)
    longest = max(args.lengths)
    skipped = skipping(args)
    haystack = document_token_stream(args.haystack, tok, min_tokens=longest, enough=longest + HAYSTACK_ROOM,
                                     what="--haystack", text_field=args.text_field, skipped=skipped, label=FLAGS,
                                     folder=out,
                                     fix=f"the longest of --lengths is {longest} tokens: give a source with more text "
                                         f"or shorter --lengths")
    if len(haystack) < longest + HAYSTACK_ROOM:
        print(f"note: --haystack holds {len(haystack)} tokens, fewer than the {longest + HAYSTACK_ROOM} that cut "
              f"each needle's and seed's prompts of {longest} tokens from their own stretch of text: their "
              f"haystacks overlap more", file=sys.stderr)
    results = [niah_grid(m.model, tok, haystack, lengths=args.lengths, depths=args.depths, modes=args.modes,
                         needles=args.needles, seeds=args.seeds, generate=not args.no_generate,
                         max_new_tokens=args.max_new_tokens, name=m.name, train_len=m.train_len,
                         progress=not args.no_progress, label=FLAGS) for m in models]
    settings = {"haystack": args.haystack, **skipped_files(skipped), "tokenizer": spec, "lengths": args.lengths,
                "depths": args.depths, "modes": args.modes, "needles": args.needles, "seeds": args.seeds,
                "generate": not args.no_generate, "models": [m.path for m in models]}
    note_replacing(os.path.join(out, "niah.json"))
    data = save_niah(results, out, settings)
    return {**written(out, ["niah.json"], data["plots"]), "models": [m["summary"] for m in data["models"]]}


def _cmd_harness(args) -> dict:
    from .harness import HarnessAdapter, check_max_length, check_request, known_tasks, require_lm_eval, run_harness
    from .loss import check_batch_size
    from .outputs import model_outputs, written

    # before the models load (minutes for large ones): the settings, the missing package, a typo in --metadata,
    # whose json error named no flag ("error: Expecting value: line 1 column 1 (char 0)"), and an unknown task
    if args.max_length is not None:  # else each model's training length, known once it loads
        check_max_length(args.max_length, label=FLAGS)
    check_batch_size(args.batch_size, label=FLAGS)
    check_request(args.tasks, args.num_fewshot, args.limit, label=FLAGS)
    require_lm_eval()
    try:
        metadata = json.loads(args.metadata) if args.metadata else None
    except json.JSONDecodeError as e:
        raise ValueError(f"--metadata: {args.metadata!r} is not JSON ({e}); give an object, e.g. "
                         f"'{{\"max_seq_lengths\": [4096]}}'") from e
    if metadata is not None and not isinstance(metadata, dict):
        raise ValueError(f"--metadata: expected a JSON object {{...}} (lm_eval passes its keys to the tasks), got "
                         f"{args.metadata!r}")
    manager = known_tasks(args.tasks, args.include_path, label=FLAGS)
    models = _load_models(args)
    tok, spec = _tokenizer(args, models)
    files = model_outputs("harness", [m.name for m in models], label=FLAGS)
    out = _out_dir(args, models)
    results = {}
    for m, file in zip(models, files):
        adapter = HarnessAdapter(m.model, tok, max_length=args.max_length or m.train_len or 2048,
                                 batch_size=args.batch_size, progress=not args.no_progress)
        path = os.path.join(out, file)
        results[m.name] = run_harness(adapter, args.tasks, num_fewshot=args.num_fewshot, limit=args.limit,
                                      metadata=metadata, out_path=path, task_manager=manager)["results"]
    return {**written(out, files), "results": results}


def _cmd_gates(args) -> dict:
    from .gates import gate_stats, parse_heads
    from .loss import check_batch_size
    from .outputs import note_replacing, plot_tags, save_gates, written
    from .sequences import check_sequences

    check_sequences(args.seq_len, args.num_seqs, label=FLAGS)  # before loading any model, as those below
    check_batch_size(args.batch_size, label=FLAGS)
    heads = parse_heads(args.heads, label=FLAGS)
    # a longer one was recorded in gates.json while the plots showed --seq-len tokens
    if args.matrix_len is not None and args.matrix_len > args.seq_len:
        raise ValueError(f"--matrix-len: {args.matrix_len} tokens are more than a sequence holds (--seq-len "
                         f"{args.seq_len}); give at most {args.seq_len}, or a longer --seq-len")
    args.split, args.text_field = text_flags(args)
    models = _load_models(args)
    out = _out_dir(args, models)
    # refuse labels whose plots would overwrite each other before any work
    plot_tags([m.name for m in models], label=FLAGS)
    tokens, where = _sequences(args, models, out)
    matrix_len = min(256 if args.matrix_len is None else args.matrix_len, int(tokens.shape[1]))
    analyses = [(gate_stats(m.model, tokens, name=m.name, batch_size=args.batch_size, progress=not args.no_progress),
                 m.model, tokens) for m in models]
    # a Transformer's analysis was a bare "has_gate": false and one plot, read as a failed run rather than its answer
    for stats, _, _ in analyses:
        if not stats.has_gate:
            print(f"note: {stats.name!r} has no forget gates (a Transformer): gates.json records only has_gate "
                  f"false, and its attention matrices are the one plot; the statistics are for FoX models",
                  file=sys.stderr)
    settings = {**where, "seq_len": int(tokens.shape[1]), "num_seqs": int(tokens.shape[0]),
                "models": [m.path for m in models], "matrix_len": matrix_len,
                "attention_scale": args.attention_scale}
    note_replacing(os.path.join(out, "gates.json"))
    data = save_gates(analyses, out, settings, heads=heads, matrix_len=matrix_len, label=FLAGS,
                      attention_scale=args.attention_scale)
    return {**written(out, ["gates.json"], data["plots"]), "units": data["units"],
            "models": [m["summary"] for m in data["models"]]}


def _cmd_eviction(args) -> dict:
    from .eviction import eviction_loss
    from .outputs import mark_output_folder, note_replacing, write_json, written
    from .plots import plot_eviction
    from .sequences import check_sequences

    check_sequences(args.seq_len, args.num_seqs, label=FLAGS)  # before the model loads, as eval loss checks them
    args.split, args.text_field = text_flags(args)
    models = _load_models(args)
    out = _out_dir(args, models)
    tokens, where = _sequences(args, models, out)
    m = models[0]
    res = eviction_loss(m.model, tokens, evict_eps=args.evict_eps, chunk=args.chunk, prefill=args.prefill,
                        qk_bound=args.qk_bound, progress=not args.no_progress, label=FLAGS)
    res = {"name": m.name, "model": m.path, **where, **res}
    note_replacing(os.path.join(out, "eviction.json"))
    # the plot first and the JSON last, atomically, as the other commands write theirs: a Ctrl-C during the
    # write left a truncated eviction.json
    mark_output_folder(out)
    plot = plot_eviction(res, os.path.join(out, "eviction.png"))
    write_json(os.path.join(out, "eviction.json"), res)
    return {**written(out, ["eviction.json"], [os.path.basename(plot)]),
            **{k: v for k, v in res.items() if k != "by_position"}}


def _cmd_compare(args) -> dict:
    from .compare import compare
    from .outputs import written

    res = compare(args.run_dirs, args.out, positions=args.positions, names=args.names, reference=args.reference,
                  label=FLAGS)
    return {**written(args.out, ["compare.json", "compare.md"], res["plots"]), **res}


def _cmd_mqar(args) -> dict:
    from ..paths import write_text
    from .mqar import config_from, run_mqar, seed_table
    from .outputs import mark_output_folder, note_replacing, written

    if args.pool:
        # folders of one task run with different --seed: their cells as mean +- sd (mqar_seeds.md in --out)
        out = args.out or os.path.join("runs", "mqar_seeds")
        # before the file is opened: a refused folder emptied the earlier table
        text = seed_table(args.pool, label=FLAGS)
        path = os.path.join(out, "mqar_seeds.md")
        note_replacing(path)
        mark_output_folder(out)  # a Markdown file, read as a document of a source folder holding it
        write_text(path, text)
        return {**written(out, [os.path.basename(path)]), "pooled": args.pool}
    cfg = config_from(args.preset, label=FLAGS, models=args.models, steps=args.steps, lr=args.lr, seed=args.seed,
                      batch_size=args.batch_size, max_minutes=args.max_minutes, compile=args.compile or None)
    return run_mqar(cfg, args.out or os.path.join("runs", f"mqar_{args.preset}"), device=args.device,
                    progress=not args.no_progress, report_only=args.report_only, label=FLAGS)


def _cmd_report(args) -> dict:
    from .report import LOOKED_FOR, build_report, check_run_dirs, has_results

    check_run_dirs(args.run_dirs)
    # a dataset, an export or a checkpoint given for its run got a report/ folder with a page saying so
    if not any(has_results(d) for d in args.run_dirs):
        raise ValueError(f"report: no results in {', '.join(map(repr, args.run_dirs))} ({LOOKED_FOR}); give the "
                         f"folders training or the eval commands wrote")
    out = args.out or os.path.join(args.run_dirs[0] if len(args.run_dirs) == 1 else "runs", "report")
    return {"report": build_report(args.run_dirs, out, fmt=args.format, title=args.title)}


def _run(fn):
    """Handler printing the command's summary as JSON (errors end in foxformer.cli.main's `error:` line)."""
    def handler(args) -> int:
        # before the work: a file in the way was found once it was done, as "file exists (...)" naming no flag
        if getattr(args, "out", None):
            check_output_dir(args.out, "--out")
        print_json(fn(args), indent=2, default=str)
        return 0

    return handler


def add_commands(subparsers) -> None:
    ev = subparsers.add_parser("eval", help="evaluate checkpoints: per-position loss, needle in a haystack, "
                                            "lm-evaluation-harness",
                               description="Evaluate models (a run folder, one of its checkpoints, a Hugging Face "
                                           "folder or Hub id, a checkpoint of the FoX paper's code) and compare the "
                                           "results: each subcommand writes its results into --out (JSON, and the "
                                           "plots and Markdown tables it has; `mqar --pool` writes only its table, "
                                           "mqar_seeds.md) and prints a JSON summary naming them; one model of a run "
                                           "folder writes to RUN_DIR/eval unless told.")
    sub = ev.add_subparsers(dest="eval_command", metavar="SUBCOMMAND")
    p = sub.add_parser("loss", help="per-position loss L(i) and perplexity P(l) with bootstrap bands",
                       description="Per-position loss over validation sequences (T may exceed the training "
                                   "length), accumulated in fp64; writes loss.json, loss_curve.png, perplexity.png.")
    _model_args(p)
    _text_args(p, seq_len=2048, num=64)
    p.add_argument("--batch-size", type=int, default=1, help="sequences per forward pass")
    # a repeat was dropped without a word (P(l) is one value per l), like the flag's typo it usually is
    p.add_argument("--lengths", type=distinct(lengths), default=None,
                   help="context lengths l for P(l), each once, e.g. 512,1Ki,2Ki; results list them in ascending "
                        "order, as the plots do (default: powers of 2)")
    p.add_argument("--smooth", type=int, default=None,
                   help="moving-average window for L(i), reaching at most i/4 either side of position i (default "
                        "T/64)")
    p.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples over sequences")
    p.add_argument("--confidence", type=float, default=0.95,
                   help="confidence level of the bootstrap bands, in (0, 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap resampling")
    p.set_defaults(func=_run(_cmd_loss))

    p = sub.add_parser("niah", help="needle in a haystack heatmaps (standard and easy mode)",
                       description="Needles inserted into haystacks of local text at a grid of context lengths x "
                                   "depths; greedy answers and answer log-likelihoods; writes niah.json and heatmaps.")
    _model_args(p)
    p.add_argument("--haystack", default="builtin:pydoc",
                   help="haystack text source: file/dir (.txt/.jsonl[.xz]) or builtin:pydoc|sympy|stdlib; at least "
                        "as many tokens as the longest of --lengths (up to 4096 more are read, for each needle's "
                        "and seed's prompts to start at their own offset)")
    # a JSONL haystack's own field: the refusal of one without "text" told to set --text-field, which was not here
    _text_field_arg(p, "of --haystack: ")
    skip_bad_files_arg(p, "--haystack")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer of the haystack, needles and answers (default: the run's, else gpt2)")
    p.add_argument("--lengths", type=lengths, default=[1024, 2048, 4096], help="context lengths, e.g. 1Ki,2Ki,4Ki")
    p.add_argument("--depths", type=floats, default=[0.0, 0.25, 0.5, 0.75, 1.0], help="needle depths in [0, 1]")
    p.add_argument("--modes", type=words, default=["standard", "easy"], help="standard,easy")
    p.add_argument("--needles", type=int, default=2, help="needles (key/value pairs) per cell")
    p.add_argument("--seeds", type=ints, default=[0], help="seeds per cell (haystack offsets and needles)")
    p.add_argument("--no-generate", action="store_true", help="log-likelihood score only (cheaper)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="tokens generated greedily for each answer (default: the answer's tokens + 4)")
    p.set_defaults(func=_run(_cmd_niah))

    p = sub.add_parser("harness", help="lm-evaluation-harness tasks (needs: pip install lm_eval)",
                       description="Runs lm_eval.simple_evaluate with a foxformer model wrapper: lm_eval's task "
                                   "names, and its flag spellings (--num_fewshot, --batch_size, ...) as well as ours. "
                                   "Offline, only tasks whose data are cached locally or generated (see "
                                   "foxformer.eval.harness; docs/interop.md for lm_eval --model hf on exports).")
    _model_args(p)
    p.add_argument("--tasks", type=words, required=True, help="comma-separated lm_eval task names")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer of the tasks' text (default: the model's; gpt2-json for converted official models)")
    p.add_argument("--num-fewshot", "--num_fewshot", type=int, default=None,
                   help="examples before each question (default: each task's own)")
    p.add_argument("--limit", type=float, default=None, help="examples per task (or fraction if < 1)")
    p.add_argument("--batch-size", "--batch_size", type=int, default=8,
                   help="loglikelihood requests per forward pass (rolling and generation requests go one at a time)")
    p.add_argument("--max-length", "--max_length", type=length, default=None,
                   help="context window (default: training length, else 2048)")
    p.add_argument("--metadata", default=None, help="JSON passed to lm_eval tasks (e.g. RULER's tokenizer)")
    p.add_argument("--include-path", "--include_path", default=None,
                   help="folder of extra lm_eval task YAMLs (e.g. over local JSON files: these run offline)")
    p.set_defaults(func=_run(_cmd_harness))
    p = sub.add_parser("eviction", help="loss change and cache memory of KV eviction on text (FoX models)",
                       description="Reads the sequences through the model's cache twice, CHUNK tokens a step, "
                                   "without and with eviction; writes eviction.json (per-token loss difference, "
                                   "peak cache bytes, kept fraction).")
    _model_args(p, several=False)
    _text_args(p, seq_len=4096, num=1)
    p.add_argument("--evict-eps", type=float, default=4.54e-5, help="eviction tolerance (default e^-10)")
    p.add_argument("--chunk", type=int, default=16, help="tokens per decode step (<= 16: the decode kernel)")
    p.add_argument("--prefill", type=int, default=16, help="tokens of the first step")
    p.add_argument("--qk-bound", type=float, default=None,
                   help="bound on |q.k| * scale (default: from QK-norm weights; needed without QK-norm)")
    p.set_defaults(func=_run(_cmd_eviction))
    p = sub.add_parser("compare", help="side-by-side loss curves and a position table from several eval outputs",
                       description="Reads the loss.json that `eval loss` left in each RUN_DIR (or RUN_DIR/eval) and "
                                   "draws them together; the runs must have measured the same sequences.")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                   help="a folder where `eval loss` wrote loss.json (it or its eval/ folder holds it; where both "
                        "do, its own, with a note naming both), or that loss.json file")
    p.add_argument("--names", type=words, default=None, help="comma-separated labels, one per model")
    p.add_argument("--positions", type=distinct(lengths), default=None,
                   help="token positions p of the table, powers of two (its columns: the octaves p/2 < i <= p), "
                        "e.g. 1Ki,4Ki (default: the last five powers of two within the evaluated length)")
    p.add_argument("--reference", default=None, help="model name the loss differences are taken to (default: last)")
    p.add_argument("--out", default=os.path.join("runs", "compare"), help="output folder (default: runs/compare)")
    no_progress_arg(p, None)
    p.set_defaults(func=_run(_cmd_compare))
    p = sub.add_parser("mqar", help="multi-query associative recall: train small models from scratch, accuracy by "
                                    "pairs and length",
                       description="Zoology's synthetic recall task: key-value pairs, then queries. Trains each model "
                                   "(matched in parameters) at one length, evaluates pairs x lengths up to 4x it; "
                                   "writes mqar.json, mqar.md, mqar.png (and models/*.json, one per model: several "
                                   "processes may share --out, --report-only then tables them all).")
    p.add_argument("--preset", default="toy", help="toy (CPU, ~15 s on 2 cores) | mid (CPU, under a minute a model) "
                                                   "| small (the GPU size of docs/results.md)")
    p.add_argument("--models", type=model_specs, default=None,
                   help="model kinds, e.g. fox-pro,transformer-pro,linear-pro,fox-llama:fgate=fixed,rope=true "
                        "(key=value items after a ':' override FoxConfig fields of that model; default: the "
                        "preset's)")
    p.add_argument("--steps", type=int, default=None, help="training steps per model (default: the --preset's)")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default: the --preset's)")
    p.add_argument("--batch-size", type=int, default=None, help="sequences per step (default: the --preset's)")
    p.add_argument("--seed", type=int, default=None, help="task, data and weights seed")
    p.add_argument("--max-minutes", type=float, default=None,
                   help="training time limit per model, a guard: mqar.md marks a model it stopped before --steps")
    p.add_argument("--compile", action="store_true", help="torch.compile the models (GPU)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--out", default=None, help="output folder (default: runs/mqar_PRESET; with --pool runs/mqar_seeds)")
    p.add_argument("--report-only", action="store_true", help="train nothing: table the results already in --out")
    p.add_argument("--pool", nargs="+", metavar="DIR", default=None,
                   help="train nothing: pool the folders of runs that differ only in --seed into one table, every "
                        "cell the mean +- standard deviation over seeds (mqar_seeds.md in --out)")
    no_progress_arg(p, "training each model")
    p.set_defaults(func=_run(_cmd_mqar))
    ev.set_defaults(func=lambda args: (ev.print_help(), 2)[1])

    an = subparsers.add_parser("analyze", help="model analyses (forget gates)",
                               description="Analyses of what a model learned: `analyze gates` measures the forget "
                                           "gates of FoX models per layer and head and writes gates.json and its "
                                           "plots into --out.")
    asub = an.add_subparsers(dest="analyze_command", metavar="SUBCOMMAND")
    p = asub.add_parser("gates", help="forget-gate statistics, decay / attention matrices, effective context",
                        description="Per layer and head: mean log f, timescale, share of f < 0.5, effective context "
                                    "length; grids of decay matrices F and attention matrices A (paper figure 3).")
    _model_args(p)
    _text_args(p, seq_len=1024, num=4)
    p.add_argument("--heads", default=None, help="layer:head pairs to plot, e.g. 0:1,3:2 (default: 8 heads "
                                                 "spread over the timescales)")
    p.add_argument("--matrix-len", type=int, default=None,
                   help="tokens shown in the matrix plots, at most --seq-len (default: 256, or --seq-len if shorter)")
    p.add_argument("--attention-scale", choices=("log", "linear"), default="log",
                   help="colour scale of the attention matrices: log (log10 of the weight, from 1e-6: the weight "
                        "beyond the few nearest tokens, a single dark colour on a linear scale, where nearly all of "
                        "it sits on the diagonal) | linear (from 0 to the largest weight) (default: log; the decay "
                        "matrices are always log)")
    p.add_argument("--batch-size", type=int, default=4, help="sequences per forward pass")
    p.set_defaults(func=_run(_cmd_gates))
    an.set_defaults(func=lambda args: (an.print_help(), 2)[1])

    p = subparsers.add_parser("report", help="collect training curves and eval outputs into one page",
                              description="One Markdown (or HTML) page, report.md (or report.html) in --out, "
                                          "with a section of tables and plots for each RUN_DIR: its training "
                                          "curve and the outputs of the eval, analyze and bias-shift commands "
                                          "found in it and its eval/ folder. The plots are copied into --out's "
                                          "assets/ folder, so the folder can be moved whole; prints the page's "
                                          "path.")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                   help="a folder training or the eval commands wrote (its results and those of its eval/ folder; "
                        "where both hold one, its own, and the page says so); one section each, in the order given, "
                        "and each folder once")
    p.add_argument("--out", default=None,
                   help="output folder (default: RUN_DIR/report for one run dir, else runs/report)")
    p.add_argument("--format", default="md", choices=("md", "html"),
                   help="md (report.md, Markdown) or html (report.html)")
    p.add_argument("--title", default="foxformer report", help="the page's heading (and the HTML page's title)")
    no_progress_arg(p, None)
    p.set_defaults(func=_run(_cmd_report))
