"""`foxformer bench <what>` (and the aliases `bench-model`, `bench-decode`): each benchmark's arguments.

Only argparse here: a benchmark's module (torch, triton, transformers) is imported when it runs, so that
`foxformer bench decode --help` answers at once.
"""
from __future__ import annotations

import argparse
import copy
import importlib
import math
import sys

from foxformer.argtypes import (distinct, no_progress_arg, non_negative_int, positive_int, positive_ints,
                                unknown_words, words)
from foxformer.paths import check_output_dir, check_output_file

# foxformer: the op as users call it (backend "auto": the Gluon kernels on H100 / H200, the chunked torch backend on
# a CPU); gluon, triton: one backend each, to compare them in one run; sdpa: torch's SDPA with the backend it picks
# itself (its flash kernel on a CPU), the ceiling of `--device cpu`.
PROVIDERS = ("foxformer", "gluon", "triton", "sdpa", "sdpa_flash", "sdpa_cudnn", "fla", "flex")
# The providers no CPU times, and why: under --device cpu each made a row of its error, the run's exit 0 (the triton
# backend takes half precision and a CPU's rows are float32, so not even Triton's interpreter runs them there).
# FlexAttention's forward runs on a CPU, but its backward raises NotImplementedError there (torch 2.13): a forward
# time, then an error row where every other provider has its forward+backward.
NEEDS_CUDA = {"gluon": "the Gluon kernels need an sm_90 GPU (H100 / H200)",
              "triton": "the Triton kernels need a CUDA GPU",
              "sdpa_cudnn": "SDPA's cuDNN kernels need a CUDA GPU", "fla": "fla-core's Triton kernels need a CUDA GPU",
              "flex": "FlexAttention has no backward on a CPU, and each row times forward+backward"}
DTYPES = ("bf16", "fp16", "fp32")
# bench decode's preset where neither --preset nor --model is given, by device type; the flag's own default is None,
# so that _check_decode tells a --preset given beside --model apart from it
DEFAULT_DECODE_PRESET = {"cuda": "fox-pro-125m", "cpu": "fox-pro-tiny"}
_AUTO_HELP = "auto (a GPU where there is one, else the CPU)"
_DEVICE_HELP = f"{_AUTO_HELP}, cpu, cuda or cuda:N"


def _out_arg(p: argparse.ArgumentParser, default: str) -> None:
    """--out, each benchmark's JSON (bench.common.ResultFile writes it)."""
    p.add_argument("--out", default=default,
                   help="JSON file of the rows, the settings and the environment, rewritten after each row; an empty "
                        "path writes none")


def _check_outputs(args) -> None:
    # Before any timing: a --out naming a folder, or inside a file, failed at the first write of the rows, after
    # the first case had run (and left its temp file beside the folder).
    if getattr(args, "out", None):
        check_output_file(args.out, "--out")
    if getattr(args, "profile", None):
        check_output_dir(args.profile, "--profile")


def _runner(module: str, *checks):
    """Handler that validates the arguments with ``checks`` and the output paths, then runs
    ``foxformer.bench.<module>.run``."""
    def handler(args) -> int:
        for check in (*checks, _check_outputs):
            check(args)
        result = importlib.import_module(f"foxformer.bench.{module}").run(args)
        return result if isinstance(result, int) else 0
    return handler


