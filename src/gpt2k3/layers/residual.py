"""Kimi K3's Attention Residuals: each sub-layer reads a learned softmax mix of the block
outputs before it instead of their plain sum.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gpt2k3.archs import K3_RMS_NORM_EPS
from gpt2k3.checks import check_finite_number, check_int
from gpt2k3.layers.norms import RMSNorm
from gpt2k3.checks import checked
from gpt2k3.ops.depth import check_sources, depth_mix


class DepthMix(nn.Module):
    """One Attention-Residual read: an RMSNorm gain ``norm.weight`` and a query vector
    ``query`` (both ``n_embd``; SGLang ``self_attention_res_norm`` / ``self_attention_res_proj``,
    ``mlp_res_norm`` / ``mlp_res_proj``, ``output_attn_res_norm`` / ``output_attn_res_proj``).
    The query starts at zero, as in the Attention Residuals paper, so an untrained read
    averages its sources uniformly. ``eps`` defaults to K3's ``rms_norm_eps``."""

    def __init__(self, n_embd: int, eps: float = K3_RMS_NORM_EPS) -> None:
        super().__init__()
        self.norm = RMSNorm(check_int(n_embd, "n_embd", 1), check_finite_number(eps, "eps", 1))
        self.query = nn.Parameter(torch.zeros(n_embd))

    def forward(self, sources) -> torch.Tensor:
        return depth_mix(sources, self.query, self.norm.weight, self.norm.eps)

    @torch.no_grad()
    def weights(self, sources) -> torch.Tensor:
        """The softmax weights over the sources, ``(R, ...)`` (for figures)."""
        check_sources(sources)
        rows = torch.stack(list(sources))
        normed = self.norm(rows)
        return (normed @ self.query).softmax(dim=0)



def check_attn_residual(residual, blocks, x, caches) -> None:
    """The door of :meth:`AttnResidual.forward`: one block per layer of the residual."""
    if len(blocks) != len(residual.attn_mix):
        raise ValueError(f"blocks must hold {len(residual.attn_mix)} blocks, got {len(blocks)}")


class AttnResidual(nn.Module):
    """Attention Residuals as the residual part of :class:`gpt2k3.model.GPT` (``residual=``).

    The stream is not one running sum. Sources: a bank of snapshots and the current block's
    running sum ``partial``. At layer ``i`` with ``i % block_size == 0`` (``block_size`` counts
    decoder layers, as SGLang's ``attn_res_block_size`` does) a block closes: the
    embedding (``i = 0``) or the finished block's sum joins the bank and ``partial`` restarts
    empty. Each sub-layer reads ``DepthMix(bank + [partial])`` (then its own pre-norm) and adds
    its output to ``partial``; the head reads ``final(bank + [partial])``. (SGLang
    ``KimiK3DecoderLayer`` and ``AttnResidual``: ``is_block_write_layer = layer_idx %
    attn_res_block_size == 0``.) Each layer has two :class:`DepthMix` -- ``attn_mix[i]`` and
    ``mlp_mix[i]`` -- and the stack one more, ``final``. It acts on each token alone, so it
    needs no cache.
    """

    def __init__(self, n_layer: int, n_embd: int, block_size: int,
                 eps: float = K3_RMS_NORM_EPS) -> None:
        super().__init__()
        self.block_size = check_int(block_size, "block_size", 1)
        check_int(n_layer, "n_layer", 1)
        self.attn_mix = nn.ModuleList(DepthMix(n_embd, eps) for _ in range(n_layer))
        self.mlp_mix = nn.ModuleList(DepthMix(n_embd, eps) for _ in range(n_layer))
        self.final = DepthMix(n_embd, eps)

    @checked(check_attn_residual)
    def forward(self, blocks, x: torch.Tensor, caches) -> torch.Tensor:
        bank, partial = [], None
        for i, (block, cache) in enumerate(zip(blocks, caches)):
            if i % self.block_size == 0:                   # a block closes: snapshot it
                bank.append(x if i == 0 else partial)
                partial = None
            sources = bank if partial is None else bank + [partial]
            a = block.mix_tokens(self.attn_mix[i](sources), cache)
            partial = a if partial is None else partial + a
            partial = partial + block.mix_channels(self.mlp_mix[i](bank + [partial]))
        return self.final(bank + [partial])
