"""The one training loop of chapters 10 and 11, its settings and its learning-rate schedule.

Chapter 10's recall experiment (:mod:`gpt2k3.experiments.recall`) and chapter 11's byte-level
language models (:mod:`gpt2k3.experiments.text_lm`) both train with :func:`fit`: AdamW with
weight decay on the matrices only, linear warm-up then cosine decay (:func:`warmup_cosine_lr`),
gradient clipping, one :func:`train_step` per batch. What differs between them is passed in:
the batches, the loss and the evaluations. The token mixers both swap into
:class:`gpt2k3.model.GPT` come from one registry, :data:`MIXER_LAYERS`. The settings may also
choose Muon instead of AdamW and QK-clip after every step (:mod:`gpt2k3.experiments.muon`).
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, ClassVar, Collection

import torch
import torch.nn as nn

from gpt2k3.checks import check_choice, check_finite_number, check_instance, check_int
from gpt2k3.config import GPTConfig
from gpt2k3.experiments.muon import MaxLogits, Muon, muon_param_groups, qk_clip
from gpt2k3.layers.attention import CausalSelfAttention
from gpt2k3.layers.deltanet import KDA, DeltaNet, GatedDeltaNet
from gpt2k3.layers.linear_attention import LinearAttention

__all__ = ["MIXER_LAYERS", "OPTIMIZERS", "mixer_layer", "TrainSettings", "warmup_cosine_lr",
           "adamw", "make_optimizer", "train_step", "fit", "steps_to_run", "torch_threads"]

#: The token-mixing layers the experiments swap into GPT, by name.
MIXER_LAYERS = {"softmax": CausalSelfAttention, "linear": LinearAttention, "deltanet": DeltaNet,
                "gated_deltanet": GatedDeltaNet, "kda": KDA}
#: The optimizers :func:`make_optimizer` builds (``TrainSettings.optimizer``).
OPTIMIZERS = ("adamw", "muon", "muon_per_head")


def mixer_layer(name: str, config: GPTConfig, chunk_size: int, **kwargs) -> nn.Module:
    """A fresh ``MIXER_LAYERS[name]`` for ``config``; the recurrent ones run chunkwise in chunks of
    ``chunk_size`` (``kwargs`` go to the delta-family layers, e.g. ``conv_size``)."""
    check_choice(name, "name", tuple(MIXER_LAYERS))
    if name == "softmax":
        return CausalSelfAttention(config)
    return MIXER_LAYERS[name](config, chunk_size=chunk_size, **kwargs)


def warmup_cosine_lr(step: int, lr: float, warmup: int, steps: int) -> float:
    """The learning rate at ``step`` (0-based) of a ``steps``-step run: linear warm-up over
    ``warmup`` steps, then cosine decay to ``lr / 10``. The schedule of chapter 10's and
    chapter 11's training loops."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


@dataclass(frozen=True)
class TrainSettings:
    """What :func:`fit` needs: ``steps`` of ``batch_size`` examples, the ``optimizer`` (AdamW,
    or Muon: :func:`make_optimizer`) at peak learning rate ``lr`` (moment decays ``betas``, a
    class constant) with ``weight_decay`` on the matrices, ``warmup`` steps of linear warm-up,
    gradients clipped at norm ``grad_clip``, QK-clip at threshold ``qk_clip`` (``None``: none).
    The experiments' configurations extend it (:class:`gpt2k3.experiments.recall.TrainConfig`,
    :class:`gpt2k3.experiments.text_lm.TextTrainConfig`) and check their fields when made."""

    steps: int = 300
    batch_size: int = 8
    lr: float = 3e-3
    weight_decay: float = 0.1
    warmup: int = 30
    grad_clip: float = 1.0
    optimizer: str = "adamw"
    qk_clip: float | None = None
    betas: ClassVar[tuple[float, float]] = (0.9, 0.95)

    def __post_init__(self):
        check_int(self.steps, "steps", 1)
        check_int(self.batch_size, "batch_size", 1)
        check_int(self.warmup, "warmup", 0)
        check_finite_number(self.lr, "lr", 1)
        check_finite_number(self.weight_decay, "weight_decay", 1, allow_zero=True)
        check_finite_number(self.grad_clip, "grad_clip", 1)
        check_choice(self.optimizer, "optimizer", OPTIMIZERS)
        if self.qk_clip is not None:
            check_finite_number(self.qk_clip, "qk_clip", 1)

    def lr_at(self, step: int) -> float:
        """Learning rate at ``step`` (0-based): :func:`warmup_cosine_lr`."""
        return warmup_cosine_lr(step, self.lr, self.warmup, self.steps)


def train_step(net: nn.Module, opt: torch.optim.Optimizer, loss_fn: Callable, batch,
               lr: float, grad_clip: float) -> float:
    """One update at learning rate ``lr`` on the loss ``loss_fn(net, batch)``; returns the loss."""
    for group in opt.param_groups:
        group["lr"] = lr
    loss = loss_fn(net, batch)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), grad_clip)
    opt.step()
    return loss.item()


