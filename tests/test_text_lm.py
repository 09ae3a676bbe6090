"""The language-model experiment: every model builds at GPT-2's size, learns (the loss falls),
deterministically; evaluation, caches, sampling; the shipped GPT-2 loads and writes."""

import json
import math

import pytest
import torch
import torch.nn as nn

from gpt2k3.book import results
from gpt2k3.experiments import checkpoint, corpus as text, text_lm
from gpt2k3.model import GPT
from gpt2k3.layers.attention import CausalSelfAttention, RotaryCausalSelfAttention
from gpt2k3.layers.mlp import SwiGLU
from gpt2k3.layers.norms import RMSNorm
from gpt2k3.layers.deltanet import BoundedKDA
from gpt2k3.layers.mla import MLA as GatedNoPEMLA  # K3's MLA: MLAConfig(rope=False, output_gate=True)
from gpt2k3.layers.deltanet import KDA, DeltaNet, GatedDeltaNet
from gpt2k3.layers.linear_attention import LinearAttention
from gpt2k3.experiments.text_lm import MIXERS, ConvMixer, TextModelConfig, TextTrainConfig

TINY = TextModelConfig(n_layer=4, n_embd=32, n_head=2, context=32, max_context=128, chunk_size=16)
TRAIN = TextTrainConfig(steps=30, batch_size=4, lr=3e-3, warmup=3, eval_every=10,
                        curve_windows=4, eval_windows=2)
# A small, very regular corpus: a model that learns anything at all drops well below 8 bits.
_LINES = ["And God said, Let there be light: and there was light.",
          "And God saw the light, that it was good.",
          "And the evening and the morning were the first day."]
CORPUS = (text.encode("\n".join(_LINES * 40), torch.uint8),
          text.encode("\n".join(_LINES[::-1] * 10), torch.uint8))


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


LAYERS = {"softmax": [CausalSelfAttention] * 4, "softmax_conv": [ConvMixer] * 4,
          "linear": [ConvMixer] * 4, "deltanet": [DeltaNet] * 4,
          "gated_deltanet": [GatedDeltaNet] * 4, "kda": [KDA] * 4,
          "hybrid": [KDA, KDA, KDA, CausalSelfAttention],
          "k3": [BoundedKDA, BoundedKDA, BoundedKDA, GatedNoPEMLA],
          "transformer_pp": [RotaryCausalSelfAttention] * 4, "gpt2_fan_in": [CausalSelfAttention] * 4}


@pytest.mark.parametrize("mixer", MIXERS)
def test_every_model_has_its_mixers_and_positions(mixer):
    net = text_lm.build_model(mixer, TINY)
    kinds = [type(b.attn) for b in net.transformer.h]
    assert kinds == LAYERS[mixer]
    names = text_lm.mixer_names(net)
    assert len(names) == 4 and all(isinstance(n, str) for n in names)
    assert names[-1] == {"softmax": "softmax", "softmax_conv": "conv + softmax", "linear": "conv + linear",
                         "deltanet": "DeltaNet", "gated_deltanet": "Gated DeltaNet", "kda": "KDA",
                         "hybrid": "softmax", "k3": "MLA", "transformer_pp": "softmax + RoPE",
                         "gpt2_fan_in": "softmax"}[mixer]
    if mixer == "softmax_conv":
        assert all(isinstance(b.attn.inner, CausalSelfAttention) for b in net.transformer.h)
    if mixer == "linear":
        assert all(isinstance(b.attn.inner, LinearAttention) for b in net.transformer.h)
    assert net.config.vocab_size == 256
    if mixer in ("softmax", "gpt2_fan_in"):  # GPT-2: learned table of `context` rows, 4 d MLP, tied head
        assert net.config.position == "learned" and net.config.block_size == TINY.context
        assert net.transformer.wpe.weight.shape == (TINY.context, TINY.n_embd)
        assert net.transformer.h[0].mlp.c_fc.out_features == 4 * TINY.n_embd
        assert net.lm_head.weight is net.transformer.wte.weight
    else:
        assert net.config.position == "none" and net.config.block_size == TINY.max_context
        assert "wpe" not in net.transformer
    if mixer == "transformer_pp":  # the Llama recipe: RMSNorm, SwiGLU, no biases, untied head
        assert all(isinstance(b.ln_1, RMSNorm) and isinstance(b.ln_2, RMSNorm)
                   and isinstance(b.mlp, SwiGLU) for b in net.transformer.h)
        assert isinstance(net.transformer.ln_f, RMSNorm)
        assert net.lm_head.weight is not net.transformer.wte.weight
        assert not any(name.endswith("bias") for name, _ in net.named_parameters())


@pytest.mark.parametrize("config", [TINY, TextModelConfig()], ids=["tiny", "chapter"])
def test_parameter_counts_are_matched_to_gpt2(config):
    target = text_lm.build_model("softmax", config).num_params()
    for mixer in MIXERS:
        sizes = text_lm.matched_sizes(mixer, config)
        n = text_lm.build_model(mixer, config, sizes=sizes).num_params()
        # the nearest count the MLP width allows: one unit of width moves it by ~2 n_layer d
        assert abs(n - target) / target < 0.01, (mixer, n, target)
        assert text_lm.param_counts(text_lm.build_model(mixer, config))["total"] == n
    k3 = text_lm.param_counts(text_lm.build_model("k3", config))
    assert k3["active"] < k3["total"]  # 2 of 8 routed experts per token


