"""`foxformer train` and `foxformer export-hf`."""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from ..argtypes import count_type, decimal_length_note, no_progress_arg
from ..json_text import print_json

# flag -> config key; every flag is optional and only overrides what the YAML (or the defaults) say. Each is kept
# as text, checked while parsed by the typing TrainConfig gives a YAML file's and --set's values (_typed_text):
# argparse's own types refused `--lr abc` in words of their own ("invalid float value"), not as the key's are said.
_FLAGS = {
    "--preset": "preset", "--context": "context", "--batch-tokens": "batch_tokens",
    "--micro-batch-size": "micro_batch_size", "--lr": "lr", "--schedule": "schedule",
    "--warmup-tokens": "warmup_tokens", "--total-tokens": "total_tokens", "--max-steps": "max_steps",
    "--max-minutes": "max_minutes", "--precision": "precision", "--data": "data_dir", "--tokenizer": "tokenizer",
    "--out": "out_dir", "--checkpoint-every-tokens": "checkpoint_every_tokens", "--keep-last": "keep_last",
    "--eval-every-tokens": "eval_every_tokens", "--eval-tokens": "eval_tokens", "--parallel": "parallel",
    "--device": "device", "--seed": "seed", "--resume": "resume", "--log-every": "log_every",
    "--init-from": "init_from", "--checkpoint-format": "checkpoint_format",
    "--dist-timeout-minutes": "dist_timeout_minutes",
}
_SWITCHES = {"--compile": "compile", "--activation-checkpointing": "activation_checkpointing", "--roll": "roll",
             "--fused-loss": "fused_loss"}


def _flags_given(args: argparse.Namespace) -> dict:
    """{config key: (flag, value)} for each of _FLAGS and _SWITCHES given on this command line."""
    given = {key: (flag, getattr(args, flag[2:].replace("-", "_"))) for flag, key in _FLAGS.items()}
    given.update({key: (flag, getattr(args, flag[2:].replace("-", "_")) or None) for flag, key in _SWITCHES.items()})
    return {key: (flag, value) for key, (flag, value) in given.items() if value is not None}


def _typed_text(key: str):
    """The argparse type of ``key``'s flag: the text as given, refused while parsed where TrainConfig cannot type
    it (`--lr abc` was refused only once torch had loaded, seconds later)."""
    from .config import COUNT_KEYS, typed_value

    def check(text: str) -> str:
        try:
            typed_value(key, text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix(f"{key}: ")) from None
        return text
    return count_type(check) if key in COUNT_KEYS else check  # its help then says what k and Ki mean


def _same_value(key: str, flag_text: str, set_value) -> bool:
    """Whether a flag's text and --set's YAML value give ``key`` one value: as TrainConfig types them
    (`--lr 1e-3 --set lr=0.001` is one learning rate), as text where either is of no value of the key."""
    from .config import typed_value

    try:
        return typed_value(key, flag_text) == typed_value(key, set_value)
    except ValueError:
        return str(flag_text) == str(set_value)


def _overrides(args: argparse.Namespace) -> dict:
    from .config import parse_overrides

    out = parse_overrides(args.set)
    for key, (flag, value) in _flags_given(args).items():
        if key in out and not _same_value(key, value, out[key]):
            raise ValueError(f"{flag} ({key}): given as {value!r} and by --set {key}={out[key]!r}; give it once")
        out[key] = value
    if args.model:
        parse_overrides(args.model, "--model", into=out.setdefault("model", {}))
    if args.no_progress:
        out["progress"] = False
    return out


def _cmd_train(args: argparse.Namespace) -> int:
    from torch.distributed.elastic.multiprocessing.errors import record

    from .stopping import StopSignals

    # around the whole command, which ends the process: the note on where a stopped run stands comes after the
    # training, and a signal then must not cut it short
    with StopSignals(exiting=True) as signals:
        # under torchrun, record() hands an uncaught error (a bug's traceback) to the launcher, which prints it as
        # the job's cause; an error the user can fix is handed over as its one line (train.elastic)
        return record(_train_command)(args, signals)