# Checked while parsing (exit 2, 'error: ...'), before the CUDA check: a bad value used to end in a
# traceback on the GPU (or, for 64x24x5, in rows of a GQA shape that does not exist).
def _number(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def _bound(text: str):
    if text == "auto":
        return text
    value = _number(text, "a number or 'auto'")
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected 'auto' or a finite number >= 0, got {text!r}")
    return value


def _gluon_fwd(text: str) -> dict:
    """'max_free=true' (every head dim) or '64:max_free=true,head_group=2;128:max_free=false'
    -> {head dim or None: {FwdConfig field: value}}; 'default' -> {} (no change). The fields and values are
    checked when the benchmark applies them (ops.forgetting_attn.hopper.launch.fwd_options)."""
    import yaml

    changes = {}
    if text.strip() == "default":
        return changes
    for part in filter(None, (p.strip() for p in text.split(";"))):
        dim, colon, items = part.rpartition(":")
        if colon and not dim.isdigit():
            raise argparse.ArgumentTypeError(f"expected HEAD_DIM:field=value,..., got {part!r}")
        fields = {}
        for item in filter(None, items.split(",")):
            key, eq, value = item.partition("=")
            if not eq or not key.strip():
                raise argparse.ArgumentTypeError(f"expected field=value, got {item!r}")
            fields[key.strip()] = yaml.safe_load(value)
        changes[int(dim) if colon else None] = fields
    return changes


def _eps(text: str) -> float:
    value = _number(text, "a number in (0, 1)")
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}")
    return value


@distinct
def _seqlens(text: str) -> list[int]:
    return [positive_int(t) for t in words(text)]


@distinct
def _providers(text: str) -> list[str]:
    names = words(text)
    unknown = unknown_words(names, PROVIDERS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown provider(s) {unknown}; choose from {', '.join(PROVIDERS)}")
    return names


@distinct
def _configs(text: str) -> list[tuple[int, int, int]]:
    shapes = []
    for cfg in words(text):
        parts = cfg.split("x")
        if len(parts) not in (2, 3):
            raise argparse.ArgumentTypeError(f"config {cfg!r}: expected DxHq or DxHqxHkv")
        try:
            D, Hq, *rest = (positive_int(x) for x in parts)
        except argparse.ArgumentTypeError as e:  # "expected a positive integer, got ''" named no config, of several
            raise argparse.ArgumentTypeError(f"config {cfg!r}: {e}") from None
        Hkv = rest[0] if rest else Hq
        if Hq % Hkv:
            raise argparse.ArgumentTypeError(f"config {cfg!r}: Hq = {Hq} is not a multiple of Hkv = {Hkv}")
        shapes.append((D, Hq, Hkv))
    return shapes


def configure_attention(p: argparse.ArgumentParser) -> None:
    p.add_argument("--providers", type=_providers, default=None,
                   help=f"comma list of {', '.join(PROVIDERS)} (default: all of them; foxformer,sdpa on a CPU)")
    p.add_argument("--seqlens", type=_seqlens, default=None,
                   help="comma list of sequence lengths T (default 2048,8192,16384,65536; CPU: 512,2048)")
    p.add_argument("--configs", type=_configs, default=None,
                   help="comma list of DxHq or DxHqxHkv (GQA; Hq a multiple of Hkv); default 64x24,128x12,128x12x2 "
                        "(CPU: 16x4,64x8, the tiny and small presets' FoX heads)")
    p.add_argument("--tokens", type=positive_int, default=None,
                   help="tokens a call, B * T: each --seqlens T runs B = tokens / T sequences, so it must be a multiple "
                        "of every T (default 32768; CPU 4096; left out, a T that does not divide it runs as many "
                        "whole sequences as fit, at least one, with a note)")
    p.add_argument("--prune", action="store_true",
                   help="add foxformer rows with tile pruning (realistic and open gates)")
    # None: left out, which --prune fills in (attention_defaults) and _check_attention refuses given without it
    p.add_argument("--prune-eps", type=_eps, default=None,
                   help="with --prune: the most attention probability a query row may lose to the tiles pruned, "
                        "in (0, 1) (default: 0.001)")
    p.add_argument("--qk-bound", type=_bound, default=None,
                   help="with --prune: 'auto' (a pass over the norms of q and k, timed with the op; the default) or a "
                        "given bound U on |scale * q . k| (no pass: what a QK-norm model gets for free)")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="also run each row's forward+backward 4 more times under torch.profiler: kernel tables and "
                        "the device's idle time per step in DIR")
    p.add_argument("--rounds", type=positive_int, default=1,
                   help="time every case of a shape this many times, the providers interleaved and their order rotated "
                        "by one each round, and report medians (each round's times are kept in the JSON)")
    # no argparse choices: cuda:N is refused by attention_defaults in words that say what to do instead. auto, as
    # bench model's and decode's: the GPU's default alone sent a user without one to "use 'cpu', or 'auto'".
    p.add_argument("--device", default="auto",
                   help=f"{_AUTO_HELP}, cpu or cuda (no cuda:N: pick the GPU with CUDA_VISIBLE_DEVICES); the CPU "
                        "times foxformer's torch backend against sdpa in float32, wall-clock medians")
    no_progress_arg(p, "the timed cases")
    _out_arg(p, "bench_attention.json")
    # None until attention_defaults fills --tokens in: then whether the command line gave it (the JSON's settings
    # record it beside the rows' B, which a --tokens left out may not divide)
    p.set_defaults(func=_runner("attention", _check_attention), tokens_given=None)


