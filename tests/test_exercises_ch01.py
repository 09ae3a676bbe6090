"""Chapter 1's exercise solutions (``gpt2k3.book.exercises.ch01``) give what their prose states."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gpt2k3.accounting import count_params
from gpt2k3.archs import GPT2_FAMILY, GPT2_SMALL, KIMI_K3, spec_from_gpt_config
from gpt2k3.book.exercises import ch01
from gpt2k3.config import GPTConfig
from gpt2k3.model import GPT, GPT2


def test_1_1_the_hand_count_is_gpt2s_count_for_every_size():
    for spec in GPT2_FAMILY:
        d = spec.n_embd
        assert ch01.gpt2_per_block(d) == 12 * d * d + 13 * d
        terms = ch01.gpt2_param_terms(spec)
        assert terms["total"] == count_params(spec).total
        assert terms["total"] == ((spec.vocab_size + spec.max_positions) * d
                                  + spec.n_layer * (12 * d * d + 13 * d) + 2 * d)
    small = ch01.gpt2_param_terms(GPT2_SMALL)
    assert small["total"] == 124_439_808  # GPT-2 small, as the released checkpoint has it
    assert small["total"] - small["position embeddings"] == 123_653_376  # nanoGPT's figure


def test_1_1_the_hand_count_is_the_built_module():
    config = GPTConfig(block_size=32, vocab_size=101, n_layer=3, n_head=2, n_embd=16)
    spec = spec_from_gpt_config(config)
    assert ch01.gpt2_param_terms(spec)["total"] == GPT(config).num_params()


def test_1_1_refuses_a_shape_that_is_not_gpt2s():
    with pytest.raises(ValueError, match="GPT-2's shape"):
        ch01.gpt2_param_terms(dataclasses.replace(GPT2_SMALL, tied_embeddings=False))


def test_1_2_a_2026_vocabulary_outweighs_gpt2_smalls_blocks():
    tied = ch01.vocab_swap(GPT2_SMALL, KIMI_K3.vocab_size, tied=True)
    untied = ch01.vocab_swap(GPT2_SMALL, KIMI_K3.vocab_size, tied=False)
    table = KIMI_K3.vocab_size * GPT2_SMALL.n_embd
    assert tied["vocab_tables"] == table and untied["vocab_tables"] == 2 * table
    assert untied["total"] - tied["total"] == table
    assert tied["vocab_tables"] > tied["blocks"]  # "more than all ... in the blocks"
    assert 0.5 < tied["share"] < untied["share"] < 0.8
    k3 = count_params(KIMI_K3)
    assert (k3.breakdown["token embeddings"] + k3.breakdown["head"]) / k3.total < 0.01


def test_1_3_last_only_returns_the_last_row_and_the_head_share():
    torch.manual_seed(0)
    config = GPTConfig(block_size=32, vocab_size=97, n_layer=2, n_head=2, n_embd=32)
    model = GPT2(config).eval()
    idx = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        last = ch01.forward_last_only(model, idx, last_only=True)
        every = ch01.forward_last_only(model, idx)
        full = model(idx)
    assert last.shape == (2, 1, 97)
    torch.testing.assert_close(every, full, rtol=0, atol=0)  # without last_only: GPT2.forward
    torch.testing.assert_close(last, full[:, -1:], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="last_only"):
        ch01.forward_last_only(model, idx, last_only="no")
    share = ch01.head_share(GPT2_SMALL, prompt_len=8)
    V, L, d = GPT2_SMALL.vocab_size, GPT2_SMALL.n_layer, GPT2_SMALL.n_embd
    assert share["head_macs"] == V * d and share["blocks_macs"] == 12 * L * d * d
    assert 0.3 < share["head_share"] < 0.32
    assert share["prefill_saved_macs"] == 7 * V * d
    assert share["prefill_saved_share"] < share["head_share"]
    assert ch01.head_share(GPT2_SMALL, 10_000)["prefill_saved_share"] == pytest.approx(share["head_share"], rel=1e-3)