def _train_command(args: argparse.Namespace, signals) -> int:
    from .distributed import PeerFailure, failures_reported, shutdown
    from .elastic import say_error

    try:
        # from the command's start: a rank that fails before the run joins the job (a --config or run only
        # another host has) stops the ranks waiting for it with its message, where they waited until the timeout
        with failures_reported():
            return _train_run(args, signals)
    except PeerFailure as e:  # this rank stopped because another failed: that rank's message is the one to give
        say_error(f"error: {e}")
        return 2
    finally:
        shutdown()


def _train_run(args: argparse.Namespace, signals) -> int:
    from .checkpoint import CheckpointWriteError, check_not_data_or_model, check_not_in_a_run, list_checkpoints
    from .config import SAVED_CONFIG, load_config
    from .distributed import barrier
    from .loop import train
    from .stopping import exit_status, launcher_note

    overrides = _overrides(args)
    main_rank = int(os.environ.get("RANK", "0")) == 0
    if main_rank:
        for note in (launcher_note(), signals.interrupt_note()):
            if note:
                print(note, file=sys.stderr)
    out_dir = overrides.get("out_dir")
    saved = bool(out_dir) and os.path.isfile(os.path.join(out_dir, SAVED_CONFIG))
    limit = None if "max_minutes" in overrides or args.config is None else _other_runs_limit(args.config, out_dir)
    if limit is not None:
        overrides["max_minutes"] = None
        if main_rank:
            print(f"train: note: --config {args.config} is another run's, whose max_minutes ({limit:g}) limited that "
                  f"run's own invocations: this run has no time limit (--max-minutes M gives it one)", file=sys.stderr)
    # a run stopped before its first checkpoint starts again from step 0: the run's own line says so
    if args.config is None and out_dir and saved and main_rank and list_checkpoints(out_dir):
        limit = None if "max_minutes" in overrides else _keys(_saved_yaml(out_dir)).get("max_minutes")
        again = (f"; its max_minutes ({limit:g}, from an earlier invocation) applies again: --max-minutes M for "
                 f"another limit, --set max_minutes=null for none" if isinstance(limit, (int, float)) else "")
        print(f"train: continuing {out_dir} with its {SAVED_CONFIG} (flags given override it){again}",
              file=sys.stderr)
    if out_dir:  # before the next check, which would call a checkpoint "no run to continue"
        check_not_in_a_run(out_dir)
        check_not_data_or_model(out_dir, "--out")
    # `--out RUN` alone means "continue RUN": where there is none, the horizon error would hide a mistyped name
    if args.config is None and out_dir and not saved and not {"data_dir", "total_tokens", "max_steps"} & set(overrides):
        raise ValueError(_no_run_to_continue(out_dir))
    continuing = args.config is None and saved  # load_config's base is then the run's config.yaml
    _note_a_decimal_context(args, overrides)  # before the config's checks, whose refusal it may explain
    cfg = None
    try:
        try:
            cfg = load_config(args.config, overrides)
        except ValueError as e:
            raise ValueError(_in_flags(e, args, continuing)) from None
        if cfg.init_from is not None and "preset" in _flags_given(args):
            raise ValueError(f"--preset (preset): the run trains the model init_from names ({cfg.init_from}), its "
                             f"architecture and weights, so no preset is built; leave --preset out")
        try:
            summary = train(cfg, signals=signals)
        except ValueError as e:  # the checks that need the data or the ranks name keys too (micro_batch_size: ...)
            said = _in_flags(e, args, continuing)
            if said == str(e):
                raise
            raise ValueError(said) from None
        if main_rank:
            _say_summary(summary, cfg)
        if summary.get("stopped_by"):
            # torchrun signals the ranks still running once one has exited, and after the stop's checkpoint a
            # signal ends a rank at once: no rank exits before rank 0 has said where the run stopped
            barrier()
    except KeyboardInterrupt:
        if cfg is None or not main_rank:  # one note per run, not one per process under torchrun
            raise
        raise KeyboardInterrupt(_resume_note(cfg.out_dir)) from None
    except CheckpointWriteError as e:
        raise CheckpointWriteError(f"{e}; resume with: foxformer train --out {shlex.quote(cfg.out_dir)}") from None
    if summary.get("stopped_by"):  # every rank: torchrun reports the first status that is not 0
        return exit_status(summary["stopped_by"])
    return 0