# What `bench attention` runs where the command line leaves it out: a GPU's sweep, and a CPU's at sizes it times in
# seconds.
ATTENTION_DEFAULTS = {
    "cuda": dict(providers=list(PROVIDERS), seqlens=[2048, 8192, 16384, 65536],
                 configs=[(64, 24, 24), (128, 12, 12), (128, 12, 2)], tokens=32768),
    "cpu": dict(providers=["foxformer", "sdpa"], seqlens=[512, 2048], configs=[(16, 4, 4), (64, 8, 8)], tokens=4096),
}


def device_type(device: str) -> str:
    """'cpu' or 'cuda': the type of --device ``device``, 'auto' resolved; one this machine lacks (or no device at all)
    is resolve_device's ValueError, which starts with "--device"."""
    from foxformer.train.distributed import resolve_device

    return resolve_device(device, "--device").type


def fill_defaults(args: argparse.Namespace, defaults: dict[str, dict], device: str) -> argparse.Namespace:
    """args with every option of ``defaults[device]`` that the command line left out (None) filled in: what a
    benchmark runs on a GPU, or on a CPU at sizes it times in seconds. run_record then records the values that ran.
    Copies: a run that changed a list it was given changed the table's."""
    for key, value in defaults[device].items():
        if getattr(args, key) is None:
            setattr(args, key, copy.deepcopy(value))
    return args


def attention_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """args with --device auto resolved and every option left out filled in for its --device (--prune's with
    --prune)."""
    from foxformer.train.distributed import resolve_device

    # "cpu" and "cuda" are taken as they are: the defaults of a GPU are asked for on machines without one (run
    # checks the GPU is there)
    if args.device not in ("cpu", "cuda"):
        device = resolve_device(args.device, "--device")
        if device.index is not None:
            # the rows and their record name the device by its type ("cuda"), and the kernels run on the current GPU
            raise ValueError(f"--device: bench attention times on the current GPU and takes no index, got "
                             f"{args.device!r}; pass cuda and pick the GPU with CUDA_VISIBLE_DEVICES={device.index}")
        args.device = device.type
    if args.tokens_given is None:
        args.tokens_given = args.tokens is not None
    fill_defaults(args, ATTENTION_DEFAULTS, args.device)
    if args.prune:
        args.prune_eps = 1e-3 if args.prune_eps is None else args.prune_eps
        args.qk_bound = "auto" if args.qk_bound is None else args.qk_bound
    return args


