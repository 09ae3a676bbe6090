"""Chapter 8's exercises: what Kimi K3 adds.

* 8.1 (derive): the factor latent experts save, in stored and in used parameters of one MoE
  layer, and the widths at which they stop saving (:func:`latent_moe_factors`).
* 8.2 (predict): the widest Attention-Residual read for a block size, Figure 8.1's slider
  (:func:`widest_reads`).
* 8.3 (predict): where Figure 8.2's curves meet and where Kimi Linear's falls through K3's
  floor (:func:`decay_crossings`).
* 8.4 (change the code): K3's ``A_log`` read as one value per key channel, shared by the
  heads, instead of one per head (:func:`bounded_log_decay_per_channel`).
* 8.5 (predict): the sign rule's trade-off on Figure 8.6's slider -- which step leaves the
  fewest idle experts, and how often each makes the load swing back up
  (:func:`sign_rule_tradeoff`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gpt2k3.accounting import kda_log_decay
from gpt2k3.accounting import k3_mechanisms as k3n
from gpt2k3.archs import K3_GATE_LOWER_BOUND, KIMI_K3, KIMI_K3_CHECKPOINT
from gpt2k3.book.figures.k3_adds import ATTN_RES_BLOCK_SIZES
from gpt2k3.checks import check_finite_number, check_int, check_kda_gate, check_positive_int, checked
from gpt2k3.experiments.forgetting import half_life
from gpt2k3.layers.deltanet import bounded_log_decay

__all__ = ["latent_moe_factors", "widest_reads", "decay_crossings", "check_a_log_per_channel",
           "bounded_log_decay_per_channel", "compare_a_log_readings", "sign_rule_tradeoff"]


# ------------------------------------------------------------------------------- 8.1 derive
@dataclass(frozen=True)
class LatentFactors:
    """One MoE layer of ``spec`` with routed experts of width ``w`` against full width ``d``.

    ``stored_*``: the layer's parameters (router, shared experts, projections and norm, all
    ``E`` routed experts); ``used_*``: what one token is multiplied through (router, shared
    experts, projections, its ``k`` experts). ``*_formula`` is the derivation's, ``*_package``
    :func:`gpt2k3.accounting.k3_mechanisms.latent_moe_cost`'s; ``routed_only`` is ``w / d``,
    what the routed experts alone save; the break-even widths are the derivation's
    ``3 k f d / (3 k f + 2 d)`` (used) and ``3 E f d / (3 E f + 2 d + 1)`` (stored)."""

    w: int
    d: int
    routed_only: float
    stored_formula: float
    stored_package: float
    used_formula: float
    used_package: float
    break_even_used: float
    break_even_stored: float
    break_even_used_package: float
    break_even_stored_package: float


def latent_moe_factors(spec=KIMI_K3) -> LatentFactors:
    """Exercise 8.1: the derived factors against the package's counts."""
    d, w, E, k, f = (spec.n_embd, spec.moe_latent_dim, spec.n_routed_experts, spec.top_k,
                     spec.d_expert)
    shared, router, norm = 3 * d * f * spec.n_shared_experts, E * d, w if spec.moe_latent_norm else 0
    stored = (router + shared + 2 * d * w + norm + 3 * E * w * f) / (router + shared + 3 * E * d * f)
    used = (router + shared + 2 * d * w + norm + 3 * k * w * f) / (router + shared + 3 * k * d * f)
    lat, wide = k3n.latent_moe_cost(spec, w), k3n.latent_moe_cost(spec, 0)
    return LatentFactors(w, d, w / d, stored, lat.layer_total / wide.layer_total, used,
                         lat.layer_active / wide.layer_active,
                         3 * k * f * d / (3 * k * f + 2 * d), 3 * E * f * d / (3 * E * f + 2 * d + 1),
                         k3n.latent_moe_break_even(spec), k3n.latent_moe_break_even(spec, stored=True))


