"""Input validation for the public Forgetting Attention functions.

Every rejection names the argument and what was expected, so that a wrong call fails here with a
ValueError or TypeError instead of deep inside a kernel (or, worse, silently).
"""
from __future__ import annotations

import itertools
import math
import os

import torch
from torch._subclasses.fake_tensor import is_fake
from torch.autograd.forward_ad import unpack_dual

from ...argtypes import did_you_mean

MAX_HEAD_DIM = 256
BACKENDS = ("auto", "gluon", "triton", "torch", "naive")
# the ops of the KV cache (decode, append, eviction scan) have no Gluon kernel, and no naive reference of their own
CACHE_BACKENDS = ("auto", "triton", "torch")
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_KERNEL_DTYPES = (torch.float16, torch.bfloat16)


class NonFiniteValueError(ValueError):
    """A gate holding NaN (or an infinite cumsum). Its own class: a caller whose gate comes from trained weights
    (the training loop) can tell a model that diverged from a wrong argument; ``what`` says it without the
    argument's fix, which is not the fix of a model that diverged (the loop gives its own)."""

    def __init__(self, what: str, fix: str = ""):  # one argument: the message, as pickle rebuilds it
        super().__init__(f"{what} {fix}" if fix else what)
        self.what = what


def _first_bad(bad: torch.Tensor) -> str:
    """How many entries of a [batch, seq, heads] mask are set and where the first is: "3 of 4096 entries, the first
    at batch 0, position 17, head 2" (the position tells a padded or cut-off input from a whole row gone bad)."""
    count = int(bad.sum())
    said = f"{count} of {bad.numel()} entries"
    if bad.dim() != 3:  # unwrapped from torch.func's batching: its leading dims are vmap's
        return said
    b, t, h = (int(i) for i in bad.nonzero()[0])
    return f"{said}, the first at batch {b}, position {t}, head {h}"


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def _without_values(x: torch.Tensor) -> bool:
    """Meta tensors and FakeTensorMode's tensors have shapes but no data: the value checks skip them, so that
    models build and trace on the meta device (they failed in Tensor.item())."""
    return x.is_meta or is_fake(x)


def values_checked(x: torch.Tensor) -> bool:
    """Whether the eager value checks read ``x``: on the CPU, where it is free, and on CUDA only with
    FOXFORMER_CHECK_VALUES=1 (a device sync each); never a tensor without data."""
    if _without_values(x):
        return False
    return x.device.type != "cuda" or os.environ.get("FOXFORMER_CHECK_VALUES", "0") == "1"


def unwrapped(x: torch.Tensor) -> torch.Tensor:
    """x under torch.func's wrappers (vmap's, grad's), every batch element's values at once: under torch.vmap, bool()
    of a batched tensor is data-dependent control flow, which vmap refuses, so the value checks read this instead."""
    while torch._C._functorch.is_functorch_wrapped_tensor(x):
        x = torch._C._functorch.get_unwrapped(x)
    return x


def _require_tensor(x, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")


def check_heads_tensor(x, name: str) -> None:
    """A [batch, seq, heads, head_dim] tensor of a float dtype."""
    _require_tensor(x, name)
    if x.dim() != 4:
        raise ValueError(f"{name} must be 4-D [batch, seq, heads, head_dim], got shape {tuple(x.shape)}")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {x.dtype}")


def check_qkv_tensors(q, k, v, gate, gate_name) -> None:
    """q, k, v: 4-D tensors of one float dtype; the gate a tensor (its shape is the caller's to check)."""
    for x, name in ((q, "q"), (k, "k"), (v, "v"), (gate, gate_name)):
        _require_tensor(x, name)
    for x, name in ((q, "q"), (k, "k"), (v, "v")):
        check_heads_tensor(x, name)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}; cast them "
                        f"with .to(q.dtype)")


def _fits(q, kv, gate) -> bool:
    B, Tq, Hq, D = q
    Bk, Tk, Hkv, Dk = kv
    return Bk == B and Dk == D and Hq > 0 and Hkv > 0 and Hq % Hkv == 0 and Tq <= Tk and gate == (B, Tk, Hq)