def attention_batch(tokens: int, T: int) -> int:
    """B of a --seqlens T row: the whole sequences of T in --tokens, at least one (only where --tokens was left out
    can T not divide it: _check_attention)."""
    return max(1, tokens // T)


def _uneven_seqlens(args: argparse.Namespace) -> list[int]:
    return [T for T in args.seqlens if args.tokens % T]


def note_default_tokens(args: argparse.Namespace) -> None:
    """Where --tokens was left out, the T its default does not divide run the whole sequences that fit, at least one
    (the GPU's sweep runs T 65536 against its 32768): said on stderr as the run starts, after every check."""
    uneven = _uneven_seqlens(args)
    if not uneven or args.tokens_given:
        return
    runs = "; ".join(f"T {T} runs B = {attention_batch(args.tokens, T)}, {attention_batch(args.tokens, T) * T} "
                     f"tokens a call" for T in uneven)
    print(f"note: --tokens left out ({args.tokens} a call), which --seqlens {_commas(uneven)} "
          f"{'do' if len(uneven) > 1 else 'does'} not divide: {runs} (the rows' B)", file=sys.stderr)


def _check_attention(args: argparse.Namespace) -> None:
    """Before any timing: a provider no CPU times, under --device cpu (or auto on a machine without a GPU), made a
    row of its error and the run's exit 0; --prune-eps and --qk-bound without --prune were unused without a word
    (the op refuses a bound for a call it does not prune); a --tokens given that is no whole number of sequences of
    some T ran B = 1 there (a --tokens under T) or the whole sequences that fit, other calls than asked, without a
    word."""
    given = [flag for flag, value in (("--prune-eps", args.prune_eps), ("--qk-bound", args.qk_bound))
             if value is not None]
    if given and not args.prune:
        raise ValueError(f"{' and '.join(given)} {'set' if len(given) > 1 else 'sets'} the pruned rows of --prune: "
                         f"add --prune, or leave {'them' if len(given) > 1 else 'it'} out")
    typed = args.device
    attention_defaults(args)
    asked = [p for p in args.providers if p in NEEDS_CUDA]
    if args.device == "cpu" and asked:
        # auto, the default, is named with why it came to the CPU: "with --device cpu" read as a flag never typed
        on = "--device cpu" if typed == "cpu" else f"--device {typed}, and no GPU is visible"
        raise ValueError(f"--providers {','.join(asked)}: {'; '.join(NEEDS_CUDA[p] for p in asked)}; on the CPU "
                         f"({on}) choose from {', '.join(p for p in PROVIDERS if p not in NEEDS_CUDA)}")
    uneven = _uneven_seqlens(args)
    if args.tokens_given and uneven:
        raise ValueError(f"--tokens {args.tokens} is not a whole number of sequences of --seqlens "
                         f"{_commas(uneven)} (each T runs B = tokens / T of them): the smallest --tokens for --seqlens "
                         f"{_commas(args.seqlens)} is {math.lcm(*args.seqlens)}, and any multiple of it fits")


# What `bench model` runs where the command line leaves it out (model_defaults): the GPU's 125M FoX (Pro), FoX
# (LLaMA) and Transformer (LLaMA) rows, and the same three at the tiny size on a CPU: `bench model --device cpu`
# ran in 31 s on a 2-core machine (OMP_NUM_THREADS=1, with the LLaMA anchor; ~0.85 s a step, steps and warm-up as on
# a GPU). 4096 tokens a step took 108 s there, the vocabulary's logits most of it.
MODEL_DEFAULTS = {
    "cuda": dict(presets="fox-pro-125m,fox-llama-125m,transformer-llama-125m", context=16384, tokens_per_step=65536),
    "cpu": dict(presets="fox-pro-tiny,fox-llama-tiny,transformer-llama-tiny", context=512, tokens_per_step=1024),
}


def model_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """args with every sizing option left out filled in for the type of its --device (bench/model.py's _check, before
    it checks them)."""
    return fill_defaults(args, MODEL_DEFAULTS, device_type(args.device))


def _presets(text: str) -> str:
    """--presets as typed (the JSON records it so), refused as it is parsed for an empty entry: "fox-pro-tiny,"
    ended in "--presets : unknown preset ''" once parsed."""
    words(text)
    return text


def configure_model(p: argparse.ArgumentParser) -> None:
    # None: left out, which model_defaults fills in for the device (a CPU ran the GPU's 125M models at 16384 tokens
    # of context until the OOM killer ended it without a word)
    p.add_argument("--presets", type=_presets, default=None,
                   help="comma list of preset names, each optionally with FoxConfig overrides of its own after "
                        "colons (fox-pro-125m:head_dim=128 times FoX (Pro) 125M with 6 heads of 128); default "
                        f"{MODEL_DEFAULTS['cuda']['presets']} (CPU: {MODEL_DEFAULTS['cpu']['presets']})")
    # Counts refused as they are parsed, as bench decode's are: "--steps must be >= 1" came after parsing, in words
    # of its own. That --tokens-per-step is a multiple of --context relates two flags: bench/model.py's _check.
    p.add_argument("--context", type=positive_int, default=None,
                   help=f"tokens per sequence (default {MODEL_DEFAULTS['cuda']['context']}; CPU: "
                        f"{MODEL_DEFAULTS['cpu']['context']})")
    p.add_argument("--tokens-per-step", type=positive_int, default=None,
                   help=f"tokens per training step, a multiple of --context: B = tokens / context sequences "
                        f"(default {MODEL_DEFAULTS['cuda']['tokens_per_step']}; CPU: "
                        f"{MODEL_DEFAULTS['cpu']['tokens_per_step']})")
    p.add_argument("--steps", type=positive_int, default=5,
                   help="timed training steps per row, whose median is reported")
    p.add_argument("--warmup", type=non_negative_int, default=2, help="untimed training steps before them")
    p.add_argument("--dtype", choices=DTYPES, default="bf16", help="autocast dtype")
    # None: left out, which a row setting its own attention_backend is told apart from (bench/model.py's _check)
    p.add_argument("--backend", default=None, help="forgetting_attention backend (default: auto)")
    p.add_argument("--vocab-size", type=positive_int, default=None,
                   help="vocabulary of every row's model and its anchor (default: each preset's own)")
    p.add_argument("--device", default="auto", help=_DEVICE_HELP)
    p.add_argument("--peak-flops", type=float, default=None,
                   help="per-device peak FLOP/s for the 'mfu' column; default: the dense peak of known GPUs for "
                        "--dtype (bf16 / fp16: 989e12 on H100/H200, as in the training logs; fp32: the TF32 peak "
                        "where TF32 matmuls are allowed, else the plain fp32 one), none on CPU")
    p.add_argument("--compile", action="store_true", help="torch.compile every model")
    p.add_argument("--fused-loss", action="store_true",
                   help="our models compute the loss through the LM head in chunks (no [B, T, V] logits)")
    p.add_argument("--grad-ckpt", action="store_true", help="activation checkpointing")
    p.add_argument("--no-anchor", dest="anchor", action="store_false",
                   help="skip transformers' LlamaForCausalLM (SDPA) anchor")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="also profile one step per model: DIR/<name>.txt, operators by self device time")
    p.add_argument("--gluon-fwd", type=_gluon_fwd, action="append", default=None, metavar="[D:]FIELD=VALUE,...",
                   help="the Gluon forward's FwdConfig with these fields, every head dim or D's (e.g. "
                        "64:max_free=true; 'default': as it is): times an option before it becomes a "
                        "default. Given more than once, each FoX row is compiled once and timed under every "
                        "setting in turn, --rounds times (one row each, named 'PRESET [setting]')")
    p.add_argument("--rounds", type=positive_int, default=1,
                   help="measure each row this many times, a FoX row's --gluon-fwd settings in turn each round; "
                        "its step time is the median over all rounds' steps")
    no_progress_arg(p, "each row's steps")
    _out_arg(p, "bench_model.json")
    p.set_defaults(func=_runner("model"))


