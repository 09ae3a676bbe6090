"""Oracle: the published MoE models, built by Hugging Face ``transformers`` on the meta device.

``DeepseekV3ForCausalLM`` (DeepSeek-V3, Kimi K2) and ``KimiLinearForCausalLM`` (Kimi Linear
48B-A3B) are instantiated under ``torch.device("meta")``: every parameter has a shape and no
storage, so a trillion-parameter model costs a second and no memory.  Their configurations are
written here *independently* of :mod:`gpt2k3.archs` -- transcribed from each model's published
``config.json`` (DeepSeek-V3's equals ``DeepseekV3Config()``'s defaults) -- so a wrong size in
``archs`` fails the comparison instead of being copied into it.

Checked: ``count_params(...).total`` equals the model's parameter count exactly; every
component of the breakdown equals the modules that hold it; ``active`` (every parameter except
the routed experts a token does not use) equals a count over the modules (embedding + head +
norms + attention + dense MLPs + router + shared experts + ``top_k`` routed experts per MoE
layer); ``matmul_active`` equals the weights of every matmul a token goes through.
"""

import pytest
import torch

from gpt2k3.accounting import count_params
from gpt2k3.archs import DEEPSEEK_V3, KIMI_K2, KIMI_LINEAR_48B

transformers = pytest.importorskip("transformers")

#: config.json of moonshotai/Kimi-K2-Instruct (the fields that fix parameter shapes).
KIMI_K2_CONFIG = dict(
    vocab_size=163840, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
    num_hidden_layers=61, num_attention_heads=64, num_key_value_heads=64, n_shared_experts=1,
    n_routed_experts=384, num_experts_per_tok=8, first_k_dense_replace=1, q_lora_rank=1536,
    kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, n_group=1,
    topk_group=1, routed_scaling_factor=2.827, tie_word_embeddings=False,
    max_position_embeddings=131072)

#: config.json of moonshotai/Kimi-Linear-48B-A3B-Instruct (layer lists are 1-based there).
_FULL = [4, 8, 12, 16, 20, 24, 27]
KIMI_LINEAR_CONFIG = dict(
    vocab_size=163840, hidden_size=2304, intermediate_size=9216, moe_intermediate_size=1024,
    num_hidden_layers=27, num_attention_heads=32, num_key_value_heads=32, num_experts=256,
    num_experts_per_token=8, num_shared_experts=1, first_k_dense_replace=1, q_lora_rank=None,
    kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
    tie_word_embeddings=False,
    linear_attn_config={"full_attn_layers": _FULL,
                        "kda_layers": [i for i in range(1, 28) if i not in _FULL],
                        "head_dim": 128, "num_heads": 32, "short_conv_kernel_size": 4})


def _meta(cls, config):
    with torch.device("meta"):
        return cls(config)


@pytest.fixture(scope="module")
def deepseek_v3():
    return DEEPSEEK_V3, _meta(transformers.DeepseekV3ForCausalLM, transformers.DeepseekV3Config())


@pytest.fixture(scope="module")
def kimi_k2():
    return KIMI_K2, _meta(transformers.DeepseekV3ForCausalLM,
                          transformers.DeepseekV3Config(**KIMI_K2_CONFIG))


@pytest.fixture(scope="module")
def kimi_linear():
    return KIMI_LINEAR_48B, _meta(transformers.KimiLinearForCausalLM,
                                  transformers.KimiLinearConfig(**KIMI_LINEAR_CONFIG))


MODELS = ["deepseek_v3", "kimi_k2", "kimi_linear"]


def _n(module_or_params) -> int:
    params = (module_or_params.parameters() if isinstance(module_or_params, torch.nn.Module)
              else module_or_params)
    return sum(p.numel() for p in params)


def _is_moe(layer) -> bool:
    return hasattr(layer.mlp, "experts")


def _expert_size(moe) -> int:
    """Parameters of one routed expert (the experts are packed into 3-D tensors)."""
    e = moe.experts
    return (e.gate_up_proj.numel() + e.down_proj.numel()) // e.gate_up_proj.shape[0]


def _top_k(model) -> int:
    return model.config.num_experts_per_tok


@pytest.mark.parametrize("name", MODELS)
def test_total_equals_the_meta_model(name, request):
    spec, model = request.getfixturevalue(name)
    assert count_params(spec).total == _n(model)


@pytest.mark.parametrize("name", MODELS)
def test_breakdown_equals_the_modules_that_hold_it(name, request):
    spec, model = request.getfixturevalue(name)
    c = count_params(spec)
    layers = model.model.layers
    assert c.breakdown["token embeddings"] == _n(model.model.embed_tokens)
    assert c.breakdown["head"] == _n(model.lm_head)
    assert c.breakdown["position embeddings"] == 0
    assert c.breakdown["attention"] == sum(_n(layer.self_attn) for layer in layers)
    assert c.breakdown["MLP"] == sum(_n(layer.mlp) for layer in layers)
    assert c.breakdown["norms"] == _n(model.model.norm) + sum(
        _n(layer.input_layernorm) + _n(layer.post_attention_layernorm) for layer in layers)
    moe = [layer.mlp for layer in layers if _is_moe(layer)]
    assert len(moe) == spec.n_moe_layers
    assert c.detail["router"] == sum(_n(m.gate) for m in moe)
    assert c.detail["shared experts"] == sum(_n(m.shared_experts) for m in moe)
    assert c.detail["routed experts"] == sum(_n(m.experts) for m in moe)
    assert c.detail["dense MLP"] == sum(_n(layer.mlp) for layer in layers if not _is_moe(layer))


