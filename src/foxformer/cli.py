"""`foxformer <command>`: one entry point; each area registers its own subcommands.

The area modules below hold only their arguments (argparse): a command imports torch, transformers and
triton when it runs, so `foxformer --help` and every `--help` answer at once. Errors a user can fix end in
one `error:` line and exit code 2 (``FOXFORMER_DEBUG=1`` shows the traceback instead).
"""
from __future__ import annotations

import argparse
import contextlib
import difflib
import errno
import importlib
import io
import os
import re
import select
import socket
import sys
import warnings

from .argtypes import COUNT_SUFFIXES, SettingError, did_you_mean, is_count_type, no_progress_arg
from .json_text import print_json

# Each module defines add_commands(subparsers); a command's handler is stored as `func`.
_AREAS = (
    "foxformer.data.cli",
    "foxformer.train.cli",
    "foxformer.eval.cli",
    "foxformer.infer.cli",
    "foxformer.bench.cli",
)
# What a shell reports for a program killed by SIGPIPE (128 + 13); Python ignores the signal instead.
BROKEN_PIPE_EXIT = 141
# ... and for one stopped by Ctrl-C (128 + SIGINT).
INTERRUPTED_EXIT = 130
USER_ERROR_EXIT = 2
# The commands that run as one process of several under torchrun. Any other ran whole in every process, the
# copies writing the same files at once (eval's JSON and plots, export-hf's folder).
DISTRIBUTED_COMMANDS = ("train",)
DESCRIPTION = ("The Forgetting Transformer (FoX): prepare data, train, evaluate, generate, benchmark. "
               "`foxformer COMMAND --help` lists a command's options.")


def _presets(args) -> int:
    from .models.presets import main

    main()
    return 0


def _convert_official(args) -> int:
    from .models.calls import hf_progress
    from .models.official import convert_official

    tokenizer = None if args.tokenizer == "none" else args.tokenizer
    # the Hub's download bars and transformers' loading and writing ones (minutes for the released 760M models)
    with hf_progress(not args.no_progress):
        summary = convert_official(args.src, args.out, tokenizer=tokenizer,
                                   max_position_embeddings=args.max_position_embeddings)
    print_json(summary, indent=2)
    return 0


def _add_model_commands(sub) -> None:
    """`presets` and `convert official`: the models package registers Hugging Face classes when imported, so its
    commands live here, where nothing imports it until one runs."""
    sub.add_parser("presets", help="list model presets with non-embedding parameter counts",
                   description="Print the model presets (fox-, transformer- and linear-pro-, tiny to 1.3b) as a "
                               "table: layers, width, heads, head dim, SwiGLU width, non-embedding parameters and "
                               "their difference from the LLaMA-block preset of the same family and size. Writes "
                               "nothing.").set_defaults(func=_presets)
    convert = sub.add_parser("convert", help="convert checkpoints of other code to foxformer models",
                             description="Convert a checkpoint of other code into a foxformer model: a Hugging Face "
                                         "folder (--out) that from_pretrained and every foxformer command load. "
                                         "SOURCE names that code: official, the FoX paper's.")
    csub = convert.add_subparsers(dest="convert_command", metavar="SOURCE")
    p = csub.add_parser("official", help="a checkpoint of the FoX paper's code (e.g. its released 760M models)",
                        description="Reads a Hugging Face folder saved by the paper's code (github.com/zhixuan-lin/"
                                    "forgetting-transformer: config.json and model.safetensors or pytorch_model.bin; "
                                    "a Hub id such as "
                                    "zhixuan-lin/fox-pro-760m-longcrawl64-48b where the Hub is reachable) and writes "
                                    "a foxformer model with the same logits: a standalone Hugging Face folder with "
                                    "its tokenizer. Their Mamba-2, DeltaNet, HGRN2 and Samba baselines are refused.")
    p.add_argument("src", metavar="SRC", help="checkpoint folder (or Hub repository id)")
    p.add_argument("--out", required=True, help="output folder (a Hugging Face folder the eval commands read)")
    p.add_argument("--tokenizer", default="auto",
                   help="auto (gpt2-json for their LongCrawl64 models, their tokenizer files otherwise) | a "
                        "tokenizer spec | none")
    p.add_argument("--max-position-embeddings", type=int, default=None,
                   help="written to the config (default: the checkpoint's, else 16384, the released models' "
                        "training context)")
    no_progress_arg(p, "the Hub download, loading and writing the weights")
    p.set_defaults(func=_convert_official)
    convert.set_defaults(func=lambda args: (convert.print_help(), 2)[1])


