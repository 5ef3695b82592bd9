"""`foxformer bench attention`: Forgetting Attention kernels against the attention ceilings.

FLOPs follow the causal convention: forward 2*B*H*T^2*D (half of the 4*B*H*T^2*D of full
attention), forward+backward 3.5 times that. Every provider is timed on the same token budget.

``--prune`` adds foxformer rows with adaptive computation pruning (prune_eps, qk_bound "auto") on
the realistic gates and on open gates (log f = 0: nothing can be pruned, so the row measures the
overhead), plus the unpruned open-gate row to compare with. Pruned rows report ``kept`` (fraction
of forward tiles kept, from ``pruning_stats``) and ``speedup`` over the unpruned row with the same
gates; their TFLOP/s count the dense causal FLOPs (an effective rate).
"""
from __future__ import annotations

import math
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from foxformer.train.distributed import resolve_device

from .cli import PROVIDERS, attention_batch, attention_defaults, note_default_tokens
from ..progress import bars_shown
from .common import ResultFile, device_heading, environment, print_table, run_record, time_ms, write_profile

# The backend of each foxformer provider (PROVIDERS, in bench/cli.py, says what they are).
_BACKEND_OF = {"foxformer": "auto", "gluon": "gluon", "triton": "triton"}


def realistic_log_fgate(B: int, T: int, H: int, device, generator=None) -> torch.Tensor:
    """Per-head decay timescales geometric in [2, T] plus N(0, 1) logit noise per token."""
    tau = torch.logspace(math.log10(2.0), math.log10(T), H, device=device, dtype=torch.float64)
    f = torch.exp(-1.0 / tau)
    logit = torch.log(f / (1 - f)).float()
    noise = torch.randn(B, T, H, device=device, generator=generator)
    return F.logsigmoid(logit + noise)


GATES = ("realistic", "open")


def _inputs(B, T, Hq, Hkv, D, device, dtype, gate="realistic"):
    # one seed per shape: pruned and unpruned rows time the very same tensors
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(B, T, Hq, D, device=device, dtype=dtype, generator=g)
    k = torch.randn(B, T, Hkv, D, device=device, dtype=dtype, generator=g)
    v = torch.randn(B, T, Hkv, D, device=device, dtype=dtype, generator=g)
    if gate == "open":
        log_f = torch.zeros(B, T, Hq, device=device)
    elif gate == "realistic":
        log_f = realistic_log_fgate(B, T, Hq, device, generator=g)
    else:
        raise ValueError(f"unknown gate {gate!r}; choose from {GATES}")
    return q, k, v, log_f


def _provider_fn(name, q, k, v, log_f, prune_eps=None, qk_bound="auto"):
    """A closure computing the provider's output from leaf tensors, or None if unavailable."""
    Hq, Hkv = q.shape[2], k.shape[2]
    if name in _BACKEND_OF:
        from foxformer import forgetting_attention
        # qk_bound only with prune_eps: the op refuses a bound for an unpruned call (it would change nothing)
        pruning = {} if prune_eps is None else dict(prune_eps=prune_eps, qk_bound=qk_bound)
        return lambda: forgetting_attention(q, k, v, log_f, backend=_BACKEND_OF[name], **pruning)
    if name in ("sdpa", "sdpa_flash", "sdpa_cudnn"):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        kinds = {"sdpa": None, "sdpa_flash": [SDPBackend.FLASH_ATTENTION],
                 "sdpa_cudnn": [SDPBackend.CUDNN_ATTENTION]}[name]
        # SDPA's native layout is [B, H, T, D]; its ceiling is measured there, without copies.
        qh, kh, vh = (x.detach().transpose(1, 2).contiguous().requires_grad_(x.requires_grad)
                      for x in (q, k, v))
        if name == "sdpa_cudnn" and not q.is_cuda:  # torch's own message says so past the row's 120 characters
            raise RuntimeError("SDPA's cuDNN kernels need a CUDA GPU")
        if Hq != Hkv:
            kh, vh = (x.detach().repeat_interleave(Hq // Hkv, 1).requires_grad_(x.requires_grad)
                      for x in (kh, vh))

        def run():
            if kinds is None:
                return F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
            with sdpa_kernel(kinds):
                return F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
        run.leaves = (qh, kh, vh)
        return run
    if name == "fla":
        from fla.ops.forgetting_attn import parallel_forgetting_attn
        return lambda: parallel_forgetting_attn(q, k, v, log_f)
    if name == "flex":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        B, T = q.shape[:2]
        c = torch.cumsum(log_f.float(), dim=1).transpose(1, 2).contiguous()   # [B, H, T]
        cq, ck = c, c.clone()  # two tensors: indexing one twice breaks the compiled backward

        def score_mod(score, b, h, qi, ki):
            return score + cq[b, h, qi] - ck[b, h, ki]

        mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, T, T, device=q.device)
        flex = torch.compile(flex_attention)
        qh, kh, vh = (x.detach().transpose(1, 2).contiguous().requires_grad_(x.requires_grad)
                      for x in (q, k, v))

        def run():
            return flex(qh, kh, vh, score_mod=score_mod, block_mask=mask, enable_gqa=Hq != Hkv)
        run.leaves = (qh, kh, vh)
        return run
    raise ValueError(f"unknown provider {name!r}; choose from {PROVIDERS}")


