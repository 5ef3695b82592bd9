"""`foxformer generate` and `foxformer bias-shift` (`bench-decode` is in bench/cli.py)."""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import warnings

from foxformer.argtypes import ESCAPES, escaped, floats, length, no_progress_arg, positive_int
from foxformer.paths import check_output_file, read_text, write_json

# How the API's checks name a setting in this module's errors (argtypes.setting_name): by its flag.
FLAGS = "--{}"


def _shift(text: str):
    """--fgate-bias-shift: one float, or comma-separated floats per layer."""
    values = floats(text)
    return values[0] if len(values) == 1 else values


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", nargs="?", default=None, metavar="MODEL",
                   help="run dir, checkpoint dir RUN/checkpoints/step_N, HF folder or Hub id owner/name")
    # the flag came first: scripts pass it
    p.add_argument("--model", default=None, help="MODEL as a flag")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU) | fp32 | bf16 | fp16")
    p.add_argument("--attention-backend", default=None, help="override the model's attention backend")
    p.add_argument("--tokenizer", default=None, help="tokenizer spec (default: the run's, else gpt2)")


def _resolve_model(args) -> None:
    """Set ``args.model`` from MODEL or --model, whichever was given (both: the same one), and ``args.model_said``
    to the flag where the user typed it (load_model's errors name it so)."""
    run, flag = args.run, args.model
    if run is not None and flag is not None and os.path.normpath(run) != os.path.normpath(flag):
        raise ValueError(f"two models given, {run} and --model {flag}: pass one")
    if run is None and flag is None:
        raise ValueError("no model given: pass MODEL (a run dir, checkpoint, Hugging Face folder or Hub id)")
    args.model = run if run is not None else flag
    args.model_said = None if run is not None else "--model"


def _cmd_generate(args) -> int:
    from foxformer.data import load_tokenizer
    from foxformer.eval.outputs import note_replacing
    from foxformer.train.distributed import resolve_device
    from foxformer.train.loading import load_model, tokenizer_spec

    from foxformer.data.tokenizer import start_ids

    from .generation import GenerationConfig, GreedyNote, end_of_text_id, generate

    _resolve_model(args)
    if (args.prompt is None) == (args.prompt_file is None):
        raise ValueError("pass exactly one of --prompt TEXT and --prompt-file PATH")
    prompt = read_text(args.prompt_file, "--prompt-file") if args.prompt_file is not None else args.prompt
    if args.out:
        check_output_file(args.out, "--out")
    # Checked first, before the model loads (--decode among them, whose modes live with the caches and torch, and
    # which asks the device for CUDA graphs), each bad setting named by its flag.
    device = resolve_device(args.device, "--device")
    cfg = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                           top_p=args.top_p, seed=args.seed, evict_eps=args.evict_eps,
                           evict_qk_bound=args.evict_qk_bound, evict_max_len=args.evict_max_len,
                           fgate_bias_shift=args.fgate_bias_shift, prefill_chunk=args.prefill_chunk,
                           stop=args.stop, ignore_eos=args.ignore_eos, decode=args.decode)
    cfg.validate(label=FLAGS, device=device)
    greedy = cfg.greedy_note(FLAGS)
    if greedy:
        print(f"note: {greedy}", file=sys.stderr)
    loaded = load_model(args.model, device=device, dtype=args.dtype, attention_backend=args.attention_backend,
                        progress=not args.no_progress, label=FLAGS, said_as=args.model_said)
    tokenizer = load_tokenizer(tokenizer_spec([loaded], args.tokenizer))
    n_prompt = len(start_ids(tokenizer) + tokenizer.encode(prompt))  # what the model reads, a BOS included
    state: dict = {}
    pieces = []
    interrupted = None

    def emit(piece: str) -> None:
        pieces.append(piece)
        if not args.no_stream:
            sys.stdout.write(piece)
            sys.stdout.flush()

    t0 = time.perf_counter()
    # a fallback from CUDA graphs is said once, on the summary line below; the greedy note was said above
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="decoding eagerly")
        warnings.simplefilter("ignore", GreedyNote)
        stream = None
        try:
            # the loaded model, whose train_len (an older run's from its config.yaml) generate warns past
            stream = generate(loaded, tokenizer, prompt, config=cfg, state=state, label=FLAGS,
                              progress=not args.no_progress)
            for piece in stream:
                emit(piece)
        except KeyboardInterrupt as e:
            # Ctrl-C ends a generation as its end would (the text so far, --no-stream's too, its line ended, the
            # summary and --out), then the command stops as interrupted. The stream hands out the text it held
            # back for the stop strings, then the interrupt: here, or, where Ctrl-C came while a piece was printed,
            # once the interrupt is thrown in (a stream that raised it has ended, and raises it again).
            interrupted = e
            if stream is not None:  # None: Ctrl-C came before the first token was asked for
                with contextlib.suppress(KeyboardInterrupt, StopIteration):
                    emit(stream.throw(KeyboardInterrupt()))
    elapsed = time.perf_counter() - t0
    text = "".join(pieces)
    if args.no_stream:
        sys.stdout.write(text)
    if text:  # the newline ends the text's line; no text (--max-new-tokens 0, an end of text first) is no line
        sys.stdout.write("\n")
    # a piped stdout holds the text's end (--no-stream's whole text) in its buffer, and the summary on stderr
    # reached `2>&1 | tee` first, glued to the text's last line
    sys.stdout.flush()
    n_new = state.get("new_tokens", 0)
    result = {"model": args.model, "prompt_tokens": n_prompt, "new_tokens": n_new,
              "seconds": elapsed, "text": text, "settings": dict(vars(cfg)), "interrupted": interrupted is not None}
    if cfg.stop_token is None and not cfg.ignore_eos:  # the tokenizer's end of text, which generate stops at
        result["settings"]["stop_token"] = end_of_text_id(tokenizer)
    cache = state.get("cache")
    if cache is not None and hasattr(cache, "memory_report"):
        result["cache"] = cache.memory_report()
    note = ""
    if "cache" in result:
        kept = result["cache"]["kept_fraction"]
        note = (f" cache: recurrent state of {result['cache']['allocated_bytes'] / 2**10:.1f} KiB" if kept is None
                else f" cache kept {kept:.1%} of keys")
    decode_note = getattr(cache, "decode_note", None)
    if decode_note:  # the one-line note of a fallback from CUDA graphs
        result["decode_note"] = decode_note
        note += f"; {decode_note}"
    asked = ", as --max-new-tokens 0 asks" if cfg.max_new_tokens == 0 else ""
    print(f"[{n_new} tokens in {elapsed:.2f} s{asked}]{note}", file=sys.stderr)
    if args.out:
        # a second generation took the first one's file without a word
        note_replacing(args.out, elsewhere="--out FILE")
        write_json(args.out, result)
    if interrupted is not None:
        raise interrupted
    return 0


