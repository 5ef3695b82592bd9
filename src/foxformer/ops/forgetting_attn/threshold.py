"""The pruning bound's threshold, without Triton: tile pruning (pruning.py) and KV-cache eviction
(models/kvcache/policy.py) both call it, and a standalone export (models/standalone.py) carries it."""
from __future__ import annotations

import math


def pruning_threshold(eps: float, qk_bound, n_keys: int):
    """delta = log(eps) - 2U - log(N): a key j with c[p_i] - c[j] <= delta carries at most eps / N of row i.

    The one formula behind tile pruning (``prune_delta``) and KV-cache eviction (with N the longest sequence the
    cache will hold). qk_bound U: a float or a float64 tensor (the result follows).
    """
    return math.log(float(eps)) - math.log(max(int(n_keys), 1)) - 2.0 * qk_bound