# What `bench decode` runs where the command line leaves it out (decode_defaults; its preset: DEFAULT_DECODE_PRESET):
# `bench decode --device cpu` ran in 15 s on a 2-core machine (OMP_NUM_THREADS=1, fox-pro-tiny with and without
# eviction and the LLaMA anchor; steps and warm-up as on a GPU).
DECODE_DEFAULTS = {"cuda": dict(contexts=[4096, 8192, 16384, 32768, 65536], batches=[1, 32]),
                   "cpu": dict(contexts=[512, 2048], batches=[1, 4])}


def _commas(values: list) -> str:
    return ",".join(map(str, values))


def decode_defaults(args: argparse.Namespace) -> str:
    """The type of args' --device, with --contexts and --batches filled in for it where left out (_check_decode, which
    fills the preset too where no --model is given)."""
    device = device_type(args.device)
    fill_defaults(args, DECODE_DEFAULTS, device)
    return device


def _check_decode(args) -> None:
    # Caught before any model is built: later they end in tracebacks (eviction_delta's ValueError, a math
    # domain error in the realistic gates, an IndexError on an empty batch). The names of the decode paths
    # and the eviction checks live beside torch (kvcache, decode_steps): imported here, when the benchmark
    # runs anyway, so that parsing and --help stay free of torch.
    from foxformer.models.kvcache import FoxCache, check_eviction

    from .decode import preset_model_config
    from .decode_steps import HF_PATHS

    device = decode_defaults(args)
    check_eviction(args.evict_eps, args.evict_qk_bound, label="--{}")
    if args.gate_tmax is not None and not (args.gate_tmax > 0 and math.isfinite(args.gate_tmax)):
        raise ValueError(f"--gate-tmax must be a finite number > 0, got {args.gate_tmax}")
    # each unknown name with the closest known one, as an unknown preset or provider is answered
    bad = unknown_words(args.decode, FoxCache.DECODE_MODES)
    if bad:
        raise ValueError(f"--decode: expected comma-separated decode paths from {', '.join(FoxCache.DECODE_MODES)}, "
                         f"got {bad}")
    anchors = args.anchors.split(",") if args.anchors != "auto" else []
    bad = unknown_words(filter(None, anchors), HF_PATHS)
    if bad:
        raise ValueError(f"--anchors must be auto or comma-separated from {', '.join(HF_PATHS)}, got {bad}")
    if len(set(anchors)) < len(anchors):
        raise ValueError(f"--anchors names an anchor more than once: {args.anchors!r}")
    if args.profile and args.kernel:
        raise ValueError("--profile profiles whole-model decode steps; --kernel times the attention op alone")
    # Each of these was dropped without a word: --kernel timed the op at --preset's head shape whatever --model was,
    # --num-splits applies to --kernel rows only, and --gate-tmax shapes the gates --gates realistic sets on a preset.
    if args.kernel and args.model:
        raise ValueError("--kernel times the attention op at a preset's head shape, not a --model's: pass --preset "
                         "(the preset of the model's shape) instead of --model")
    if args.num_splits is not None and not args.kernel:
        raise ValueError("--num-splits sets the key splits of the decode op's rows under --kernel; add --kernel, or "
                         "leave --num-splits out")
    if args.gate_tmax is not None and (args.model or args.gates == "init"):
        kept = "a --model keeps its trained gates" if args.model else "--gates init keeps the initial ones"
        raise ValueError(f"--gate-tmax sets the timescales of the gates --gates realistic gives a --preset; {kept}: "
                         "leave it out")
    # None: left out. A --model brings its own vocabulary and trained gates, so these, given beside it, were
    # dropped without a word as --gate-tmax was; the preset's defaults are filled in here. --preset beside it set
    # the block of the Transformer baseline alone (a FoX (LLaMA) model got a Transformer (Pro) one), which now
    # follows the model's own block and size.
    if args.model:
        if args.preset is not None:
            raise ValueError(f"--preset {args.preset} names the model to build, and --model {args.model} is the "
                             f"model to bench (the transformer baseline takes its block and size): pass one of them")
        own = {"--vocab-size": "its own vocabulary", "--gates": "its trained gates"}
        given = [flag for flag in own if getattr(args, flag[2:].replace("-", "_")) is not None]
        if given:
            raise ValueError(f"{' and '.join(given)} {'shape' if len(given) > 1 else 'shapes'} the model built from a "
                             f"--preset; a --model keeps {' and '.join(own[f] for f in given)}: leave "
                             f"{'them' if len(given) > 1 else 'it'} out")
    else:
        args.preset = args.preset or DEFAULT_DECODE_PRESET[device]
        args.gates = args.gates or "realistic"
        args.vocab_size = preset_model_config(args).vocab_size