def _cmd_bias_shift(args) -> int:
    from foxformer.eval.cli import skipped_files, skipping, text_flags
    from foxformer.eval.outputs import default_out_dir, note_replacing, write_json as write_results
    from foxformer.eval.sequences import check_out_apart, check_sequences, note_fewer
    from foxformer.train.loading import load_model, saved_config

    from .bias_shift import bias_shift_sweep, check_forget_gates, check_saved_forget_gates

    _resolve_model(args)
    ran_on = None if args.data or args.source else _run_data(args.model)
    args.data = args.data or ran_on
    if bool(args.data) == bool(args.source):  # before the model loads, as every check of a flag
        raise ValueError("pass exactly one of --data DIR (prepared dataset) and --source SPEC (text)")
    args.split, args.text_field = text_flags(args)
    check_sequences(args.seq_len, args.num_seqs, label=FLAGS)
    if ran_on:
        print(f"note: --data {ran_on} (the dataset the run trained on; its {args.split} split)", file=sys.stderr)
    # --out: a .json file, or a folder for bias_shift.json; checked before the work (a missing folder or a
    # folder given as the file failed after the whole sweep)
    out = args.out
    if out and (os.path.isdir(out) or not out.endswith(".json")):
        out = os.path.join(out, "bias_shift.json")
    if out:
        check_output_file(out, "--out")
        # the folder of the file, which text_flags' check of --out as a folder passed: found as the source was
        # read, after the model had loaded
        if args.source:
            check_out_apart(args.source, os.path.dirname(out) or os.curdir, "--source", FLAGS)
    # from the config, before the weights load (for a Hub id, before they download)
    check_saved_forget_gates(saved_config(args.model, said_as=args.model_said), "bias-shift", args.model)
    loaded = load_model(args.model, device=args.device, dtype=args.dtype, attention_backend=args.attention_backend,
                        train_len=args.train_len, progress=not args.no_progress, label=FLAGS,
                        said_as=args.model_said)
    check_forget_gates(loaded.model, "bias-shift", args.model)
    if not out:  # the default, known once the model loads, checked before the sweep as a given --out is
        out = os.path.join(default_out_dir([loaded]), "bias_shift.json")
        check_output_file(out, "--out")
    args.skipped = skipping(args)
    tokens = _eval_tokens(args, loaded, os.path.dirname(out))
    # a --data dataset's windows lie inside documents, as a --source's do
    note_fewer(len(tokens), args.seq_len, args.num_seqs, args.data or args.source, per_doc=True)
    res = bias_shift_sweep(loaded.model, tokens, args.shifts, train_len=loaded.train_len, bins=args.bins,
                           progress=not args.no_progress)
    res.update({"model": args.model, "seq_len": int(tokens.shape[1]), "num_seqs": int(tokens.shape[0]),
                "data": args.data, "split": args.split if args.data else None, "source": args.source,
                **skipped_files(args.skipped)})
    note_replacing(out)  # as the eval commands say it: a second sweep took the first one's place without a word
    write_results(out, res)  # marks its folder as eval outputs, passed over by a source folder's walk
    plot = out.rsplit(".", 1)[0] + ".png"
    _plot_bias_shift(res, plot)
    for s, a, b in zip(res["shifts"], res["loss_within"], res["loss_beyond"]):
        print(f"shift {s:+.3g}: loss within train_len {a:.4f}, beyond {b if b is None else round(b, 4)}")
    print(f"wrote {out} and {plot}")
    return 0


