"""exp2 split between the MUFU unit and the FMA pipe (FlashAttention-4's trick, written for Hopper).

At head dim 64 the forward's softmax needs one MUFU ``ex2`` per score, and by the published per-SM rates
(16 MUFU results a cycle; dense bf16 wgmma ~4096 FLOP a cycle) an SM's MUFU units take as long over a 64 x 128
tile as its tensor cores take over the tile's two products (about 512 cycles each; arithmetic, not a
measurement): the two pipes pace each other. ``exp2_split(x, POLY)`` computes one element in every
POLY with a polynomial on the FMA pipe instead (128 lanes a cycle, 11 operations an element), so MUFU
does (POLY - 1) / POLY of the work.

The polynomial element, for x <= 0 (softmax arguments after the row maximum is subtracted):
    2^x = 2^floor(x) * 2^f,  f = x - floor(x) in [0, 1)
floor(x) comes from adding 1.5 * 2^23 with rounding toward -inf (its low mantissa bits then hold floor(x),
no conversion instruction); 2^f is a degree-3 polynomial (relative error 1.03e-4, below bf16's 3.9e-3, which
P is rounded to anyway); the integer floor(x) shifted by 23 is added to the exponent bits. x < -126
gives exactly 0, as MUFU's ex2 does for -inf (the masked scores).
"""
from __future__ import annotations

import struct

import numpy as np

from .compat import gl, gluon

# 2^f on [0, 1), degree 3, c0 + f (c1 + f (c2 + f c3)), fitted for relative error (max 1.03e-4) with p(0) = 1 and
# p(1) = 2: exact at integer x (the row maximum's own score gives exactly 1) and continuous across them.
POLY_COEFFS = (1.0, 0.6954243488379713, 0.22630768165012655, 0.07826796951190212)


def _f32(x: float) -> str:
    """x as a PTX float32 literal (0fXXXXXXXX)."""
    return "0f%08X" % struct.unpack("<I", struct.pack("<f", x))[0]


def exp2_asm(pack: int) -> tuple[str, str]:
    """PTX and constraints of one call on `pack` elements: the first pack - 1 by MUFU, the last by the
    polynomial (outputs $0..$pack-1, inputs $pack..$2pack-1)."""
    c0, c1, c2, c3 = (_f32(c) for c in POLY_COEFFS)
    mufu = "".join(f"ex2.approx.ftz.f32 ${i}, ${pack + i};\n" for i in range(pack - 1))
    x, out = f"${2 * pack - 1}", f"${pack - 1}"
    poly = f"""{{
.reg .f32 fx, fj, fi, ff, fp;
.reg .b32 ej, pb;
.reg .pred lo;
max.ftz.f32 fx, {x}, {_f32(-126.0)};
add.rm.ftz.f32 fj, fx, {_f32(12582912.0)};
sub.ftz.f32 fi, fj, {_f32(12582912.0)};
sub.ftz.f32 ff, fx, fi;
fma.rn.ftz.f32 fp, ff, {c3}, {c2};
fma.rn.ftz.f32 fp, fp, ff, {c1};
fma.rn.ftz.f32 fp, fp, ff, {c0};
mov.b32 ej, fj;
shl.b32 ej, ej, 23;
mov.b32 pb, fp;
add.s32 pb, pb, ej;
setp.lt.f32 lo, {x}, {_f32(-126.0)};
selp.b32 pb, 0, pb, lo;
mov.b32 {out}, pb;
}}
"""
    return mufu + poly, ",".join(["=f"] * pack + ["f"] * pack)


# Gluon reads module-level constants only as gl.constexpr, one name each
ASM2, CON2 = (gl.constexpr(x) for x in exp2_asm(2))
ASM4, CON4 = (gl.constexpr(x) for x in exp2_asm(4))
ASM8, CON8 = (gl.constexpr(x) for x in exp2_asm(8))
SPLITS = (0, 2, 4, 8)  # the POLY values exp2_split takes (0: MUFU only)


def exp2_reference(x, pack: int):
    """What exp2_split computes, in float32 on the CPU (numpy), for tests: elements at index
    pack - 1 mod pack (in the order the kernel packs them: here, along the last axis) by the polynomial."""
    x = np.asarray(x, dtype=np.float32)
    out = np.exp2(x).astype(np.float32)
    if pack:
        xp = x[..., pack - 1::pack]
        fx = np.maximum(xp, np.float32(-126.0))
        fi = np.floor(fx).astype(np.float32)
        ff = (fx - fi).astype(np.float32)
        c0, c1, c2, c3 = (np.float32(c) for c in POLY_COEFFS)
        fp = (ff * c3 + c2).astype(np.float32)
        fp = (fp * ff + c1).astype(np.float32)
        fp = (fp * ff + c0).astype(np.float32)
        bits = fp.view(np.int32) + (fi.astype(np.int32) << 23)
        res = bits.view(np.float32)
        out[..., pack - 1::pack] = np.where(xp < -126.0, np.float32(0.0), res)
    return out


@gluon.jit
def exp2_split(x, POLY: gl.constexpr):
    """exp2 of a float32 tensor of x <= 0 (or -inf), one element in every POLY by the FMA-pipe polynomial;
    POLY = 0: all by MUFU (gl.exp2). POLY must be one of SPLITS and divide the elements per thread."""
    if POLY == 2:
        y = gl.inline_asm_elementwise(ASM2, CON2, [x], dtype=gl.float32, is_pure=True, pack=2)
    elif POLY == 4:
        y = gl.inline_asm_elementwise(ASM4, CON4, [x], dtype=gl.float32, is_pure=True, pack=4)
    elif POLY == 8:
        y = gl.inline_asm_elementwise(ASM8, CON8, [x], dtype=gl.float32, is_pure=True, pack=8)
    else:
        y = gl.exp2(x)
    return y