def _note_a_decimal_context(args: argparse.Namespace, overrides: dict) -> None:
    """The note eval's lengths give (argtypes.decimal_length_note) where the context was written with a k or M,
    by a flag, --set or the --config file: `--context 4k` trained at 4000 tokens without a word, where 4Ki was
    meant. Once for the job. A run's saved config.yaml holds the count itself, so continuing a run says nothing."""
    from .elastic import says_for_the_job

    given = overrides["context"] if "context" in overrides else (
        _keys(_saved_yaml(args.config)).get("context") if args.config is not None else None)
    note = decimal_length_note(given)
    if note and says_for_the_job():
        print(f"train: note: context {note}", file=sys.stderr)


def _say_summary(summary: dict, cfg) -> None:
    """The run's summary on stdout and, for a run that stopped before its end, where it stands."""
    print_json(summary, indent=2)
    if summary.get("time_limit"):
        why = f" at the time limit (max_minutes {cfg.max_minutes:g})"
    elif summary.get("stopped_by"):
        why = f" on {summary['stopped_by']}"
    else:
        return
    print(_resume_note(cfg.out_dir, f"{why} after step {summary['step']}", redone=False), file=sys.stderr, flush=True)


def _in_flags(error: ValueError, args: argparse.Namespace, continuing: bool) -> str:
    """A config error in the user's words: TrainConfig names keys (``total_tokens: ...``); a key set by a flag
    on this command line is named by that flag, an item of --set by that item, a key of the --config file by that
    file, a key left at its default by its flag, saying so (not where ``continuing`` a run, whose config.yaml set
    it), the --config file's own refusal by --config, and the horizon error lists the flags that set it."""
    from .config import read_yaml, shown_default

    if said := _in_model_flags(error, args):
        return said
    given = _flags_given(args)
    if said := _tokenizer_of_a_file(error, args, given):
        return said
    message = str(error)
    key, sep, rest = message.partition(": ")
    if sep and key in given:
        return f"{given[key][0]} ({key}): {rest}"
    # set by --set or by a YAML file: the bare key left the user to look for where it came from
    if sep and (item := next((i for i in args.set or [] if i.partition("=")[0].strip() == key), None)):
        return f"--set {item}: {rest}"
    if key == "config" and args.config is not None:  # the file itself (missing, a folder, not YAML) and not a key
        return f"--config: {rest}"
    # a run's saved config.yaml, which the run continues from, holds every key: only a file the user gave says one
    if sep and args.config is not None and key in _keys(read_yaml(args.config)):
        return f"config {args.config}: {message}"
    # `train` without --data stopped at 'data_cache/default', a path the user never typed nor was told is a default
    flag = next((flag for flag, field in _FLAGS.items() if field == key), None)
    if sep and flag and not continuing:
        return f"{flag} ({key}): {rest}; {flag} was left out, so its default ({shown_default(key)}) was used"
    if key == "total_tokens / max_steps":
        return f"{message}: give --total-tokens or --max-steps"
    if key == "overrides":  # what load_config calls them: on this command line only --set names keys
        return f"--set: {rest}"
    return message


