"""The recall models: every mixer builds, is causal, trains (the loss falls), deterministically."""

import math
from dataclasses import asdict, replace

import plotly.graph_objects as go
import pytest
import torch
import torch.nn as nn

from gpt2k3.book import figures
from gpt2k3.experiments import recall
from gpt2k3.book.figures import recall as recall_figs
from gpt2k3.model import GPT
from gpt2k3.layers.attention import CausalSelfAttention
from gpt2k3.layers.deltanet import KDA, DeltaNet, GatedDeltaNet
from gpt2k3.layers.linear_attention import LinearAttention
from gpt2k3.experiments.recall import MIXERS, ModelConfig, TrainConfig
from gpt2k3.experiments.mqar import MQARConfig, mqar
from gpt2k3.book.widgets.recall import VARIANTS

TINY = ModelConfig(n_embd=32, n_layer=2, n_head=2, chunk_size=8)
TASKS = [MQARConfig(n_pairs=2, vocab_size=32), MQARConfig(n_pairs=4, vocab_size=32)]



@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One torch thread: as fast for these tiny models, and immune to a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


LAYER = {"softmax": CausalSelfAttention, "linear": LinearAttention, "deltanet": DeltaNet,
         "gated_deltanet": GatedDeltaNet, "kda": KDA}


@pytest.mark.parametrize("mixer", MIXERS)
def test_every_block_gets_the_mixer_with_a_short_convolution(mixer):
    net = recall.build_model(mixer, TASKS, TINY)
    assert isinstance(net, GPT) and net.config.block_size == TASKS[-1].length
    for block in net.transformer.h:
        assert type(block.attn) is LAYER[mixer]
        if mixer in ("softmax", "linear"):
            assert isinstance(block.attn.c_attn, recall.ConvProjection)
        else:
            assert block.attn.conv_size == TINY.conv_size
    plain = recall.build_model(mixer, TASKS, ModelConfig(n_embd=32, n_head=2, conv="none"))
    assert not any(isinstance(m, (recall.ConvProjection, nn.Conv1d)) for m in plain.modules())
    assert not any(type(m).__name__ == "ShortConv" for m in plain.modules())


def test_softmax_without_convolution_is_gpt2_exactly():
    net = recall.build_model("softmax", TASKS, ModelConfig(n_embd=32, n_head=2, conv="native"))
    assert all(type(b.attn) is CausalSelfAttention for b in net.transformer.h)
    assert isinstance(net.transformer.h[0].attn.c_attn, nn.Linear)


@pytest.mark.parametrize("mixer", MIXERS)
def test_models_are_causal(mixer):
    """Changing token t changes no output before t: the models cannot peek at later queries."""
    net = recall.build_model(mixer, TASKS, TINY, seed=1).eval()
    x = mqar(TASKS[-1], 2, seed=0).inputs
    y = x.clone()
    y[:, 9] = (y[:, 9] + 5) % 32
    with torch.no_grad():
        a, b = net(x), net(y)
    torch.testing.assert_close(a[:, :9], b[:, :9])
    assert not torch.allclose(a[:, 9:], b[:, 9:])


@pytest.mark.parametrize("mixer", ["linear", "deltanet", "kda"])
def test_chunk_size_changes_nothing_but_speed(mixer):
    x = mqar(TASKS[-1], 2, seed=0).inputs
    with torch.no_grad():
        outs = [recall.build_model(mixer, TASKS, ModelConfig(n_embd=32, n_head=2, chunk_size=c))(x)
                for c in (3, 8, 64)]
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(outs[0], outs[2], rtol=1e-4, atol=1e-4)


def test_init_options():
    fan_in = recall.build_model("deltanet", TASKS, TINY)
    gpt2 = recall.build_model("deltanet", TASKS, ModelConfig(n_embd=32, n_head=2, init="gpt2"))
    w = fan_in.transformer.h[0].attn.q_proj.weight
    assert abs(w.std().item() - 32 ** -0.5) < 0.03
    assert abs(gpt2.transformer.h[0].attn.q_proj.weight.std().item() - 0.02) < 0.005
    assert fan_in.lm_head.weight is fan_in.transformer.wte.weight  # still tied
    # same seed, same weights; another seed, other weights
    again = recall.build_model("deltanet", TASKS, TINY)
    other = recall.build_model("deltanet", TASKS, TINY, seed=5)
    assert torch.equal(again.transformer.h[0].attn.q_proj.weight, w)
    assert not torch.equal(other.transformer.h[0].attn.q_proj.weight, w)