def test_conv_mixer_starts_as_its_layer_and_decodes_like_a_forward():
    torch.manual_seed(0)
    from gpt2k3.config import GPTConfig
    cfg = GPTConfig(block_size=64, vocab_size=256, n_layer=1, n_head=2, n_embd=16, position="none")
    inner = CausalSelfAttention(cfg)
    conv = ConvMixer(inner, 16)
    x = torch.randn(2, 20, 16)
    torch.testing.assert_close(conv(x), inner(x))  # identity at initialisation
    with torch.no_grad():
        conv.conv_weight.normal_()
    full = conv(x)
    cache = conv.new_cache(2, 20)
    parts = [conv(x[:, :7], cache=cache)] + [conv(x[:, t:t + 1], cache=cache) for t in range(7, 20)]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-5, atol=1e-6)
    assert cache.length == 20
    assert cache.used_nbytes == 2 * 2 * 20 * 16 * 4 + 2 * 16 * 3 * 4  # K, V + the conv's tail
    cache.reset()
    assert cache.length == 0 and cache.conv is None
    with pytest.raises(ValueError, match="ConvCache"):
        conv(x, cache=inner.new_cache(2, 20))
    with pytest.raises(ValueError, match="kernel_size"):
        ConvMixer(inner, 16, kernel_size=1)


@pytest.mark.parametrize("mixer", MIXERS)
def test_a_few_steps_of_each_model_lower_the_loss(mixer):
    run = text_lm.train(mixer, CORPUS, TINY, TRAIN, seed=0, final_eval=False)
    assert len(run.losses) == TRAIN.steps and all(math.isfinite(v) for v in run.losses)
    first, last = run.curve[0][1], run.curve[-1][1]
    assert [s for s, _ in run.curve] == TRAIN.curve_steps()
    assert 7.0 < first < 9.0  # about log2(256) bits before training
    assert last < first - 2.5, (mixer, run.curve)
    assert sum(run.losses[-5:]) / 5 < sum(run.losses[:5]) / 5 - 2.0


def test_training_is_deterministic_and_until_reproduces_the_start():
    a = text_lm.train("deltanet", CORPUS, TINY, TRAIN, seed=1, final_eval=False)
    b = text_lm.train("deltanet", CORPUS, TINY, TRAIN, seed=1, final_eval=False)
    c = text_lm.train("deltanet", CORPUS, TINY, TRAIN, seed=1, until=10, final_eval=False)
    d = text_lm.train("deltanet", CORPUS, TINY, TRAIN, seed=2, until=10, final_eval=False)
    assert a.losses == b.losses and a.curve == b.curve
    assert c.losses == a.losses[:10] and c.curve == a.curve[:2]
    assert d.losses != c.losses
    assert c.tokens == 10 * TRAIN.batch_size * TINY.context
    e = text_lm.train("transformer_pp", CORPUS, TINY, TRAIN, seed=1, until=10, final_eval=False)
    f = text_lm.train("transformer_pp", CORPUS, TINY, TRAIN, seed=1, until=10, final_eval=False)
    assert e.losses == f.losses and e.curve == f.curve  # the new baseline too


def test_the_final_evaluation_and_its_record():
    steps = []
    run = text_lm.train("softmax", CORPUS, TINY, TRAIN, seed=0, callback=lambda s, b: steps.append(s),
                        sample_args=dict(prompt="And God", max_new_tokens=12, temperature=0.8, seed=0))
    assert steps == list(range(TRAIN.steps))
    assert set(run.position_bits) == set(TINY.lengths) == {32, 128}
    assert run.position_bits[128] is None and run.length_bits[128] is None  # past its table
    assert len(run.position_bits[32]) == 32
    assert run.decode_bytes == {32: 4 * 2 * 32 * 32 * 4, 128: None}
    assert run.val_bits == pytest.approx(sum(run.position_bits[32]) / 32)
    assert len(run.sample.ids) == 12 and run.sample.text == text.decode(run.sample.ids)
    record = text_lm.run_record(run)
    json.dumps(record)
    assert record["length_bits"] == {"32": record["val_bits"], "128": None}
    assert len(record["position_bits"]["32"]) == len(text_lm.position_bins(32))
    assert all(float(f"{v:.4e}") == v for v in record["losses"])  # 5 significant digits


def test_every_length_scores_the_same_bytes():
    net = text_lm.build_model("deltanet", TINY, seed=3)
    windows = text.eval_windows(CORPUS[1], 128, 2)
    bits = text_lm.evaluate(net, windows, (32, 64, 128))
    # the first 32 positions of a 128-window are the 32-window's positions: same bytes, same context
    torch.testing.assert_close(bits[128][:32],
                               text_lm.position_bits(net, windows[0][:, :32], windows[1][:, :32]))
    x32 = windows[0].reshape(-1, 32)
    torch.testing.assert_close(bits[32], text_lm.position_bits(net, x32, windows[1].reshape(-1, 32)))
    with pytest.raises(ValueError, match="divide"):
        text_lm.evaluate(net, windows, (48,))
    gpt2 = text_lm.build_model("softmax", TINY)
    assert text_lm.evaluate(gpt2, windows, (32, 128))[128] is None
    with pytest.raises(ValueError, match="position table"):
        text_lm.position_bits(gpt2, *windows)


def test_position_bits_by_hand():
    net = text_lm.build_model("softmax", TINY, seed=0).eval()
    x, y = text.eval_windows(CORPUS[0], 32, 3)
    with torch.no_grad():
        logp = torch.log_softmax(net(x).double(), -1)
    nll = -logp.gather(-1, y[..., None])[..., 0].mean(0) / math.log(2)
    torch.testing.assert_close(text_lm.position_bits(net, x, y, batch=2), nll, rtol=1e-6, atol=1e-6)