def _tokenizer_of_a_file(error: ValueError, args: argparse.Namespace, given: dict) -> str | None:
    """Data of another tokenizer than the one a YAML file set (a run's config.yaml records the tokenizer of the
    data that run trained on): the dataset's fix, "leave the tokenizer out", named what no flag had given. None for
    any other error, and where this command line gave the tokenizer."""
    from ..data.dataset import TokenizerMismatch
    from .config import SAVED_CONFIG

    typed = {item.partition("=")[0].strip() for item in args.set or []}
    if not isinstance(error, TokenizerMismatch) or "tokenizer" in given or "tokenizer" in typed:
        return None
    source = args.config if args.config is not None else os.path.join(args.out, SAVED_CONFIG)
    data = f"{given['data_dir'][0]} (data_dir)" if "data_dir" in given else f"config {source}: data_dir"
    return (f"{data}: {error.data_dir!r} was tokenized with {error.found!r}, but {source} sets tokenizer "
            f"{error.expected!r} (no flag gave it); give --tokenizer {error.found} to train on this data, or "
            f"prepare the data again with --tokenizer {error.expected}")


def _saved_yaml(path: str):
    """The YAML ``path`` holds (a run folder: its config.yaml), or None where it cannot be read: load_config says
    what is wrong with it, in the user's words."""
    from .config import SAVED_CONFIG, read_yaml

    if os.path.isdir(path):
        path = os.path.join(path, SAVED_CONFIG)
    try:
        return read_yaml(path)
    except (ValueError, OSError):
        return None


def _other_runs_limit(config: str, out_dir: str | None) -> float | None:
    """The max_minutes that ``config``, another run's saved config.yaml (save_config adds its ``derived`` facts),
    holds, where this run is not that run: a time limit given to some invocation of that run (`--max-minutes` on a
    resume is saved with it) is no setting of a new run started from its config, as its schedule and model are.
    None for a file of the user's own, whose limit is meant."""
    loaded = _keys(_saved_yaml(config))
    limit = loaded.get("max_minutes")
    if "derived" not in loaded or not isinstance(limit, (int, float)):
        return None
    this_run = out_dir or loaded.get("out_dir")
    if isinstance(this_run, str) and os.path.realpath(this_run) == os.path.realpath(os.path.dirname(config) or "."):
        return None
    return limit


def _keys(loaded) -> dict:
    """The mapping a YAML file holds, or none where it holds something else (load_config refuses that by itself)."""
    return loaded if isinstance(loaded, dict) else {}


def _in_model_flags(error: ValueError, args: argparse.Namespace) -> str | None:
    """A model setting's error (models.config.ConfigError, whoever raised it: FoxConfig, get_preset, TrainConfig's
    check of the keys) on a field that --model (or --set model.KEY) set on this command line, named by that item
    (``--model num_heads=3: num_heads (3) must divide ...``) in place of the function that refused it. None for
    any other error."""
    from ..models.config import ConfigError

    if not isinstance(error, ConfigError):
        return None
    item = _model_item(error.fields, args)
    return f"{item}: {error.reason}" if item else None


def _model_item(fields: tuple[str, ...], args: argparse.Namespace) -> str | None:
    """The --model (or --set model.KEY) item of this command line, as typed (``--model num_kv_heads=3``), that set
    the first of ``fields`` set there (an error's fields: the refused one, then those beside it). None where none
    was."""
    given = {}
    for flag, items in (("--set", args.set), ("--model", args.model)):  # --model's items are applied last
        for item in items or []:
            key = item.partition("=")[0].strip()
            if key.startswith("model.") or flag == "--model":
                given[key.removeprefix("model.")] = f"{flag} {item}"
    return next((given[field] for field in fields if field in given), None)


def _no_run_to_continue(out_dir: str) -> str:
    from ..argtypes import did_you_mean
    from .config import SAVED_CONFIG

    parent = os.path.dirname(os.path.normpath(out_dir))
    names = os.listdir(parent or ".") if os.path.isdir(parent or ".") else []
    runs = [os.path.join(parent, name) for name in names if os.path.isfile(os.path.join(parent, name, SAVED_CONFIG))]
    return (f"out_dir: there is no run in {out_dir!r} to continue{did_you_mean(os.path.normpath(out_dir), runs)}; "
            f"start one with: foxformer train --data DIR --out {shlex.quote(out_dir)} --max-steps N (or "
            f"--total-tokens N), DIR made by `foxformer data prepare`")


