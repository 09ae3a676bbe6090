r"""Learned recall: tiny GPTs with a swappable token mixer, trained on MQAR (chapter 10).

Every model here is :class:`gpt2k3.model.GPT` -- embeddings, pre-LayerNorm blocks, MLPs, tied
head -- with only the token mixer swapped (``GPT(config, mixer=...)``):

* ``"softmax"``: GPT-2's own causal softmax attention (keeps every key and value);
* ``"linear"``: :class:`gpt2k3.layers.linear_attention.LinearAttention` (an additive ``D x D`` state per head);
* ``"deltanet"``: :class:`gpt2k3.layers.deltanet.DeltaNet` (a delta-rule state);
* ``"gated_deltanet"``: :class:`gpt2k3.layers.deltanet.GatedDeltaNet` (delta rule, one decay per head);
* ``"kda"``: :class:`gpt2k3.layers.deltanet.KDA` (delta rule, one decay per key channel).

Three settings keep the comparison about the mixers and make it trainable in minutes on a CPU
(each can be switched back, see ``CONV_MODES``, ``GATE_INITS`` and ``INITS``): every mixer gets the
short causal convolution on q, k, v that the delta-family layers carry (:class:`ConvProjection`
adds it to softmax and linear attention); the forget gates start out slow; and the weights start
at ``N(0, 1/fan_in)`` instead of GPT-2's ``N(0, 0.02^2)``, which is tuned for width 768.

The recurrent mixers train with their chunkwise forms (the layers call
:func:`gpt2k3.ops.linear.chunkwise`, :func:`gpt2k3.ops.delta.chunkwise` and
:func:`gpt2k3.ops.gated_delta.chunkwise`). ``chunk_size`` does not change what they compute,
only how fast; 16 suits these short sequences on a CPU (KDA's per-channel decay makes its chunk
work grow as ``C^2 Dk``).

:func:`train` runs the one training loop of chapters 10 and 11,
:func:`gpt2k3.experiments.train.fit`: AdamW, linear warm-up then cosine decay, gradient
clipping; here with a fresh batch of MQAR sequences every step (so the model cannot memorise pairs, only
learn to recall them), and at the end the accuracy on held-out sequences drawn from a different
seed. Same arguments, same numbers (on the same machine and thread count).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable, ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2k3.accounting import mixer_state_numbers
from gpt2k3.checks import check_choice, check_instance, check_int
from gpt2k3.config import GPTConfig
from gpt2k3.experiments.mqar import MQARBatch, MQARConfig, mqar
from gpt2k3.experiments.train import TrainSettings, fit, mixer_layer, steps_to_run, torch_threads
from gpt2k3.layers.conv import ShortConv
from gpt2k3.model import GPT

__all__ = ["MIXERS", "MIXER_LABELS", "CONV_MODES", "GATE_INITS", "SLOW_GATE_RATES", "INITS", "ModelConfig", "TrainConfig", "TrainResult", "ConvProjection", "mixer_factory", "build_model", "state_numbers", "masked_loss", "evaluate", "train", "sweep_results", "sweep_config", "sweep_point"]

#: The mixers compared in chapter 10, in the book's order.
MIXERS = ("softmax", "linear", "deltanet", "gated_deltanet", "kda")
#: Display names.
MIXER_LABELS = {"softmax": "Softmax attention", "linear": "Linear attention", "deltanet": "DeltaNet",
                "gated_deltanet": "Gated DeltaNet", "kda": "KDA"}

#: Where the short causal convolution on q, k, v sits: ``"all"`` -- in every mixer (inside the
#: delta-family layers, as published, and added to softmax and linear attention with
#: :class:`ConvProjection`), ``"native"`` -- only inside the delta-family layers, ``"none"`` --
#: nowhere (the delta layers built with ``conv_size=0``).
CONV_MODES = ("all", "native", "none")
#: How the forget gates of Gated DeltaNet and KDA start: ``"layer"`` -- the layers' own
#: initialisation (that of flash-linear-attention), ``"slow"`` -- decay rates drawn log-uniformly
#: in ``[1e-3, 1e-2]`` per token, so every head starts out remembering for 100--1000 tokens.
GATE_INITS = ("slow", "layer")
#: The range of the per-token decay rates ``-log(alpha)`` that ``gate_init="slow"`` draws from.
SLOW_GATE_RATES = (1e-3, 1e-2)
#: How the ``nn.Linear`` weights start: ``"fan_in"`` -- ``N(0, 1 / fan_in)``, ``"gpt2"`` -- GPT-2's
#: ``N(0, 0.02^2)`` (which :class:`gpt2k3.model.GPT` applies), tuned for width 768. At width 64
#: GPT-2's draw is about 6x smaller than ``1 / sqrt(fan_in)`` and training sits far longer on the
#: plateau where every query is answered with the average value.
INITS = ("fan_in", "gpt2")

# Offsets that keep the training and evaluation streams of different seeds apart.
_EVAL_SEED_BASE = 1_000_000_007
_STEPS_PER_SEED = 1_000_003


@dataclass(frozen=True)
class ModelConfig:
    """The tiny model: ``n_layer`` GPT blocks of width ``n_embd`` with ``n_head`` heads.

    Each head of a recurrent mixer keeps a ``head_dim x head_dim`` state (``head_dim =
    n_embd / n_head``). ``chunk_size`` is the chunkwise forms' chunk length.
    """

    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    chunk_size: int = 16
    conv: str = "all"
    conv_size: int = 4
    gate_init: str = "slow"
    init: str = "fan_in"

    def __post_init__(self):
        for name in ("n_embd", "n_layer", "n_head", "chunk_size", "conv_size"):
            check_int(getattr(self, name), name, 1)
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        check_choice(self.conv, "conv", CONV_MODES)
        check_choice(self.gate_init, "gate_init", GATE_INITS)
        check_choice(self.init, "init", INITS)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


@dataclass(frozen=True)
class TrainConfig(TrainSettings):
    """The training loop's settings (see :func:`train` and
    :class:`gpt2k3.experiments.train.TrainSettings`); the defaults are chapter 10's sweep.

    ``checkpoints`` evaluations are spread evenly over the run, the last one after the final
    step; each scores ``eval_examples`` held-out sequences per task.
    """

    steps: int = 600
    batch_size: int = 32
    eval_examples: int = 256
    checkpoints: int = 6
    betas: ClassVar[tuple[float, float]] = (0.9, 0.98)

    def __post_init__(self):
        super().__post_init__()
        check_int(self.eval_examples, "eval_examples", 1)
        check_int(self.checkpoints, "checkpoints", 1)

    def checkpoint_steps(self) -> list[int]:
        """Steps (1-based counts of updates done) after which the model is evaluated."""
        n = min(self.checkpoints, self.steps)
        return sorted({round(self.steps * (i + 1) / n) for i in range(n)})


@dataclass
class TrainResult:
    """What one training run produced.

    ``losses``: training loss (mean cross-entropy over the queries of that step's batch) at every
    step. ``accuracy[P]``: fraction of held-out queries of the ``P``-pair task answered correctly
    (argmax over the whole vocabulary) after the last step; ``eval_loss[P]`` their cross-entropy.
    ``history``: ``(step, {P: accuracy})`` at every checkpoint. ``seconds``: wall time of the
    training steps (evaluations excluded).
    """

    mixer: str
    tasks: list[MQARConfig]
    model: ModelConfig
    train: TrainConfig
    seed: int
    losses: list[float]
    accuracy: dict[int, float]
    eval_loss: dict[int, float]
    history: list[tuple[int, dict[int, float]]]
    n_params: int
    seconds: float

    def to_dict(self) -> dict:
        """A JSON-ready record (configurations as dicts, pair counts as string keys)."""
        d = asdict(self)
        for t, task in zip(d["tasks"], self.tasks):
            t["length"] = task.length
        d["accuracy"] = {str(k): v for k, v in self.accuracy.items()}
        d["eval_loss"] = {str(k): v for k, v in self.eval_loss.items()}
        d["history"] = [{"step": s, "accuracy": {str(k): v for k, v in acc.items()}}
                        for s, acc in self.history]
        return d


class ConvProjection(nn.Module):
    """A projection followed by a short causal convolution over time (and SiLU) per channel.

    Wraps GPT-2's fused ``c_attn`` so that softmax and linear attention get what the delta-family
    layers carry inside: a depthwise convolution (:class:`gpt2k3.layers.conv.ShortConv`, kernel
    ``K``) on each of q, k and v, so every position's query, key and value also see the ``K - 1``
    tokens before it. That is all MQAR needs to bind a value to the key just before it. Training
    only: the convolution's state is not cached.
    """

    def __init__(self, proj: nn.Linear, kernel_size: int = 4):
        super().__init__()
        self.proj = proj
        self.conv = ShortConv(proj.out_features, kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(self.proj(x))[0]


def _slow_gates(layer: nn.Module, generator: torch.Generator) -> None:
    """Re-initialise a gated layer's decay so it starts out remembering (see ``GATE_INITS``).

    With ``A = exp(A_log) = 1`` the per-token log-decay is ``-softplus(x W + dt_bias)``; at
    initialisation ``x W`` is small, so setting ``dt_bias = softplus^-1(r)`` makes the decay
    about ``exp(-r)`` per token, with ``r`` log-uniform in ``[1e-3, 1e-2]`` per head (Gated
    DeltaNet) or per key channel (KDA).
    """
    with torch.no_grad():
        n = layer.dt_bias.numel()
        lo, hi = (math.log(r) for r in SLOW_GATE_RATES)
        r = torch.exp(torch.empty(n).uniform_(lo, hi, generator=generator))
        layer.dt_bias.copy_(r + torch.log(-torch.expm1(-r)))  # softplus^-1(r)
        layer.A_log.zero_()


def mixer_factory(mixer: str, model: ModelConfig = ModelConfig()) -> Callable | None:
    """The ``mixer`` argument of :class:`gpt2k3.model.GPT` for a mixer name and model settings.

    ``None`` means GPT-2's own attention (softmax with no shared convolution).
    """
    check_choice(mixer, "mixer", MIXERS)
    check_instance(model, "model", ModelConfig)
    own_conv = 0 if model.conv == "none" else model.conv_size

    def make(config: GPTConfig, i: int) -> nn.Module:
        if mixer in ("softmax", "linear"):
            layer = mixer_layer(mixer, config, model.chunk_size)
            if model.conv == "all":
                layer.c_attn = ConvProjection(layer.c_attn, model.conv_size)
            return layer
        layer = mixer_layer(mixer, config, model.chunk_size, conv_size=own_conv)
        if mixer != "deltanet" and model.gate_init == "slow":
            _slow_gates(layer, torch.Generator().manual_seed(1000 + i))
        return layer

    if mixer == "softmax" and model.conv != "all":
        return None  # GPT-2 exactly
    return make


def _as_tasks(tasks) -> list[MQARConfig]:
    tasks = [tasks] if isinstance(tasks, MQARConfig) else list(tasks)
    if not tasks or not all(isinstance(t, MQARConfig) for t in tasks):
        raise ValueError("tasks must be an MQARConfig or a non-empty sequence of MQARConfigs")
    if len({t.n_pairs for t in tasks}) != len(tasks):
        raise ValueError(f"tasks must have different n_pairs, got {[t.n_pairs for t in tasks]}")
    if len({t.vocab_size for t in tasks}) != 1:
        raise ValueError(f"tasks must share one vocab_size, got {[t.vocab_size for t in tasks]}")
    return tasks


def build_model(mixer: str, tasks, model: ModelConfig = ModelConfig(), seed: int = 0) -> GPT:
    """A freshly initialised GPT with ``mixer`` in every block, sized for ``tasks`` (seeded init).

    ``tasks`` is one :class:`MQARConfig` or several; the model's vocabulary is theirs and its
    position table covers the longest.
    """
    check_choice(mixer, "mixer", MIXERS)
    tasks = _as_tasks(tasks)
    check_instance(model, "model", ModelConfig)
    config = GPTConfig(block_size=max(t.length for t in tasks), vocab_size=tasks[0].vocab_size,
                       n_layer=model.n_layer, n_head=model.n_head, n_embd=model.n_embd)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(check_int(seed, "seed", 0))
        net = GPT(config, mixer=mixer_factory(mixer, model))
        if model.init == "fan_in":  # the tied embedding is lm_head's weight: redrawn here too
            with torch.no_grad():
                for module in net.modules():
                    if isinstance(module, nn.Linear):
                        module.weight.normal_(0.0, module.in_features ** -0.5)
    return net


def state_numbers(mixer: str, model: ModelConfig, seq_len: int) -> int:
    """Numbers one block's mixer keeps per sequence to continue after ``seq_len`` tokens.

    Softmax attention: its KV cache, ``2 * seq_len * n_embd`` (grows with the sequence).
    The recurrent mixers: :func:`gpt2k3.accounting.mixer_state_numbers` -- ``H D^2`` for the
    delta family, ``H (D^2 + D)`` for linear attention (the state ``S`` and normaliser ``z``).
    Every mixer with a short convolution (see ``CONV_MODES``) also keeps its last
    ``conv_size - 1`` inputs of q, k and v.
    """
    check_choice(mixer, "mixer", MIXERS)
    check_instance(model, "model", ModelConfig)
    seq_len = check_int(seq_len, "seq_len", 1)
    H, D = model.n_head, model.head_dim
    has_conv = model.conv == "all" or (model.conv == "native" and mixer not in ("softmax", "linear"))
    kernel = model.conv_size if has_conv else 0
    if mixer == "softmax":
        return 2 * seq_len * model.n_embd + max(kernel - 1, 0) * 3 * model.n_embd
    return sum(mixer_state_numbers(H, D, conv_kernel=kernel, normalizer=mixer == "linear").values())


def masked_loss(logits: torch.Tensor, batch: MQARBatch) -> torch.Tensor:
    """Mean cross-entropy over the scored positions (the queries) only.

    ``logits`` is ``(N, T, vocab)`` for a batch of ``N`` sequences of ``T`` tokens; a batch with
    no scored position has no loss (``ValueError``, not NaN)."""
    check_instance(batch, "batch", MQARBatch)
    if (not isinstance(logits, torch.Tensor) or logits.ndim != 3 or not logits.is_floating_point()
            or tuple(logits.shape[:2]) != tuple(batch.mask.shape)):
        got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"logits must be a floating tensor of shape (N, T, vocab) with (N, T) = "
                         f"{tuple(batch.mask.shape)}, got {got}")
    if not bool(batch.mask.any()):
        raise ValueError("batch must score at least one position (its mask is all False), "
                         "otherwise the mean loss is 0/0")
    return F.cross_entropy(logits[batch.mask], batch.targets[batch.mask])


def query_loss(net: GPT, batch: MQARBatch) -> torch.Tensor:
    """:func:`masked_loss` of ``net`` on ``batch`` without its checks: the training loop's loss,
    on batches :func:`gpt2k3.experiments.mqar.mqar` made, which always score their queries."""
    return F.cross_entropy(net(batch.inputs)[batch.mask], batch.targets[batch.mask])


@torch.no_grad()
def evaluate(model: GPT, batch: MQARBatch, chunk: int = 256) -> tuple[float, float]:
    """``(accuracy, loss)`` of ``model`` on the queries of ``batch`` (run ``chunk`` sequences at a time)."""
    was_training = model.training
    model.eval()
    correct, total, loss_sum = 0, 0, 0.0
    for s in range(0, batch.inputs.shape[0], chunk):
        part = MQARBatch(*(t[s:s + chunk] for t in batch))
        logits = model(part.inputs)[part.mask]
        targets = part.targets[part.mask]
        correct += int((logits.argmax(-1) == targets).sum())
        total += targets.numel()
        loss_sum += float(F.cross_entropy(logits, targets, reduction="sum"))
    model.train(was_training)
    return correct / total, loss_sum / total


def train(mixer: str, tasks=MQARConfig(), model: ModelConfig = ModelConfig(),
          config: TrainConfig = TrainConfig(), seed: int = 0,
          callback: Callable[[int, float], None] | None = None,
          until: int | None = None, threads: int | None = 1) -> TrainResult:
    """Train a fresh ``mixer`` model on ``tasks`` for ``config.steps`` steps; score held-out data.

    ``tasks`` is one :class:`MQARConfig` or several with different numbers of pairs (as in
    Zoology, one model learns them all): step ``s`` trains on a fresh batch of
    ``tasks[s % len(tasks)]``, so small tasks, which teach the mechanism fastest, come up
    throughout. Every checkpoint scores the model on each task separately. The loop is
    :func:`gpt2k3.experiments.train.fit`, the one chapter 11 trains with too.

    Deterministic in ``seed``: it fixes the initial weights, the training batches and, through a
    separate stream, the held-out sequences. ``callback(step, loss)``, if given, is called after
    every step (the live explorer draws its loss curve with it). ``until`` stops after that many
    steps of the *same* run (same learning-rate schedule), so that the first ``until`` steps of a
    long run, and its checkpoint there, can be reproduced at a fraction of the cost.
    ``threads`` sets torch's intra-op threads for the run
    (:func:`gpt2k3.experiments.train.torch_threads`; one by default).
    """
    check_choice(mixer, "mixer", MIXERS)
    check_instance(config, "config", TrainConfig)
    tasks = _as_tasks(tasks)
    seed = check_int(seed, "seed", 0)
    n_steps = steps_to_run(config, until)
    with torch_threads(threads):
        net = build_model(mixer, tasks, model, seed)
        held_out = {t.n_pairs: mqar(t, config.eval_examples,
                                    seed=_EVAL_SEED_BASE + 1009 * seed + t.n_pairs) for t in tasks}
        scores = {}  # step -> {P: (accuracy, loss)}

        def checkpoint(step):
            scores[step] = {P: evaluate(net, b) for P, b in held_out.items()}

        losses, seconds = fit(
            net, config, lambda s: mqar(tasks[s % len(tasks)], config.batch_size,
                                        seed=seed * _STEPS_PER_SEED + s),
            query_loss, n_steps, evaluate=checkpoint, callback=callback,
            eval_at={s for s in config.checkpoint_steps() if s < n_steps} | {n_steps})
    history = [(s, {P: acc for P, (acc, _) in at.items()}) for s, at in scores.items()]
    eval_loss = {P: loss for P, (_, loss) in scores[n_steps].items()}
    return TrainResult(mixer=mixer, tasks=tasks, model=model, train=config, seed=seed,
                       losses=losses, accuracy=dict(history[-1][1]), eval_loss=eval_loss,
                       history=history, n_params=net.num_params(), seconds=seconds)


def sweep_config(data: dict) -> tuple[list[MQARConfig], ModelConfig, TrainConfig]:
    """The tasks, model and training settings of a ``benchmarks/mqar.py`` results file.

    With them, :func:`train` reruns any of the sweep's runs exactly (up to float rounding on
    another machine), or its first ``until`` steps.
    """
    try:
        config = data["config"]
        tasks = [MQARConfig(**{k: v for k, v in t.items() if k != "length"}) for t in config["tasks"]]
        return tasks, ModelConfig(**config["model"]), TrainConfig(**config["train"])
    except (KeyError, TypeError) as err:
        raise ValueError(f"data must be the results of benchmarks/mqar.py ({err})") from None


def sweep_point(data: dict, mixer: str, seed: int, step: int | None = None) -> dict[int, float]:
    """The sweep's accuracy per number of pairs for one run (``mixer``, ``seed``) at checkpoint
    ``step`` (default: the last), as ``{P: accuracy}``."""
    check_choice(mixer, "mixer", MIXERS)
    runs = [r for r in data.get("runs", []) if r["mixer"] == mixer and r["seed"] == seed]
    if not runs:
        raise ValueError(f"the results hold no run of mixer={mixer!r} with seed={seed!r}")
    history = runs[0]["history"]
    hit = history[-1] if step is None else next((h for h in history if h["step"] == step), None)
    if hit is None:
        raise ValueError(f"step must be one of the checkpoints {[h['step'] for h in history]}, "
                         f"got {step!r}")
    return {int(P): acc for P, acc in hit["accuracy"].items()}


def sweep_results(results: list[TrainResult]) -> dict:
    """The ``config``, ``rows`` and ``runs`` of a results file from runs with shared settings.

    ``rows`` holds one record per (mixer, pairs, seed) with the final accuracy and loss; ``runs``
    one per run with its loss at every step (rounded to 5 digits), its accuracy at every
    checkpoint and its wall time. :func:`sweep_config` reads the settings back.
    """
    if not results or not all(isinstance(r, TrainResult) for r in results):
        raise ValueError("results must be a non-empty list of TrainResult")
    first = results[0]
    if any((r.tasks, r.model, r.train) != (first.tasks, first.model, first.train) for r in results):
        raise ValueError("results must share their tasks, model and training settings")
    runs, rows = [], []
    for r in results:
        run = r.to_dict()
        run["losses"] = [round(x, 5) for x in r.losses]
        for key in ("tasks", "model", "train"):  # in "config", once
            run.pop(key)
        runs.append(run)
        rows += [{"mixer": r.mixer, "n_pairs": P, "seed": r.seed, "accuracy": acc,
                  "eval_loss": r.eval_loss[P]} for P, acc in r.accuracy.items()]
    config = {"mixers": list(dict.fromkeys(r.mixer for r in results)),
              "pairs": [t.n_pairs for t in first.tasks],
              "seeds": sorted({r.seed for r in results}),
              "tasks": [dict(asdict(t), length=t.length) for t in first.tasks],
              "model": asdict(first.model), "head_dim": first.model.head_dim,
              "train": asdict(first.train), "checkpoint_steps": first.train.checkpoint_steps()}
    return {"config": config, "rows": rows, "runs": runs,
            "train_seconds": sum(r.seconds for r in results)}