def test_decode_bytes_grow_only_with_a_kv_cache():
    idx = text.encode("x" * 128)[None]
    grow = text_lm.decode_bytes(text_lm.build_model("softmax_conv", TINY), idx, (32, 64, 128))
    flat = text_lm.decode_bytes(text_lm.build_model("kda", TINY), idx, (32, 64, 128))
    per_token = 4 * 2 * 32 * 4  # 4 layers, K and V of width 32, float32
    assert grow[64] - grow[32] == 32 * per_token and grow[128] - grow[64] == 64 * per_token
    assert flat[32] == flat[64] == flat[128]
    hybrid = text_lm.decode_bytes(text_lm.build_model("hybrid", TINY), idx, (32, 128))
    assert hybrid[128] - hybrid[32] == 1 * 2 * 96 * 32 * 4  # only the one attention layer grows


def _greedy_reference(model, prompt, n):
    """Greedy decoding the slow way: the whole sequence through the model for every byte."""
    idx = text.encode(prompt)[None]
    net = model.double().eval()
    with torch.no_grad():
        for _ in range(n):
            idx = torch.cat([idx, net(idx)[:, -1].argmax(-1, keepdim=True)], 1)
    return idx[0, -n:].tolist()


@pytest.mark.parametrize("mixer", ["softmax", "softmax_conv", "kda", "k3"])
def test_cached_sampling_equals_the_recompute_reference(mixer):
    net = text_lm.build_model(mixer, TINY, seed=5)
    out = text_lm.sample(net, "And God", 10, temperature=0)
    assert out.ids == _greedy_reference(text_lm.build_model(mixer, TINY, seed=5), "And God", 10)
    assert out.min_margin > 0


def test_sampling_is_seeded_and_leaves_the_model_alone():
    net = text_lm.build_model("linear", TINY, seed=0)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    a = text_lm.sample(net, "And", 20, temperature=1.0, seed=7)
    b = text_lm.sample(net, "And", 20, temperature=1.0, seed=7)
    c = text_lm.sample(net, "And", 20, temperature=1.0, seed=8)
    assert a == b and a.ids != c.ids
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert next(net.parameters()).dtype == torch.float32
    with pytest.raises(ValueError, match="exceeds block_size"):
        text_lm.sample(text_lm.build_model("softmax", TINY), "And", 40)
    with pytest.raises(ValueError, match="temperature"):
        text_lm.sample(net, "And", 2, temperature=-1)
    with pytest.raises(ValueError, match="prompt"):
        text_lm.sample(net, "", 2)


def test_position_bins_cover_every_position():
    for n in (1, 5, 32, 256, 2048):
        bins = text_lm.position_bins(n)
        assert bins[0][0] == 0 and bins[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(bins, bins[1:]))
    assert text_lm.position_bins(8)[:4] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert text_lm.bin_positions([1.0, 2.0, 3.0, 5.0], [(0, 1), (1, 4)]) == [1.0, 10 / 3]


def test_checkpoint_round_trip(tmp_path):
    net = text_lm.build_model("softmax", TINY, seed=0)
    path = tmp_path / "m.pt"
    sha = checkpoint.save_checkpoint(net, path, mixer="softmax", meta={"seed": 0})
    assert len(sha) == 64
    back, meta = checkpoint.load_checkpoint(path)
    assert meta == {"seed": 0} and back.config == net.config
    x = text.encode("And God said")[None]
    torch.testing.assert_close(back(x), net.eval()(x), rtol=0, atol=0)
    with pytest.raises(ValueError, match="only the GPT-2-shaped"):
        checkpoint.save_checkpoint(text_lm.build_model("kda", TINY), path, mixer="kda")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="checkpoint"):
        checkpoint.load_checkpoint(tmp_path / "junk.pt")


def test_the_shipped_gpt2_loads_and_writes_what_the_results_record():
    model = checkpoint.load_gpt2()
    assert isinstance(model, GPT) and not model.training
    assert model.config.block_size == 256 and model.config.vocab_size == 256
    assert model.config.position == "learned" and type(model.transformer.h[0].attn) is CausalSelfAttention
    data = results.load("text_lm_tuned.json")  # the longer run trained it
    shipped = data["checkpoint"]
    assert shipped["mixer"] in text_lm.LEARNED_POSITIONS
    run = next(r for r in data["runs"] if (r["mixer"], r["seed"]) == (shipped["mixer"], shipped["seed"]))
    assert shipped["sample"] == run["sample"]
    s = shipped["sample"]
    a = text_lm.sample(model, s["prompt"], len(s["ids"]), temperature=data["config"]["sample"]["temperature"],
                       seed=data["config"]["sample"]["seed"])
    b = text_lm.sample(model, s["prompt"], len(s["ids"]), temperature=data["config"]["sample"]["temperature"],
                       seed=data["config"]["sample"]["seed"])
    assert a == b
    assert a.ids == s["ids"] and a.text == s["text"]
    assert a.min_margin > 1e-9  # far above float64 rounding: no machine picks another byte
    assert checkpoint.checkpoint_path().read_bytes() and shipped["bytes"] < 8 * 2**20


