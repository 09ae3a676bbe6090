"""How many distinct experts a batch wakes, and on the busiest device: the occupancy of
routed experts that sets a decode step's weight reads (:func:`expected_busiest_experts`).
"""

from __future__ import annotations

import math

from gpt2k3.accounting.spec import ArchSpec, check_spec
from gpt2k3.checks import (
    check_positive_int,
    is_int,
)

__all__ = ["expected_busiest_experts", "expected_busiest_experts_sampled"]


def _log_factorials(n: int):
    import numpy as np
    out = np.zeros(n + 1)
    if n:
        out[1:] = np.cumsum(np.log(np.arange(1, n + 1, dtype=np.float64)))
    return out



def _hypergeom(lf, pop: int, good, draws, j):
    """P(j of ``good`` marked among ``draws`` drawn without replacement from ``pop``), element-
    wise over numpy arrays; 0 where impossible."""
    import numpy as np
    good, draws, j = np.broadcast_arrays(np.asarray(good), np.asarray(draws), np.asarray(j))
    ok = (j >= 0) & (j <= good) & (draws - j >= 0) & (draws - j <= pop - good) & (draws <= pop)
    g, d, k = (np.where(ok, a, 0) for a in (good, draws, j))
    logp = (lf[g] - lf[k] - lf[g - k] + lf[pop - g] - lf[d - k] - lf[pop - g - d + k]
            - lf[pop] + lf[d] + lf[pop - d])
    return np.where(ok, np.exp(logp), 0.0)



#: Routing more tokens than this changes the distinct-expert distribution by less than this
#: share of its mass (far below float64's 2**-53): it has saturated.
_SATURATED = 2.0 ** -64



def _saturation_batch(n_experts: int, top_k: int) -> int:
    """The batch from which ``batch`` tokens leave any expert unpicked with probability below
    :data:`_SATURATED`: ``P(D < E) <= E (1 - k/E)^B`` (a union bound over the experts), solved
    for ``B``. Independent of the batch asked for; about 2,900 for Kimi K3 (896 experts, 16 a
    token)."""
    if top_k >= n_experts:
        return 1                                     # one token picks every expert
    return max(1, math.ceil(math.log(_SATURATED / n_experts) / math.log1p(-top_k / n_experts)))



def _one_token(p, steps, n_experts: int):
    """The law of the distinct-expert count after one more token: from ``u`` distinct so far,
    its picks add ``j`` new ones with probability ``steps[j][u]``."""
    import numpy as np
    q = np.zeros_like(p)
    for j, w in enumerate(steps):
        q[j:] += (p * w)[:n_experts + 1 - j]
    return q



def _distinct_experts_distribution(n_experts: int, top_k: int, batch: int) -> list[float]:
    """The distribution of the number of distinct experts ``batch`` tokens touch in one MoE
    layer (each token picks ``top_k`` of ``n_experts`` uniformly, without repeats, independently
    of the others): element ``d`` is the probability of exactly ``d``.  Its mean is
    :func:`~gpt2k3.accounting.decode.expected_distinct_experts`.

    Exact, token by token, up to :func:`_saturation_batch` tokens; past it the law has
    saturated (all but a ``2**-64`` share of the mass sits on "every expert"), so the work is
    bounded by ``(top_k + 1) * _saturation_batch`` vector steps whatever the batch.  The
    arguments are checked by the public entry.
    """
    import numpy as np
    lf = _log_factorials(n_experts)
    u = np.arange(n_experts + 1)
    steps = [_hypergeom(lf, n_experts, n_experts - u, top_k, j) for j in range(top_k + 1)]
    p = np.zeros(n_experts + 1)
    p[0] = 1.0
    for _ in range(min(batch, _saturation_batch(n_experts, top_k))):
        p = _one_token(p, steps, n_experts)
        if p[n_experts] >= 1.0:  # every expert already touched: nothing left to change
            break
    return [float(x) for x in p]