def configure_decode(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default=None,
                   help=f"fox-*, transformer-* or linear-* preset (default: {DEFAULT_DECODE_PRESET['cuda']}; CPU: "
                        f"{DEFAULT_DECODE_PRESET['cpu']}; the baseline is transformer-<block>-<size>)")
    p.add_argument("--model", default=None, help="bench a trained FoX model (run dir / HF folder) instead of a "
                   "--preset (the baseline: the transformer preset of its block and size)")
    p.add_argument("--vocab-size", type=positive_int, default=None,
                   help="vocabulary of the --preset model (default: the preset's; a --model has its own)")
    # Counts refused as they are parsed, in the words of every other command's: a negative --warmup ran no warm-up
    # and sized the cache short of the steps (a misleading evict_max_len error), and the others ended in tracebacks.
    # None: left out, which decode_defaults fills in for the device
    p.add_argument("--contexts", type=distinct(positive_ints), default=None,
                   help=f"comma list of context lengths, the tokens in the cache when the timed steps start (default "
                        f"{_commas(DECODE_DEFAULTS['cuda']['contexts'])}; CPU: "
                        f"{_commas(DECODE_DEFAULTS['cpu']['contexts'])})")
    p.add_argument("--batches", type=distinct(positive_ints), default=None,
                   help=f"comma list of batch sizes, a row each per context (default "
                        f"{_commas(DECODE_DEFAULTS['cuda']['batches'])}; CPU: "
                        f"{_commas(DECODE_DEFAULTS['cpu']['batches'])})")
    p.add_argument("--steps", type=positive_int, default=32, help="timed decode steps per row")
    p.add_argument("--warmup", type=non_negative_int, default=4, help="untimed decode steps before them")
    p.add_argument("--prefill-chunk", type=positive_int, default=8192,
                   help="tokens per forward while the cache is filled to the context, at batch <= 4; larger "
                        "batches take proportionally fewer, at least 128")
    p.add_argument("--evict-eps", type=float, default=1e-3,
                   help="tolerance of the +evict rows, in (0, 1): the keys a row evicts carry at most this much of "
                        "its attention")
    p.add_argument("--evict-qk-bound", type=float, default=None,
                   help="without QK-norm: your bound U >= |scale q.k| (your contract); without it (or the model "
                        "config's evict_qk_bound) the +evict row is skipped")
    p.add_argument("--gates", choices=("realistic", "init"), default=None,
                   help="gate biases of the --preset model (default: realistic; a --model keeps its trained ones)")
    p.add_argument("--gate-tmax", type=float, default=None,
                   help="longest decay timescale of the realistic gates, in tokens (default: the longest of "
                        "--contexts)")
    p.add_argument("--decode", type=distinct(words), default=["auto"],
                   help="comma-separated decode paths of the foxformer model (a row each): auto (CUDA graphs where "
                        "possible), graphs, compiled (graphs of the torch.compile'd step), static, eager")
    p.add_argument("--anchors", default="auto", help="comma-separated transformers Llama anchors: sdpa (eager, "
                   "DynamicCache), static-compiled (StaticCache + torch.compile reduce-overhead); auto: both on "
                   "CUDA, sdpa on the CPU")
    p.add_argument("--no-baseline", dest="baseline", action="store_false", help="skip the LLaMA anchors")
    p.add_argument("--kernel", action="store_true",
                   help="time the attention op alone (FoX decode op vs SDPA) at the preset's head shape")
    p.add_argument("--num-splits", type=distinct(positive_ints), default=None,
                   help="with --kernel: also a row per key-split count of the decode kernel (the default picks one "
                        "to fill the GPU)")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="after each row's timed steps, profile 8 more: DIR/<row>_<path>_<context>_b<batch>.txt, "
                        "operators and kernels by self device time")
    p.add_argument("--device", default="auto", help=_DEVICE_HELP)
    p.add_argument("--dtype", default="auto", choices=("auto", *DTYPES),
                   help="the models' dtype; auto: bf16 on a GPU, fp32 on the CPU (the JSON's dtype says which ran)")
    no_progress_arg(p, "loading --model, the rows")
    _out_arg(p, "bench_decode.json")
    p.set_defaults(func=_runner("decode", _check_decode))