@pytest.mark.parametrize("mixer", ["gated_deltanet", "kda"])
def test_slow_gate_init_starts_out_remembering(mixer):
    x = torch.randn(2, 10, 32, generator=torch.Generator().manual_seed(0))
    slow = recall.build_model(mixer, TASKS, TINY).transformer.h[0].attn
    layer = recall.build_model(mixer, TASKS, ModelConfig(n_embd=32, n_head=2, gate_init="layer"))
    with torch.no_grad():
        la_slow = slow.log_alpha(x)
        la_layer = layer.transformer.h[0].attn.log_alpha(x)
    # per-token decay rates near [1e-3, 1e-2] (x W perturbs them a little): memories of 100+ tokens
    assert (la_slow < 0).all() and la_slow.median() > -0.03 and la_slow.mean() > -0.05
    assert la_layer.mean() < la_slow.mean()  # the layers' own init forgets faster


def test_state_numbers():
    m = ModelConfig(n_embd=64, n_head=4, conv="none")
    assert recall.state_numbers("softmax", m, 100) == 2 * 100 * 64
    assert recall.state_numbers("linear", m, 100) == 4 * (16 * 16 + 16)
    for mixer in ("deltanet", "gated_deltanet", "kda"):
        assert recall.state_numbers(mixer, m, 100) == recall.state_numbers(mixer, m, 10**6) == 4 * 16 * 16
    # with the short convolution (kernel 4) every mixer also keeps 3 inputs of q, k and v
    tail = 3 * 3 * 64
    m = ModelConfig(n_embd=64, n_head=4, conv="all", conv_size=4)
    assert recall.state_numbers("softmax", m, 100) == 2 * 100 * 64 + tail
    assert recall.state_numbers("linear", m, 100) == 4 * (16 * 16 + 16) + tail
    native = ModelConfig(n_embd=64, n_head=4, conv="native", conv_size=4)
    assert recall.state_numbers("softmax", native, 100) == 2 * 100 * 64
    assert recall.state_numbers("kda", native, 100) == 4 * 16 * 16 + tail


class _Oracle(nn.Module):
    """Answers every query from the pairs in its input; a fixed wrong answer elsewhere."""

    def __init__(self, vocab, pairs, wrong_every=0):
        super().__init__()
        self.vocab, self.pairs, self.wrong_every = vocab, pairs, wrong_every

    def forward(self, idx):
        B, T = idx.shape
        logits = torch.zeros(B, T, self.vocab)
        for b in range(B):
            table = {}
            for t in range(T):
                tok = int(idx[b, t])
                if t % 2 == 1 and t < 2 * self.pairs:
                    table[int(idx[b, t - 1])] = tok
                answer = table.get(tok, 0) if t >= 2 * self.pairs else 0
                if self.wrong_every and b % self.wrong_every == 0:
                    answer = 0
                logits[b, t, answer] = 1.0
        return logits


def test_evaluate_scores_only_the_queries():
    task = MQARConfig(n_pairs=3, vocab_size=20, seq_len=12)
    batch = mqar(task, 8, seed=0)
    oracle = _Oracle(20, pairs=3)
    acc, loss = recall.evaluate(oracle, batch, chunk=3)
    assert acc == 1.0
    assert loss == pytest.approx(math.log(19 + math.e) - 1.0)  # softmax of one logit at 1
    oracle.wrong_every = 2  # every other sequence answered wrongly
    acc, _ = recall.evaluate(oracle, batch)
    assert acc == 0.5


