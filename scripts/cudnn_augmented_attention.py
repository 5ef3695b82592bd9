"""Could FoX ride cuDNN's Hopper attention kernel? An experiment, not a backend.

Forgetting Attention's bias c_i - c_j has rank 2, so it fits in plain attention as extra q / k
channels: q' = [scale * q, c_i, 1], k' = [k, 1, -c_j] gives q' . k' = scale * q . k + c_i - c_j.
c (float64, |c| ~ 1e4 at 16K with f ~ 0.5) is split into three bf16 pieces hi + mid + lo so that the
channels carry it to ~2^-24 relative; D = 64 + 6 is padded to 72 (cuDNN wants a multiple of 8), and
SDPA's cuDNN backend then runs the whole thing, gradients of c included (autograd through the
pieces). Prints accuracy against the exact torch op and fwd+bwd time against our Triton kernel and
cuDNN at the plain D = 64 / D = 128 shapes, and writes JSON.

    PYTHONPATH=src python scripts/cudnn_augmented_attention.py --out cudnn_augmented.json

Fifth-session finding it tests (docs/bench/history.md, "Whole models"): cuDNN's D = 128 kernel runs ~2x
faster per FLOP than our D = 64 kernel. Measured sixth session on an H200: the augmented D = 72 call
ran at 280 TFLOP/s (counting FoX's D = 64 FLOPs), against 285 for our kernel: no gain, since cuDNN's
fast path is for D = 64 / 128, and the gate gradient came back 10x less accurate (bf16 channels).
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from foxformer.ops import forgetting_attention, gate_cumsum


def bf16_pieces(c: torch.Tensor) -> torch.Tensor:
    """float64 [B, T, H] -> bf16 [B, T, H, 3] with hi + mid + lo = c to ~2^-24 relative; the gradient
    reaches c through hi (the others are differences of c with itself)."""
    hi = c.to(torch.bfloat16)
    rest = c - hi.double()
    mid = rest.to(torch.bfloat16)
    lo = (rest - mid.double()).to(torch.bfloat16)
    return torch.stack([hi, mid, lo], -1)


def augmented_attention(q, k, v, log_f, pad_v: bool = False):
    """Forgetting Attention through SDPA's cuDNN backend; q, k, v [B, T, H, D] (no GQA), log_f [B, T, H]."""
    B, T, H, D = q.shape
    p = bf16_pieces(gate_cumsum(log_f))
    one = torch.ones_like(p)
    width = (D + 6 + 7) // 8 * 8
    pad = q.new_zeros(B, T, H, width - D - 6)
    q2 = torch.cat([q * D ** -0.5, p, one, pad], -1)
    k2 = torch.cat([k, one, -p, pad], -1)
    v2 = torch.cat([v, q.new_zeros(B, T, H, width - D)], -1) if pad_v else v
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(q2.transpose(1, 2), k2.transpose(1, 2), v2.transpose(1, 2),
                                             is_causal=True, scale=1.0)
    return out.transpose(1, 2)[..., :D]


def sdpa_cudnn(q, k, v, log_f=None):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=True).transpose(1, 2)


def time_ms(fn, reps: int = 10) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def accuracy(T: int) -> dict:
    """Relative errors of out, dq, dk, dv, dlog_f against the exact torch op in fp32 (4 heads, D 64, gates
    from fast (f ~ 0.5) to slow)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, T, 4, 64, device="cuda", generator=g, dtype=torch.bfloat16).requires_grad_()
               for _ in range(3))
    bias = torch.tensor([0.0, 2.0, 5.0, 9.0], device="cuda")
    log_f = F.logsigmoid(torch.randn(1, T, 4, device="cuda", generator=g) + bias).requires_grad_()
    do = torch.randn(1, T, 4, 64, device="cuda", generator=g, dtype=torch.bfloat16)
    grads = {}
    runs = {"reference": lambda: forgetting_attention(q.float(), k.float(), v.float(), log_f, backend="torch"),
            "foxformer": lambda: forgetting_attention(q, k, v, log_f),
            "cudnn_augmented": lambda: augmented_attention(q, k, v, log_f)}
    for name, fn in runs.items():
        for t in (q, k, v, log_f):
            t.grad = None
        out = fn()
        out.backward(do.to(out.dtype))
        grads[name] = [out.detach(), q.grad, k.grad, v.grad, log_f.grad]
    keys = ("out", "dq", "dk", "dv", "dlog_f")
    return {name: dict(zip(keys, (rel(a, b) for a, b in zip(grads[name], grads["reference"]))))
            for name in ("foxformer", "cudnn_augmented")}


def speed(B: int, T: int) -> dict:
    """fwd+bwd ms and TFLOP/s (causal, 3.5x the forward FLOPs) at 125M FoX shapes (12 x 64) and the
    Transformer's (6 x 128)."""
    rows = {}
    cases = {"foxformer_d64": (forgetting_attention, 12, 64), "cudnn_augmented_d72": (augmented_attention, 12, 64),
             "sdpa_cudnn_d64": (sdpa_cudnn, 12, 64), "sdpa_cudnn_d128_6_heads": (sdpa_cudnn, 6, 128)}
    for name, (op, H, D) in cases.items():
        q, k, v, do = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=i < 3)
                       for i in range(4))
        log_f = F.logsigmoid(torch.randn(B, T, H, device="cuda") + 3).requires_grad_()

        def step():
            op(q, k, v, log_f).backward(do)
        ms = time_ms(step)
        rows[name] = {"ms": ms, "tflops": 2 * B * H * T * T * D * 3.5 / ms / 1e9}
        print(f"{name:26s} {ms:7.2f} ms {rows[name]['tflops']:6.1f} TFLOP/s", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="cudnn_augmented.json")
    args = ap.parse_args()
    result = {"env": {"torch": torch.__version__, "device": torch.cuda.get_device_name()},
              "accuracy": {f"T{T}": accuracy(T) for T in (4096, 16384)}, "speed_4x16k": speed(4, 16384)}
    for T, errs in result["accuracy"].items():
        for name, e in errs.items():
            print(T, name, " ".join(f"{k}={x:.1e}" for k, x in e.items()))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