@pytest.mark.parametrize("call, match", [
    (lambda: text_lm.build_model("gpt5"), "mixer must be one of"),
    (lambda: text_lm.build_model("softmax", TINY, sizes={"mlp_hidden": 0}), "sizes"),
    (lambda: text_lm.build_model("k3", TINY, sizes={"mlp_hidden": 64}), "may set only"),
    (lambda: text_lm.train("softmax", CORPUS, TINY, TRAIN, until=31), "until"),
    (lambda: text_lm.train("softmax", "corpus", TINY, TRAIN), "data must be"),
    (lambda: text_lm.train("softmax", CORPUS, TINY, "fast"), "config must be"),
    (lambda: TextModelConfig(context=100, max_context=250), "multiple of context"),
    (lambda: TextModelConfig(n_embd=30, n_head=4), "divisible"),
    (lambda: TextTrainConfig(lr=0), "lr"),
    (lambda: text_lm.param_counts(nn.Linear(2, 2)), "model must be a GPT"),
    (lambda: checkpoint.checkpoint_path("../x.pt"), "plain file name"),
])
def test_bad_arguments_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_scale_ratios():
    r = text_lm.scale_ratios(1000, 10, {"p": {"params": 2e6, "active": 1e5, "tokens": 1e3}})
    assert r == {"p": {"params": 2000.0, "active": 100.0, "tokens": 100.0}}
    default = text_lm.scale_ratios(858_880, 614_400)
    assert set(default) == set(text_lm.PUBLISHED_SCALE)
    assert 1_000 < default["deltanet"]["params"] < 2_000
    assert default["kimi_linear"]["active"] < default["kimi_linear"]["params"]
    with pytest.raises(ValueError, match="params"):
        text_lm.scale_ratios(0, 10)
    with pytest.raises(ValueError, match="tokens"):
        text_lm.scale_ratios(10, True)
    with pytest.raises(ValueError, match="published"):
        text_lm.scale_ratios(10, 10, {"p": {"params": 1}})
    with pytest.raises(ValueError, match="published"):
        text_lm.scale_ratios(10, 10, {"p": {"params": 1, "active": float("nan"), "tokens": 1}})
    with pytest.raises(ValueError, match="published"):
        text_lm.scale_ratios(10, 10, {})


def test_eval_ngram_baselines_score_the_evaluation_windows():
    """The stored n-gram baselines are ngram_window_bits on the final evaluation's windows."""
    from types import SimpleNamespace

    data = SimpleNamespace(train=CORPUS[0], validation=CORPUS[1])
    out = text_lm.eval_ngram_baselines(data, TINY, TRAIN, {"head": (0, 16), "tail": (64, 128)})
    win = text.eval_windows(CORPUS[1], TINY.max_context, TRAIN.eval_windows)
    assert out["bigram_eval"] == round(text.ngram_window_bits(CORPUS[0], win, 2), 4)
    part = (win[0][:, 64:128], win[1][:, 64:128])
    assert out["ng3_tail"] == round(text.ngram_window_bits(CORPUS[0], part, 3), 4)
    assert out["fourgram_eval"] == round(text.ngram_window_bits(CORPUS[0], win, 4), 4)
    assert set(out) == {"bigram_eval", "trigram_eval", "fourgram_eval", "ng2_head", "ng3_head", "ng2_tail", "ng3_tail"}
    with pytest.raises(ValueError, match="ranges"):
        text_lm.eval_ngram_baselines(data, TINY, TRAIN, {"bad": (0, TINY.max_context + 1)})


def test_the_results_hold_the_evaluation_baselines():
    stored = results.load("text_lm.json")["eval_baselines"]
    assert stored["bigram_eval"] > stored["trigram_eval"] > 0
    assert set(stored["ranges"]) == {"inside", "beyond"}


# ------------------------------------------------------------------ RoPE and Transformer++
def _rope_layer(seed=0, n_embd=16, n_head=2):
    from gpt2k3.config import GPTConfig
    torch.manual_seed(seed)
    cfg = GPTConfig(block_size=64, vocab_size=256, n_layer=1, n_head=n_head, n_embd=n_embd,
                    position="none", bias=False)
    return RotaryCausalSelfAttention(cfg), cfg


def test_rope_attention_decodes_like_one_forward():
    layer, _ = _rope_layer()
    x = torch.randn(2, 20, 16)
    full = layer(x)
    cache = layer.new_cache(2, 20)
    parts = [layer(x[:, :7], cache=cache)] + [layer(x[:, t:t + 1], cache=cache) for t in range(7, 20)]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="KVCache"):
        layer(x, cache=object())


def test_rope_scores_depend_only_on_the_offset():
    from gpt2k3.layers.mla import apply_rope
    q, k = torch.randn(1, 1, 1, 8, dtype=torch.float64), torch.randn(1, 1, 1, 8, dtype=torch.float64)
    def score(m, n):
        return float((apply_rope(q, torch.tensor([m]), 10000.0, interleave=False)
                      * apply_rope(k, torch.tensor([n]), 10000.0, interleave=False)).sum())
    assert score(5, 2) == pytest.approx(score(105, 102), rel=1e-12)
    assert score(5, 2) != pytest.approx(score(5, 3), rel=1e-6)


def test_rope_attention_is_gpt2_attention_plus_the_rotation():
    """Same weights: at position 0 nothing is rotated, so the first output equals GPT-2's layer;
    later outputs differ. GPT-2's own layer is unchanged."""
    layer, cfg = _rope_layer(seed=3)
    plain = CausalSelfAttention(cfg)
    plain.load_state_dict(layer.state_dict())
    x = torch.randn(1, 6, 16)
    a, b = layer(x), plain(x)
    torch.testing.assert_close(a[:, 0], b[:, 0])
    assert not torch.allclose(a[:, 1:], b[:, 1:])
    with pytest.raises(ValueError, match="even"):
        _rope_layer(n_embd=6, n_head=2)
    with pytest.raises(ValueError, match="rope_theta"):
        RotaryCausalSelfAttention(cfg, rope_theta=0)