_SDPA_FORCED = {"sdpa_flash": "flash", "sdpa_cudnn": "cudnn"}


def _ran_on(name, fn, q, k, v) -> str:
    """The kernels a provider's row timed: the op's backend as resolved for these tensors (the foxformer provider's
    "auto" is the Gluon kernels on an H100 / H200, Triton's on other GPUs, the torch backend on a CPU), and the
    SDPA kernel torch picks itself for "sdpa" (its cuDNN, flash or memory-efficient one by GPU and version)."""
    if name in _BACKEND_OF:
        from foxformer.ops.forgetting_attn.interface import kernel_backend
        return kernel_backend(q, k, v, _BACKEND_OF[name])
    if name in _SDPA_FORCED:  # sdpa_kernel raises where it cannot run, so it is that kernel or an error row
        return _SDPA_FORCED[name]
    if name == "sdpa":
        from torch.nn.attention import SDPBackend
        try:  # a private torch function: a torch that moved it costs the row its label, not its timing
            choice = SDPBackend(torch._fused_sdp_choice(*fn.leaves, None, 0.0, True))
        except (AttributeError, TypeError, ValueError, RuntimeError):
            return "unknown"
        return {SDPBackend.FLASH_ATTENTION: "flash", SDPBackend.EFFICIENT_ATTENTION: "efficient",
                SDPBackend.CUDNN_ATTENTION: "cudnn", SDPBackend.MATH: "math"}.get(choice, "unknown")
    return name


# Several steps, as time_ms runs them (queued without a sync): the host's launch time then overlaps the
# device's work except before the first step, and the per-step idle time shows what the timed calls pay.
PROFILE_STEPS = 4