@pytest.mark.parametrize("mixer", MIXERS)
def test_a_few_training_steps_lower_the_loss(mixer):
    cfg = TrainConfig(steps=40, batch_size=16, lr=3e-3, warmup=5, eval_examples=64, checkpoints=2)
    net0 = recall.build_model(mixer, TASKS, TINY, seed=0)
    held_out = mqar(TASKS[0], 64, seed=123)
    _, loss_before = recall.evaluate(net0, held_out)
    steps = []
    result = recall.train(mixer, TASKS, TINY, cfg, seed=0, callback=lambda s, l: steps.append(s))
    assert steps == list(range(40)) and len(result.losses) == 40
    assert all(math.isfinite(x) for x in result.losses)
    first, last = sum(result.losses[:5]) / 5, sum(result.losses[-5:]) / 5
    assert last < first - 0.3
    assert result.eval_loss[2] < loss_before - 0.3
    assert [s for s, _ in result.history] == [20, 40]
    assert set(result.accuracy) == {2, 4} and all(0 <= a <= 1 for a in result.accuracy.values())
    record = result.to_dict()
    assert record["mixer"] == mixer and record["tasks"][1]["length"] == 12
    assert set(record["accuracy"]) == {"2", "4"}


def test_training_is_deterministic_in_the_seed():
    cfg = TrainConfig(steps=6, batch_size=8, warmup=2, eval_examples=16, checkpoints=1)
    a = recall.train("deltanet", TASKS, TINY, cfg, seed=3)
    b = recall.train("deltanet", TASKS, TINY, cfg, seed=3)
    c = recall.train("deltanet", TASKS, TINY, cfg, seed=4)
    assert a.losses == b.losses and a.accuracy == b.accuracy
    assert a.losses != c.losses
    torch.set_num_threads(1)
    recall.train("deltanet", TASKS, TINY, cfg, seed=3, threads=2)
    assert torch.get_num_threads() == 1  # restored


def test_until_reproduces_the_start_of_a_longer_run():
    cfg = TrainConfig(steps=8, batch_size=8, warmup=2, eval_examples=16, checkpoints=2)
    full = recall.train("softmax", TASKS, TINY, cfg, seed=1)
    half = recall.train("softmax", TASKS, TINY, cfg, seed=1, until=4)
    assert half.losses == full.losses[:4]
    assert half.history == full.history[:1] and half.history[0][0] == 4
    with pytest.raises(ValueError, match="until"):
        recall.train("softmax", TASKS, TINY, cfg, until=9)


def test_lr_schedule_and_checkpoints():
    cfg = TrainConfig(steps=100, lr=1e-3, warmup=10, checkpoints=4)
    assert cfg.lr_at(0) == pytest.approx(1e-4) and cfg.lr_at(9) == pytest.approx(1e-3)
    assert cfg.lr_at(99) == pytest.approx(1e-4, rel=0.01)
    assert cfg.checkpoint_steps() == [25, 50, 75, 100]
    assert TrainConfig(steps=2, checkpoints=5).checkpoint_steps() == [1, 2]


