"""Chapter 7's exercises: MLA and MoE.

* 7.1 (derive): how many distinct routed experts a batch wakes, ``E (1 - (1 - k/E)^B)``
  (:func:`distinct_experts`).
* 7.2 (derive): how many heads absorbed MLA needs before its decode reaches a GPU's ridge,
  on one GPU and split by tensor parallelism (:func:`heads_at_ridge`).
* 7.3 (predict): the context at which a batch's latent cache fills one H200, Figure 7.1's
  slider (:func:`contexts_that_fill`).
* 7.4 (change the code): ``dispatch`` with a capacity per expert, as Switch-style layers run
  it: what overflows is dropped (:func:`dispatch_with_capacity`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from gpt2k3.accounting import H200, kv_cache_bytes, mla_cache_variants, mla_decode_costs
from gpt2k3.accounting.decode import expected_distinct_experts
from gpt2k3.accounting.experts import expected_busiest_experts, expected_busiest_experts_sampled
from gpt2k3.archs import DEEPSEEK_V3, KIMI_K2
from gpt2k3.checks import check_int, check_positive_int
from gpt2k3.layers.moe import MoE, MoEConfig

__all__ = ["distinct_experts", "heads_at_ridge", "contexts_that_fill", "dispatch_with_capacity",
           "capacity_drops"]


# ------------------------------------------------------------------------------- 7.1 derive
@dataclass(frozen=True)
class DistinctExperts:
    """One MoE layer of ``model``, ``batch`` tokens routed uniformly: the formula
    ``E (1 - (1 - k/E)^B)``, the package's :func:`~gpt2k3.accounting.decode.expected_distinct_experts`,
    the mean of the exact distribution (:func:`~gpt2k3.accounting.expected_busiest_experts` on
    one device), and a seeded simulation of ``trials`` batches."""

    model: str
    n_experts: int
    top_k: int
    batch: int
    formula: float
    package: float
    exact_mean: float
    simulated: float | None

    @property
    def share(self) -> float:
        """The share of the layer's routed experts the batch wakes (and whose weights it reads)."""
        return self.formula / self.n_experts


def distinct_experts(specs=(DEEPSEEK_V3, KIMI_K2), batches=(1, 8, 64, 256),
                     trials: int = 200, simulate_up_to: int = 64) -> list[DistinctExperts]:
    """Exercise 7.1: the derived count against the package's and, for batches up to
    ``simulate_up_to`` (the simulation's cost grows with the batch), a simulation's."""
    trials = check_positive_int(trials, "trials")
    rows = []
    for spec in specs:
        E, k = spec.n_routed_experts, spec.top_k
        for B in batches:
            B = check_positive_int(B, "each batch")
            rows.append(DistinctExperts(
                spec.name, E, k, B, E * (1 - (1 - k / E) ** B), expected_distinct_experts(E, k, B),
                expected_busiest_experts(spec, B, 1),
                expected_busiest_experts_sampled(spec, B, 1, trials=trials, seed=B)
                if B <= simulate_up_to else None))
    return rows


# ------------------------------------------------------------------------------- 7.2 derive
@dataclass(frozen=True)
class HeadsAtRidge:
    """Absorbed MLA's decode intensity (FLOP per byte of bf16 latent) as ``H (2 r + dr) /
    (r + dr)``, the heads ``H* = ridge (r + dr) / (2 r + dr)`` at which it reaches the ridge,
    and the intensity of ``spec``'s heads on one GPU and split ``tp`` ways."""

    model: str
    heads: int
    per_head: float
    heads_at_ridge: float
    ridge_over_two: float
    intensity_one_gpu: float
    tp: int
    intensity_split: float


def heads_at_ridge(spec=DEEPSEEK_V3, tp: int = H200.per_machine, ridge: float = H200.ridge) -> HeadsAtRidge:
    """Exercise 7.2: the derivation's numbers for ``spec`` (FLOPs from
    :func:`gpt2k3.accounting.mla_decode_costs`, as in the chapter's table)."""
    tp = check_positive_int(tp, "tp")
    r, dr, H = spec.kv_lora_rank, spec.qk_rope_head_dim, spec.n_head
    per_head = (2 * r + dr) / (r + dr)
    c = mla_decode_costs(spec)["absorbed"]
    intensity = c["flops"] / (2 * c["numbers"])
    return HeadsAtRidge(spec.name, H, per_head, ridge / per_head, ridge / 2, intensity, tp,
                        intensity / tp)


def intensity_with_heads(spec, heads: int) -> float:
    """Absorbed MLA's FLOP per byte for ``spec`` with ``heads`` heads (the accounting's count)."""
    c = mla_decode_costs(spec.with_(n_head=check_positive_int(heads, "heads")))["absorbed"]
    return c["flops"] / (2 * c["numbers"])


# ------------------------------------------------------------------------------ 7.3 predict
@dataclass(frozen=True)
class FillContext:
    """The context (tokens per sequence) at which ``batch`` sequences' cache fills one H200 by
    itself: the latent cache and an MHA cache of the same heads (bf16)."""

    batch: int
    latent: int
    mha: int