def test_kimi_linear_schedule_and_mixers_match(kimi_linear):
    spec, model = kimi_linear
    kinds = ["kda" if t == "linear_attention" else "mla" for t in model.config.layer_types]
    assert tuple(kinds) == spec.layer_mixers
    c = count_params(spec)
    kda = [layer.self_attn for layer, k in zip(model.model.layers, kinds) if k == "kda"]
    mla = [layer.self_attn for layer, k in zip(model.model.layers, kinds) if k == "mla"]
    assert c.detail["linear attention"] == sum(_n(m) for m in kda)
    assert c.detail["softmax attention"] == sum(_n(m) for m in mla)


@pytest.mark.parametrize("name", MODELS)
def test_active_equals_a_count_over_the_modules(name, request):
    """Active = everything except the routed experts a token does not use."""
    spec, model = request.getfixturevalue(name)
    k = _top_k(model)
    active = _n(model.model.embed_tokens) + _n(model.lm_head) + _n(model.model.norm)
    for layer in model.model.layers:
        active += _n(layer.self_attn) + _n(layer.input_layernorm) + _n(layer.post_attention_layernorm)
        if _is_moe(layer):
            active += _n(layer.mlp.gate) + _n(layer.mlp.shared_experts) + k * _expert_size(layer.mlp)
        else:
            active += _n(layer.mlp)
    c = count_params(spec)
    assert c.active == active
    assert sum(c.active_detail.values()) == c.active < c.total


@pytest.mark.parametrize("name", MODELS)
def test_matmul_active_equals_the_weights_a_token_is_multiplied_through(name, request):
    """Linear weights (the head included), router weights, the depthwise convolutions, and
    ``top_k`` of the packed routed experts; not embeddings, norm gains, A_log or dt_bias."""
    spec, model = request.getfixturevalue(name)
    k = _top_k(model)
    total = 0
    for module in model.modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Conv1d)):
            total += module.weight.numel()
    for layer in model.model.layers:
        if _is_moe(layer):
            total += layer.mlp.gate.weight.numel() + k * _expert_size(layer.mlp)
    assert count_params(spec).matmul_active == total


# ----------------------------------------------------------------------------- hf_config
from gpt2k3.archs import GPT2_SMALL  # noqa: E402
from gpt2k3.oracles import hf_config, hf_meta_model, hf_param_counts  # noqa: E402

_SHAPE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
                 "num_hidden_layers", "num_attention_heads", "n_shared_experts", "n_routed_experts",
                 "num_experts_per_tok", "first_k_dense_replace", "q_lora_rank", "kv_lora_rank",
                 "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "tie_word_embeddings")


@pytest.mark.parametrize("spec, published", [
    (DEEPSEEK_V3, lambda: transformers.DeepseekV3Config()),
    (KIMI_K2, lambda: transformers.DeepseekV3Config(**KIMI_K2_CONFIG)),
    (KIMI_LINEAR_48B, lambda: transformers.KimiLinearConfig(**KIMI_LINEAR_CONFIG)),
], ids=["DeepSeek-V3", "Kimi K2", "Kimi Linear"])
def test_hf_config_of_a_spec_has_the_published_shapes(spec, published):
    ours, theirs = hf_config(spec), published()
    assert type(ours) is type(theirs)
    for name in _SHAPE_FIELDS:
        if name == "n_routed_experts" and not hasattr(theirs, name):
            name = "num_experts"  # KimiLinearConfig's name
        assert getattr(ours, name) == getattr(theirs, name), name
    assert getattr(ours, "layer_types", None) == getattr(theirs, "layer_types", None)


@pytest.mark.parametrize("spec", [
    GPT2_SMALL.with_(n_layer=2, vocab_size=1000),
    DEEPSEEK_V3.with_(n_layer=4, first_k_dense=1, n_routed_experts=16, top_k=4, n_shared_experts=2),
    DEEPSEEK_V3.with_(n_layer=3, n_routed_experts=0, top_k=0, n_shared_experts=0, q_lora_rank=None),
    KIMI_LINEAR_48B.with_(n_layer=5, kda_layers=(0, 2, 3), kda_conv_kernel=2, first_k_dense=2),
], ids=["gpt2", "deepseek-moe", "deepseek-dense", "kimi-linear"])
def test_hf_meta_model_counts_equal_ours(spec):
    model = hf_meta_model(spec)
    assert next(model.parameters()).device.type == "meta"
    assert _n(model) == count_params(spec).total
    assert hf_param_counts([spec]) == [count_params(spec).total]


@pytest.mark.parametrize("spec", [
    GPT2_SMALL.with_(attention="gqa", n_kv_head=4), GPT2_SMALL.with_(mlp="swiglu"),
    DEEPSEEK_V3.with_(tied_embeddings=True), KIMI_LINEAR_48B.with_(kda_conv_kernel=0),
])
def test_hf_config_refuses_what_it_cannot_express(spec):
    with pytest.raises(ValueError):
        hf_config(spec)
