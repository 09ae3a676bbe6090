"""The KDA / attention hybrid: schedule, mixer factory, its layers' caches = full forward, cache sizes."""

import pytest
import torch

from gpt2k3.accounting import hybrid_layers
from gpt2k3.archs import KIMI_LINEAR_48B
from gpt2k3.model import GPT
from gpt2k3.layers.attention import CausalSelfAttention
from gpt2k3.config import GPTConfig
from gpt2k3.cache import ModelCache, StateCache
from gpt2k3.cache import KVCache, concat_cache
from gpt2k3.layers.deltanet import KDA, DeltaState, GatedDeltaNet
from gpt2k3.models.hybrid import (ATTENTION_KIND, KDA_KIND, forward_in_pieces, hybrid_gpt,
    hybrid_mixer, hybrid_schedule, schedule_of)

CFG = GPTConfig(block_size=64, vocab_size=101, n_layer=6, n_head=2, n_embd=16)


def ids(T, B=2, seed=0):
    return torch.randint(0, CFG.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- schedule
def test_kimi_linear_schedule():
    sched = hybrid_schedule(27, 3)
    attention = [i + 1 for i, s in enumerate(sched) if s == ATTENTION_KIND]
    assert attention == [4, 8, 12, 16, 20, 24, 27]  # Kimi Linear 48B's full_attn_layers (1-based)
    assert tuple(i for i, s in enumerate(sched) if s == KDA_KIND) == KIMI_LINEAR_48B.kda_layers
    assert sched.count(KDA_KIND) == 20


@pytest.mark.parametrize("n_layer", [1, 2, 5, 8, 13])
@pytest.mark.parametrize("ratio", [0, 1, 3, 7, 40])
def test_schedule_agrees_with_accounting(n_layer, ratio):
    sched = hybrid_schedule(n_layer, ratio)
    assert len(sched) == n_layer and sched[-1] == ATTENTION_KIND
    assert tuple(i for i, s in enumerate(sched) if s == KDA_KIND) == hybrid_layers(n_layer, ratio)
    if ratio == 0:
        assert set(sched) == {ATTENTION_KIND}


def test_all_kda_schedule():
    assert hybrid_schedule(5, None) == (KDA_KIND,) * 5


@pytest.mark.parametrize("args, match", [((0, 3), "n_layer must be a positive int"),
                                         ((4.0, 3), "n_layer must be a positive int"),
                                         ((4, -1), "ratio must be None"),
                                         ((4, 1.5), "ratio must be None"),
                                         ((4, True), "ratio must be None")])
def test_bad_schedule(args, match):
    with pytest.raises(ValueError, match=match):
        hybrid_schedule(*args)


# --------------------------------------------------------------------------- model
def test_mixer_factory_builds_the_schedule():
    torch.manual_seed(0)
    model = hybrid_gpt(CFG, ratio=2)
    kinds = schedule_of(model)
    assert kinds == hybrid_schedule(6, 2) == ("kda", "kda", "attention", "kda", "kda", "attention")
    for block, kind in zip(model.transformer.h, kinds):
        assert isinstance(block.attn, CausalSelfAttention if kind == ATTENTION_KIND else KDA)
    other = GPT(CFG, mixer=hybrid_mixer(kinds, GatedDeltaNet, conv_size=0))
    assert isinstance(other.transformer.h[0].attn, GatedDeltaNet)
    assert other.transformer.h[0].attn.conv_size == 0


def test_mixer_factory_rejects_mismatches():
    with pytest.raises(ValueError, match="the schedule has 3 layers but config.n_layer is 6"):
        GPT(CFG, mixer=hybrid_mixer(("kda", "kda", "attention")))
    for bad in ("kda", [], ["kda", "mamba"], None):
        with pytest.raises(ValueError, match="schedule must be"):
            hybrid_mixer(bad)
    with pytest.raises(ValueError, match="model must be a GPT"):
        schedule_of(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("ratio", [0, 1, 2, None])
@pytest.mark.parametrize("sizes", [[9] + [1] * 11, [1] * 20, [5, 7, 8]])
def test_hybrid_cache_prompt_then_decode_equals_full_forward(ratio, sizes):
    torch.manual_seed(ratio or 0)
    model = hybrid_gpt(CFG, ratio=ratio).double().eval()
    idx = ids(sum(sizes))
    with torch.no_grad():
        full = model(idx)
    cache = model.new_cache(2, 32)
    stepped, used = forward_in_pieces(model, idx, cache, sizes)
    torch.testing.assert_close(stepped, full, atol=1e-12, rtol=1e-12)
    assert cache.length == sum(sizes) and len(used) == len(sizes)
    assert all(c.length == sum(sizes) for c in cache)


def test_the_cache_follows_the_schedule():
    """A hybrid's cache is ``model.new_cache``: a KVCache for each attention layer, a
    StateCache for each KDA layer, in the model's dtype."""
    torch.manual_seed(0)
    for ratio in (0, 1, 2, None):
        model = hybrid_gpt(CFG, ratio=ratio).double()
        cache = model.new_cache(2, 16)
        assert isinstance(cache, ModelCache) and len(cache) == CFG.n_layer
        assert cache.kinds == tuple("KVCache" if k == ATTENTION_KIND else "StateCache"
                                    for k in schedule_of(model))
        assert all(c.k.dtype == torch.float64 for c in cache if isinstance(c, KVCache))


def test_all_attention_hybrid_matches_a_plain_kv_cache():
    """With no KDA layer the hybrid is GPT-2: the same weights give the same logits as a plain
    GPT through its KV caches (bit for bit), and as the seed's concatenating cache."""
    torch.manual_seed(0)
    model = hybrid_gpt(CFG, ratio=0).eval()
    plain = GPT(CFG).eval()
    plain.load_state_dict(model.state_dict())
    idx = ids(12)
    sizes = [4] + [1] * 8
    a, _ = forward_in_pieces(model, idx, model.new_cache(2, 12), sizes)
    b, _ = forward_in_pieces(plain, idx, plain.new_cache(2, 12), sizes)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    c, _ = forward_in_pieces(model, idx, concat_cache(model, 2), sizes)
    torch.testing.assert_close(c, a, atol=1e-6, rtol=1e-6)


# --------------------------------------------------------------------------- cache sizes
def test_cache_holds_kv_only_for_attention_layers_and_states_stay_fixed():
    torch.manual_seed(0)
    model = hybrid_gpt(CFG, ratio=2).eval()  # attention in layers 3 and 6 (1-based)
    cache = model.new_cache(2, 40)
    attention = tuple(i for i, c in enumerate(cache) if isinstance(c, KVCache))
    linear = tuple(i for i, c in enumerate(cache) if isinstance(c, StateCache))
    assert attention == (2, 5) and linear == (0, 1, 3, 4)
    kv_alloc = 2 * 2 * (2 * CFG.n_head * 40 * CFG.head_dim) * 4  # layers x (K, V) x numbers x fp32
    assert cache.nbytes == kv_alloc and cache.used_nbytes == 0
    assert cache.nbytes_by_kind() == {"StateCache": 0, "KVCache": 0}
    _, used = forward_in_pieces(model, ids(20), cache, [10] + [1] * 10)
    per_token = 2 * 2 * (2 * CFG.n_head * CFG.head_dim) * 4  # layers x batch x (K+V) x fp32
    state = cache.nbytes_by_kind()["StateCache"]
    assert state == 4 * model.transformer.h[0].attn.state_numbers(batch=2) * 4
    assert [u - state for u in used] == [per_token * n for n in range(10, 21)]
    assert cache.nbytes_by_kind()["KVCache"] == per_token * 20
    assert cache.used_nbytes == state + per_token * 20
    assert cache.nbytes == kv_alloc + state
    assert all(isinstance(cache[i].state, DeltaState) for i in linear)


def test_cache_errors_and_reset():
    torch.manual_seed(0)
    model = hybrid_gpt(CFG, ratio=2).eval()
    cache = model.new_cache(1, 8)
    # each layer accepts only its own kind of cache: a KDA layer refuses a KV cache, an
    # attention layer a state (the old HybridCache refused the wrong layer index)
    kda, attn = model.transformer.h[0].attn, model.transformer.h[2].attn
    x = torch.zeros(1, 1, CFG.n_embd)
    with pytest.raises(ValueError, match=r"cache must be a StateCache \(from new_cache\), got KVCache"):
        kda(x, cache=cache[2])
    with pytest.raises(ValueError):  # the state cache refuses the attention layer's write
        attn(x, cache=cache[0])
    assert cache.length == 0  # a refused cache is left as it was
    # so another schedule's cache is refused by the model
    other = hybrid_gpt(CFG, ratio=1).new_cache(1, 8)
    with torch.no_grad(), pytest.raises(ValueError, match="KVCache|StateCache"):
        model(ids(1, B=1), cache=other)
    forward_in_pieces(model, ids(8, B=1), cache, [8])
    with pytest.raises(ValueError, match="Cache overflow"):  # the first full layer refuses
        with torch.no_grad():
            model(ids(1, B=1), cache=cache)
    assert cache.length == 8
    cache.reset()
    assert cache.length == 0 and cache.used_nbytes == 0
    assert cache.nbytes_by_kind() == {"StateCache": 0, "KVCache": 0}
    assert all(c.state is None for c in cache if isinstance(c, StateCache))
    all_kda = hybrid_gpt(GPTConfig(block_size=64, vocab_size=101, n_layer=3, n_head=2, n_embd=16),
                         ratio=None).new_cache(1, 4)
    assert all_kda.kinds == ("StateCache",) * 3 and all_kda.nbytes == 0
    all_kda.check_room(4)  # a state holds what new_cache(1, 4) promised: 4 tokens, no more
    for c in all_kda:
        c.extend(torch.zeros(1), 4)
    assert all_kda.length == 4
    with pytest.raises(ValueError, match="StateCache overflow"):
        all_kda[0].extend(torch.zeros(1), 1)


def test_forward_in_pieces_validates():
    torch.manual_seed(0)
    model = hybrid_gpt(CFG, ratio=1).eval()
    cache = model.new_cache()
    with pytest.raises(ValueError, match="sizes must be positive ints adding up to T = 5"):
        forward_in_pieces(model, ids(5), cache, [2, 2])
    with pytest.raises(ValueError, match="sizes must be positive ints"):
        forward_in_pieces(model, ids(5), cache, [5, 0])
    with pytest.raises(ValueError, match="idx must be a"):
        forward_in_pieces(model, ids(5)[0], cache, [5])


def test_generate_through_the_hybrid_cache():
    """gpt2k3.model.generate decodes a hybrid through its layers' caches (``model.new_cache``,
    the default): same greedy tokens as recomputing every step."""
    from gpt2k3.model import generate

    torch.manual_seed(0)
    model = hybrid_gpt(CFG, ratio=2).double()
    prompt = ids(5)
    recomputed = generate(model, prompt, 12, temperature=0, use_cache=False)
    assert torch.equal(generate(model, prompt, 12, temperature=0), recomputed)
    cache = model.new_cache(2, 17)
    assert torch.equal(generate(model, prompt, 12, temperature=0, cache=cache), recomputed)
    assert cache.length == 16 and set(cache.kinds) == {"KVCache", "StateCache"}