def configure_scaling(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", help="training run folders (metrics.jsonl); the first is the reference")
    p.add_argument("--skip", type=non_negative_int, default=5,
                   help="logged training steps at the start of each run left out of its tokens/s median (compilation "
                        "and allocator warm-up; a run with no more logged steps keeps them all)")
    p.add_argument("--tolerance", type=float, default=0.01,
                   help="largest relative loss difference, |loss - reference loss| / reference loss, at any shared "
                        "step that still counts as a match (0.01: 1%%)")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 when a run does not match or was trained with another setup than the reference")
    p.add_argument("--out", default=None,
                   help="JSON file for the table, the losses and the environment (default: none, the table only)")
    p.set_defaults(func=_runner("scaling"))


_MODEL_HELP = "training tokens/s and peak memory of whole models (and transformers' LlamaForCausalLM as anchor)"
_DECODE_HELP = "decode tokens/s and memory at long context (a preset with and without eviction, LLaMA SDPA)"
_ATTENTION_DESCRIPTION = ("Time Forgetting Attention's forward and forward+backward against torch's SDPA, fla and "
                          "FlexAttention over sequence lengths and head shapes, each on the same token budget (with "
                          "--prune: rows with adaptive computation pruning too). Prints a table of ms, TFLOP/s and "
                          "(on a GPU) peak memory under the device it ran on; --out (bench_attention.json) is "
                          "rewritten after each case.")
_SCALING_DESCRIPTION = ("Compare training runs of the same batches on different numbers of GPUs with the first, the "
                        "reference: loss difference at shared steps, tokens/s (median after --skip steps) and "
                        "scaling efficiency, from each run's metrics.jsonl and config.yaml. Prints a table; JSON "
                        "only with --out; exit 1 with --strict where a run does not match.")


def add_commands(sub) -> None:
    bench = sub.add_parser("bench", help="benchmarks (tables + JSON)",
                           description="Benchmarks on this machine: each prints a table and writes its rows, "
                                       "settings and environment as JSON to --out (bench_attention.json, "
                                       "bench_model.json, bench_decode.json; scaling only where --out is given).")
    inner = bench.add_subparsers(dest="bench_command", metavar="WHAT")
    configure_attention(inner.add_parser("attention", help="time Forgetting Attention against SDPA / fla / "
                                                           "FlexAttention", description=_ATTENTION_DESCRIPTION))
    configure_model(inner.add_parser("model", help=_MODEL_HELP, description=_MODEL_HELP))
    configure_decode(inner.add_parser("decode", help=_DECODE_HELP, description=_DECODE_HELP))
    configure_scaling(inner.add_parser("scaling", help="loss match and tokens/s scaling of runs on 1..N GPUs",
                                       description=_SCALING_DESCRIPTION))
    bench.set_defaults(func=lambda args: (bench.print_help(), 2)[1])
    configure_model(sub.add_parser("bench-model", help="the same as `bench model`", description=_MODEL_HELP))
    configure_decode(sub.add_parser("bench-decode", help="the same as `bench decode`", description=_DECODE_HELP))