# run_demo's settings (and the data preparation's, of the folder it makes in --out) by the flags that set them:
# its errors name a keyword, where the user typed a flag
_DEMO_FLAGS = {"minutes": "--minutes", "out": "--out", "out_dir": "--out", "device": "--device",
               "tokenizer": "--tokenizer", "context": "--context"}


def _demo(args) -> int:
    from .demo import run_demo

    overrides = {k: v for k, v in (("tokenizer", args.tokenizer), ("context", args.context)) if v is not None}
    try:
        summary = run_demo(out=args.out, minutes=args.minutes, device=args.device, progress=not args.no_progress,
                           overrides=overrides)
    except SettingError as e:
        if e.field not in _DEMO_FLAGS:
            raise
        raise e.in_flags(_DEMO_FLAGS) from None
    print_json({k: summary[k] for k in ("out", "report", "plot", "wall_s")} |
               {"val_loss": {p: m["val_loss"] for p, m in summary["models"].items()}}, indent=2)
    return 0


def _add_demo(sub) -> None:
    p = sub.add_parser("demo", help="end-to-end demo: prepare built-in data, train tiny FoX and Transformer, "
                                    "evaluate, plot, report",
                       description="Prepare the SymPy-source corpus, train a tiny FoX (Pro) and a tiny Transformer "
                                   "(Pro) on the same number of tokens, evaluate validation loss and per-position "
                                   "loss L(i), and write a PNG and a Markdown report. Rerunning resumes or reuses "
                                   "whatever is already finished.")
    p.add_argument("--minutes", type=float, default=3.0,
                   help="about how many minutes the whole demo takes: preparing the data, measuring the speed, training and "
                        "evaluating both models (each gets as many tokens as fit), the report; not counted: Python "
                        "loading torch before the demo's first line (default 3)")
    p.add_argument("--out", default="runs/demo", help="run directory (report.md and demo.png land here)")
    # no argparse choices: they refused cuda:N, which run_demo takes (its device check names this flag)
    p.add_argument("--device", default="auto",
                   help="auto | cpu | cuda | cuda:N: where both models train and are evaluated; auto: a GPU where "
                        "there is one, else the CPU")
    p.add_argument("--tokenizer", help="tokenizer of the corpus and the models, as `data prepare --tokenizer` takes "
                                       "it (default: bytes on CPU, fast for tiny models; gpt2 on GPU)")
    p.add_argument("--context", type=int, help="sequence length (default: 512 on CPU, 2048 on GPU)")
    no_progress_arg(p, "preparing the data, training, loading the trained models")
    p.set_defaults(func=_demo)