def _run_data(model: str) -> str | None:
    """The prepared dataset that the run of ``model`` (a run dir, one of its checkpoints, its hf/ export) trained
    on, where it still exists: eval loss takes it when neither --data nor --source is given, and so does this."""
    from foxformer.data.preparation import is_dataset
    from foxformer.train.loading import RUN_CONFIG, read_run_config, run_dir_of

    run = run_dir_of(model) if os.path.isdir(model) else None
    data = read_run_config(os.path.join(run, RUN_CONFIG)).get("data_dir") if run else None
    return data if data and is_dataset(data) else None


def _eval_tokens(args, loaded, folder: str):
    from foxformer.data import load_tokenizer
    from foxformer.train.loading import check_data_tokenizer, tokenizer_spec
    from foxformer.eval.sequences import dataset_sequences, source_sequences

    if args.data:
        check_data_tokenizer(args.data, [loaded], args.tokenizer, label=FLAGS)
        return dataset_sequences(args.data, args.seq_len, args.num_seqs, split=args.split, within_docs=True,
                                 label=FLAGS, within_docs_optional=False)
    tok = load_tokenizer(tokenizer_spec([loaded], args.tokenizer))
    return source_sequences(args.source, tok, args.seq_len, args.num_seqs, args.text_field, label=FLAGS,
                            skipped=args.skipped, folder=folder)


def _plot_bias_shift(res: dict, path: str) -> None:
    from foxformer.eval.plots import plt, save_figure  # Agg set before pyplot loads; the file whole or not at all

    edges = res["bin_edges"]
    mids = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:]) if b > a]
    fig, ax = plt.subplots(figsize=(7, 4))
    for s, row in zip(res["shifts"], res["binned_loss"]):
        ax.plot(mids, row, marker="o", ms=3, label=f"shift {s:+g}")
    if res.get("train_len"):
        ax.axvline(res["train_len"], color="gray", ls="--", lw=1, label="training length")
    ax.set_xlabel("position")
    ax.set_ylabel("loss (nats)")
    ax.set_title("forget-gate bias shift")
    # outside the axes: the curves span the whole width, so a legend inside sat over some of them
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    fig.tight_layout()
    save_figure(fig, path)