def bench_case(provider, B, T, Hq, Hkv, D, dtype=torch.bfloat16, device="cuda", gate="realistic",
               prune_eps=None, qk_bound="auto", profile_path=None):
    """One provider on one shape: forward and forward+backward times (and with profile_path, PROFILE_STEPS more
    forward+backwards back to back under torch.profiler: the kernel table and the device's idle time per step,
    as the timed calls run them, written there)."""
    q, k, v, log_f = _inputs(B, T, Hq, Hkv, D, device, dtype, gate)
    fwd_flops = 2.0 * B * Hq * T * T * D
    row = dict(provider=provider if prune_eps is None else f"{provider}+prune", gate=gate,
               T=T, B=B, Hq=Hq, Hkv=Hkv, D=D)
    try:
        fn = _provider_fn(provider, q, k, v, log_f, prune_eps, qk_bound)
    except ImportError as exc:  # an asked-for provider that is not installed gets a row that says so
        row["error"] = f"not installed: {exc}"[:160]
        return row
    except RuntimeError as exc:  # one that cannot run on this device
        row["error"] = str(exc)
        return row
    if prune_eps is not None:
        from foxformer.ops import pruning_stats
        row["prune_eps"], row["qk_bound"] = prune_eps, qk_bound
        kept = pruning_stats(q, k, log_f, prune_eps, qk_bound=qk_bound).mean(0)    # [Hq]
        row["kept"] = float(kept.mean())
        row["kept_per_head"] = [round(float(x), 4) for x in kept]
    cuda = q.device.type == "cuda"
    try:
        row["backend"] = _ran_on(provider, fn, q, k, v)
        with torch.no_grad():
            row["fwd_ms"] = time_ms(fn, cuda=cuda)
        leaves = getattr(fn, "leaves", (q, k, v))
        for x in (*leaves, log_f):
            x.requires_grad_(True)
        out = fn()
        do = torch.randn_like(out)

        def fwd_bwd():
            fn().backward(do)
        torch.cuda.reset_peak_memory_stats() if cuda else None
        row["fwd_bwd_ms"] = time_ms(lambda: fwd_bwd(), grad_to_none=(*leaves, log_f), cuda=cuda)
        if cuda:
            row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        if profile_path:
            with torch.profiler.profile() as prof:
                for _ in range(PROFILE_STEPS):
                    for x in (*leaves, log_f):
                        x.grad = None
                    fwd_bwd()
                torch.cuda.synchronize() if cuda else None
            write_profile(prof, profile_path, q.device, steps=PROFILE_STEPS)
    except Exception as exc:  # a provider that cannot run a shape is reported, not fatal
        row["error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
        return row
    row["fwd_tflops"] = fwd_flops / row["fwd_ms"] / 1e9
    row["fwd_bwd_tflops"] = 3.5 * fwd_flops / row["fwd_bwd_ms"] / 1e9
    return row


def run(args) -> int:
    args = attention_defaults(args)
    resolve_device(args.device, "--device")
    note_default_tokens(args)
    # A CPU computes the op in float32 (reference.py), so the CPU rows time float32 inputs.
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    providers, shapes = args.providers, args.configs
    record = {"env": environment(args.device), **run_record(args, "attention"),
              "dtype": str(dtype).removeprefix("torch."), "rounds": args.rounds}
    rows = []
    out = ResultFile(args.out)
    cases = [(p, "realistic", None) for p in providers]
    if args.prune:
        if "foxformer" not in providers:
            cases.append(("foxformer", "realistic", None))
        cases += [("foxformer", "realistic", args.prune_eps), ("foxformer", "open", None),
                  ("foxformer", "open", args.prune_eps)]
    # A GPU sweep runs for an hour: a bar over every timing with its ETA. Off a terminal (a log) the per-case lines
    # are the progress, as in train, and a bar's frames would only glue onto them.
    bar = tqdm(total=len(shapes) * len(args.seqlens) * args.rounds * len(cases), desc="bench attention",
               unit="case", disable=not bars_shown(not args.no_progress))
    for D, Hq, Hkv in shapes:
        for T in args.seqlens:
            B = attention_batch(args.tokens, T)
            # Rounds interleave the cases (every provider once, then again): a drift of the clock under the power
            # cap then reaches every provider alike instead of whichever ran at the time. Each round also starts one
            # case later, so that a drift within a round falls on every provider in turn (with as many rounds as
            # cases, each runs once in every position): in the twenty-sixth session's all-provider runs at 16K every
            # provider read ~2% slower after the first round, the Gluon kernels and CUDNN alike.
            timed = {case: [] for case in cases}
            for rnd in range(args.rounds):
                for provider, gate, eps in cases[rnd % len(cases):] + cases[:rnd % len(cases)]:
                    prof = (os.path.join(args.profile,
                                         f"{provider}_{gate}{'_prune' if eps else ''}_D{D}_{Hq}x{Hkv}_T{T}.txt")
                            if args.profile and rnd == 0 else None)
                    row = bench_case(provider, B, T, Hq, Hkv, D, dtype=dtype, device=args.device, gate=gate,
                                     prune_eps=eps, qk_bound=args.qk_bound, profile_path=prof)
                    timed[(provider, gate, eps)].append(row)
                    bar.update()
                    # four significant digits: three decimals read a CPU's 0.0012 TFLOP/s as 0.001 and 0.0004 as 0.0
                    tqdm.write(str({"round": rnd, **{k: (float(f"{v:.4g}") if isinstance(v, float) else v)
                                                     for k, v in row.items()}}))
                    sys.stdout.flush()  # a log sees each case as it ends
                    partial = [merge_rounds(v) for v in timed.values() if v]
                    out.write({**record, "rows": rows + partial})
                    torch.cuda.empty_cache() if args.device == "cuda" else None
            for (provider, gate, eps), per_round in timed.items():
                row = merge_rounds(per_round)
                if eps is not None:
                    _add_speedup(row, rows)
                rows.append(row)
    bar.close()
    cols = ["provider", "backend", "gate", "T", "B", "Hq", "Hkv", "D", "fwd_ms", "fwd_tflops", "fwd_bwd_ms",
            "fwd_bwd_tflops", "peak_gib", "error"]
    if args.prune:
        cols[-1:-1] = ["kept", "speedup", "fwd_speedup"]
    table = print_table(rows, cols, device_heading(record["env"]))
    out.write({**record, "rows": rows, "table": table}, complete=True)
    if args.out:
        print(f"wrote {args.out}")
    return 0


def merge_rounds(per_round: list[dict]) -> dict:
    """One row from the same case timed in several rounds: the first round's row (shape, memory, errors) with the
    medians of its times, TFLOP/s from those medians, and every round's time kept beside them ("*_ms_rounds")."""
    row = dict(per_round[0])
    if len(per_round) == 1 or "error" in row:
        return row
    fwd_flops = 2.0 * row["B"] * row["Hq"] * row["T"] * row["T"] * row["D"]
    for key in ("fwd_ms", "fwd_bwd_ms"):
        times = [r[key] for r in per_round if key in r]
        row[f"{key}_rounds"] = times
        row[key] = statistics.median(times)
    row["fwd_tflops"] = fwd_flops / row["fwd_ms"] / 1e9
    row["fwd_bwd_tflops"] = 3.5 * fwd_flops / row["fwd_bwd_ms"] / 1e9
    return row


def _add_speedup(row: dict, rows: list[dict]) -> None:
    """Speed-up of a pruned row over the unpruned foxformer row with the same shape and gates."""
    keys = ("gate", "T", "B", "Hq", "Hkv", "D")
    for base in rows:
        if base["provider"] == "foxformer" and all(base[k] == row[k] for k in keys):
            if "fwd_bwd_ms" in base and "fwd_bwd_ms" in row:
                row["speedup"] = base["fwd_bwd_ms"] / row["fwd_bwd_ms"]
                row["fwd_speedup"] = base["fwd_ms"] / row["fwd_ms"]
            return