def test_transformer_pp_equals_hugging_face_llama():
    """Transformer++ is Llama: with its weights loaded into transformers' LlamaForCausalLM (an
    independent implementation of RoPE, RMSNorm and SwiGLU), the logits agree."""
    transformers = pytest.importorskip("transformers")
    tiny = TextModelConfig(n_layer=2, n_embd=32, n_head=2, context=32, max_context=128, chunk_size=16)
    net = text_lm.build_model("transformer_pp", tiny, seed=0).eval()
    d, hidden = tiny.n_embd, net.transformer.h[0].mlp.gate_proj.out_features
    cfg = transformers.LlamaConfig(
        vocab_size=256, hidden_size=d, intermediate_size=hidden, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6,
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    hf = transformers.LlamaForCausalLM(cfg).eval()
    sd = {"model.embed_tokens.weight": net.transformer.wte.weight,
          "model.norm.weight": net.transformer.ln_f.weight, "lm_head.weight": net.lm_head.weight}
    for i, b in enumerate(net.transformer.h):
        q, k, v = b.attn.c_attn.weight.split(d, 0)
        pre = f"model.layers.{i}."
        sd.update({pre + "self_attn.q_proj.weight": q, pre + "self_attn.k_proj.weight": k,
                   pre + "self_attn.v_proj.weight": v, pre + "self_attn.o_proj.weight": b.attn.c_proj.weight,
                   pre + "mlp.gate_proj.weight": b.mlp.gate_proj.weight,
                   pre + "mlp.up_proj.weight": b.mlp.up_proj.weight,
                   pre + "mlp.down_proj.weight": b.mlp.down_proj.weight,
                   pre + "input_layernorm.weight": b.ln_1.weight,
                   pre + "post_attention_layernorm.weight": b.ln_2.weight})
    hf.load_state_dict({k: v.detach() for k, v in sd.items()}, strict=True)
    x = torch.randint(0, 256, (2, 100), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(net(x), hf(x).logits, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ the repeat test
def _repeat_stream():
    """Held-out-like text with one verbatim repeat 40 bytes after its first copy."""
    filler = ("In the beginning God created the heaven and the earth. And the earth was without "
              "form, and void; and darkness was upon the face of the deep. ")
    copy = "the voice of the turtle is heard in our land"
    s = filler + copy + " and so on, and so forth. " + copy + " amen."
    return text.encode(s, torch.uint8), copy, s


def test_repeat_windows_hold_the_copy_and_its_first_occurrence():
    stream, copy, s = _repeat_stream()
    (r,) = text.find_repeats(stream, 32, 128)
    assert r.length >= len(copy) and r.distance == len(copy) + len(" and so on, and so forth. ")
    assert s[r.second:r.second + r.length] == s[r.first:r.first + r.length]
    n = r.span + 1
    for which, start in (("first", r.first), ("second", r.second)):
        x, y = text_lm.repeat_windows(stream, [r], n, which)
        assert x.shape == y.shape == (1, n) and torch.equal(x[0, 1:], y[0, :-1])
        # the copy's bytes are the window's last targets
        assert text.decode(y[0, -r.length:]) == s[start:start + r.length]
    x, _ = text_lm.repeat_windows(stream, [r], n, "second")
    assert s[r.first:r.first + r.length] in text.decode(x[0])  # the first copy is in view
    x, _ = text_lm.repeat_windows(stream, [r], r.span - 20, "second")
    assert s[r.first:r.first + r.length] not in text.decode(x[0])  # a shorter window: not
    with pytest.raises(ValueError, match="does not fit"):
        text_lm.repeat_windows(stream, [r], 400, "first")
    with pytest.raises(ValueError, match="copy"):
        text_lm.repeat_windows(stream, [r], 100, "third")


def test_a_model_that_reads_only_the_current_byte_scores_both_copies_alike():
    """With every attention output zeroed, GPT-2 predicts each byte from the byte before it
    alone: the two copies cost the same from offset 1 on (offset 0 follows different bytes).
    A model with attention sees the first copy and scores the second differently."""
    stream, copy, _ = _repeat_stream()
    repeats = text.find_repeats(stream, 32, 128)
    model = TextModelConfig(n_layer=2, n_embd=32, n_head=2, context=128, max_context=256)
    bigram_only = text_lm.build_model("softmax", model, seed=0)
    with torch.no_grad():
        for b in bigram_only.transformer.h:
            b.attn.c_proj.weight.zero_()
            b.attn.c_proj.bias.zero_()
    length = model.context
    fits = [r for r in repeats if r.first + r.length - 1 >= length]
    bits = text_lm.repeat_bits(bigram_only, stream, fits, length)
    for a, b in zip(bits["first"], bits["second"]):
        torch.testing.assert_close(a[1:], b[1:], rtol=0, atol=1e-9)
    record = text_lm.repeat_record(bits, fits, length)
    picked = [i for i, r in enumerate(fits) if r.span <= length]
    assert sum(record["n"]) == len(picked) == 1
    for a, b in zip(record["first"], record["second"]):
        assert (a is None and b is None) or a == pytest.approx(b, rel=1e-4)
    want = sum(v for i in picked for v in bits["second"][i][text_lm.REPEAT_SKIP:].tolist())
    n = sum(fits[i].length - text_lm.REPEAT_SKIP for i in picked)
    assert sum(record["bytes"]) == n
    got = sum(m * k for m, k in zip(record["second"], record["bytes"]) if m is not None)
    assert got == pytest.approx(want, rel=1e-4)
    assert text_lm.repeat_bits(bigram_only, stream, fits, 2 * length) is None  # past its table
    assert text_lm.repeat_record(None, fits, 2 * length) is None
    # a model that attends reads the first copy: the second costs it other bits
    attends = text_lm.build_model("softmax", model, seed=0)
    seen = text_lm.repeat_bits(attends, stream, fits, length)
    assert not torch.allclose(seen["first"][0][1:], seen["second"][0][1:])


# ------------------------------------------------------------------ the benchmark resumes
def _benchmark_module():
    """``benchmarks/text_lm.py`` imported as a module (it is a script, not in the package)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "text_lm.py"
    before = list(sys.path)
    spec = importlib.util.spec_from_file_location("_text_lm_benchmark", path)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look their module up
    try:
        spec.loader.exec_module(bench)
    finally:
        sys.path[:] = before
        del sys.modules[spec.name]
    return bench


def test_the_rate_trials_grow_until_the_best_rate_is_inside_them():
    bench = _benchmark_module()
    assert [bench.beyond(lr, up=True) for lr in (1e-3, 3e-3, 1e-2)] == [3e-3, 1e-2, 3e-2]
    assert [bench.beyond(lr, up=False) for lr in (1e-3, 3e-3, 3e-2)] == [3e-4, 1e-3, 1e-2]

    def trials(bits):  # {lr: bits} of one model's rate trials
        return [{"mixer": "linear", "lr": lr, "val_bits": b} for lr, b in bits.items()]

    grid = (1e-3, 3e-3)
    assert bench.next_rate(trials({1e-3: 3.0}), "linear", grid) == 3e-3
    assert bench.next_rate(trials({1e-3: 3.0, 3e-3: 2.5}), "linear", grid) == 1e-2
    assert bench.next_rate(trials({1e-3: 2.5, 3e-3: 3.0}), "linear", grid) == 3e-4
    assert bench.choose_lr(trials({1e-3: 3.0, 3e-3: 2.5}), "linear", grid) is None  # not yet
    done = trials({1e-3: 3.0, 3e-3: 2.5, 1e-2: 2.7})
    assert bench.next_rate(done, "linear", grid) is None
    assert bench.choose_lr(done, "linear", grid)["lr"] == 3e-3


def _tiny_benchmark(tmp_path):
    """The command that runs the tiny preset on a small text file, and its results file."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    corpus_file = tmp_path / "text.txt"
    corpus_file.write_text("\n".join(_LINES * 60) + "\n")
    out = tmp_path / "results.json"
    return [sys.executable, str(root / "benchmarks" / "text_lm.py"), "--preset", "tiny",
            "--text", str(corpus_file), "--out", str(out)], out


def test_the_benchmark_resumes_after_a_kill_and_reruns_nothing(tmp_path):
    """Kill the tiny benchmark once its first run is written, restart it: every run written
    before the kill is kept as it was, only the missing ones train, and none appears twice."""
    import signal
    import subprocess
    import time

    cmd, out = _tiny_benchmark(tmp_path)

    def records():
        if not out.exists():
            return []
        data = json.loads(out.read_text())
        return data["sweep"] + [r for r in data["runs"] if r not in data["sweep"]]

    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 600
        while not records() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    before = {json.dumps(r, sort_keys=True) for r in records()}
    assert before, proc.stderr.read().decode()[-2000:]
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    data = json.loads(out.read_text())
    # the rates tried for each of two models (two of the grid, and any it grew by), then seed 1
    total = len(data["sweep"]) + 2
    trained = [line for line in again.stdout.splitlines() if line.startswith("[")]
    assert len(before) < total  # the kill came before the end: there was something to resume
    assert len(trained) == total - len(before)  # only the missing runs trained
    after = {json.dumps(r, sort_keys=True) for r in records()}
    assert before <= after and len(after) == total  # kept as they were, none twice
    assert data["complete"] and len(data["sessions"]) == 2
    keys = [(r["mixer"], r["seed"], r["lr"]) for r in data["sweep"]]
    assert len(set(keys)) == len(keys) >= 4
    assert sorted((r["mixer"], r["seed"]) for r in data["runs"]) == [
        ("deltanet", 0), ("deltanet", 1), ("softmax", 0), ("softmax", 1)]
    for m, choice in data["lr_choice"].items():  # seed 0 is the best trial; seed 1 trains at its rate
        best = min(r["val_bits"] for r in data["sweep"] if r["mixer"] == m)
        assert [r["val_bits"] for r in data["sweep"] if r["mixer"] == m and r["lr"] == choice["lr"]] == [best]
        assert {r["lr"] for r in data["runs"] if r["mixer"] == m} == {choice["lr"]}
    for r in data["sweep"] + data["runs"]:
        assert len(r["machine"]["load_before"]) == 3 and r["machine"]["wall_seconds"] >= 0
        assert r["machine"]["started"] <= r["machine"]["finished"]
    # a restart with other settings is refused
    other = subprocess.run(cmd + ["--mixers", "softmax"], capture_output=True, text=True, timeout=600)
    assert other.returncode != 0 and "other settings" in other.stderr
    # a model added to the run trains on resuming, the others are kept
    more = subprocess.run(cmd + ["--mixers", "softmax,deltanet,gpt2_fan_in"], capture_output=True,
                          text=True, timeout=600)
    assert more.returncode == 0, more.stderr[-2000:]
    grown = json.loads(out.read_text())
    added = [r for r in grown["sweep"] if r["mixer"] == "gpt2_fan_in"]  # its trials, then seed 1
    assert len([line for line in more.stdout.splitlines() if line.startswith("[")]) == len(added) + 1
    assert before <= {json.dumps(r, sort_keys=True) for r in grown["sweep"] + grown["runs"]}
    assert grown["complete"] and {r["mixer"] for r in grown["runs"]} == {"softmax", "deltanet", "gpt2_fan_in"}


def test_two_workers_share_one_results_file(tmp_path):
    """Two processes of the tiny benchmark on one file at once: every run is trained by one of
    them, exactly once, and the file ends complete, holding both sessions."""
    import subprocess

    cmd, out = _tiny_benchmark(tmp_path)
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outputs]
    trained = [line for o, _ in outputs for line in o.splitlines() if line.startswith("[")]
    data = json.loads(out.read_text())
    assert len(trained) == len(set(trained)) == len(data["sweep"]) + 2  # each once, by one worker
    assert data["complete"] and len(data["sessions"]) == 2
    assert len({(r["mixer"], r["lr"]) for r in data["sweep"]}) == len(data["sweep"]) >= 4
    assert sorted((r["mixer"], r["seed"]) for r in data["runs"]) == [
        ("deltanet", 0), ("deltanet", 1), ("softmax", 0), ("softmax", 1)]
    assert not out.with_name(out.name + ".claims").exists()  # no claim outlives its run


# ------------------------------------------------------------------ chapter 11's new figures
@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A folder with the tiny preset's results file (``r.json``), as the benchmark writes it, and
    every run's weights (``weights/``)."""
    import subprocess
    import sys
    from pathlib import Path

    folder = tmp_path_factory.mktemp("tiny")
    (folder / "text.txt").write_text("\n".join(_LINES * 60) + "\n")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "text_lm.py"), "--preset", "tiny",
                           "--text", str(folder / "text.txt"), "--out", str(folder / "r.json"),
                           "--save", str(folder / "weights")],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return folder


