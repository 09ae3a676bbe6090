"""Chapter 12's exercise solutions give what their prose states, checked independently."""

from __future__ import annotations

import math

import pytest
import torch

from gpt2k3.archs import KIMI_K3
from gpt2k3.book.exercises import ch12
from gpt2k3.book.reading import trace
from gpt2k3.config import GPTConfig
from gpt2k3.model import GPT, generate
from gpt2k3.models.k3 import tiny_k3

CONFIG = GPTConfig(block_size=16, vocab_size=64, n_layer=2, n_head=2, n_embd=32)  # chapter 12's
PROMPT = torch.zeros(1, 4, dtype=torch.long)


@pytest.fixture(scope="module")
def traces():
    torch.manual_seed(0)
    _, gpt2 = trace(generate, GPT(CONFIG), PROMPT, 2, temperature=0)
    _, k3 = trace(generate, tiny_k3(CONFIG), PROMPT, 2, temperature=0)
    return gpt2, k3


def test_12_1_a_deeper_k3_runs_the_same_program(traces):
    deeper = ch12.deeper_k3(CONFIG, PROMPT, traces[1], n_layer=4)
    assert deeper["same"] and deeper["new"] == deeper["gone"] == []
    assert deeper["schedule"] == ("kda", "kda", "kda", "mla")
    assert deeper["params"] > 1.5 * deeper["chapter_params"]
    # Kimi K3 deepened as much, as chapter 9's explorer counts it at that depth
    from gpt2k3.accounting import count_params
    from gpt2k3.book.widgets.k3 import spec_from_controls
    assert deeper["k3_n_layer"] == 2 * KIMI_K3.n_layer
    explorer = spec_from_controls(KIMI_K3, {"n_layer": deeper["k3_n_layer"]}, 3)
    assert deeper["k3_params"] == count_params(explorer).total
    assert deeper["k3_chapter_params"] == count_params(KIMI_K3).total
    # more than double: one dense layer stays one, the MoE layers go from 92 to 185
    assert (deeper["k3_chapter_moe_layers"], deeper["k3_moe_layers"]) == (92, 185)
    assert 2 < deeper["k3_params"] / deeper["k3_chapter_params"] < 185 / 92


def test_12_2_latent_cache_meets_the_state(traces):
    grow = ch12.latent_outgrows_state(CONFIG)
    H, dk, K = CONFIG.n_head, CONFIG.n_embd // CONFIG.n_head, 4
    state = H * (dk * dk + 3 * (K - 1) * dk)            # written out from the tiny K3's sizes
    latent = 16 + 4                                     # tiny_k3's kv_lora_rank + qk_rope_head_dim
    assert (grow["state"], grow["latent"], grow["crossover"]) == (state, latent, state // latent)
    T = grow["crossover"]
    assert grow["caches"][T - 1]["LatentCache"] < state == grow["caches"][T]["LatentCache"]
    assert grow["caches"][T]["StateCache"] == state and T > CONFIG.block_size
    k3_state = 96 * (128 * 128 + 3 * 3 * 128)
    assert grow["k3_crossover"] == math.ceil(k3_state / 576) < KIMI_K3.max_positions // 100


def test_12_3_taking_two_changes_back(traces):
    gpt2, k3 = traces
    closer = ch12.k3_closer_to_gpt2(CONFIG, PROMPT, gpt2, k3)
    gone = " ".join(closer["gone"])
    assert "Router" in gone and "AttnResidual" in gone and "dispatch" in gone
    assert closer["new"] == ["gpt2k3.model.Block.forward"]
    assert any(p.name == "gpt2k3.model.Block.forward" for p in gpt2)   # GPT-2's block, back
    assert 0 < closer["still_k3_only"] < closer["k3_only"]
    assert closer["k3_units"] - closer["units"] == len(closer["gone"]) - len(closer["new"])
