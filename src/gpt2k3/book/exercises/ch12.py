"""Solutions to chapter 12's exercises (Kimi K3 in one sitting).

Each solution builds a tiny model and runs at most one traced prefill-and-decode
(:func:`gpt2k3.book.reading.trace`) or one prefill, so each takes about a second on two cores.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gpt2k3.accounting import (count_params, hybrid_spec, kv_numbers_per_layer,
                               state_numbers_per_layer)
from gpt2k3.archs import KIMI_K3
from gpt2k3.book.reading import Piece, trace
from gpt2k3.config import GPTConfig
from gpt2k3.model import generate
from gpt2k3.models.k3 import tiny_k3


def _names(pieces: Sequence[Piece], validation: bool = False) -> set[str]:
    return {p.name for p in pieces if p.validation == validation}


# ---------------------------------------------------------------- 12.1 predict, then check
def deeper_k3(config: GPTConfig, prompt: torch.Tensor, k3_pieces: Sequence[Piece],
              n_layer: int = 4) -> dict:
    """Trace the same prefill and decode step through a tiny K3 ``n_layer`` layers deep and
    compare its pieces with the chapter's (``k3_pieces``, from ``config``'s depth).  Beside it,
    Kimi K3 deepened by the same factor with its 3:1 schedule, as chapter 9's explorer counts
    it when its depth is set (``k3_n_layer``, ``k3_params`` against ``KIMI_K3``'s)."""
    deeper = GPTConfig(block_size=config.block_size, vocab_size=config.vocab_size,
                       n_layer=n_layer, n_head=config.n_head, n_embd=config.n_embd)
    model = tiny_k3(deeper)
    _, pieces = trace(generate, model, prompt, 2, temperature=0)
    ours, theirs = _names(pieces), _names(k3_pieces)
    return {"n_layer": n_layer, "schedule": model.schedule,
            "units": len(ours), "chapter_units": len(theirs),
            "same": ours == theirs, "new": sorted(ours - theirs), "gone": sorted(theirs - ours),
            "params": model.num_params(), "chapter_params": tiny_k3(config).num_params(),
            **_k3_deepened(n_layer / config.n_layer)}


def _k3_deepened(factor: float) -> dict:
    n = round(KIMI_K3.n_layer * factor)
    deep = hybrid_spec(KIMI_K3.with_(kda_layers=(), n_layer=n), 3)
    return {"k3_n_layer": n, "k3_params": count_params(deep).total,
            "k3_chapter_params": count_params(KIMI_K3).total,
            "k3_moe_layers": deep.n_moe_layers, "k3_chapter_moe_layers": KIMI_K3.n_moe_layers}


# ---------------------------------------------------------------------------- 12.2 derive
def latent_outgrows_state(config: GPTConfig, seed: int = 0) -> dict:
    """The prompt length at which one MLA layer's latent cache holds more numbers than one KDA
    layer's state: derived, ``T* = state / (d_c + d_R)``, from the tiny K3's spec, checked
    against the caches a real prefill fills, and the same crossover at Kimi K3's size."""
    model = tiny_k3(config)
    spec = model.spec
    state = sum(state_numbers_per_layer(spec).values())
    latent = kv_numbers_per_layer(spec)
    crossover = -(-state // latent)                       # the first T with T * latent > state
    room = GPTConfig(block_size=crossover + 1, vocab_size=config.vocab_size,
                     n_layer=config.n_layer, n_head=config.n_head, n_embd=config.n_embd)
    torch.manual_seed(seed)
    model = tiny_k3(room)
    numbers = {}
    for T in (crossover - 1, crossover):                  # prefill T tokens, read the caches
        cache = model.new_cache(1, T + 1)
        generate(model, torch.zeros(1, T, dtype=torch.long), 1, temperature=0, cache=cache)
        kinds = cache.nbytes_by_kind()
        numbers[T] = {kind: n // 4 for kind, n in kinds.items()}   # float32: 4 bytes a number
    k3_state = sum(state_numbers_per_layer(KIMI_K3).values())
    return {"state": state, "latent": latent, "crossover": crossover,
            "block_size": config.block_size, "caches": numbers,
            "k3_state": k3_state, "k3_latent": kv_numbers_per_layer(KIMI_K3),
            "k3_crossover": -(-k3_state // kv_numbers_per_layer(KIMI_K3))}


# ------------------------------------------------------------------- 12.3 change the code
def k3_closer_to_gpt2(config: GPTConfig, prompt: torch.Tensor, gpt2_pieces: Sequence[Piece],
                      k3_pieces: Sequence[Piece]) -> dict:
    """Take two of K3's changes back -- Attention Residuals (``attn_res_block_size=0``: the
    plain residual sum) and the mixture of experts (``first_k_dense=n_layer``: every layer
    dense) -- and trace again: which pieces leave the program, and how many remain K3's own."""
    model = tiny_k3(config, attn_res_block_size=0, first_k_dense=config.n_layer)
    _, pieces = trace(generate, model, prompt, 2, temperature=0)
    gpt2, k3, ours = _names(gpt2_pieces), _names(k3_pieces), _names(pieces)
    return {"units": len(ours), "k3_units": len(k3), "gone": sorted(k3 - ours),
            "new": sorted(ours - k3), "k3_only": len(k3 - gpt2), "still_k3_only": len(ours - gpt2),
            "shared": len(ours & gpt2)}