@pytest.mark.parametrize("call, match", [
    (lambda: recall.build_model("mamba", TASKS), "mixer"),
    (lambda: recall.build_model("softmax", []), "tasks"),
    (lambda: recall.build_model("softmax", [TASKS[0], TASKS[0]]), "n_pairs"),
    (lambda: recall.build_model("softmax", [TASKS[0], MQARConfig(n_pairs=3, vocab_size=64)]), "vocab_size"),
    (lambda: recall.build_model("softmax", TASKS, model={"n_embd": 32}), "model"),
    (lambda: ModelConfig(n_embd=30, n_head=4), "divisible"),
    (lambda: ModelConfig(conv="both"), "conv"),
    (lambda: ModelConfig(gate_init="fast"), "gate_init"),
    (lambda: ModelConfig(init="xavier"), "init"),
    (lambda: ModelConfig(n_layer=0), "n_layer"),
    (lambda: TrainConfig(lr=0), "lr"),
    (lambda: TrainConfig(steps=0), "steps"),
    (lambda: TrainConfig(weight_decay=-1), "weight_decay"),
    (lambda: recall.train("softmax", TASKS, TINY, config=None), "config"),
    (lambda: recall.state_numbers("softmax", TINY, 0), "seq_len"),
    (lambda: recall.mixer_factory("softmax", model=None), "model"),
])
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_the_one_loop_is_shared_and_stops_on_a_non_finite_loss():
    from gpt2k3.experiments import text_lm, train
    assert issubclass(TrainConfig, train.TrainSettings)
    assert issubclass(text_lm.TextTrainConfig, train.TrainSettings)
    assert TrainConfig.betas == (0.9, 0.98) and text_lm.TextTrainConfig.betas == (0.9, 0.95)
    assert "betas" not in asdict(TrainConfig())  # a constant, not a recorded setting
    net = nn.Linear(2, 1)
    cfg = train.TrainSettings(steps=3, warmup=1)
    seen = []
    losses, seconds = train.fit(net, cfg, lambda s: torch.ones(4, 2), lambda n, x: n(x).square().mean(),
                                3, evaluate=seen.append, eval_at={0, 3})
    assert len(losses) == 3 and seen == [0, 3] and seconds >= 0
    with pytest.raises(ValueError, match="not finite at step 0"):
        train.fit(net, cfg, lambda s: torch.full((4, 2), math.nan), lambda n, x: n(x).mean(), 3)
    assert train.steps_to_run(cfg, None) == 3 and train.steps_to_run(cfg, 2) == 2
    with pytest.raises(ValueError, match="until"):
        train.steps_to_run(cfg, 4)
    with pytest.raises(ValueError, match="threads"):
        with train.torch_threads(0):
            pass


# --------------------------------------------------------------------------- results, figures, explorer


@pytest.fixture(scope="module")
def sweep():
    """A miniature results file: two mixers, two seeds, two checkpoints."""
    cfg = TrainConfig(steps=6, batch_size=8, warmup=2, eval_examples=16, checkpoints=2)
    runs = [recall.train(m, TASKS, TINY, cfg, seed=s) for s in (0, 1) for m in ("softmax", "deltanet")]
    return runs, recall.sweep_results(runs)


def test_sweep_results_round_trip(sweep):
    runs, data = sweep
    assert data["config"]["pairs"] == [2, 4] and data["config"]["head_dim"] == 16
    assert data["config"]["mixers"] == ["softmax", "deltanet"] and data["config"]["seeds"] == [0, 1]
    assert len(data["rows"]) == 4 * 2 and len(data["runs"]) == 4
    row = data["rows"][0]
    assert row == {"mixer": "softmax", "n_pairs": 2, "seed": 0, "accuracy": runs[0].accuracy[2],
                   "eval_loss": runs[0].eval_loss[2]}
    tasks, model, cfg = recall.sweep_config(data)
    assert (tasks, model, cfg) == (TASKS, TINY, runs[0].train)
    assert recall.sweep_point(data, "deltanet", 1) == runs[3].accuracy
    assert recall.sweep_point(data, "deltanet", 1, step=3) == runs[3].history[0][1]
    with pytest.raises(ValueError, match="step"):
        recall.sweep_point(data, "deltanet", 1, step=4)
    with pytest.raises(ValueError, match="seed"):
        recall.sweep_point(data, "deltanet", 7)
    with pytest.raises(ValueError, match="share"):
        recall.sweep_results([runs[0], recall.train("softmax", TASKS[:1], TINY, runs[0].train)])
    with pytest.raises(ValueError, match="benchmarks/mqar.py"):
        recall.sweep_config({"rows": []})


def test_summary_and_table(sweep):
    runs, data = sweep
    s = recall_figs.recall_summary(data)
    accs = [runs[0].accuracy[4], runs[2].accuracy[4]]  # softmax, seeds 0 and 1
    assert s["softmax"][4]["seeds"] == accs
    assert s["softmax"][4]["mean"] == pytest.approx(sum(accs) / 2)
    assert s["softmax"][4]["min"] == min(accs) and s["softmax"][4]["max"] == max(accs)
    early = recall_figs.recall_summary(data, step=3)
    assert early["deltanet"][2]["seeds"] == [runs[1].history[0][1][2], runs[3].history[0][1][2]]
    headers, rows = recall_figs.recall_table(data)
    assert headers == ["mixer", "P = 2", "P = 4"]
    assert rows[0][0] == "Softmax attention" and " ± " in rows[0][1]
    with pytest.raises(ValueError, match="step"):
        recall_figs.recall_summary(data, step=5)
    with pytest.raises(ValueError, match="benchmarks/mqar.py"):
        recall_figs.recall_summary({"runs": []})