def add_commands(subparsers) -> None:
    from foxformer.eval.cli import skip_bad_files_arg

    p = subparsers.add_parser("generate", help="stream a continuation from a model (sampling, eviction, bias shift)",
                              description="Continue a prompt with a model (a run dir, a checkpoint, a Hugging Face "
                                          "folder or Hub id), streaming the text as it comes. Sampling by default "
                                          "(--temperature 0.8; 0 is greedy); the KV cache keeps the running gate sum, "
                                          "and --evict-eps drops keys the forget gate has provably erased.")
    _model_args(p)
    p.add_argument("--prompt", default=None, help="prompt text")
    p.add_argument("--prompt-file", default=None, help="file holding the prompt text")
    p.add_argument("--max-new-tokens", type=int, default=128,
                   help="tokens to generate (default 128); fewer where the end-of-text token comes first (see "
                        "--ignore-eos)")
    p.add_argument("--temperature", type=float, default=0.8,
                   help="sampling temperature: the logits are divided by it (default 0.8); 0 = greedy")
    p.add_argument("--top-k", type=int, default=None, help="sample among the K most likely tokens (default, 0: all)")
    p.add_argument("--top-p", type=float, default=None,
                   help="sample among the fewest most likely tokens whose probabilities reach P, in (0, 1] "
                        "(default, 1: all)")
    p.add_argument("--seed", type=int, default=None,
                   help="sampling seed: the same seed, settings, model and device give the same text "
                        "(default: a new draw each run)")
    p.add_argument("--evict-eps", type=float, default=None,
                   help="evict cached keys whose attention probability is provably below this / N: a number in "
                        "(0, 1), e.g. 1e-3 (default: the model config's evict_eps; without one, every key is kept)")
    p.add_argument("--evict-qk-bound", type=float, default=None,
                   help="without QK-norm: your bound U >= |scale q.k| (your contract; needed for eviction)")
    p.add_argument("--evict-max-len", type=int, default=None,
                   help="N of the bound (default: max_position_embeddings, or the prompt and new tokens where they are "
                        "more); given, the prompt and new tokens may not exceed it")
    p.add_argument("--fgate-bias-shift", type=_shift, default=None,
                   help="added to the gate logits: one float, or comma-separated per layer; positive slows the "
                        "decay, a longer memory (default: the model config's fgate_bias_shift, 0 unless set)")
    p.add_argument("--prefill-chunk", type=int, default=None,
                   help="prompt tokens per forward (default: the whole prompt in one); with --evict-eps, smaller "
                        "chunks bound the memory a long prompt takes")
    p.add_argument("--ignore-eos", action="store_true", help="keep going past the end-of-text token")
    p.add_argument("--stop", action="append", default=None, metavar="TEXT", type=escaped,
                   help="stop once the text contains TEXT, which is cut off with what follows (repeatable: the first "
                        f"found stops). Backslash escapes are read: {ESCAPES}; e.g. --stop '\\n' stops at the end "
                        "of a line")
    p.add_argument("--decode", default="auto",
                   help="one-token steps: auto (CUDA graphs on a GPU, else eager), graphs (a GPU's only), compiled "
                        "(graphs of the torch.compile'd step: faster steps, a slower start; a GPU's only), static "
                        "(the graph-safe step without capture), eager")
    p.add_argument("--no-stream", action="store_true", help="print the text at the end instead of streaming")
    p.add_argument("--out", default=None, help="write text and stats to this JSON file")
    no_progress_arg(p, "loading the weights, reading a long prompt")
    p.set_defaults(func=_cmd_generate)

    p = subparsers.add_parser("bias-shift",
                              help="per-token loss under forget-gate bias shifts (beyond the training length)",
                              description="Measure what shifting the forget-gate bias at inference does to a FoX "
                                          "model's loss, within and beyond the length it was trained on: each "
                                          "shift of --shifts is added to every gate logit (positive slows the "
                                          "decay, a longer memory), and the per-token loss of --num-seqs sequences "
                                          "of --seq-len tokens is averaged by position. Writes bias_shift.json "
                                          "(per shift: the mean loss, the loss within and beyond the training "
                                          "length, and the loss in --bins position bins) and beside it "
                                          "bias_shift.png, the binned loss against position (where: --out). Needs "
                                          "a model with forget gates.")
    _model_args(p)
    p.add_argument("--shifts", type=floats, default=[0.0, 0.5, 1.0, 2.0], help="comma-separated shifts")
    p.add_argument("--data", default=None, help="prepared dataset dir (windows inside documents; default, without "
                                                "--source: the one the run trained on)")
    # None: left out, which --source may be given with (eval.cli.text_flags)
    p.add_argument("--split", default=None, choices=("train", "val"), help="split of --data (default: val)")
    p.add_argument("--source", default=None, help="text source spec (as in foxformer eval)")
    p.add_argument("--text-field", default=None,
                   help="with --source: the JSONL field / Parquet column of the text (default: text)")
    skip_bad_files_arg(p, "--source")
    # token counts as eval's flags take them: "--seq-len 4Ki" was refused here alone
    p.add_argument("--seq-len", type=length, default=4096, help="tokens per sequence, e.g. 4096 or 4Ki")
    p.add_argument("--num-seqs", type=int, default=8, help="sequences of --seq-len tokens the loss is averaged over")
    p.add_argument("--train-len", type=length, default=None,
                   help="training context, e.g. 2048 or 2Ki (default: the run's)")
    p.add_argument("--bins", type=positive_int, default=16, help="position bins of the binned loss (default 16)")
    p.add_argument("--out", default=None,
                   help="JSON path, or a folder for bias_shift.json (default: RUN/eval/bias_shift.json for a run "
                        "dir, else runs/eval/bias_shift.json; the plot sits next to it)")
    no_progress_arg(p, "loading the weights, each shift's pass over the sequences")
    p.set_defaults(func=_cmd_bias_shift)
