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
from gpt2k3.layers.attention import CausalSelfAttention
from gpt2k3.layers.deltanet import BoundedKDA
from gpt2k3.layers.mla import MLA as GatedNoPEMLA  # K3's MLA: MLAConfig(rope=False, output_gate=True)
from gpt2k3.layers.deltanet import KDA, DeltaNet, GatedDeltaNet
from gpt2k3.layers.linear_attention import LinearAttention
from gpt2k3.experiments.text_lm import MIXERS, ConvMixer, TextModelConfig, TextTrainConfig

TINY = TextModelConfig(n_layer=4, d_model=32, n_head=2, context=32, max_context=128, chunk_size=16)
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
          "k3": [BoundedKDA, BoundedKDA, BoundedKDA, GatedNoPEMLA]}


@pytest.mark.parametrize("mixer", MIXERS)
def test_every_model_has_its_mixers_and_positions(mixer):
    net = text_lm.build_model(mixer, TINY)
    kinds = [type(b.attn) for b in net.transformer.h]
    assert kinds == LAYERS[mixer]
    names = text_lm.mixer_names(net)
    assert len(names) == 4 and all(isinstance(n, str) for n in names)
    assert names[-1] == {"softmax": "softmax", "softmax_conv": "conv + softmax", "linear": "conv + linear",
                         "deltanet": "DeltaNet", "gated_deltanet": "Gated DeltaNet", "kda": "KDA",
                         "hybrid": "softmax", "k3": "MLA"}[mixer]
    if mixer == "softmax_conv":
        assert all(isinstance(b.attn.inner, CausalSelfAttention) for b in net.transformer.h)
    if mixer == "linear":
        assert all(isinstance(b.attn.inner, LinearAttention) for b in net.transformer.h)
    assert net.config.vocab_size == 256
    if mixer == "softmax":  # GPT-2 exactly: learned table of `context` rows, 4 d MLP, tied head
        assert net.config.position == "learned" and net.config.block_size == TINY.context
        assert net.transformer.wpe.weight.shape == (TINY.context, TINY.d_model)
        assert net.transformer.h[0].mlp.c_fc.out_features == 4 * TINY.d_model
        assert net.lm_head.weight is net.transformer.wte.weight
    else:
        assert net.config.position == "none" and net.config.block_size == TINY.max_context
        assert "wpe" not in net.transformer


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
    data = results.load("text_lm.json")
    shipped = data["checkpoint"]
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
    (lambda: TextModelConfig(d_model=30, n_head=4), "divisible"),
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
    assert set(out) == {"bigram_eval", "trigram_eval", "ng2_head", "ng3_head", "ng2_tail", "ng3_tail"}
    with pytest.raises(ValueError, match="ranges"):
        text_lm.eval_ngram_baselines(data, TINY, TRAIN, {"bad": (0, TINY.max_context + 1)})


def test_the_results_hold_the_evaluation_baselines():
    stored = results.load("text_lm.json")["eval_baselines"]
    assert stored["bigram_eval"] > stored["trigram_eval"] > 0
    assert set(stored["ranges"]) == {"inside", "beyond"}