def _resume_note(out_dir: str, why: str = "", redone: bool = True) -> str:
    """Where a stopped run stands and the command that continues it (after Ctrl-C, which abandons the step in
    progress: ``redone``, or at the time limit or on SIGTERM, just after a checkpoint); ``why`` follows "training
    stopped"."""
    from .checkpoint import latest_checkpoint

    try:
        last = latest_checkpoint(out_dir)
    except ValueError:  # a dangling pointer: the resume will say what to do
        last = None
    command = f"foxformer train --out {shlex.quote(out_dir)}"
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        command = (f"torchrun --nproc-per-node N -m foxformer.cli train --out {shlex.quote(out_dir)} (the same "
                   f"launch, any number of processes)")
    if last is None:
        return f"training stopped{why} ({out_dir}) before its first checkpoint; start it again with: {command}"
    redo = " (the steps after it will be redone)" if redone else ""
    return f"training stopped{why} ({out_dir}); the last checkpoint is {last}{redo}; resume with: {command}"


def _named_checkpoint(run: str, name: str) -> str:
    """--checkpoint as given (a folder), else a checkpoint of the run by its name (step_00000260); an unknown name
    lists the run's checkpoints."""
    from .checkpoint import CheckpointError, checkpoint_root, checkpoints_held

    if os.path.isdir(name):
        return name
    inside = os.path.join(checkpoint_root(run), name)
    if os.path.isdir(inside):
        return inside
    raise CheckpointError(f"export: --checkpoint {name!r} is neither a folder nor a checkpoint of {run!r} "
                          f"({checkpoints_held(run)})")


def _cmd_export(args: argparse.Namespace) -> int:
    from ..models.calls import hf_progress
    from .checkpoint import (CKPT_DIR, CheckpointError, checkpoint_format, checkpoints_held, data_or_model_folder,
                             latest_checkpoint, load_checkpoint, read_meta)
    from .config import saved_model_config
    from .loading import read_run_config
    from .export import export_hf
    from .sharded import export_hf_sharded, model_tensor_specs

    if not os.path.isdir(args.run):
        # a checkpoint's path from a stop's note, since removed by keep_last: "no run folder" sent the user looking
        root = os.path.dirname(os.path.abspath(args.run))
        run = os.path.dirname(root)
        if os.path.basename(root) == CKPT_DIR and os.path.isfile(os.path.join(run, "config.yaml")):
            raise CheckpointError(f"export: checkpoint {args.run!r} does not exist ({checkpoints_held(run)}): "
                                  f"foxformer export-hf {run} --checkpoint NAME")
        raise ValueError(f"export: no run folder {args.run!r}; export-hf takes a run folder, the --out of "
                         f"`foxformer train`")
    if os.path.exists(os.path.join(args.run, "meta.json")):  # a checkpoint folder, not its run's
        run = os.path.dirname(os.path.dirname(os.path.abspath(args.run)))
        name = os.path.basename(os.path.normpath(args.run))
        raise ValueError(f"export: {args.run!r} is a checkpoint; export-hf takes its run folder and the checkpoint "
                         f"by name: foxformer export-hf {run} --checkpoint {name}")
    # both were "run ... has no checkpoints": of a checkpoints folder, of an export that needs none
    parent = os.path.dirname(os.path.abspath(args.run))
    if os.path.basename(os.path.normpath(args.run)) == CKPT_DIR and os.path.isfile(os.path.join(parent, "config.yaml")):
        raise ValueError(f"export: {args.run!r} is the checkpoints folder of the run {parent}; export-hf takes the run "
                         f"folder: foxformer export-hf {parent}")
    # a dataset was "run ... has no checkpoints" too
    if taken := data_or_model_folder(args.run):
        held, what = taken
        how = ("which from_pretrained and every foxformer command load as is" if held == "config.json" else
               "which `foxformer train --data` trains on")
        raise ValueError(f"export: {args.run!r} is {what} (it holds {held}), {how}; export-hf takes a run folder, "
                         f"the --out of `foxformer train`")
    path = _named_checkpoint(args.run, args.checkpoint) if args.checkpoint else latest_checkpoint(args.run)
    if path is None:  # what to do was left unsaid: a run that saved none yet, or a folder that is no run
        if os.path.isfile(os.path.join(args.run, "config.yaml")):
            raise CheckpointError(f"export: run {args.run!r} has no checkpoints yet; train it on until it saves one: "
                                  f"foxformer train --out {args.run}")
        raise CheckpointError(f"export: {args.run!r} is no run folder (it holds no config.yaml and no checkpoint); "
                              f"export-hf takes a run folder, the --out of `foxformer train`")
    run_cfg = read_run_config(os.path.join(args.run, "config.yaml"))
    out = args.out or os.path.join(args.run, "hf")
    step = read_meta(path)["step"]
    # transformers' writing bar (a full checkpoint) and the tensors' (a sharded one): minutes at 760M and up
    with hf_progress(not args.no_progress):
        if checkpoint_format(path) == "sharded":  # tensor by tensor: the model is never whole in memory
            vocab = model_tensor_specs(path)["model.embed_tokens.weight"][0][0]
            out = export_hf_sharded(saved_model_config(args.run, run_cfg, vocab), path, out, run_dir=args.run,
                                    progress=not args.no_progress)
        else:
            model_sd = load_checkpoint(path)[0]
            vocab = model_sd["model.embed_tokens.weight"].shape[0]
            out = export_hf(saved_model_config(args.run, run_cfg, vocab), model_sd, out, run_dir=args.run, step=step)
    print_json({"checkpoint": path, "step": step, "hf_dir": out}, indent=2)
    return 0


