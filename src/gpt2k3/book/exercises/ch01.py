"""Chapter 1's exercises: GPT-2 small counted by hand, GPT-2's shape with a 2026 vocabulary, and a
forward pass that computes only the logits a decode step keeps."""

from __future__ import annotations

import dataclasses

import torch

from gpt2k3.accounting import count_params
from gpt2k3.accounting import ArchSpec
from gpt2k3.checks import check_bool, checked
from gpt2k3.model import GPT2, check_forward

__all__ = ["gpt2_param_terms", "gpt2_per_block", "vocab_swap", "forward_last_only", "check_last_only", "head_share"]


def gpt2_per_block(d: int) -> int:
    """Exercise 1.1: one GPT-2 block of width ``d`` (MLP width ``4d``), weights and biases."""
    ln_1 = ln_2 = 2 * d                  # LayerNorm: a gain and a bias per channel
    c_attn = d * 3 * d + 3 * d           # queries, keys and values of every head in one matrix
    attn_proj = d * d + d                # attention's c_proj
    c_fc = d * 4 * d + 4 * d             # the MLP's up-projection
    mlp_proj = 4 * d * d + d             # the MLP's c_proj
    return ln_1 + c_attn + attn_proj + ln_2 + c_fc + mlp_proj   # = 12 d^2 + 13 d


def gpt2_param_terms(spec: ArchSpec) -> dict[str, int]:
    """Exercise 1.1: a GPT-2's parameters from its configuration alone, term by term.

    ``(V + P) d`` for the token and position tables (the head is tied to the token table and
    adds nothing), ``L (12 d^2 + 13 d)`` for the blocks and ``2 d`` for the final LayerNorm.
    """
    V, P, L, d = spec.vocab_size, spec.max_positions, spec.n_layer, spec.n_embd
    if spec.ffn_dim != 4 * d or not spec.tied_embeddings or not spec.bias:
        raise ValueError(f"spec must have GPT-2's shape (MLP width 4 d, a tied head, biases), "
                         f"got {spec.name}")
    terms = {"token embeddings": V * d, "position embeddings": P * d,
             "blocks": L * gpt2_per_block(d), "final LayerNorm": 2 * d}
    terms["total"] = sum(terms.values())
    return terms


def vocab_swap(spec: ArchSpec, vocab_size: int, tied: bool) -> dict[str, float]:
    """Exercise 1.2: ``spec``'s shape with another vocabulary, the head tied or not: the share of
    the parameters that sit in the vocabulary's tables (token embedding, and the head if untied)."""
    other = dataclasses.replace(spec, name=f"{spec.name}, vocabulary {vocab_size:,}",
                                vocab_size=vocab_size, tied_embeddings=tied)
    c = count_params(other)
    vocab_tables = c.breakdown["token embeddings"] + c.breakdown["head"]
    return {"total": c.total, "vocab_tables": vocab_tables, "share": vocab_tables / c.total,
            "blocks": c.breakdown["attention"] + c.breakdown["MLP"] + c.breakdown["norms"]}


def check_last_only(self, idx, *, last_only=False) -> None:
    """:func:`forward_last_only`'s door: ``GPT2.forward``'s, and ``last_only`` a bool."""
    check_forward(self, idx)
    check_bool(last_only, "last_only")


@checked(check_last_only)
def forward_last_only(self: GPT2, idx: torch.Tensor, *, last_only: bool = False) -> torch.Tensor:
    """Exercise 1.3: :meth:`gpt2k3.model.GPT2.forward` with ``last_only``: the head runs on the
    last position alone, ``(B, 1, vocab_size)``, the only logits a decode step samples from."""
    pos = torch.arange(0, idx.shape[1], device=idx.device)  # positions 0 .. T-1
    x = self.transformer.wte(idx) + self.transformer.wpe(pos)
    x = self.transformer.drop(x)
    for block in self.transformer.h:
        x = block(x)
    if last_only:  # every earlier position's logits would be computed only to be thrown away
        x = x[:, -1:]
    return self.lm_head(self.transformer.ln_f(x))


def head_share(spec: ArchSpec, prompt_len: int) -> dict[str, float]:
    """Exercise 1.3: multiply-adds of the weight matrices for one position -- the blocks' ``12 L
    d^2`` and the head's ``V d`` -- and what ``last_only`` saves in a prefill of ``prompt_len``."""
    V, L, d = spec.vocab_size, spec.n_layer, spec.n_embd
    blocks, head = 12 * L * d * d, V * d
    return {"blocks_macs": blocks, "head_macs": head, "head_share": head / (blocks + head),
            "prefill_saved_macs": (prompt_len - 1) * head,
            "prefill_saved_share": (prompt_len - 1) * head / (prompt_len * (blocks + head))}