def _layout_fixes(q, k, gate) -> list[tuple[int, ...]]:
    """Which of (q, k and v, the gate) swapped in dims 1 and 2 make the shapes fit, when they do not as given: a
    [batch, heads, seq, ...] layout failed on whichever dim it first broke (heads "not a multiple", "more
    positions"), never saying the layout. Several answers are possible (T and H both 4 and 8): all are given."""
    shapes = (tuple(q.shape), tuple(k.shape), tuple(gate.shape))
    if gate.dim() != 3 or 0 in sum(shapes, ()) or _fits(*shapes):  # an empty dim swapped is no clue
        return []
    swap = lambda s: (s[0], s[2], s[1], *s[3:])  # noqa: E731
    return [combo for n in (1, 2, 3) for combo in itertools.combinations(range(3), n)
            if _fits(*(swap(s) if i in combo else s for i, s in enumerate(shapes)))]


def check_layout(q, k, gate, gate_name) -> None:
    """q, k (v: k's shape) and a [batch, seq, heads] gate: a ValueError naming the transposes that would fit them."""
    fixes = _layout_fixes(q, k, gate)
    if not fixes:
        return
    names = ("q", "k, v", gate_name)
    calls = " or ".join(", ".join(f"{x}.transpose(1, 2)" for i in combo for x in names[i].split(", "))
                        for combo in fixes)
    which = " (whichever matches how they were made)" if len(fixes) > 1 else ""
    raise ValueError(f"q {tuple(q.shape)}, k and v {tuple(k.shape)} and {gate_name} {tuple(gate.shape)} do not fit "
                     f"the layout q, k, v [batch, seq, heads, head_dim] and {gate_name} [batch, seq, heads], but would "
                     f"with seq and heads swapped in some of them (a [batch, heads, seq, ...] layout): pass "
                     f"{calls}{which}")


def check_qk_shapes(q, k) -> None:
    """q [B, Tq, Hq, D] and k [B, Tk, Hkv, D]: one batch and head dim, Hq a multiple of Hkv (4-D already)."""
    B, _, Hq, D = q.shape
    Bk, _, Hkv, Dk = k.shape
    if Bk != B:
        raise ValueError(f"batch mismatch: q has batch {B}, k and v have {Bk}")
    if Dk != D:
        raise ValueError(f"head_dim mismatch: q has {D}, k and v have {Dk}")
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim must be in [1, {MAX_HEAD_DIM}], got {D}")
    if Hq == 0 or Hkv == 0:
        raise ValueError(f"q and k, v need at least one head (dim 2 of [batch, seq, heads, head_dim]), got Hq={Hq}, "
                         f"Hkv={Hkv}")
    if Hq % Hkv != 0:
        raise ValueError(f"query heads ({Hq}) must be a multiple of key/value heads ({Hkv})")


def per_kv_head_hint(gate, gate_name: str, B: int, T: int, Hq: int, Hkv: int) -> str:
    """What to add to the refusal of a GQA gate (or c) given per key/value head, k and v's heads, where the ops
    take one per query head: they said only the shape it must have."""
    if Hkv == Hq or Hkv == 0 or tuple(gate.shape) != (B, T, Hkv):
        return ""
    return (f"; it has one entry per key/value head (Hkv={Hkv}), not per query head (Hq={Hq}): where a group's "
            f"query heads share one gate, pass {gate_name}.repeat_interleave({Hq // Hkv}, dim=2)")


def check_one_device(**named) -> None:
    """ValueError naming each tensor's device when they are not all on one (None: an argument not given)."""
    named = {name: t for name, t in named.items() if isinstance(t, torch.Tensor)}
    if len({t.device for t in named.values()}) > 1:
        where = ", ".join(f"{name} on {t.device}" for name, t in named.items())
        raise ValueError(f"all tensors must be on one device, got {where}; move them with .to(q.device)")


