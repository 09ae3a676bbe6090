"""Attention Residuals' read over depth: a softmax over the outputs of earlier layers
(Kimi Team, "Attention Residuals", arXiv:2603.15031). :func:`depth_mix_reference` is the
definition, one source at a time; :func:`depth_mix` the batched form the layer runs.
"""

from __future__ import annotations

import torch

from gpt2k3.archs import K3_RMS_NORM_EPS
from gpt2k3.checks import checked


# ======================================================================= 5. Attention Residuals
def check_sources(sources, name: str = "sources") -> None:
    """A non-empty list of tensors of one shape ``(..., d)``."""
    if isinstance(sources, torch.Tensor) or not isinstance(sources, (list, tuple)) or not sources \
            or any(not isinstance(s, torch.Tensor) or s.shape != sources[0].shape for s in sources):
        raise ValueError(f"{name} must be a non-empty list of tensors of one shape (..., d)")


def check_depth_mix(sources, query, norm_weight, eps=K3_RMS_NORM_EPS) -> None:
    """The door of the depth mixes: the sources (:func:`check_sources`); the layer's own
    ``query`` and ``norm_weight`` are its parameters."""
    check_sources(sources)



@checked(check_depth_mix)
def depth_mix_reference(sources, query: torch.Tensor, norm_weight: torch.Tensor,
                        eps: float = K3_RMS_NORM_EPS) -> torch.Tensor:
    """Attention Residuals, the definition: one source at a time.

    ``sources`` is a list of ``(..., d)`` tensors -- the block snapshots and the current
    block's running sum. Each is RMS-normalised (gain ``norm_weight``) and scored against the
    learned vector ``query``: ``s_i = <RMSNorm(source_i), query>``. The output is
    ``sum_i softmax(s)_i * source_i``: the weights mix the *raw* sources. (SGLang 0.5.23
    ``srt/layers/attn_residual.py``, ``aggregate_stream_torch``: ``score_norm``, then
    ``score_proj``, a ``d -> 1`` linear map whose weight is ``query``.)
    """
    scores = []
    for s in sources:
        normed = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * norm_weight
        scores.append((normed * query).sum(-1))
    top = scores[0]
    for s in scores[1:]:
        top = torch.maximum(top, s)
    exps = [torch.exp(s - top) for s in scores]
    total = sum(exps)
    out = torch.zeros_like(sources[0])
    for e, s in zip(exps, sources):
        out = out + (e / total)[..., None] * s
    return out



@checked(check_depth_mix)
def depth_mix(sources, query: torch.Tensor, norm_weight: torch.Tensor,
              eps: float = K3_RMS_NORM_EPS) -> torch.Tensor:
    """:func:`depth_mix_reference` in one stacked computation (the form the model uses):
    sources stacked ``(R, ..., d)``, scores ``(R, ...)``, softmax over ``R`` in float32 or
    wider."""
    rows = torch.stack(list(sources))
    normed = rows * torch.rsqrt(rows.pow(2).mean(-1, keepdim=True) + eps) * norm_weight
    scores = normed @ query
    p = scores.to(torch.promote_types(scores.dtype, torch.float32)).softmax(dim=0)
    return (p[..., None].to(rows.dtype) * rows).sum(0)