def _busiest_experts(n_experts: int, top_k: int, batch: int, n_devices: int) -> float:
    """Expected number of distinct picked experts on the *busiest* device of one MoE layer.

    The ``n_experts`` routed experts of a layer are spread as evenly as they go over
    ``n_devices`` devices (``ceil(E/n)`` on the fullest), and ``batch`` tokens each pick
    ``top_k`` of them uniformly and independently (the model of
    :func:`~gpt2k3.accounting.decode.expected_distinct_experts`).  A device reads the experts
    of its own that anybody picked; the layer waits for the device with the most.  This returns
    ``E[max over devices]``, computed exactly (no sampling): by symmetry the ``D`` distinct
    experts the batch touches are a uniformly random ``D``-subset
    (:func:`_distinct_experts_distribution` gives ``D``'s law), and the chance that no device
    holds more than ``m`` of a uniform subset follows device by device from hypergeometric
    draws.  It is at least the mean load ``ceil(E/n) (1 - (1 - k/E)^B)`` for equal shares and
    at most ``ceil(E/n)``.  Its work does not grow with ``batch`` (see
    :func:`_distinct_experts_distribution`).  The arguments are checked by the public entry.
    """
    import numpy as np
    dist = np.asarray(_distinct_experts_distribution(n_experts, top_k, batch))
    d_all = np.arange(n_experts + 1)
    if n_devices == 1:
        return float(dist @ d_all)
    base, extra = divmod(n_experts, n_devices)
    sizes = [base + 1] * extra + [base] * (n_devices - extra)
    sizes = [s for s in sizes if s]
    g = max(sizes)
    lf = _log_factorials(n_experts)
    m = np.arange(g + 1)[:, None]          # the cap: P(every device holds <= m)
    # f[m, r]: P(the devices not yet placed all hold <= m | r of the subset lie among them)
    f = np.zeros((g + 1, 1))
    f[:, 0] = 1.0
    pop = 0
    for size in reversed(sizes):
        pop += size
        r = np.arange(pop + 1)[None, :]
        new = np.zeros((g + 1, pop + 1))
        for j in range(size + 1):
            w = _hypergeom(lf, pop, size, r, j)       # j of the r on this device
            prev = r - j
            valid = (prev >= 0) & (prev <= pop - size)
            rest = np.where(valid, f[:, np.clip(prev[0], 0, pop - size)], 0.0)
            new += np.where(j <= m, w * rest, 0.0)
        f = new
    below = dist @ np.clip(f, 0.0, 1.0).T                 # P(max <= m), m = 0..g
    return float(np.sum(1.0 - below[:g]))



def _busiest_experts_sampled(n_experts: int, top_k: int, batch: int, n_devices: int,
                             trials: int = 2000, seed: int = 0) -> float:
    """The reference form of :func:`_busiest_experts`: route ``batch`` tokens
    ``trials`` times with a seeded generator and average the busiest device's count (for the
    tests; its result carries sampling error)."""
    import random
    base, extra = divmod(n_experts, n_devices)
    owner = []
    for dev in range(n_devices):
        size = base + (dev < extra)
        owner += [dev] * size
    rng = random.Random(seed)
    total = 0
    for _ in range(trials):
        picked = set()
        for _ in range(batch):
            picked.update(rng.sample(range(n_experts), top_k))
        load = [0] * n_devices
        for x in picked:
            load[owner[x]] += 1
        total += max(load)
    return total / trials



def expected_busiest_experts(spec: ArchSpec, batch: int = 1, n_devices: int = 1) -> float:
    """Expected number of picked routed experts on the busiest of ``n_devices`` devices in one
    MoE layer of ``spec``, when ``batch`` tokens each pick ``top_k`` of ``n_routed_experts``
    uniformly and independently and the experts are spread as evenly as they go over the
    devices (``ceil(E/n)`` on the fullest): ``E[max over devices]``, computed exactly (see
    :func:`_busiest_experts`).  A layer waits for its most loaded device, so this, not the mean
    load ``ceil(E/n) (1 - (1 - k/E)^batch)``, is what :func:`plan_roofline` charges.  0.0 for a
    model without routed experts."""
    check_spec(spec)
    check_positive_int(batch, "batch")
    check_positive_int(n_devices, "n_devices")
    if not spec.is_moe:
        return 0.0
    return _busiest_experts(spec.n_routed_experts, spec.top_k, batch, n_devices)



def expected_busiest_experts_sampled(spec: ArchSpec, batch: int = 1, n_devices: int = 1,
                                     trials: int = 2000, seed: int = 0) -> float:
    """The reference form of :func:`expected_busiest_experts`: ``trials`` routings of the
    batch drawn with ``random.Random(seed)``, the busiest device's count averaged (carries
    sampling error; for the tests)."""
    check_spec(spec)
    check_positive_int(batch, "batch")
    check_positive_int(n_devices, "n_devices")
    check_positive_int(trials, "trials")
    if not is_int(seed):
        raise ValueError(f"seed must be an int, got {seed!r}")
    if not spec.is_moe:
        return 0.0
    return _busiest_experts_sampled(spec.n_routed_experts, spec.top_k, batch, n_devices,
                                    trials, seed)