@pytest.fixture(scope="module")
def tiny_results(tiny_folder):
    return json.loads((tiny_folder / "r.json").read_text())


def test_a_saved_run_ships_as_the_gpt2_checkpoint_and_writes_its_sample(tiny_folder, tmp_path):
    import shutil

    bench = _benchmark_module()
    results = tmp_path / "r.json"
    shutil.copy(tiny_folder / "r.json", results)
    dest = tmp_path / "gpt2.pt"
    shipped = bench.ship_saved(results, tiny_folder / "weights", "softmax", 1, dest=dest)
    data = json.loads(results.read_text())
    run = next(r for r in data["runs"] if (r["mixer"], r["seed"]) == ("softmax", 1))
    assert data["checkpoint"] == shipped and shipped["sample"] == run["sample"]
    model, meta = checkpoint.load_checkpoint(dest)
    assert meta["trained_as"] == "softmax" and meta["val_bits"] == run["val_bits"]
    s = data["config"]["sample"]
    assert text_lm.sample(model, **s).ids == run["sample"]["ids"]
    with pytest.raises(SystemExit, match="GPT-2-shaped"):
        bench.ship_saved(results, tiny_folder / "weights", "deltanet", 1, dest=dest)
    with pytest.raises(SystemExit, match="no finished run"):
        bench.ship_saved(results, tiny_folder / "weights", "softmax", 7, dest=dest)


