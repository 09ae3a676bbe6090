"""Training compute of chapter 11's byte models, and the compute multiplier (chapter 11).

Kimi K3's report measures an architecture's gain as the compute another model needs to reach
the same loss. :func:`multiplier` reads that off a set of training runs: the baseline at
several budgets, the target at one. :func:`train_flops_per_byte` counts a model's training
FLOPs per byte as chapter 9 counts a published model's: ``6 N`` for the ``N`` parameters a
token is multiplied through, plus the products of attention (scores and weighted values
over the visible positions) and of a recurrent state (read and write), also times three for
the forward and backward passes.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from torch import nn

from gpt2k3.checks import check_int

__all__ = ["matmul_params", "mixer_flops_per_token", "train_flops_per_byte", "multiplier",
           "log_interpolate"]


def matmul_params(model: nn.Module) -> int:
    """Parameters one token is multiplied through: the model's spec's ``matmul_active``
    (:class:`gpt2k3.accounting.ParamCount`) where it has one (routed experts count ``top_k``
    of them), else the weights of every ``nn.Linear`` (a tied head counts once, as a matmul)."""
    spec = getattr(model, "spec", None)
    if spec is not None:
        from gpt2k3.accounting import count_params
        return count_params(spec).matmul_active
    seen, total = set(), 0
    for module in model.modules():
        if isinstance(module, nn.Linear) and id(module.weight) not in seen:
            seen.add(id(module.weight))
            total += module.weight.numel()
    return total


def mixer_flops_per_token(layer: nn.Module, context: int) -> int:
    """Forward FLOPs per token of a token mixer's sequence products at training length
    ``context`` (its projections are in :func:`matmul_params`): ``2 (d_qk + d_v)`` per head per
    visible position for softmax attention and MLA (``(context + 1) / 2`` visible on average
    under the causal mask); ``2 d_k d_v`` per head for each state read or write (two for
    linear attention, three for the delta rule, which also reads the state at the key)."""
    from gpt2k3.layers.attention import CausalSelfAttention
    from gpt2k3.layers.deltanet import DeltaNet
    from gpt2k3.layers.linear_attention import LinearAttention
    from gpt2k3.layers.mla import MLA

    inner = getattr(layer, "inner", layer)  # a convolution in front changes nothing here
    visible = (context + 1) / 2
    if isinstance(inner, MLA):
        c = inner.cfg
        return round(2 * c.n_heads * (c.qk_head_dim + c.v_head_dim) * visible)
    if isinstance(inner, CausalSelfAttention):
        return round(2 * 2 * inner.n_embd * visible)
    if isinstance(inner, LinearAttention):
        return 2 * 2 * inner.n_embd * (inner.n_embd // inner.n_head)
    if hasattr(inner, "head_k_dim") and hasattr(inner, "head_v_dim"):  # the delta family
        return 3 * 2 * inner.n_head * inner.head_k_dim * inner.head_v_dim
    raise ValueError(f"no FLOP count for a token mixer of type {type(inner).__name__}")


def train_flops_per_byte(model: nn.Module, context: int) -> float:
    """Training FLOPs per byte (a byte is a token here) of ``model`` at length ``context``:
    ``3 x 2 x`` (:func:`matmul_params` plus every block's :func:`mixer_flops_per_token` / 2)."""
    context = check_int(context, "context", 1)
    mixers = sum(mixer_flops_per_token(block.attn, context) for block in model.transformer.h)
    return 3.0 * (2.0 * matmul_params(model) + mixers)


def log_interpolate(points: Sequence[tuple[float, float]], level: float) -> float | None:
    """The first compute at which the curve ``points`` (``(compute, bits)``, compute rising)
    falls to ``level``, interpolating bits linearly in log compute; ``None`` if it never does
    within the points (the first point already at or below ``level`` returns its compute)."""
    pts = sorted(points)
    if not pts:
        return None
    if pts[0][1] <= level:
        return pts[0][0]
    for (c0, b0), (c1, b1) in zip(pts, pts[1:]):
        if b1 <= level < b0:
            t = (b0 - level) / (b0 - b1)
            return math.exp(math.log(c0) + t * (math.log(c1) - math.log(c0)))
    return None


def _mean(values):
    values = list(values)
    return math.fsum(values) / len(values)


def multiplier(baseline: Sequence[Mapping], target: Sequence[Mapping]) -> dict:
    """How much more compute the ``baseline`` runs need to reach the ``target`` runs' loss.

    Each run is a mapping with ``compute`` and ``val_bits`` (and ``seed``); the baseline comes
    at several budgets, the target at one. Returns ``{"target_bits", "target_compute",
    "curve", "multiplier", "band", "lower_bound"}``: ``curve`` holds the baseline's mean, best
    and worst seed per budget; ``multiplier`` is the compute at which the mean curve reaches
    the target's mean (:func:`log_interpolate`) over the target's mean compute, ``None`` if it
    never does, and then ``lower_bound`` is the largest budget's ratio. ``band`` is ``[low,
    high]``: the best seed curve against the target's worst seed, and the worst seed curve
    against its best (a side is ``None`` where its curve never gets there)."""
    if not baseline or not target:
        raise ValueError("baseline and target must each hold at least one run")
    t_bits = [float(r["val_bits"]) for r in target]
    t_compute = _mean(float(r["compute"]) for r in target)
    budgets = sorted({float(r["compute"]) for r in baseline})
    curve = []
    for c in budgets:
        bits = [float(r["val_bits"]) for r in baseline if float(r["compute"]) == c]
        curve.append({"compute": c, "ratio": c / t_compute, "mean": _mean(bits),
                      "best": min(bits), "worst": max(bits), "seeds": len(bits)})

    def reach(key, level):
        at = log_interpolate([(p["compute"], p[key]) for p in curve], level)
        return None if at is None else at / t_compute

    found = reach("mean", _mean(t_bits))
    return {"target_bits": {"mean": _mean(t_bits), "best": min(t_bits), "worst": max(t_bits),
                            "seeds": len(t_bits)},
            "target_compute": t_compute, "curve": curve, "multiplier": found,
            "band": [reach("best", max(t_bits)), reach("worst", min(t_bits))],
            "lower_bound": None if found is not None else budgets[-1] / t_compute}
