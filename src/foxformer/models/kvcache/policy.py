"""The eviction policy: which cached keys decoding may drop for good (FoX only; DESIGN.md "Pruning bound").

After a step at position t with cumsum c_t, key j can never again carry more than eps / N of any later
query's attention once

    c_t - c_j <= delta = log(eps) - 2U - log(N)

because c never increases (later queries only push c_i - c_j lower), the query's own key keeps its
largest logit >= -U, and every logit is <= U. This is the bound of tile pruning, computed by the same
function (``pruning_threshold``, which ops/forgetting_attn/pruning.py calls). N is the longest sequence the cache
will hold (so the evicted keys of one row carry at most eps in total), U a bound on |scale * q . k|:

* with QK-norm: U from the norm weights (``Attention.eviction_bound``; RMS-normalised vectors have norm
  sqrt(D) before the weight, RoPE is a rotation and keeps norms);
* without it: ``qk_bound`` given by the user. That is the user's contract: the bound, and so the tolerance,
  holds only if no query/key pair ever exceeds it. Without either, the layer keeps every key.

Consequence for each attention output row: |out - out_evicted| <= 2 * eps * max_j |v_j| per coordinate
(the dropped mass is at most eps, and renormalising the kept mass moves it by as much).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from foxformer.argtypes import setting_name
from foxformer.ops.forgetting_attn.threshold import pruning_threshold

# Decode steps scan for dead keys every 8th step: on the H200 eviction added 2.4 ms to a 13.9 ms decode
# step of the 125M model at 64K (bench decode, 2026-11-29), almost all of it kernel launches.
EVICT_EVERY = 8
# Keys per head examined by a decode step's scan (the rest waits for later scans; keeping a key longer is
# always safe): O(window) reads of c per layer instead of the whole cache.
EVICT_WINDOW = 64

_FIELDS = {"eps": "evict_eps", "qk_bound": "evict_qk_bound", "max_len": "evict_max_len"}


def check_eviction(eps=None, qk_bound=None, max_len=None, *, label: str = "{}") -> None:
    """ValueError naming the setting for an invalid evict_eps / evict_qk_bound / evict_max_len (None passes).
    ``label`` formats the name (argtypes.setting_name): "FoxConfig.{}" for a config field, "--{}" for a flag. Worded
    as generate's and eval's own checks are ("--top-p: expected ..."): beside those, `--evict-max-len 0` read as the
    models layer's words rather than the flag's."""
    def name(field: str) -> str:
        return setting_name(label, _FIELDS[field])

    # What None means differs by caller (no eviction in a FoxConfig, the model config's setting in generate, the
    # default tolerance in `eval eviction`), so the message only says None passes, and not to a flag's user.
    none = "" if label.startswith("--") else " or None"
    # NaN fails every comparison below, so `not (0 < x < 1)` refuses it too.
    if eps is not None and (isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1):
        raise ValueError(f"{name('eps')}: expected a number in (0, 1){none}, got {eps!r}")
    if qk_bound is not None and (isinstance(qk_bound, bool) or not isinstance(qk_bound, (int, float))
                                 or not 0 <= qk_bound < math.inf):
        raise ValueError(f"{name('qk_bound')}: expected a finite number >= 0{none}, got {qk_bound!r}")
    if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1):
        raise ValueError(f"{name('max_len')}: expected a positive integer{none}, got {max_len!r}")


@dataclass(frozen=True)
class EvictionPolicy:
    """KV eviction settings, validated once here.

    eps: tolerance in (0, 1): the evicted keys of a row carry at most eps of its attention.
    qk_bound: the user's U >= |scale * q . k| for layers without QK-norm (None: those layers keep every key).
    max_len: N, the longest sequence the cache may hold; given, the model refuses to go past it. None: N is
        max_position_embeddings, raised to the length a generation announces (``n_keys``).
    """

    eps: float
    qk_bound: Optional[float] = None
    max_len: Optional[int] = None

    def __post_init__(self) -> None:
        if self.eps is None:
            raise ValueError("evict_eps: expected a number in (0, 1), got None (no eviction: pass no policy)")
        check_eviction(self.eps, self.qk_bound, self.max_len)

    @classmethod
    def resolve(cls, config, eps=None, qk_bound=None, max_len=None) -> Optional["EvictionPolicy"]:
        """The policy of these settings, each falling back to the model config's evict_* value; None when
        neither gives evict_eps (keep every key)."""
        eps = eps if eps is not None else getattr(config, "evict_eps", None)
        if eps is None:
            return None
        return cls(eps, qk_bound if qk_bound is not None else getattr(config, "evict_qk_bound", None),
                   max_len if max_len is not None else getattr(config, "evict_max_len", None))

    def with_defaults(self, config) -> "EvictionPolicy":
        """Unset qk_bound / max_len taken from the model config."""
        return EvictionPolicy.resolve(config, self.eps, self.qk_bound, self.max_len)

    def n_keys(self, max_position_embeddings: int, total_len: Optional[int] = None) -> int:
        """N of the bound: max_len, else max_position_embeddings raised to ``total_len`` (the tokens a
        generation will feed the cache; FoX may go past max_position_embeddings, and the tolerance would
        be void there)."""
        if self.max_len is not None:
            return int(self.max_len)
        return max(int(max_position_embeddings), int(total_len or 0))

    def deltas(self, bounds: Sequence[Optional[float]], n_keys: int) -> list[Optional[float]]:
        """One threshold per layer from its U (None: that layer keeps every key)."""
        return [None if u is None else float(pruning_threshold(self.eps, float(u), n_keys)) for u in bounds]


def output_tolerance(eps: float, v_max: float) -> float:
    """Largest change of one attention output coordinate that eviction may cause: 2 * eps * max|v|."""
    return 2.0 * eps * v_max