def check_common(q, k, v, gate, gate_name, softmax_scale, cu_seqlens, max_seqlen):
    """Validate shapes, dtypes and devices. Returns (softmax_scale, max_seqlen) resolved."""
    check_qkv_tensors(q, k, v, gate, gate_name)
    B, Tq, Hq, D = q.shape
    Tk = k.shape[1]
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    check_layout(q, k, gate, gate_name)
    check_qk_shapes(q, k)
    if Tq > Tk:  # Tk = 0 with queries too: a row with no key has no softmax (torch's attention makes it 0)
        raise ValueError(f"q has more positions (Tq={Tq}) than k and v (Tk={Tk}); queries are the last Tq keys' positions")
    if gate.shape != (B, Tk, Hq):
        # with Tq < Tk, the gates of the queries alone are the likely mistake: the bias needs every key's
        hint = (f"; it has one entry per key position (Tk={Tk}), not per query (Tq={Tq})"
                if Tq != Tk and gate.shape == (B, Tq, Hq) else "")
        hint = hint or per_kv_head_hint(gate, gate_name, B, Tk, Hq, k.shape[2])
        raise ValueError(f"{gate_name} must be [batch, Tk, Hq] = {(B, Tk, Hq)}, got {tuple(gate.shape)}{hint}")
    if gate.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{gate_name} must be a floating tensor, got {gate.dtype}")
    if gate_name == "c":
        check_c_dtype(gate)
    if cu_seqlens is not None:
        _require_tensor(cu_seqlens, "cu_seqlens")
    check_one_device(q=q, k=k, v=v, **{gate_name: gate}, cu_seqlens=cu_seqlens)
    softmax_scale = check_softmax_scale(softmax_scale, D)
    # int() would take "5", 5.7 or a tensor without a word (a SymInt is how torch.compile passes an int)
    if max_seqlen is not None and (isinstance(max_seqlen, bool) or not isinstance(max_seqlen, (int, torch.SymInt))):
        raise TypeError(f"max_seqlen must be an int or None, got {type(max_seqlen).__name__} {max_seqlen!r}")
    check_max_seqlen(cu_seqlens, max_seqlen)
    if cu_seqlens is not None:
        max_seqlen = _check_cu_seqlens(cu_seqlens, max_seqlen, B, Tq, Tk)
    return softmax_scale, max_seqlen


def check_c_dtype(c: torch.Tensor) -> None:
    """A precomputed gate cumsum c (forgetting_attention_cumsum, the decode op) must be float64. Other float dtypes
    were taken and cast: the decode output of an fp16 c was off by 4e-3 at 40 tokens and by 2 at 16K, that of an fp32
    c by 1e-4 at 16K (the torch path against a float64 c); the cast cannot bring back the low bits already lost, and
    every cache keeps c in float64."""
    if c.dtype != torch.float64:
        raise TypeError(f"c must be float64, got {c.dtype}: c is the cumulative sum of the log forget gates "
                        f"(gate_cumsum's result, what the KV caches keep), which grows with the context (tens of "
                        f"thousands at 64K tokens), and the bias c_i - c_j lives in the low bits a narrower dtype drops; "
                        f"keep the running sum in float64 (gate_cumsum)")


def check_max_seqlen(cu_seqlens, max_seqlen, name: str = "max_seqlen", offsets: str = "cu_seqlens") -> None:
    """max_seqlen only with cu_seqlens. Alone it was ignored without a word, a negative one too: a call that forgot
    cu_seqlens then attended across the documents packed into its row. ``name`` and ``offsets``: what the caller
    calls the two (a model's transformers markers max_length_q and cu_seq_lens_q)."""
    if max_seqlen is not None and cu_seqlens is None:
        raise ValueError(f"{name}={max_seqlen!r} was given without {offsets}: {name} only applies with {offsets} (the "
                         f"longest of the sequences it packs into one row); pass {offsets} as well, or leave {name} "
                         f"None for a batch of unpacked rows")


def check_return_lse(return_lse) -> None:
    if not isinstance(return_lse, bool):  # "yes" or a tensor would be taken for True (or raise) without a word
        raise TypeError(f"return_lse must be True or False, got {return_lse!r}")


def check_inputs(q, k, v, gate, name: str, softmax_scale, cu_seqlens, max_seqlen, return_lse):
    """The attention ops' argument checks (forgetting_attention with its gate log f, name "log_fgate"; the cumsum
    form with c, name "c", which may be positive): (softmax scale, max_seqlen) resolved."""
    scale, max_seqlen = check_common(q, k, v, gate, name, softmax_scale, cu_seqlens, max_seqlen)
    check_return_lse(return_lse)
    check_gate_values(gate, name, allow_positive=name == "c")
    return scale, max_seqlen


def check_softmax_scale(softmax_scale, head_dim: int):
    """The scale to use: 1 / sqrt(head_dim) for None, else a finite number (a SymFloat passes as is)."""
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    # A float that varies between calls turns symbolic under torch.compile (a SymFloat, on which
    # math.isfinite breaks the graph): compare instead, False for NaN and +-inf.
    # a bool is an int to isinstance: True was taken as a scale of 1.0 (1 / sqrt(D) was likely meant)
    if (isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float, torch.SymFloat))
            or not abs(softmax_scale) < math.inf):
        raise TypeError(f"softmax_scale must be a finite float or None, got {softmax_scale!r}")
    return softmax_scale if isinstance(softmax_scale, torch.SymFloat) else float(softmax_scale)