class _Version(argparse.Action):
    """--version, with the commit where there is one: read when asked (git runs only then)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from . import __version__
        from .provenance import code_version

        commit = code_version()
        print(f"foxformer {__version__}" + (f" (commit {commit})" if commit else ""))
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="foxformer", description=DESCRIPTION)
    parser.add_argument("--version", action=_Version, help="print the version (and the commit) and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_demo(sub)
    for name in _AREAS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):  # area not built: its commands are absent
                continue
            raise
        module.add_commands(sub)
    _add_model_commands(sub)
    _tag_parsers(parser)
    _hint_choices(parser, _command_paths(parser))
    return parser


def _said_default(action: argparse.Action) -> str | None:
    """An option's default as its help shows it, or None where there is none worth saying (None, False, and a
    switch's: `--no-anchor`'s True is the setting it turns off, and read as though the anchor were off)."""
    default = action.default
    switch = isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))
    if not action.option_strings or default is None or default is False or default is argparse.SUPPRESS or switch:
        return None
    if isinstance(default, (list, tuple)):
        default = ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in default)
    return str(default).replace("%", "%%")


class _HelpFormatter(argparse.HelpFormatter):
    """An option's help ends with its default where it has one worth saying and the text does not give it
    already: `generate --temperature` samples at 0.8 unless told, which a user would not guess. That of an option
    reading token counts (argtypes.count_type) then says what k and Ki mean: `--seq-len 1k` is 1000 tokens."""

    def _get_help_string(self, action):
        text, said = action.help or "", _said_default(action)
        if text == argparse.SUPPRESS:
            return text
        if said is not None and "default" not in text.lower():
            text = f"{text} (default: {said})"
        if is_count_type(action.type) and COUNT_SUFFIXES not in text:
            text = f"{text}; {COUNT_SUFFIXES}"
        return text


def _tag_parsers(parser: argparse.ArgumentParser) -> None:
    """Record in each parser's defaults which parser it is: the innermost one chosen wins, so that parsing
    yields the subcommand's own (for its usage line and its flags) as ``_parser``; every parser's help gives the
    options' defaults (_HelpFormatter)."""
    parser.set_defaults(_parser=parser)
    parser.formatter_class = _HelpFormatter
    for action in parser._actions:
        if action.help is None and _said_default(action) is not None:  # argparse prints no help line for None
            action.help = f"default: {_said_default(action)}"
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in set(action.choices.values()):
                _tag_parsers(child)