def adamw(net: nn.Module, config: TrainSettings) -> torch.optim.AdamW:
    """AdamW over ``net``'s parameters, with weight decay on the matrices only (the embeddings
    included), none on biases, norm scales and gates' vectors."""
    decay = [p for p in net.parameters() if p.dim() >= 2]
    no_decay = [p for p in net.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=config.lr, betas=config.betas)


def make_optimizer(net: nn.Module, config: TrainSettings) -> torch.optim.Optimizer:
    """The optimizer ``config.optimizer`` names, over ``net``'s parameters: :func:`adamw`, or
    :class:`gpt2k3.experiments.muon.Muon` with :func:`~gpt2k3.experiments.muon.muon_param_groups`
    (Muon for the hidden matrices, AdamW for the rest) at the same ``lr`` and ``weight_decay``;
    ``"muon_per_head"`` is Muon with each attention head's Q, K and V blocks orthogonalised on
    their own (Kimi K3's Per-Head Muon)."""
    check_instance(config, "config", TrainSettings)
    if config.optimizer == "adamw":
        return adamw(net, config)
    per_head = config.optimizer == "muon_per_head"
    return Muon(muon_param_groups(net, config.weight_decay, per_head), lr=config.lr,
                weight_decay=config.weight_decay, betas=config.betas)


def fit(net: nn.Module, config: TrainSettings, batch_at: Callable[[int], object],
        loss_fn: Callable, n_steps: int, *, evaluate: Callable[[int], None] | None = None,
        eval_at: Collection[int] = (), callback: Callable[[int, float], None] | None = None,
        logits: MaxLogits | None = None,
        on_optimizer: Callable[[torch.optim.Optimizer], None] | None = None,
        ) -> tuple[list[float], float]:
    """Train ``net`` for the first ``n_steps`` of ``config.steps`` steps; return ``(losses,
    seconds)``: the loss of every step and the wall time of the steps alone.

    Step ``s`` trains on ``batch_at(s)``. ``evaluate(n)`` is called after ``n`` steps for every
    ``n`` in ``eval_at`` (0: before the first), ``callback(s, loss)`` after every step.
    ``ValueError`` as soon as a loss is not finite. The optimizer is :func:`make_optimizer`'s;
    with ``config.qk_clip`` set, QK-clip follows every step, on the logit maxima of its forward
    pass that ``logits`` records (:class:`~gpt2k3.experiments.muon.MaxLogits`; default: its own).
    ``on_optimizer(opt)`` is called once with the optimizer before the first step (a measurement
    that reads its state, such as Muon's momentum, keeps it).
    """
    check_instance(config, "config", TrainSettings)
    n_steps = check_int(n_steps, "n_steps", 1)
    if logits is not None:
        check_instance(logits, "logits", MaxLogits)
    elif config.qk_clip is not None:  # QK-clip reads the maxima: record them for this run
        with MaxLogits(net) as own:
            return fit(net, config, batch_at, loss_fn, n_steps, evaluate=evaluate,
                       eval_at=eval_at, callback=callback, logits=own,
                       on_optimizer=on_optimizer)
    opt = make_optimizer(net, config)
    if on_optimizer is not None:
        on_optimizer(opt)
    if evaluate is not None and 0 in eval_at:
        evaluate(0)
    losses, seconds = [], 0.0
    net.train()
    for step in range(n_steps):
        start = time.perf_counter()
        loss = train_step(net, opt, loss_fn, batch_at(step), config.lr_at(step), config.grad_clip)
        if config.qk_clip is not None:
            qk_clip(logits, config.qk_clip)
        seconds += time.perf_counter() - start
        if not math.isfinite(loss):  # the step has read the loss already: checking it is free
            raise ValueError(f"the training loss is not finite at step {step} "
                             f"(lower the learning rate, lr = {config.lr})")
        losses.append(loss)
        if callback is not None:
            callback(step, loss)
        if evaluate is not None and step + 1 in eval_at:
            evaluate(step + 1)
    return losses, seconds


def steps_to_run(config: TrainSettings, until: int | None) -> int:
    """How many steps a run of ``config`` stops after: ``until`` (``1 .. config.steps``) or all."""
    if until is None:
        return config.steps
    if check_int(until, "until", 1) > config.steps:
        raise ValueError(f"until must be <= config.steps = {config.steps}, got {until}")
    return until


@contextmanager
def torch_threads(threads: int | None):
    """Run the block with torch's intra-op threads set to ``threads`` (``None``: leave them),
    restored afterwards. These models are too small to gain from a second thread, and on a busy
    machine a second one spin-waits for the first and can make a run ten times slower."""
    if threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(check_int(threads, "threads", 1))
    try:
        yield
    finally:
        torch.set_num_threads(before)