def contexts_that_fill(spec=DEEPSEEK_V3, batches=(1, 4, 16, 64, 256)) -> list[FillContext]:
    """Exercise 7.3: ``H200 bytes / (batch x bytes per token)``, for Figure 7.1's batches."""
    per_token = kv_cache_bytes(spec, 1)
    variants = mla_cache_variants(spec)
    mha_per_token = per_token * variants["MHA, same heads"] // variants["MLA latent"]
    return [FillContext(b, int(H200.memory_bytes // (check_positive_int(b, "each batch") * per_token)),
                        int(H200.memory_bytes // (b * mha_per_token))) for b in batches]


# ---------------------------------------------------------------------- 7.4 change the code
def dispatch_with_capacity(x: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor,
                           experts: nn.ModuleList, capacity: int) -> torch.Tensor:
    """:func:`gpt2k3.layers.moe.dispatch` with a fixed ``capacity`` per expert: each expert
    runs on the first ``capacity`` (token, slot) pairs that chose it, in token order, and the
    rest are dropped -- their tokens get nothing from that expert (a Switch-style capacity)."""
    capacity = check_int(capacity, "capacity", 0)
    # Sort the N*k (token, slot) assignments by expert, so that each expert reads one
    # contiguous run of them.
    order = indices.flatten().argsort(stable=True)
    token_of, weight_of = order // indices.shape[1], weights.flatten()[order]
    ends = torch.bincount(indices.flatten(), minlength=len(experts)).cumsum(0).tolist()
    out, start = torch.zeros_like(x), 0
    for expert, end in zip(experts, ends):
        if end > start:
            kept = slice(start, min(end, start + capacity))  # overflow past capacity: dropped
            tok = token_of[kept]
            out.index_add_(0, tok, expert(x[tok]) * weight_of[kept, None])
        start = end
    return out


def _dropped_tokens(indices: torch.Tensor, capacity: int) -> set[int]:
    """The tokens that lose an expert under :func:`dispatch_with_capacity`'s rule, worked out
    token by token: each expert keeps the first ``capacity`` tokens that chose it."""
    seen = [0] * (int(indices.max()) + 1)
    dropped = set()
    for n, row in enumerate(indices.tolist()):
        for e in row:
            seen[e] += 1
            if seen[e] > capacity:
                dropped.add(n)
    return dropped


def capacity_drops(capacity_factors=(1.0, 1.25, 2.0), skews=(0.0, 0.2), seed: int = 0) -> dict:
    """Exercise 7.4: the chapter's toy MoE layer (16 experts, top-4, 128 tokens), its selection
    bias set to ``skew * linspace(1, -1)`` for each ``skew``: 0 leaves the random router about
    even, a positive skew pushes tokens towards the first experts.

    For each skew and capacity factor ``f`` (capacity ``ceil(f N k / E)``): the (token, slot)
    pairs dropped, ``sum_e max(0, load_e - capacity)``, and their share; the tokens whose output
    changed against ``dispatch`` and the tokens the rule says lose an expert, worked out token
    by token; and that a capacity of the busiest expert's load reproduces ``dispatch``."""
    from gpt2k3.layers.moe import dispatch
    cfg = MoEConfig(n_embd=32, n_routed_experts=16, n_shared_experts=1, top_k=4, d_expert=24,
                    routed_scaling_factor=2.5, n_group=4, topk_group=2)
    torch.manual_seed(check_int(seed, "seed", 0))
    moe = MoE(cfg).double()
    x = torch.randn(128, cfg.n_embd, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 1))
    out = {"tokens": x.shape[0], "balanced": x.shape[0] * cfg.top_k // cfg.n_routed_experts,
           "by_skew": {}}
    with torch.no_grad():
        for skew in skews:
            moe.gate.e_score_correction_bias.copy_(skew * torch.linspace(1, -1, 16, dtype=torch.float64))
            weights, indices = moe.gate(x)
            load = torch.bincount(indices.flatten(), minlength=16)
            full = dispatch(x, weights, indices, moe.experts)
            rows = []
            for f in capacity_factors:
                cap = math.ceil(f * x.shape[0] * cfg.top_k / cfg.n_routed_experts)
                changed = (dispatch_with_capacity(x, weights, indices, moe.experts, cap) - full).abs().amax(-1)
                over = int((load - cap).clamp_min(0).sum())
                rows.append({"factor": f, "capacity": cap, "dropped": over,
                             "dropped_share": over / indices.numel(),
                             "tokens_hit": int((changed > 1e-12).sum()),
                             "tokens_expected": len(_dropped_tokens(indices, cap))})
            same = float((dispatch_with_capacity(x, weights, indices, moe.experts, int(load.max()))
                          - full).abs().max())
            out["by_skew"][skew] = {"load": load.tolist(), "busiest": int(load.max()), "rows": rows,
                                    "at_busiest_vs_dispatch": same}
    return out