def _command_paths(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """Every subcommand's name and the full commands it names (`report`: [`foxformer report`])."""
    paths: dict[str, list[str]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                paths.setdefault(name, []).append(child.prog)
                for inner, progs in _command_paths(child).items():
                    paths.setdefault(inner, []).extend(progs)
    return paths


# argparse's refusal of a value not among an argument's choices, which it names as _get_action_name does
_INVALID_CHOICE = re.compile(r"^argument (.+?): invalid choice: '([^']*)' \(choose from .*\)$")


def _hint_choices(parser: argparse.ArgumentParser, paths: dict[str, list[str]]) -> None:
    """Each parser's refusal of a value not among an argument's choices ends with the closest choice
    (`--split trian`: did you mean 'train'?; "evl": did you mean "eval"?), or, for a command this parser does not
    have, where that command is (eval's "report": the report is a command of its own, `foxformer report`)."""
    by_name = {argparse._get_action_name(a): a for a in parser._actions if a.choices is not None}
    error = parser.error

    def with_hint(message, error=error):
        found = _INVALID_CHOICE.search(message)
        action = by_name.get(found.group(1)) if found else None
        if action is not None:
            word = found.group(2)
            elsewhere = ([p for p in paths.get(word, []) if p.rsplit(" ", 1)[0] != parser.prog]
                         if isinstance(action, argparse._SubParsersAction) else [])
            if elsewhere:
                message += f"; {word!r} is {' or '.join(f'`{p}`' for p in elsewhere)}"
            else:
                message += did_you_mean(word, [str(c) for c in action.choices])
        error(message)

    parser.error = with_hint
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in set(action.choices.values()):
                _hint_choices(child, paths)


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None):
    """parse_args, except that a misspelled flag is reported by the subcommand's parser (its usage, not the
    top level's) with the closest flag it has; returns the arguments and that parser."""
    args, extras = parser.parse_known_args(argv)
    own = vars(args).pop("_parser", parser)  # commands write vars(args) into their JSON
    if extras:
        flags = [s for a in own._actions for s in a.option_strings]
        hints = []
        for extra in extras:
            close = difflib.get_close_matches(extra.split("=")[0], flags, n=1) if extra.startswith("-") else []
            if close:
                hints.append(f"{extra}: did you mean {close[0]}?")
        own.error(f"unrecognized arguments: {' '.join(extras)}" + (f" ({'; '.join(hints)})" if hints else ""))
    if not getattr(args, "func", None):  # `foxformer` alone: a refusal as argparse's are (under torchrun: reported)
        own.exit(USER_ERROR_EXIT, f"{own.format_help()}{own.prog}: error: a command is required\n")
    return args, own


def _parse_once(parser: argparse.ArgumentParser, argv: list[str] | None):
    """_parse; under torchrun, where every rank parses the same command line, argparse's refusal (its usage and
    error line) is said by rank 0 alone, and is each rank's entry in torchrun's summary (it said "<N/A>"). Each
    host's torchrun gives its ranks its own command line: the refusal is left for the other hosts' ranks too, which
    waited for these until dist_timeout_minutes."""
    from .train.elastic import one_of_several, say_error

    if not one_of_several():
        return _parse(parser, argv)
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            return _parse(parser, argv)
    except SystemExit as e:
        lines = said.getvalue().strip().splitlines()
        if e.code and lines:
            say_error(lines[-1], said.getvalue())
            _report_refusal(lines[-1])
        raise


def _report_refusal(line: str) -> None:
    """argparse's error line (``foxformer train: error: ...``) as this rank's failure, for the other ranks of the
    job; the host is the one whose command line to fix."""
    try:
        from .train.distributed import report_early_failure
    except ImportError:  # no torch on this host, so no store to reach: argparse's exit stands, as it is
        return
    report_early_failure(f"the command line on host {socket.gethostname()} was refused: "
                         f"{line.replace(': error: ', ': ', 1)}")


def _one_of_several(command: str) -> str | None:
    """Why ``command`` (its parser's prog, ``foxformer eval niah``) may not run here: this is one process of
    several (torchrun sets WORLD_SIZE) and the command is not one of DISTRIBUTED_COMMANDS; None where it may."""
    from .train.elastic import one_of_several

    if not one_of_several() or command.split()[1] in DISTRIBUTED_COMMANDS:
        return None
    world = os.environ["WORLD_SIZE"]
    return (f"{command} runs in one process, and WORLD_SIZE={world} makes this one of {world} (torchrun sets it): "
            f"each would run the whole command and write the same outputs; run it without torchrun (or unset "
            f"WORLD_SIZE)")


_OS_FIXES = {errno.ENOSPC: "free disk space or choose another location",
             errno.EDQUOT: "free disk space or choose another location",
             errno.EACCES: "choose a location you may write to, or fix its permissions",
             errno.EPERM: "choose a location you may write to, or fix its permissions",
             errno.EROFS: "the file system is read-only: choose another location",
             errno.ENOENT: "check the path",
             errno.EISDIR: "give a file, not a folder",
             errno.EEXIST: "a file of that name is in the way: choose another location",
             errno.ENOTDIR: "a part of the path is a file, not a folder"}


def describe(exc: BaseException) -> str:
    """The text of an `error:` line: our messages as they are, an OSError as `<what> (<path>): <how to fix>`."""
    if isinstance(exc, OSError) and exc.strerror and str(exc).startswith("[Errno"):
        where = f" ({exc.filename})" if exc.filename is not None else ""
        fix = _OS_FIXES.get(exc.errno)
        return f"{exc.strerror.lower()}{where}" + (f": {fix}" if fix else "")
    return str(exc) or type(exc).__name__


def _say_error(line: str) -> None:
    """``line`` on stderr in one write: under torchrun every rank runs with ``python -u``, where print writes the
    text and its newline apart, and the ranks' lines ran into each other (``...to let the run chooseerror: ...``)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _issued_by_foxformer(frame) -> bool:
    """Whether the warning being shown was raised by foxformer's code: the first frame from ``frame`` up that is
    not the warnings module's own. Not the file the warning names, which its stacklevel points at the caller
    (often transformers' or torch's wrappers around a forward)."""
    while frame is not None and frame.f_globals.get("__name__") in ("warnings", "_py_warnings"):  # 3.14: the latter
        frame = frame.f_back
    return frame is not None and frame.f_globals.get("__name__", "").split(".")[0] == "foxformer"


def _warning_lines(previous):
    """A warnings.showwarning for the CLI: foxformer's own UserWarnings as one `warning: ...` line (they speak to
    the user, to whom Python's `path.py:123: UserWarning:` prefix and echoed source line are noise); any other
    warning as ``previous`` shows it."""
    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if not (issubclass(category, UserWarning) and _issued_by_foxformer(sys._getframe(1))):
            previous(message, category, filename, lineno, file, line)
            return
        tqdm = getattr(sys.modules.get("tqdm.std"), "tqdm", None)
        # An open progress bar is cleared first: the line was glued to the bar's otherwise.
        with tqdm.external_write_mode(file=sys.stderr) if tqdm is not None else contextlib.nullcontext():
            _say_error(f"warning: {message}")
    return show


def main(argv: list[str] | None = None) -> int:
    """Run one command, showing foxformer's warnings as `warning:` lines while it runs; after it they are shown
    as Python shows them again (main is also called in-process, by tests and scripts)."""
    previous = warnings.showwarning
    warnings.showwarning = _warning_lines(previous)
    try:
        return _main(argv)
    finally:
        warnings.showwarning = previous


def _main(argv: list[str] | None) -> int:
    from .train.elastic import say_error

    parser = build_parser()
    args, own = _parse_once(parser, argv)
    refused = _one_of_several(own.prog)
    if refused:
        say_error(f"error: {refused}")
        return USER_ERROR_EXIT
    try:
        rc = int(args.func(args) or 0)
        sys.stdout.flush()  # inside the try: a reader gone by now fails this flush, not the one at exit
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise  # another pipe (a data-loader worker, a socket): a real error
        _silence_stdout()
        return BROKEN_PIPE_EXIT
    except KeyboardInterrupt as e:
        if os.environ.get("FOXFORMER_DEBUG") == "1":
            raise
        _close_bars()
        # under torchrun rank 0 says where to resume; the other ranks' bare "interrupted" only repeated it
        if str(e) or os.environ.get("RANK", "0") == "0":
            _say_error(f"interrupted{': ' + str(e) if str(e) else ''}")
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            # one process of a torchrun job: the step Ctrl-C abandoned left collectives in flight that no peer
            # will match, and freeing them (this exception's frames hold the model) kept the ranks waiting for
            # each other until torchrun killed them 30 s later (a Ctrl-C to one rank: the 10-minute timeout)
            sys.stdout.flush()
            os._exit(INTERRUPTED_EXIT)
        return INTERRUPTED_EXIT
    except (ValueError, TypeError, OSError, ImportError) as e:  # what a user can fix: a path, a value, a package
        if os.environ.get("FOXFORMER_DEBUG") == "1":  # the full traceback, for bug reports
            raise
        _close_bars()
        say_error(f"error: {describe(e)}")  # under torchrun: said by rank 0, and in torchrun's summary
        return USER_ERROR_EXIT
    return rc


def _close_bars() -> None:
    """Close the progress bars an exception left open, so that its line starts a line of its own (it was glued
    to the bar's: `...tok_s=33,474]interrupted: ...`)."""
    tqdm = getattr(sys.modules.get("tqdm.std"), "tqdm", None)
    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll reports POLLERR on such a write end)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    if not hasattr(select, "poll"):  # no way to tell (Windows): the standard pattern assumes stdout
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def _silence_stdout() -> None:
    """The reader (`| head`) is gone: point stdout at devnull so that the interpreter's final flush of
    what is still buffered does not print 'Exception ignored ... BrokenPipeError'."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no file descriptor (captured in-process)
        pass


if __name__ == "__main__":
    sys.exit(main())
