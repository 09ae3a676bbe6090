"""Solutions to chapter 9's exercises (Kimi K3 accounting).

Every solution is closed-form arithmetic on :mod:`gpt2k3.accounting` and :mod:`gpt2k3.archs`,
or a small seeded simulation; none takes more than a fraction of a second.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from gpt2k3.accounting import (ArchSpec, cache_bound_context, count_params, decode_bytes,
                               expected_distinct_experts, hybrid_spec, kv_cache_bytes,
                               memory_per_sequence, roofline, state_bytes)
from gpt2k3.accounting.experts import expected_busiest_experts
from gpt2k3.archs import KIMI_K3


# ---------------------------------------------------------------- 9.1 predict, then check
@dataclass(frozen=True)
class CacheOvertakes:
    """When a decode step of K3 reads more cache (and state) bytes than weight bytes."""

    context_len: int             # the context the question asks about
    batch1_crossover: float      # the context at which batch 1 turns cache-bound
    max_context: int             # K3's longest context
    first_batch: int             # the smallest batch that is cache-bound at ``context_len``
    crossover_before: float      # the crossover context of the batch just below it
    crossover_at: float          # ... and of ``first_batch`` itself
    cache_share: float           # the share of a step's bytes that is cache at ``first_batch``


def cache_overtakes_weights(spec: ArchSpec = KIMI_K3, context_len: int = 1 << 20,
                            max_batch: int = 1 << 14) -> CacheOvertakes:
    """The smallest batch whose caches and states outweigh the weights a step reads, at
    ``context_len``; found by bisection on :func:`cache_bound_context`, which falls as the
    batch grows (the weights are shared, the caches are not)."""
    lo, hi = 1, max_batch
    if cache_bound_context(spec, hi) > context_len:
        raise ValueError(f"no batch up to {max_batch} is cache-bound at {context_len} tokens")
    while lo < hi:                        # the first batch with crossover <= context_len
        mid = (lo + hi) // 2
        if cache_bound_context(spec, mid) <= context_len:
            hi = mid
        else:
            lo = mid + 1
    b = decode_bytes(spec, context_len, lo)
    return CacheOvertakes(context_len=context_len,
                          batch1_crossover=cache_bound_context(spec, 1),
                          max_context=spec.max_positions, first_batch=lo,
                          crossover_before=cache_bound_context(spec, lo - 1) if lo > 1 else 0.0,
                          crossover_at=cache_bound_context(spec, lo),
                          cache_share=(b.cache + b.state) / b.total)


# ---------------------------------------------------------------------------- 9.2 derive
@dataclass(frozen=True)
class DistinctExperts:
    """Experts one MoE layer of K3 wakes for a decode batch, three ways, and per device."""

    batch: int
    n_experts: int
    top_k: int
    derived: float              # E (1 - (1 - k/E)^B), the derivation's result
    accounting: float           # gpt2k3.accounting.expected_distinct_experts
    simulated: float            # the mean over seeded routings
    simulated_se: float         # its standard error
    n_devices: int
    mean_per_device: float      # derived / n_devices: the average device's picked experts
    busiest_per_device: float   # gpt2k3.accounting.experts.expected_busiest_experts


def distinct_experts(spec: ArchSpec = KIMI_K3, batch: int = 64, n_devices: int = 64,
                     trials: int = 400, seed: int = 0) -> DistinctExperts:
    """The derivation's ``E (1 - (1 - k/E)^B)`` beside the accounting's and a simulation of
    ``trials`` uniform top-``k`` routings of ``batch`` tokens (``random.Random(seed)``)."""
    E, k = spec.n_routed_experts, spec.top_k
    derived = E * (1 - (1 - k / E) ** batch)       # linearity: E times P(an expert is picked)
    rng = random.Random(seed)
    counts = []
    for _ in range(trials):
        picked = set()
        for _ in range(batch):
            picked.update(rng.sample(range(E), k))   # one token: k distinct experts
        counts.append(len(picked))
    mean = sum(counts) / trials
    var = sum((c - mean) ** 2 for c in counts) / (trials - 1)
    return DistinctExperts(batch=batch, n_experts=E, top_k=k, derived=derived,
                           accounting=expected_distinct_experts(E, k, batch), simulated=mean,
                           simulated_se=(var / trials) ** 0.5, n_devices=n_devices,
                           mean_per_device=derived / n_devices,
                           busiest_per_device=expected_busiest_experts(spec, batch, n_devices))


# ------------------------------------------------------------------- 9.3 change the code
def k3_schedule(ratio: int | None, context_len: int = 1 << 20) -> dict[str, float]:
    """Kimi K3 with another KDA : attention schedule (``ratio`` KDA layers per MLA layer; 0 is
    MLA everywhere, ``None`` all KDA), counted by the chapter's functions: the change is one
    argument, the layer schedule :func:`gpt2k3.accounting.hybrid_spec` writes into the spec."""
    spec = hybrid_spec(KIMI_K3, ratio)
    c = count_params(spec)
    return {"mla_layers": spec.n_attention_layers, "kda_layers": spec.n_kda_layers,
            "total": c.total, "active": c.active_without_embedding,
            "kv_per_token": kv_cache_bytes(spec, 1), "state": state_bytes(spec),
            "sequence": memory_per_sequence(spec, context_len),
            "ms_batch1": 1e3 * roofline(spec, context_len, 1).per_token_s,
            "ms_batch1024": 1e3 * roofline(spec, context_len, 1024).per_token_s}


def k3_schedules(ratios=(0, 1, 3, 7, 15, None), context_len: int = 1 << 20) -> dict:
    """:func:`k3_schedule` for each ratio, keyed by ratio."""
    return {r: k3_schedule(r, context_len) for r in ratios}