# ------------------------------------------------------------------------------ 8.2 predict
def widest_reads(n_layer: int = KIMI_K3.n_layer, block_sizes=ATTN_RES_BLOCK_SIZES) -> list[dict]:
    """Exercise 8.2: for each of Figure 8.1's block sizes ``S``, the predicted widest read
    ``ceil(L / S) + 1`` (the bank's snapshots and the running sum) against
    :func:`gpt2k3.accounting.k3_mechanisms.attn_res_reads`."""
    n_layer = check_positive_int(n_layer, "n_layer")
    return [{"block_size": S, "predicted": -(-n_layer // check_positive_int(S, "each block size")) + 1,
             "counted": k3n.attn_res_reads(n_layer, S).max_sources} for S in block_sizes]


# ------------------------------------------------------------------------------ 8.3 predict
def _inverse_softplus(y: float) -> float:
    return y + math.log(-math.expm1(-y))           # ln(e^y - 1), stable for large y


def decay_crossings(a_logs=(-1.0, 0.0, 1.0, 2.0), lower_bound: float = K3_GATE_LOWER_BOUND,
                    x_max: float = 12.0) -> list[dict]:
    """Exercise 8.3: Figure 8.2's curves (``b = 0``) at each ``A_log`` of its slider.

    At ``x = 0`` K3's log-decay is ``lambda / 2`` whatever ``A`` (a sigmoid of 0 is one half),
    Kimi Linear's ``-e^A ln 2``. Kimi Linear's reaches K3's floor where
    ``e^A softplus(x) = |lambda|``, ``x = softplus^-1(|lambda| e^-A)``: inside the figure's
    range only if that is below ``x_max``. Each value is checked against the scalar
    :func:`gpt2k3.accounting.kda_log_decay`."""
    lam = check_finite_number(lower_bound, "lower_bound", -1)
    rows = []
    for a in a_logs:
        cross = _inverse_softplus(-lam * math.exp(-a))
        rows.append({"a_log": a, "k3_at_0": kda_log_decay(0.0, a, 0.0, lam), "k3_predicted": lam / 2,
                     "linear_at_0": kda_log_decay(0.0, a, 0.0), "linear_predicted": -math.exp(a) * math.log(2),
                     "floor_crossing_x": cross, "linear_at_crossing": kda_log_decay(cross, a, 0.0),
                     "crosses_in_figure": cross < x_max})
    return rows


def half_life_at_midpoint(lower_bound: float = K3_GATE_LOWER_BOUND) -> float:
    """The half-life of K3's decay where its sigmoid is one half: ``2 ln 2 / |lambda|`` tokens."""
    return half_life(check_finite_number(lower_bound, "lower_bound", -1) / 2)


# ---------------------------------------------------------------------- 8.4 change the code
def check_a_log_per_channel(x, A_log, dt_bias, lower_bound=K3_GATE_LOWER_BOUND) -> None:
    """The door of :func:`bounded_log_decay_per_channel`: the arguments of
    :func:`gpt2k3.layers.deltanet.bounded_log_decay`, with ``A_log`` of shape ``(Dk,)``, one
    number per key channel of ``x`` ``(B, T, H, Dk)``."""
    Dk = x.shape[-1] if isinstance(x, torch.Tensor) and x.ndim == 4 else None
    if not isinstance(A_log, torch.Tensor) or not A_log.dtype.is_floating_point or Dk is None \
            or tuple(A_log.shape) != (Dk,):
        got = f"{A_log.dtype} {tuple(A_log.shape)}" if isinstance(A_log, torch.Tensor) else type(A_log).__name__
        raise ValueError(f"A_log must be a floating tensor of shape (Dk,) = ({Dk},), one per key "
                         f"channel of x (B, T, H, Dk), got {got}")
    check_kda_gate(x, A_log.new_zeros(x.shape[2]), dt_bias, lower_bound)  # x and dt_bias as there


@checked(check_a_log_per_channel)
def bounded_log_decay_per_channel(x: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                                  lower_bound: float = K3_GATE_LOWER_BOUND) -> torch.Tensor:
    """:func:`gpt2k3.layers.deltanet.bounded_log_decay` with the other public reading of K3's
    ``A_log``: one value per key channel, ``(Dk,)``, shared by every head, instead of one per
    head. ``x`` and ``dt_bias`` as there."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    x, A_log, dt_bias = (t.to(dtype) for t in (x, A_log, dt_bias))
    return lower_bound * torch.sigmoid(A_log.exp() * (x + dt_bias.view(x.shape[2:])))  # (Dk,) per channel


def compare_a_log_readings(spec=KIMI_K3, stored: int | None = None, H: int = 3, Dk: int = 4,
                           seed: int = 0) -> dict:
    """Exercise 8.4: the two readings side by side.

    Counts for ``spec``: numbers stored per KDA layer, used by each reading, and the
    parameters the channel reading adds to the whole model. On a small random input: the
    per-channel form against its scalar definition; that the two readings agree when every
    ``A`` is the same number; that they differ otherwise (every ``A`` drawn from a standard
    normal, inputs of standard deviation ``x_scale``, on ``H`` heads of ``Dk`` channels); and
    that both stay inside ``(lower_bound, 0]``."""
    stored = KIMI_K3_CHECKPOINT["a_log_stored"] if stored is None else check_positive_int(stored, "stored")
    H, Dk = check_positive_int(H, "H"), check_positive_int(Dk, "Dk")
    g = torch.Generator().manual_seed(check_int(seed, "seed", 0))
    x_scale = 4.0
    x = x_scale * torch.randn(2, 5, H, Dk, generator=g, dtype=torch.float64)
    dt_bias = torch.randn(H * Dk, generator=g, dtype=torch.float64)
    a_channel = torch.randn(Dk, generator=g, dtype=torch.float64)
    a_head = torch.randn(H, generator=g, dtype=torch.float64)
    lam = spec.kda_gate_lower_bound
    per_channel = bounded_log_decay_per_channel(x, a_channel, dt_bias, lam)
    scalar = torch.tensor([[[[kda_log_decay(x[b, t, h, c].item(), a_channel[c].item(),
                                            dt_bias[h * Dk + c].item(), lam)
                              for c in range(Dk)] for h in range(H)] for t in range(5)]
                           for b in range(2)], dtype=torch.float64)
    same = torch.full((), 0.7, dtype=torch.float64)
    agree = (bounded_log_decay_per_channel(x, same.expand(Dk).clone(), dt_bias, lam)
             - bounded_log_decay(x, same.expand(H).clone(), dt_bias, lam)).abs().max()
    per_head = bounded_log_decay(x, a_head, dt_bias, lam)
    both = torch.stack([per_channel, per_head])
    return {"stored_per_layer": stored, "heads": spec.kda_n_head, "head_dim": spec.kda_head_dim,
            "used_per_head_reading": spec.kda_n_head, "used_channel_reading": spec.kda_head_dim,
            "extra_parameters": spec.n_kda_layers * (spec.kda_head_dim - spec.kda_n_head),
            "vs_scalar": float((per_channel - scalar).abs().max()),
            "agree_when_equal": float(agree),
            "differ_otherwise": float((per_channel - per_head).abs().max()),
            "in_range": bool(((both >= lam) & (both <= 0)).all()),
            "H": H, "Dk": Dk, "x_scale": x_scale}


# ------------------------------------------------------------------------------- 8.5 predict
def sign_rule_tradeoff(runs: dict) -> list[dict]:
    """For each rule of :func:`gpt2k3.book.figures.k3_adds.balancing_runs`' ``runs``: the
    max/mean load and the idle experts of the last batch, the first step with no idle expert
    (``None`` if never), the swings -- steps at which the max/mean load rose again -- and the
    largest rise, the biggest factor by which it grew from one batch to the next."""
    if not isinstance(runs, dict) or "history" not in runs or "names" not in runs:
        raise ValueError("runs must be the dict balancing_runs returns")
    rows = []
    for name in runs["names"]:
        h = runs["history"][name]
        ratio, dead = h["max_over_mean"], h["dead"]
        rows.append({"rule": name, "last_max_over_mean": ratio[-1], "last_idle": dead[-1],
                     "first_no_idle": next((i + 1 for i, d in enumerate(dead) if d == 0), None),
                     "swings": sum(b > a for a, b in zip(ratio, ratio[1:])),
                     "largest_rise": max([b / a for a, b in zip(ratio, ratio[1:])] + [1.0])})
    return rows