def add_commands(subparsers) -> None:
    p = subparsers.add_parser(
        "train", help="train a FoX / Transformer model (CPU, GPU, or torchrun with FSDP2/DDP)",
        description="Train from a YAML config and/or flags; resumes automatically from out_dir. Launch on many "
                    "GPUs with: `torchrun --nproc-per-node N -m foxformer.cli train ...`. SIGTERM or SIGUSR1 (a "
                    "scheduler's preemption or time limit) stops it after the step in progress with a checkpoint "
                    "and exit status 128 + the signal (143, 138); a second one ends it at once. torchrun passes "
                    "SIGUSR1 on only with --signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 (else SIGUSR1 "
                    "ends torchrun itself at once).")
    from .config import describe_key  # light: the models and torch are imported only when a run starts

    p.add_argument("--config", help="YAML file with TrainConfig keys")
    for flag, key in _FLAGS.items():
        # default=None: a flag not given leaves the YAML's (or a continued run's) value, so the help says the default
        p.add_argument(flag, default=None, type=_typed_text(key), help=f"config key {key}{describe_key(key)}")
    for flag, key in _SWITCHES.items():
        p.add_argument(flag, action="store_true", help=f"set {key}: true{describe_key(key)}")
    p.add_argument("--model", action="append", metavar="KEY=VALUE", help="FoxConfig override (repeatable)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="any TrainConfig key (repeatable)")
    p.add_argument("--no-progress", action="store_true", help=f"set progress: false{describe_key('progress')}")
    p.set_defaults(func=_cmd_train)

    e = subparsers.add_parser("export-hf", help="export a training checkpoint as a Hugging Face model directory",
                              description="Write a checkpoint of a training run (the latest, or --checkpoint) as a "
                                          "standalone Hugging Face model folder, <run>/hf unless --out: config, "
                                          "weights, tokenizer files and a model card of the training; "
                                          "from_pretrained loads it. Prints the checkpoint, its step and the folder "
                                          "as JSON.")
    e.add_argument("run", help="run directory (out_dir of `foxformer train`)")
    e.add_argument("--checkpoint", help="checkpoint folder, or its name in the run (step_00000260; default: the "
                                        "latest)")
    e.add_argument("--out", help="output directory (default: <run>/hf)")
    no_progress_arg(e, "writing the weights")
    e.set_defaults(func=_cmd_export)