def _check_cu_seqlens(cu_seqlens, max_seqlen, B, Tq, Tk):
    if cu_seqlens.dtype != torch.int32:
        raise TypeError(f"cu_seqlens must be int32, got {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise ValueError(f"cu_seqlens must be 1-D [N + 1] (N >= 0 sequences), got shape {tuple(cu_seqlens.shape)}")
    if B != 1:
        raise ValueError(f"with cu_seqlens the sequences are packed along T and batch must be 1, got {B}")
    if Tq != Tk:
        raise ValueError(f"with cu_seqlens q and k must have the same length, got Tq={Tq}, Tk={Tk}")
    if _compiling():
        if max_seqlen is None:
            raise ValueError("max_seqlen must be given with cu_seqlens under torch.compile")
        # Reading cu_seqlens on the host would cost a device sync (and a graph break), so the checks
        # below run on the device: unchecked, the kernels' grid trusts max_seqlen (rows of a longer
        # segment stayed unwritten) and a bound past T reads out of bounds. A failure raises on CPU
        # and is a device-side assert on CUDA.
        lengths = cu_seqlens[1:] - cu_seqlens[:-1]
        # all() rather than min() and max(): true of N = 0 sequences, where min() of nothing raises
        ok = (cu_seqlens[0] == 0) & (cu_seqlens[-1] == Tk) & (lengths > 0).all() & (lengths <= max_seqlen).all()
        torch._assert_async(ok, "forgetting_attention: cu_seqlens must start at 0, end at T and increase "
                                "strictly, and max_seqlen must be >= its longest sequence")
        return int(max_seqlen)
    if _without_values(cu_seqlens):  # no bounds to read: T bounds every sequence
        return Tq if max_seqlen is None else int(max_seqlen)
    bounds = cu_seqlens.tolist()  # one small device-to-host copy checks everything below
    lengths = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
    if bounds[0] != 0 or bounds[-1] != Tk:
        raise ValueError(f"cu_seqlens must start at 0 and end at T={Tk}, got {bounds[0]} ... {bounds[-1]}")
    if any(n <= 0 for n in lengths):
        raise ValueError("cu_seqlens must be strictly increasing (every sequence at least 1 token)")
    longest = max(lengths, default=0)  # cu_seqlens [0]: T = 0 packs no sequence
    if max_seqlen is None:
        return longest
    if int(max_seqlen) < longest:
        raise ValueError(f"max_seqlen={max_seqlen} is shorter than the longest sequence ({longest})")
    return int(max_seqlen)


def check_gate_values(gate: torch.Tensor, name: str, allow_positive: bool = False) -> None:
    """Reject NaN (and positive log-gates; infinite c). Costs a device sync, so on CUDA it runs only with
    FOXFORMER_CHECK_VALUES=1, and never under torch.compile; compiled on CPU it is an assert (a RuntimeError without
    the eager message's detail)."""
    if _compiling():
        # a positive gate was taken without a word once compiled (a host check breaks the graph): on CPU, where the
        # eager checks always run, checked as _check_cu_seqlens checks its bounds
        if gate.device.type == "cpu":
            bad = torch.isnan(gate) | (torch.isinf(gate) if allow_positive else gate > 0)
            torch._assert_async(~bad.any(), f"{name} must not hold NaN, and must be "
                                            f"{'finite' if allow_positive else '<= 0 (log f, f in [0, 1])'}")
        return
    if not values_checked(gate):
        return
    gate = unwrapped(gate)
    nan = torch.isnan(gate)
    if nan.any():
        raise NonFiniteValueError(f"{name} contains NaN", f"({_first_bad(nan)}): a NaN gate comes from NaN in what "
                                  f"made it (the gate logits, their inputs or weights); find the first with "
                                  f"torch.isnan")
    # A cumsum c (allow_positive) is subtracted from itself: an infinite entry gives inf - inf = nan.
    inf = torch.isinf(gate) if allow_positive else None
    if inf is not None and inf.any():
        raise NonFiniteValueError(f"{name} must be finite", f"(gate_cumsum floors -inf gates), got inf "
                                  f"({_first_bad(inf)})")
    if not allow_positive and (gate > 0).any():
        raise ValueError(f"{name} must be <= 0 (it is log f with f in [0, 1]); use F.logsigmoid on the gate logits")


def check_differentiation(backend: str, *tensors: torch.Tensor) -> None:
    """Only "naive" is plain torch; the other backends are torch.library custom ops with a backward alone.
    Forward-mode AD (torch.func.jvp, jacfwd, torch.autograd.forward_ad) gave their outputs a zero tangent
    without a word, and torch.func.grad / jacrev failed with a message about autograd.Function internals."""
    if backend == "naive" or _compiling():
        return
    if any(unpack_dual(t).tangent is not None for t in tensors):
        raise RuntimeError(f"backend={backend!r} has no forward-mode derivative (torch.func.jvp, jacfwd, "
                           f"torch.autograd.forward_ad); use backend='naive'")
    if any(torch._C._functorch.is_gradtrackingtensor(t) for t in tensors):
        raise RuntimeError(f"backend={backend!r} does not run under torch.func.grad, vjp or jacrev (use "
                           f"tensor.backward() or torch.autograd.grad); or use backend='naive'")


def check_gate_cumsum(log_fgate, initial) -> None:
    """gate_cumsum's arguments: a list failed on .dim(), and a NaN or positive gate gave a c that every op then
    took as it was (the cumsum ops check only that c is finite)."""
    _require_tensor(log_fgate, "log_fgate")
    if log_fgate.dim() != 3:
        raise ValueError(f"log_fgate must be [B, T, H], got shape {tuple(log_fgate.shape)}")
    if log_fgate.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"log_fgate must be a floating tensor, got {log_fgate.dtype}")
    if initial is not None:
        _require_tensor(initial, "initial")
        if initial.shape != (log_fgate.shape[0], log_fgate.shape[2]):
            raise ValueError(f"initial must be [B, H] = {(log_fgate.shape[0], log_fgate.shape[2])}, "
                             f"got {tuple(initial.shape)}")
        if initial.dtype not in _FLOAT_DTYPES:
            raise TypeError(f"initial must be a floating tensor (the c of the last cached token), got {initial.dtype}")
        if initial.device != log_fgate.device:
            raise ValueError(f"initial must be on log_fgate's device {log_fgate.device}, got {initial.device}")
    check_gate_values(log_fgate, "log_fgate")


