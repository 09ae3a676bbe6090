"""count_params against real modules (built on the meta device: no memory)."""

import pytest
import torch

from gpt2k3.accounting import COMPONENTS, ArchSpec, count_params, kv_cache_bytes
from gpt2k3.archs import GPT2_FAMILY, GPT2_SMALL, K3_TOTAL_PARAMS, spec_from_gpt_config
from gpt2k3.gpt2 import GPT, GPTConfig


def _config(spec):
    return GPTConfig(block_size=spec.max_positions, vocab_size=spec.vocab_size, n_layer=spec.n_layer,
                     n_head=spec.n_head, n_embd=spec.d_model)


@pytest.mark.parametrize("spec", GPT2_FAMILY, ids=lambda s: s.name)
def test_gpt2_family_counts_equal_built_models(spec):
    with torch.device("meta"):
        model = GPT(_config(spec))
    c = count_params(spec)
    assert c.total == model.num_params() == c.active
    assert sum(c.breakdown.values()) == c.total
    assert tuple(c.breakdown) == COMPONENTS
    blocks = model.transformer.h
    assert c.breakdown["attention"] == sum(p.numel() for b in blocks for p in b.attn.parameters())
    assert c.breakdown["MLP"] == sum(p.numel() for b in blocks for p in b.mlp.parameters())
    assert c.breakdown["position embeddings"] == model.transformer.wpe.weight.numel()
    assert c.breakdown["head"] == 0


@pytest.mark.parametrize("spec", GPT2_FAMILY, ids=lambda s: s.name)
def test_gpt2_family_counts_equal_hugging_face(spec):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=spec.n_layer, n_head=spec.n_head, n_embd=spec.d_model,
                                  vocab_size=spec.vocab_size, n_positions=spec.max_positions)
    with torch.device("meta"):
        hf = transformers.GPT2LMHeadModel(cfg)
    assert count_params(spec).total == sum(p.numel() for p in hf.parameters())


def test_gpt2_small_is_the_published_size():
    # 124,439,808 is GPT-2 small's size as every framework counts it; this pins the
    # formula, the meta-model tests above pin it to real modules.
    assert count_params(GPT2_SMALL).total == 124_439_808


def test_untied_head_and_rmsnorm_and_no_bias():
    s = GPT2_SMALL.with_(tied_embeddings=False)
    assert count_params(s).breakdown["head"] == s.vocab_size * s.d_model
    r = GPT2_SMALL.with_(norm="rmsnorm", bias=False)
    assert count_params(r).breakdown["norms"] == (2 * 12 + 1) * 768
    assert count_params(r).breakdown["attention"] == 12 * 4 * 768 * 768


def test_spec_from_gpt_config_matches_the_model():
    cfg = GPTConfig(block_size=64, vocab_size=300, n_layer=3, n_head=2, n_embd=32, bias=False)
    with torch.device("meta"):
        model = GPT(cfg)
    assert count_params(spec_from_gpt_config(cfg)).total == model.num_params()


@pytest.mark.parametrize("field,value", [("n_layer", 0), ("d_model", -8), ("vocab_size", 1.5),
                                         ("n_head", 0), ("d_ff", 0), ("max_positions", -1),
                                         ("norm", "batchnorm")])
def test_arch_spec_rejects_bad_fields(field, value):
    with pytest.raises(ValueError, match=field):
        GPT2_SMALL.with_(**{field: value})


def test_arch_spec_rejects_indivisible_heads():
    with pytest.raises(ValueError, match="divisible"):
        GPT2_SMALL.with_(n_head=7)


def test_count_params_rejects_non_spec():
    with pytest.raises(ValueError, match="ArchSpec"):
        count_params({"n_layer": 12})


def test_kv_cache_bytes():
    # K and V, 12 layers, 768 channels, fp16
    assert kv_cache_bytes(GPT2_SMALL, 1024) == 2 * 12 * 768 * 1024 * 2
    assert kv_cache_bytes(GPT2_SMALL, 10, batch=3, dtype_bytes=4) == 2 * 12 * 768 * 10 * 3 * 4
    with pytest.raises(ValueError, match="context_len"):
        kv_cache_bytes(GPT2_SMALL, -1)
    with pytest.raises(ValueError, match="dtype_bytes"):
        kv_cache_bytes(GPT2_SMALL, 1, dtype_bytes=0)


def test_the_headline_ratio():
    exact = K3_TOTAL_PARAMS / count_params(GPT2_SMALL).total
    headline = K3_TOTAL_PARAMS // round(count_params(GPT2_SMALL).total, -6)
    assert int(headline) == 22_580
    assert round(exact) == 22_501
    assert isinstance(ArchSpec.field_names(), tuple)