def test_accuracy_figure_slider_walks_the_checkpoints(sweep):
    _, data = sweep
    fig = figures.recall_accuracy(data)
    steps = fig.layout.sliders[0].steps
    assert [s.label for s in steps] == ["3", "6"] and fig.layout.sliders[0].active == 1
    summary = recall_figs.recall_summary(data, step=3)
    assert steps[0].args[0]["y"][1] == [100 * summary["deltanet"][P]["mean"] for P in (2, 4)]
    assert list(steps[0].args[2]) == [0, 1]  # the 1/P guide line never moves
    assert list(fig.data[2].y) == [50.0, 25.0]
    assert fig.layout.xaxis.type == "log" and fig.layout.xaxis.title.text
    assert "6 of 6" in fig.layout.title.text
    with pytest.raises(ValueError, match="active"):
        figures.recall_accuracy(data, active=2)


def test_loss_figure_splits_the_interleaved_tasks(sweep):
    runs, data = sweep
    fig = figures.recall_loss_curves(data, window=1)
    s2, s4 = fig.layout.sliders[0].steps
    assert s2.args[0]["x"][0] == [1, 3, 5] and s4.args[0]["x"][0] == [2, 4, 6]
    mean = [(a + b) / 2 for a, b in zip(runs[1].losses[1::2], runs[3].losses[1::2])]  # deltanet, P=4
    assert s4.args[0]["y"][1] == pytest.approx(mean, abs=1e-4)
    assert fig.layout.yaxis.type == "log"
    assert recall_figs.smooth([1, 2, 3, 4], 2) == [1, 1.5, 2.5, 3.5]
    with pytest.raises(ValueError, match="window"):
        recall_figs.smooth([1.0], 0)


def test_run_figure_and_live_explorer(sweep):
    runs, data = sweep
    fig = figures.recall_run(runs[1], recall.sweep_point(data, "deltanet", 0))
    assert len(fig.data) == 3 and list(fig.data[1].y) == [100 * runs[1].accuracy[P] for P in (2, 4)]
    from gpt2k3.book.widgets import train_explorer

    box = train_explorer(data)
    c = box.controls
    assert "switch on" in box.current.value  # nothing is trained until asked
    assert list(c["steps"].options) == [3, 6] and list(c["seed"].options) == [0, 1]
    c["steps"].value = 3
    c["train"].value = True  # trains deltanet, seed 0, the first 3 of the sweep's 6 steps
    assert isinstance(box.current, go.Figure)
    ours, theirs = box.current.data[0].y, box.current.data[1].y
    assert list(ours) == pytest.approx(list(theirs))  # the sweep's checkpoint, reproduced
    assert train_explorer().controls["steps"].options[-1] == TrainConfig().steps


def test_accuracy_figure_with_one_checkpoint_has_no_slider():
    cfg = TrainConfig(steps=4, batch_size=8, warmup=1, eval_examples=16, checkpoints=1)
    data = recall.sweep_results([recall.train("linear", TASKS, TINY, cfg, seed=0)])
    fig = figures.recall_accuracy(data)
    assert not fig.layout.sliders and "4 of 4" in fig.layout.title.text
    assert list(fig.data[0].y) == [100 * a for a in data["runs"][0]["accuracy"].values()]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_explorer_variant_builds_and_runs(variant):
    model = replace(TINY, **VARIANTS[variant])
    x = mqar(TASKS[-1], 2, seed=0).inputs
    for mixer in MIXERS:
        with torch.no_grad():
            logits = recall.build_model(mixer, TASKS, model)(x)
        assert logits.shape == (2, TASKS[-1].length, 32) and torch.isfinite(logits).all()