def _plateau_results():
    bins = [[1, 4], [4, 16]]
    def run(variant, steps, falls):
        return {"variant": variant, "steps": steps, "val_bits": 3.0 - falls,
                "curve": [{"step": s, "bits": 8.0 if s == 0 else 3.3 - falls * s / steps}
                          for s in range(0, steps + 1, steps // 4)],
                "attention": [{"step": s, "layers": [[0.3 + 0.1 * s / steps, 0.1], [0.35, 0.11]]}
                              for s in range(0, steps + 1, steps // 4)]}
    return {"config": {"model": {"context": 32}, "train": {"batch_size": 4}, "attention_bins": bins,
                       "uniform": text_lm.uniform_previous_byte(bins)},
            "baselines": {"bigram": 3.2, "trigram": 2.5},
            "runs": [run("published", 8, 0.05), run("fan_in", 8, 0.04), run("published_1200", 32, 1.0)]}


def test_plateau_figures_and_summary():
    from gpt2k3.book.figures import text_longer as memfigs

    data = _plateau_results()
    summary = memfigs.plateau_summary(data)
    assert summary["published_1200"]["bits_at"][8] == pytest.approx(3.3 - 1.0 * 8 / 32)
    assert summary["fan_in"]["val_bits"] == pytest.approx(2.96) and summary["fan_in"]["steps"] == 8
    fig = memfigs.plateau_curves(data)
    assert len(fig.data) == 3 and len(fig.layout.sliders[0].steps) == 4
    assert fig.data[2].line.dash == "dash"  # the longer run is drawn dashed
    heads = memfigs.previous_byte_heads(data)
    assert len(heads.layout.sliders[0].steps) == 5 and heads.layout.yaxis.type == "log"
    assert list(heads.data[-1].y) == pytest.approx(data["config"]["uniform"], rel=1e-5)  # 6 digits kept
    assert list(heads.data[0].y) == [0.4, 0.1]  # the last step by default
    with pytest.raises(ValueError, match="attention record"):
        memfigs.previous_byte_heads(data, variant="nothing")
    with pytest.raises(ValueError, match="plateau"):
        memfigs.plateau_curves({"runs": []})


def test_previous_byte_attention_by_hand():
    """A GPT-2 whose every query and key are zero attends evenly: the measure gives 1 / (t + 1)."""
    net = text_lm.build_model("softmax", TINY, seed=0)
    with torch.no_grad():
        for b in net.transformer.h:
            b.attn.c_attn.weight[: 2 * TINY.n_embd].zero_()
            b.attn.c_attn.bias[: 2 * TINY.n_embd].zero_()
    bins = [(1, 4), (4, 16), (16, 32)]
    x = torch.randint(0, 256, (3, 32), generator=torch.Generator().manual_seed(0))
    got = text_lm.previous_byte_attention(net, x, bins)
    even = text_lm.uniform_previous_byte(bins)
    assert len(got) == TINY.n_layer
    for layer in got:
        assert layer == pytest.approx(even, rel=1e-5)
    assert even[0] == pytest.approx((1 / 2 + 1 / 3 + 1 / 4) / 3)
    with pytest.raises(ValueError, match="CausalSelfAttention"):
        text_lm.previous_byte_attention(text_lm.build_model("kda", TINY), x, bins)
    with pytest.raises(ValueError, match="bins"):
        text_lm.previous_byte_attention(net, x, [(1, 40)])


def test_gpt2_starts_change_only_what_they_name():
    base = text_lm.build_model("softmax", TINY, seed=0)
    for name, start in text_lm.GPT2_STARTS.items():
        net = text_lm.build_model("softmax", TINY, seed=0)
        start(net)
        changed = {k for k, v in net.state_dict().items()
                   if k not in base.state_dict() or not torch.equal(v, base.state_dict()[k])}
        if name == "untied":
            assert net.lm_head.weight is not net.transformer.wte.weight
            assert changed == {"transformer.wte.weight"}
        elif name == "sinusoid":
            assert changed == {"transformer.wpe.weight"}
            w = net.transformer.wpe.weight
            assert float(w.detach().pow(2).mean().sqrt()) == pytest.approx(0.02, rel=1e-3)
        else:
            assert changed and all(k.endswith("weight") for k in changed)
            w = net.transformer.h[0].mlp.c_fc.weight
            assert float(w.detach().std()) == pytest.approx(TINY.n_embd ** -0.5, rel=0.1)


def test_the_longer_runs_figures_read_the_benchmarks_file(tiny_results):
    from gpt2k3.book.display import md_table
    from gpt2k3.book.figures import text_longer as memfigs

    data = tiny_results
    headers, rows = memfigs.design_table(data)
    assert [r[0] for r in rows] == [text_lm.MIXER_LABELS[m] for m in data["config"]["mixers"]]
    assert rows[0][2] == "+0.00" and rows[0][3] == "learned table"
    headers, rows = memfigs.repeat_table(data)
    assert sum(r[1] for r in rows) == data["repeats"]["used"]
    md_table(headers, rows)
    assert data["complete"]
    fig = memfigs.lr_sweep(data)
    assert len(fig.data) == len(data["config"]["mixers"]) and fig.layout.xaxis.type == "log"
    summary = memfigs.repeat_summary(data)
    for m, bins in summary.items():
        for b in bins:
            assert b is None or b["gain"] == pytest.approx(b["first"] - b["second"])
    fig = memfigs.repeat_gain(data)
    assert len(fig.layout.sliders[0].steps) == len(data["config"]["mixers"]) + 1
    headers, rows = memfigs.seed_table(data)
    seeds = data["config"]["seeds"]
    assert headers[2:2 + len(seeds)] == [f"seed {k}" for k in seeds]
    tables = len([k for k in ("bigram_eval", "trigram_eval", "fourgram_eval") if k in data["eval_baselines"]])
    assert tables == 3
    means = [float(r[-1].split(" ± ")[0]) for r in rows[:-tables]]
    assert means == sorted(means) and len(means) == len(data["config"]["mixers"])
    for r in rows[:-tables]:  # each mean is the mean of the seeds shown beside it
        assert float(r[-1].split(" ± ")[0]) == pytest.approx(
            sum(float(v) for v in r[2:2 + len(seeds)]) / len(seeds), abs=1.5e-3)
    assert [r[0] for r in rows[-3:]] == ["byte four-gram table", "byte trigram table", "byte bigram table"]
    assert rows[-1][-1] == f"{data['eval_baselines']['bigram_eval']:.3f}"
    with pytest.raises(ValueError, match="not finished"):
        memfigs.seed_table({**data, "complete": False})
    with pytest.raises(ValueError, match="not finished"):
        memfigs.lr_sweep({**data, "complete": False})


def test_repeat_findings_by_hand():
    """Two models, two seeds, two distance bins: the savings, the largest, the consistent pairs;
    a model that cannot read every repeat of a bin gets no point there."""
    from gpt2k3.book.figures import text_longer as memfigs

    def rec(first, second, n):  # one evaluation length's record of one run
        return {"n": list(n), "bytes": [10 * k for k in n], "first": first, "second": second}

    def run(m, seed, first, second, beyond=True):  # the far bin is read in both window lengths
        return {"mixer": m, "seed": seed,
                "repeats": {"256": rec(first, second, (1, 1)),
                            "1024": rec(first, second, (0, 1)) if beyond else None}}

    # repeats (first, second, length): spans 80 and 240 fit 256 bytes, 300 needs 1,024
    info = {"distances": [[32, 128], [128, 256]], "lengths": {"256": 2, "1024": 1},
            "repeats": [[0, 40, 40], [0, 200, 40], [300, 500, 100]]}
    data = {"complete": True, "config": {"mixers": ["a", "b"], "reference": "a", "seeds": [0, 1],
                                         "model": {"context": 256}},
            "models": {"a": {}, "b": {}}, "repeats": info,
            "runs": [run("a", 0, [2.0, 2.0], [1.5, 2.1]), run("a", 1, [2.0, 2.0], [1.7, 1.9]),
                     run("b", 0, [3.0, 5.0], [3.0, 4.9], beyond=False),
                     run("b", 1, [3.0, 5.0], [3.1, 5.0], beyond=False)]}
    summary = memfigs.repeat_summary(data)
    assert summary["b"][1] is None  # b reads the 240-byte span but not the 300-byte one
    found = memfigs.repeat_findings(data)
    assert found["cells"] == 3
    assert found["first_worst"] == {"mixer": "b", "bin": (32, 128), "first": 3.0}
    assert found["largest"]["mixer"] == "a" and found["largest"]["bin"] == (32, 128)
    assert found["largest"]["gain"] == pytest.approx(0.4)  # (0.5 + 0.3) / 2
    assert found["consistent"] == [("a", (32, 128))]  # the second bin: -0.1 and +0.1
    assert found["spread"] == pytest.approx(0.1)
    inside = memfigs.repeat_findings(data, bins=[1])
    assert inside["cells"] == 1 and inside["consistent"] == [] and inside["largest"]["mixer"] == "a"
    assert memfigs.inside_bins(data) == [0]  # the second bin's last repeat spans 300 bytes
    data["runs"] = [{"mixer": "b", "seed": k, "repeats": {"256": rec([3.0, 5.0], [3.0, 5.0], (0, 0)),
                                                         "1024": None}} for k in (0, 1)]
    data["config"]["mixers"] = ["b"]
    with pytest.raises(ValueError, match="no repeat"):
        memfigs.repeat_findings(data)