def check_backend(backend: str, choices: tuple[str, ...]) -> None:
    """Refuses a backend outside ``choices`` in one wording for every op here, offering the closest name: a typo
    such as 'trition' was told only the list to search."""
    if backend not in choices:
        raise ValueError(f"backend must be one of {choices}, got {backend!r}{did_you_mean(backend, choices)}")


def resolve_backend(backend: str, q: torch.Tensor) -> str:
    """The backend a call runs on. "auto": the Gluon Hopper kernels where they cover the call (an sm_90
    GPU, fp16 / bf16, head dim 64 or 128; hopper/dispatch.py), else the Triton kernels for CUDA fp16 /
    bf16, else torch."""
    check_backend(backend, BACKENDS)
    if backend == "auto":
        if not (q.is_cuda and q.dtype in _KERNEL_DTYPES):
            return "torch"
        return "gluon" if _gluon_reason(q.dtype, q.shape[-1], q.device) is None else "triton"
    if backend == "gluon":
        reason = _gluon_reason(q.dtype, q.shape[-1], q.device)
        if reason is not None:
            other = "'triton' or 'auto'" if q.is_cuda else "'torch' or 'auto'"  # triton wants CUDA tensors too
            raise ValueError(f"backend='gluon': {reason}; use backend={other}")
    if backend == "triton":
        check_triton_device(q)  # first: on a CPU the device, not the dtype, is what to change
        if q.dtype not in _KERNEL_DTYPES:
            raise TypeError(f"the triton backend takes float16 or bfloat16, got {q.dtype}; use backend='torch'")
    return backend


def check_triton_device(q: torch.Tensor) -> None:
    """The Triton kernels read CUDA tensors (CPU ones only under the interpreter): on a CPU tensor they
    failed with Triton's own "0 active drivers" traceback."""
    if not q.is_cuda and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise ValueError("backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1 for CPU tensors); use "
                         "backend='torch' or 'auto'")


# A constant while torch.compile traces: the device's capability and Triton's API do not change.
@torch.compiler.assume_constant_result
def _gluon_reason(dtype: torch.dtype, head_dim: int, device: torch.device) -> str | None:
    from .hopper.dispatch import device_capability, static_reason  # Triton's Gluon API: only when a call may use it

    return static_reason(dtype, head_dim, device_capability(device))
