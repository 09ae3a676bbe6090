r"""Does it still write? Every token mixer trained as a byte-level language model (chapter 11).

One small decoder -- the book's one model core :class:`gpt2k3.model.GPT` -- with each token
mixer in turn (:data:`MIXERS`), trained on the King James Bible (:mod:`gpt2k3.experiments.corpus`) byte by
byte and scored in **bits per byte** on held-out books:

* ``"softmax"``: GPT-2 exactly (causal softmax attention, a learned position table, the GELU
  MLP ``4 d`` wide, LayerNorm, tied head) -- the reference the others are matched to;
* ``"gpt2_fan_in"``: the same GPT-2 with its weights drawn from ``N(0, 1 / fan_in)`` (GPT-2
  draws ``N(0, 0.02^2)``, tuned for width 768): the start with which it leaves its plateau
  sooner at chapter 11's width (``benchmarks/text_lm.py --preset plateau``);
* ``"softmax_conv"``: the same attention behind a short causal convolution
  (:class:`ConvMixer`) and with no position table (NoPE): the softmax baseline on the delta
  family's footing, and one that can be run past its training length;
* ``"linear"``: :class:`gpt2k3.layers.linear_attention.LinearAttention` behind the same convolution;
* ``"deltanet"``, ``"gated_deltanet"``, ``"kda"``: :class:`gpt2k3.layers.deltanet.DeltaNet`,
  :class:`~gpt2k3.layers.deltanet.GatedDeltaNet`, :class:`~gpt2k3.layers.deltanet.KDA` in every
  block (with their own short convolution on q, k and v, as published);
* ``"hybrid"``: three KDA layers, then one softmax-attention layer (Kimi Linear's 3:1,
  :func:`gpt2k3.models.hybrid.hybrid_schedule`);
* ``"k3"``: the tiny Kimi K3 (:func:`gpt2k3.models.k3.tiny_k3`): bounded-gate KDA with a gated NoPE MLA
  layer every fourth, latent MoE, SiTU-GLU, RMSNorm, Attention Residuals, untied head;
* ``"transformer_pp"``: the modern softmax baseline the Gated DeltaNet and Kimi Linear papers
  compare with, "Transformer++" (the Llama recipe): rotary positions
  (:class:`gpt2k3.layers.attention.RotaryCausalSelfAttention`), RMSNorm
  (:class:`gpt2k3.layers.norms.RMSNorm`), a SwiGLU MLP (:class:`gpt2k3.layers.mlp.SwiGLU`), no
  biases, untied head.

Every model but GPT-2 has no position table (Kimi Linear and K3 use none; the recurrent mixers
know order from their recurrence; Transformer++ rotates its queries and keys instead), so its
``block_size`` is the longest evaluation length,
``max_context``, and it can read 4x and 8x more bytes than it was trained on. GPT-2's learned
table has ``context`` rows and nothing beyond: it cannot run past them at all.

**Matched parameters.** The token mixers differ in size (the delta family adds a short
convolution, a write-strength and gate projections, an output norm and gate), so each model
gets the MLP width that brings its *total* parameter count closest to GPT-2's
(:func:`matched_sizes`): a GELU MLP (:class:`gpt2k3.layers.mlp.MLP`) of width ``mlp_hidden`` in place of ``4 d``, or for the
tiny K3 the experts' width ``d_expert`` and then its one dense layer's ``d_ff``. The counts are
recorded with the results; K3 activates fewer than it holds (2 of 8 routed experts per token).

**Training** (:func:`train`) runs chapter 10's loop, :func:`gpt2k3.experiments.train.fit`:
AdamW, linear warm-up then cosine decay to a tenth, gradient clipping; here on random windows of the training books drawn with an
explicit generator (:func:`gpt2k3.experiments.corpus.sample_batch`), every model for the same number of
bytes. **Evaluation** (:func:`evaluate`) scores fixed windows of the validation books: bits
per byte overall and per position in the window (:func:`position_bits`), at the training
length and at 4x and 8x of it on the *same* bytes (the long windows cut into short ones).
:func:`repeat_bits` asks whether a model reads far back: the loss on a stretch of held-out text
the second time it occurs within a window, against the first time
(:func:`gpt2k3.experiments.corpus.find_repeats`).
:func:`decode_bytes` measures what a model keeps per sequence to decode the next byte, its
cache's ``used_nbytes``. :func:`sample` writes text with a seeded generator in float64.

The trained GPT-2 ships with the package (:func:`load_gpt2`, ``gpt2k3/checkpoints``), so
chapter 1 can show real, if tiny, text from the model it builds.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2k3.cache import ConvCache
from gpt2k3.checks import check_choice, check_finite_number, check_instance, check_int
from gpt2k3.config import GPTConfig
from gpt2k3.experiments import corpus as _text
from gpt2k3.experiments.train import (
    TrainSettings,
    fit,
    mixer_layer,
    steps_to_run,
    torch_threads,
)
from gpt2k3.layers import deltanet as delta
from gpt2k3.layers.attention import CausalSelfAttention, RotaryCausalSelfAttention
from gpt2k3.layers.linear_attention import LinearAttention
from gpt2k3.layers.mla import apply_rope
from gpt2k3.layers.mlp import MLP, SwiGLU
from gpt2k3.layers.norms import RMSNorm
from gpt2k3.model import GPT
from gpt2k3.models.hybrid import hybrid_mixer, hybrid_schedule
from gpt2k3.models.k3 import tiny_k3

__all__ = ["eval_ngram_baselines", "REPEAT_SKIP", "REPEAT_DISTANCES", "REPEAT_OFFSETS",
           "GPT2_STARTS", "previous_byte_attention", "uniform_previous_byte",
           "byte_loss", "token_bits", "repeat_lengths", "repeat_windows", "repeat_bits", "repeat_record", "MIXERS", "MIXER_LABELS", "REFERENCE", "LEARNED_POSITIONS", "CONV_ADDED", "CONV_SIZE", "TextModelConfig", "TextTrainConfig", "ConvMixer", "SampleResult", "TextRun", "gpt_config", "build_model", "matched_sizes", "param_counts", "mixer_names", "position_bins", "bin_positions", "position_bits", "evaluate", "decode_bytes", "sample", "train", "run_record", "PUBLISHED_SCALE", "scale_ratios"]

#: The models compared in chapter 11, in the book's order.
MIXERS = ("softmax", "softmax_conv", "linear", "deltanet", "gated_deltanet", "kda", "hybrid", "k3",
          "transformer_pp", "gpt2_fan_in")
#: Display names.
MIXER_LABELS = {"softmax": "GPT-2 (softmax)", "softmax_conv": "Softmax + conv (NoPE)",
                "linear": "Linear attention + conv", "deltanet": "DeltaNet",
                "gated_deltanet": "Gated DeltaNet", "kda": "KDA",
                "hybrid": "3:1 KDA:softmax hybrid", "k3": "Tiny Kimi K3",
                "transformer_pp": "Transformer++ (RoPE, RMSNorm, SwiGLU)",
                "gpt2_fan_in": "GPT-2, fan-in init"}
#: The model every other is matched to in parameters.
REFERENCE = "softmax"
#: Models with a learned position table (they cannot read past ``context``).
LEARNED_POSITIONS = ("softmax", "gpt2_fan_in")
#: Models that get :class:`ConvMixer`'s short convolution in front of their attention (the
#: delta family, the hybrid's KDA layers and K3's KDA layers carry one of their own).
CONV_ADDED = ("softmax_conv", "linear")
#: Kernel size of every short convolution (the delta layers' default).
CONV_SIZE = 4

#: The scale of the papers chapter 11 compares with: parameters (total, and active per token
#: where a mixture of experts activates fewer) and training tokens of the runs they report.
#: DeltaNet and Gated DeltaNet: 1.3B-parameter models trained on 100B tokens; Kimi Linear: a
#: 48B-parameter model with 3B active, compared with full attention at 1.4T tokens.
PUBLISHED_SCALE = {
    "deltanet": {"params": 1.3e9, "active": 1.3e9, "tokens": 100e9},
    "gated_deltanet": {"params": 1.3e9, "active": 1.3e9, "tokens": 100e9},
    "kimi_linear": {"params": 48e9, "active": 3e9, "tokens": 1.4e12},
}
_BITS = 1.0 / math.log(2.0)
_BATCH_SEED_BASE = 1_000_003


def scale_ratios(params: int, tokens: int, published: Mapping | None = None) -> dict[str, dict]:
    """How many times larger each published run is than one of chapter 11's: ``{paper:
    {"params", "active", "tokens"}}``, the paper's total and active parameters over ``params``
    and its training tokens over ``tokens`` (this chapter's bytes; a byte is a token here).
    ``published`` defaults to :data:`PUBLISHED_SCALE`."""
    params = check_int(params, "params", 1)
    tokens = check_int(tokens, "tokens", 1)
    published = PUBLISHED_SCALE if published is None else published
    if not isinstance(published, Mapping) or not published:
        raise ValueError("published must be a non-empty mapping of paper -> {params, active, tokens}")
    out = {}
    for name, p in published.items():
        try:
            values = {k: float(p[k]) for k in ("params", "active", "tokens")}
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"published[{name!r}] must hold numbers params, active and tokens") from None
        if not all(0 < v < float("inf") for v in values.values()):
            raise ValueError(f"published[{name!r}] must hold positive finite numbers, got {p!r}")
        out[name] = {"params": values["params"] / params, "active": values["active"] / params,
                     "tokens": values["tokens"] / tokens}
    return out


@dataclass(frozen=True)
class TextModelConfig:
    """The small decoder: ``n_layer`` blocks of width ``n_embd`` with ``n_head`` heads, trained
    on windows of ``context`` bytes and evaluated up to ``max_context`` (a multiple of it).
    ``chunk_size`` is the recurrent mixers' chunk length (it changes speed, not results)."""

    n_layer: int = 4
    n_embd: int = 128
    n_head: int = 4
    context: int = 256
    max_context: int = 2048
    chunk_size: int = 64

    def __post_init__(self):
        for name in ("n_layer", "n_embd", "n_head", "context", "max_context", "chunk_size"):
            check_int(getattr(self, name), name, 1)
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.max_context % self.context:
            raise ValueError(f"max_context ({self.max_context}) must be a multiple of context "
                             f"({self.context})")

    @property
    def lengths(self) -> tuple[int, ...]:
        """Evaluation lengths: the training length, 4x and 8x (those up to ``max_context``)."""
        return tuple(m * self.context for m in (1, 4, 8) if m * self.context <= self.max_context)


@dataclass(frozen=True)
class TextTrainConfig(TrainSettings):
    """The training loop's settings (see :func:`train` and
    :class:`gpt2k3.experiments.train.TrainSettings`); defaults are chapter 11's run.

    Every run trains on ``steps * batch_size * context`` bytes. The validation curve is scored
    every ``eval_every`` steps (and at step 0) on ``curve_windows`` windows of ``context``
    bytes; the final evaluation on ``eval_windows`` windows of ``max_context`` bytes.
    """

    steps: int = 300
    batch_size: int = 8
    eval_every: int = 30
    curve_windows: int = 32
    eval_windows: int = 16

    def __post_init__(self):
        super().__post_init__()
        for name in ("eval_every", "curve_windows", "eval_windows"):
            check_int(getattr(self, name), name, 1)

    def curve_steps(self) -> list[int]:
        """Steps (counts of updates done) at which the validation curve is scored."""
        return sorted({0, *range(self.eval_every, self.steps + 1, self.eval_every), self.steps})


class ConvMixer(nn.Module):
    """A token mixer with a short causal convolution in front: ``inner(conv(x))``.

    The delta-family layers run a short depthwise convolution over time on q, k and v, so every
    position sees the few bytes before it without any attention; GPT-2's attention and linear
    attention have none, and at a small training budget that, more than the mixer, decides how
    fast a model learns local structure (chapter 10 found the same). This wrapper gives any layer
    one: a depthwise causal convolution of ``kernel_size`` taps per input channel (no bias, no
    activation), started as the identity (the last tap 1, the others 0), so the model starts out
    as the layer alone. Its cache (:class:`ConvCache`) keeps the last ``kernel_size - 1`` inputs
    beside the inner layer's cache, so decoding byte by byte equals one forward pass.

    A deliberate second short convolution: it is :class:`gpt2k3.layers.conv.ShortConv`'s
    convolution with neither its SiLU nor its random start, and chapter 11's recorded runs were
    trained with exactly this form.
    """

    def __init__(self, inner: nn.Module, channels: int, kernel_size: int = CONV_SIZE):
        super().__init__()
        if not isinstance(inner, nn.Module) or not hasattr(inner, "new_cache"):
            raise ValueError("inner must be a token-mixing layer (an nn.Module with new_cache)")
        self.inner = inner
        self.channels = check_int(channels, "channels", 1)
        self.kernel_size = check_int(kernel_size, "kernel_size", 2)
        weight = torch.zeros(self.channels, 1, self.kernel_size)
        weight[:, 0, -1] = 1.0
        self.conv_weight = nn.Parameter(weight)

    def new_cache(self, batch: int, max_len: int | None = None, *, dtype=None, device=None) -> ConvCache:
        return ConvCache(self.inner.new_cache(batch, max_len, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor, cache: ConvCache | None = None) -> torch.Tensor:
        if cache is not None and not isinstance(cache, ConvCache):
            raise ValueError(f"cache must be a ConvCache (from new_cache), got {type(cache).__name__}")
        B, T, C = x.shape
        xt = x.transpose(1, 2)
        state = cache.conv if cache is not None else None
        if state is None:
            state = xt.new_zeros(B, C, self.kernel_size - 1)
        full = torch.cat([state.to(xt.dtype), xt], dim=-1)
        y = F.conv1d(full, self.conv_weight.to(xt.dtype), groups=C).transpose(1, 2)
        out = self.inner(y, cache=cache.inner if cache is not None else None)
        if cache is not None:
            cache.conv = full[..., full.shape[-1] - (self.kernel_size - 1):].clone()
        return out


def gpt_config(mixer: str, model: TextModelConfig = TextModelConfig()) -> GPTConfig:
    """The :class:`GPTConfig` of ``mixer``'s model: byte vocabulary; a learned position table of
    ``context`` rows for GPT-2, none (and ``block_size = max_context``) for every other; no
    biases and an untied head for Transformer++ (the Llama recipe)."""
    check_choice(mixer, "mixer", MIXERS)
    check_instance(model, "model", TextModelConfig)
    learned = mixer in LEARNED_POSITIONS
    llama = mixer == "transformer_pp"
    return GPTConfig(block_size=model.context if learned else model.max_context,
                     vocab_size=_text.VOCAB_SIZE, n_layer=model.n_layer, n_head=model.n_head,
                     n_embd=model.n_embd, position="learned" if learned else "none",
                     bias=not llama, tie_embeddings=not llama)


def _check_sizes(mixer: str, sizes: Mapping | None) -> dict:
    allowed = ("d_expert", "d_ff") if mixer == "k3" else ("mlp_hidden",)
    sizes = dict(sizes or {})
    if any(k not in allowed for k in sizes):
        raise ValueError(f"sizes for {mixer!r} may set only {allowed}, got {sorted(sizes)}")
    for k, v in sizes.items():
        check_int(v, f"sizes[{k!r}]", 1)
    return sizes


def assemble_model(mixer: str, model: TextModelConfig, sizes: dict) -> GPT:
    """``mixer``'s model with the widths ``sizes``, drawn from the global random state and not
    checked: the builder behind :func:`build_model` and :func:`matched_sizes`."""
    config = gpt_config(mixer, model)
    if mixer == "k3":
        return tiny_k3(config, **sizes)
    if mixer == "gpt2_fan_in":  # GPT-2, its weights drawn at 1 / fan-in (below: GPT2_STARTS)
        net = GPT(config)
        GPT2_STARTS["fan_in"](net)
        return net
    hidden, cs = sizes.get("mlp_hidden"), model.chunk_size
    if mixer == "transformer_pp":  # RoPE, RMSNorm, SwiGLU: the Llama recipe
        return GPT(config, mixer=lambda c, i: RotaryCausalSelfAttention(c),
                   mlp=lambda c, i: SwiGLU(c.n_embd, hidden or 8 * c.n_embd // 3), norm=RMSNorm)
    mlp = None if hidden is None else (lambda c, i: MLP(c, hidden))  # None: GPT-2's 4 d
    if mixer == "softmax":
        mix = None  # GPT-2's own attention
    elif mixer == "hybrid":  # Kimi Linear's 3:1: three KDA layers, then one softmax attention
        mix = hybrid_mixer(hybrid_schedule(model.n_layer, 3), delta.KDA, chunk_size=cs)
    elif mixer in CONV_ADDED:  # no convolution of their own: one goes in front
        mix = lambda c, i: ConvMixer(mixer_layer(mixer.removesuffix("_conv"), c, cs), c.n_embd)
    else:  # the delta family, with its own short convolution on q, k and v
        mix = lambda c, i: mixer_layer(mixer, c, cs)
    return GPT(config, mixer=mix, mlp=mlp)


_MATCHED: dict = {}


def matched_sizes(mixer: str, model: TextModelConfig = TextModelConfig()) -> dict:
    """The sizes that bring ``mixer``'s total parameter count closest to GPT-2's.

    GPT-2 (``"softmax"``, and ``"gpt2_fan_in"``) keeps its ``4 d`` MLP: ``{}``. Every other model gets the GELU MLP
    width ``mlp_hidden`` whose total is nearest; the tiny K3 gets the largest expert width
    ``d_expert`` that stays under the target with its dense layer at ``4 d``, then the dense
    width ``d_ff`` that comes nearest. Counts are linear in these widths, so two builds give
    the slope and a third checks the answer.
    """
    check_choice(mixer, "mixer", MIXERS)
    check_instance(model, "model", TextModelConfig)
    key = (mixer, model)
    if key in _MATCHED:
        return dict(_MATCHED[key])
    if mixer in LEARNED_POSITIONS:  # GPT-2 itself, however it starts
        _MATCHED[key] = {}
        return {}
    target = assemble_model(REFERENCE, model, {}).num_params()

    def count(sizes):
        with torch.random.fork_rng(devices=[]):
            return assemble_model(mixer, model, sizes).num_params()

    d = model.n_embd
    if mixer == "k3":
        base = dict(d_ff=4 * d)
        n8, n9 = count({**base, "d_expert": 8}), count({**base, "d_expert": 9})
        e = max(1, 8 + math.floor((target - n8) / (n9 - n8)))
        m0 = count({"d_expert": e, "d_ff": 4 * d})
        m1 = count({"d_expert": e, "d_ff": 4 * d + 1})
        f = max(1, 4 * d + round((target - m0) / (m1 - m0)))
        sizes = {"d_expert": e, "d_ff": f}
    else:
        n0, n1 = count({"mlp_hidden": 4 * d}), count({"mlp_hidden": 4 * d + 1})
        sizes = {"mlp_hidden": max(1, 4 * d + round((target - n0) / (n1 - n0)))}
    _MATCHED[key] = sizes
    return dict(sizes)


def build_model(mixer: str, model: TextModelConfig = TextModelConfig(), seed: int = 0,
                sizes: Mapping | None = None) -> GPT:
    """A freshly initialised model (seeded) with ``mixer``; ``sizes`` default to
    :func:`matched_sizes`. The global random state is left as it was."""
    check_choice(mixer, "mixer", MIXERS)
    check_instance(model, "model", TextModelConfig)
    sizes = matched_sizes(mixer, model) if sizes is None else _check_sizes(mixer, sizes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(check_int(seed, "seed", 0))
        return assemble_model(mixer, model, sizes)


def param_counts(model: GPT) -> dict:
    """``{"total", "active"}``: parameters held, and those one token uses (fewer only with an
    MoE: the tiny K3's routed experts count ``top_k`` of ``n_routed_experts``)."""
    check_instance(model, "model", GPT)
    total = model.num_params()
    spec = getattr(model, "spec", None)
    if spec is None:
        return {"total": total, "active": total}
    from gpt2k3.accounting import count_params
    counted = count_params(spec)
    if counted.total != total:
        raise ValueError(f"the model's spec counts {counted.total} parameters, the model holds {total}")
    return {"total": total, "active": counted.active}


def mixer_names(model: GPT) -> list[str]:
    """The token mixer of every block, by name: ``"softmax"``, ``"softmax + RoPE"``, ``"conv + softmax"``,
    ``"conv + linear"``, ``"DeltaNet"``, ``"Gated DeltaNet"``, ``"KDA"``, ``"MLA"``."""
    check_instance(model, "model", GPT)
    from gpt2k3.layers.mla import MLA

    def name(layer):
        if isinstance(layer, ConvMixer):
            return "conv + " + name(layer.inner)
        for cls, label in ((RotaryCausalSelfAttention, "softmax + RoPE"),
                           (CausalSelfAttention, "softmax"), (LinearAttention, "linear"),
                           (delta.KDA, "KDA"), (delta.GatedDeltaNet, "Gated DeltaNet"),
                           (delta.DeltaNet, "DeltaNet"), (MLA, "MLA")):
            if isinstance(layer, cls):
                return label
        return type(layer).__name__

    return [name(b.attn) for b in model.transformer.h]


# ------------------------------------------------------------------ GPT-2's plateau
def _fan_in_start(net: GPT) -> None:
    """Every matrix drawn from ``N(0, 1 / fan_in)`` (the tied embedding with the head), the
    residual projections ``c_proj`` scaled by ``1 / sqrt(2 n_layer)`` as GPT-2 scales its own:
    weights about 4x larger than GPT-2's ``N(0, 0.02^2)`` at width 128."""
    for name, module in net.named_modules():
        if isinstance(module, nn.Linear):
            scale = 1 / math.sqrt(2 * net.config.n_layer) if name.endswith("c_proj") else 1.0
            nn.init.normal_(module.weight, 0.0, scale * module.in_features ** -0.5)


def _untied_start(net: GPT) -> None:
    """An input embedding of its own, drawn like GPT-2's, so the head no longer shares it."""
    net.transformer.wte.weight = nn.Parameter(torch.empty_like(net.lm_head.weight).normal_(0.0, 0.02))


def _sinusoid_start(net: GPT) -> None:
    """The learned position table started as the original Transformer's sinusoids (still
    learned), at GPT-2's scale (RMS 0.02): row ``t`` holds ``sin, cos(t / 10000^(2i/d))``, so
    the row of ``t - 1`` is a fixed rotation of the row of ``t`` at every ``t``."""
    table = net.transformer.wpe.weight
    T, d = table.shape
    pos = torch.arange(T, dtype=torch.float64)[:, None]
    angle = pos * 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    rows = torch.stack((angle.sin(), angle.cos()), dim=-1).flatten(1)[:, :d]
    with torch.no_grad():
        table.copy_((rows * 0.02 * math.sqrt(2)).to(table.dtype))


#: Other starts of GPT-2 that chapter 11 tries against its plateau (each applied to a freshly
#: built GPT-2 before training: :func:`train`'s ``start``).
GPT2_STARTS = {"fan_in": _fan_in_start, "untied": _untied_start, "sinusoid": _sinusoid_start}


@torch.no_grad()
def previous_byte_attention(model: GPT, x: torch.Tensor, bins: Sequence[tuple[int, int]]) -> list[list[float]]:
    """How much GPT-2's attention looks at the byte just before: for every layer and every
    position bin ``[lo, hi)`` (``lo >= 1``), the largest over the heads of the mean attention
    weight that a query at position ``t`` puts on position ``t - 1``, over the windows ``x``
    ``(N, T)``. Uniform attention over the ``t + 1`` visible bytes gives
    :func:`uniform_previous_byte`; a previous-byte head gives nearly 1. For models whose every
    token mixer is :class:`CausalSelfAttention` (with or without RoPE)."""
    check_instance(model, "model", GPT)
    layers = [b.attn for b in model.transformer.h]
    if not all(isinstance(a, CausalSelfAttention) for a in layers):
        raise ValueError("model must mix tokens with CausalSelfAttention in every block")
    bins = [(check_int(lo, "bins lo", 1), check_int(hi, "bins hi", 2)) for lo, hi in bins]
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or any(hi > x.shape[1] or lo >= hi for lo, hi in bins):
        raise ValueError(f"x must be (N, T) token ids and bins 1 <= lo < hi <= T, got {bins}")
    seen = []

    def hook(attn, inputs, _):  # recompute the layer's attention weights from its input
        h = inputs[0]
        B, T, C = h.shape
        q, k, _v = attn.c_attn(h).split(attn.n_embd, dim=2)
        q, k = (t.view(B, T, attn.n_head, C // attn.n_head).transpose(1, 2) for t in (q, k))
        if isinstance(attn, RotaryCausalSelfAttention):
            q, k = (apply_rope(t, torch.arange(T), attn.rope_theta, interleave=False) for t in (q, k))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        seen.append(scores.masked_fill(mask, float("-inf")).softmax(-1))

    handles = [a.register_forward_hook(hook) for a in layers]
    was_training = model.training
    try:
        model.eval()
        model(x)
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    out = []
    for weights in seen:
        t = torch.arange(x.shape[1])
        prev = weights[:, :, t[1:], t[:-1]].mean(0)  # (H, T - 1): weight on t - 1, query t
        out.append([float(prev[:, lo - 1:hi - 1].mean(1).max()) for lo, hi in bins])
    return out


def uniform_previous_byte(bins: Sequence[tuple[int, int]]) -> list[float]:
    """What :func:`previous_byte_attention` gives for attention spread evenly over the ``t + 1``
    visible bytes: the mean of ``1 / (t + 1)`` over each bin ``[lo, hi)``."""
    return [math.fsum(1 / (t + 1) for t in range(lo, hi)) / (hi - lo) for lo, hi in bins]


# ------------------------------------------------------------------ evaluation
def position_bins(length: int) -> list[tuple[int, int]]:
    """Bins ``[lo, hi)`` of positions ``0 .. length - 1`` for per-position curves: one per
    position up to 4, then edges at powers of two and 1.5 times them (log-spaced)."""
    length = check_int(length, "length", 1)
    edges = {0, 1, 2, 3, 4, length}
    p = 4
    while p < length:
        edges.update({p, min(length, p * 3 // 2)})
        p *= 2
    edges = sorted(e for e in edges if e <= length)
    return list(zip(edges[:-1], edges[1:]))


def bin_positions(values: Sequence[float], bins: Sequence[tuple[int, int]]) -> list[float]:
    """Means of ``values`` (one per position) over each bin of ``bins``."""
    values = [float(v) for v in values]
    out = []
    for lo, hi in bins:
        if not 0 <= lo < hi <= len(values):
            raise ValueError(f"bins must lie within [0, {len(values)}], got [{lo}, {hi})")
        out.append(math.fsum(values[lo:hi]) / (hi - lo))
    return out


@torch.no_grad()
def token_bits(model: GPT, x: torch.Tensor, y: torch.Tensor, batch: int = 4) -> torch.Tensor:
    """Bits of every target of the windows ``x`` -> ``y`` (each ``(N, T)``), as a float64 tensor
    ``(N, T)``. Runs ``batch`` windows at a time in eval mode. ``ValueError`` if a window is
    longer than the model's ``block_size`` or a loss is not finite."""
    check_instance(model, "model", GPT)
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)) or x.dim() != 2 \
            or x.shape != y.shape:
        raise ValueError(f"x and y must be (N, T) tensors of one shape, got "
                         f"{tuple(getattr(x, 'shape', ()))} and {tuple(getattr(y, 'shape', ()))}")
    if x.shape[1] > model.config.block_size:
        raise ValueError(f"windows of {x.shape[1]} bytes exceed the model's block_size="
                         f"{model.config.block_size}"
                         + (" (its learned position table has no rows beyond)"
                            if model.config.position == "learned" else ""))
    check_int(batch, "batch", 1)
    was_training = model.training
    model.eval()
    try:
        out = [F.cross_entropy(model(x[s:s + batch]).transpose(1, 2), y[s:s + batch],
                               reduction="none").double() for s in range(0, x.shape[0], batch)]
    finally:
        model.train(was_training)
    bits = torch.cat(out) * _BITS
    if not torch.isfinite(bits).all():
        raise ValueError("the model's loss is not finite on these windows")
    return bits


def position_bits(model: GPT, x: torch.Tensor, y: torch.Tensor, batch: int = 4) -> torch.Tensor:
    """Mean loss in bits per byte at every position of the windows ``x`` -> ``y`` (each
    ``(N, T)``), as a float64 tensor ``(T,)``: :func:`token_bits` averaged over the windows."""
    return token_bits(model, x, y, batch).mean(0)


#: Bytes at the start of each copy of a repeat left out of its score: a model has to read a
#: few bytes of a stretch before it can tell which earlier stretch it repeats.
REPEAT_SKIP = 8
#: Bins of the distance (bytes from the earlier copy's start to the later one's) the repeat
#: test reports; the first two fit in chapter 11's training length of 256 bytes.
REPEAT_DISTANCES = ((32, 128), (128, 256), (256, 512), (512, 1024), (1024, 2048))
#: Bins of the offset (bytes from the start of the copy) of the per-offset repeat curve.
REPEAT_OFFSETS = ((0, 2), (2, 4), (4, 8), (8, 16), (16, 32), (32, 64), (64, 1 << 30))


def repeat_lengths(repeats: Sequence[_text.Repeat], lengths: Sequence[int]) -> dict[int, list]:
    """Each repeat under the shortest of ``lengths`` that holds both its copies (``r.span <=
    length``): ``{length: [repeats]}`` for every length, in order. A repeat that fits none is
    left out. Scoring each at the shortest length that holds it keeps the cost down, and the
    first and second copy of one repeat always share their window length."""
    lengths = sorted(check_int(n, "length", 1) for n in lengths)
    out: dict[int, list] = {n: [] for n in lengths}
    for r in repeats:
        fit = next((n for n in lengths if r.span <= n), None)
        if fit is not None:
            out[fit].append(r)
    return out


def repeat_windows(stream: torch.Tensor, repeats: Sequence[_text.Repeat], length: int,
                   copy: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows ``(x, y)`` of ``length`` bytes of ``stream``, one per repeat, whose last target is
    the last byte of the repeat's ``copy`` (``"first"`` or ``"second"``). The copy's bytes are
    then the last ``r.length`` targets of its window; for the second copy the window holds the
    whole first copy when ``r.span <= length``. Every repeat's copy must end at least
    ``length`` bytes into the stream (the window must not start before it)."""
    check_choice(copy, "copy", ("first", "second"))
    length = check_int(length, "length", 1)
    if not repeats:
        raise ValueError("repeats must not be empty")
    ends = []
    for r in repeats:
        if not isinstance(r, _text.Repeat):
            raise ValueError(f"repeats must be corpus.Repeat values, got {type(r).__name__}")
        end = (r.first if copy == "first" else r.second) + r.length  # one past its last byte
        if end - 1 - length < 0 or end > stream.numel():
            raise ValueError(f"a window of {length} bytes ending at byte {end - 1} does not fit "
                             f"in the stream of {stream.numel()} bytes")
        ends.append(end)
    rows = torch.stack([stream[e - 1 - length:e].long() for e in ends])
    return rows[:, :-1], rows[:, 1:]


def repeat_bits(model: GPT, stream: torch.Tensor, repeats: Sequence[_text.Repeat],
                length: int) -> dict[str, list[torch.Tensor]] | None:
    """The model's bits on every byte of each repeat, read the first and the second time:
    ``{"first": [...], "second": [...]}``, one float64 tensor of ``r.length`` bits per repeat
    (offset 0 is the copy's first byte). Both copies are scored in windows of ``length`` bytes
    ending on the copy's last byte (:func:`repeat_windows`), so they sit at the same positions
    and only what came before them differs: for the second copy, the first one (when it fits,
    ``r.span <= length``). ``None`` when ``length`` exceeds the model's ``block_size``."""
    check_instance(model, "model", GPT)
    if length > model.config.block_size:
        return None
    out = {}
    for copy in ("first", "second"):
        bits = token_bits(model, *repeat_windows(stream, repeats, length, copy))
        out[copy] = [bits[i, length - r.length:] for i, r in enumerate(repeats)]
    return out


def repeat_record(bits: Mapping[str, Sequence[torch.Tensor]] | None,
                  repeats: Sequence[_text.Repeat], length: int, skip: int = REPEAT_SKIP) -> dict | None:
    """:func:`repeat_bits` summarised for a results file (``None`` stays ``None``): over the
    repeats that fit in ``length`` (``span <= length``), per bin of :data:`REPEAT_DISTANCES`
    the number of repeats ``n``, of bytes scored ``bytes`` (offsets from ``skip`` on) and the
    mean bits on them the ``first`` and the ``second`` time; and per bin of
    :data:`REPEAT_OFFSETS` the same means over every repeat that fits (``offset_first``,
    ``offset_second``, ``offset_bytes``). Means are 5 significant digits; empty bins ``None``."""
    if bits is None:
        return None
    skip = check_int(skip, "skip", 0)
    fits = [i for i, r in enumerate(repeats) if r.span <= length]

    def mean(copy, picks):
        values = [v for i, lo, hi in picks for v in bits[copy][i][lo:hi].tolist()]
        return (_round(math.fsum(values) / len(values)), len(values)) if values else (None, 0)

    out = {"n": [], "bytes": [], "first": [], "second": []}
    for lo, hi in REPEAT_DISTANCES:
        picks = [(i, skip, None) for i in fits if lo <= repeats[i].distance < hi]
        first, n_bytes = mean("first", picks)
        out["n"].append(len(picks))
        out["bytes"].append(n_bytes)
        out["first"].append(first)
        out["second"].append(mean("second", picks)[0])
    for key in ("offset_first", "offset_second", "offset_bytes"):
        out[key] = []
    for lo, hi in REPEAT_OFFSETS:
        picks = [(i, lo, hi) for i in fits]
        first, n_bytes = mean("first", picks)
        out["offset_first"].append(first)
        out["offset_second"].append(mean("second", picks)[0])
        out["offset_bytes"].append(n_bytes)
    return out


def evaluate(model: GPT, windows: tuple[torch.Tensor, torch.Tensor],
             lengths: Sequence[int]) -> dict[int, torch.Tensor | None]:
    """Per-position bits per byte at each of ``lengths`` on the same bytes.

    ``windows`` are ``(x, y)`` of shape ``(N, L)`` (from :func:`gpt2k3.experiments.corpus.eval_windows`);
    at length ``l`` (a divisor of ``L``) each window is cut into ``L / l`` windows of ``l``
    bytes, so every length scores exactly the same targets, only with more or less context
    before them. A length past the model's ``block_size`` gives ``None``.
    """
    x, y = windows
    out: dict[int, torch.Tensor | None] = {}
    for length in lengths:
        length = check_int(length, "length", 1)
        if x.shape[1] % length:
            raise ValueError(f"lengths must divide the window length {x.shape[1]}, got {length}")
        if length > model.config.block_size:
            out[length] = None
            continue
        out[length] = position_bits(model, x.reshape(-1, length), y.reshape(-1, length))
    return out


@torch.no_grad()
def decode_bytes(model: GPT, idx: torch.Tensor, lengths: Sequence[int]) -> dict[int, int | None]:
    """Bytes the model keeps for one sequence after reading each of ``lengths`` bytes of ``idx``
    ``(1, T)``: its cache's ``used_nbytes`` (KV cache, recurrent states, MLA latents), in the
    model's own dtype. A length past ``block_size`` gives ``None``."""
    check_instance(model, "model", GPT)
    lengths = sorted({check_int(n, "length", 1) for n in lengths})
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.shape[0] != 1 \
            or idx.shape[1] < lengths[-1]:
        raise ValueError(f"idx must be a (1, T) tensor with T >= {lengths[-1]}, got "
                         f"{tuple(getattr(idx, 'shape', ()))}")
    fits = [n for n in lengths if n <= model.config.block_size]
    out: dict[int, int | None] = {n: None for n in lengths}
    if not fits:
        return out
    was_training = model.training
    model.eval()
    try:
        cache = model.new_cache(1, fits[-1])
        done = 0
        for n in fits:
            model(idx[:, done:n], cache=cache)
            done = n
            out[n] = int(cache.used_nbytes)
    finally:
        model.train(was_training)
    return out


@dataclass
class SampleResult:
    """Text written by :func:`sample`: the ``prompt``, the new bytes ``ids`` and their ``text``,
    and ``min_margin``, the smallest distance between a uniform draw and the edge of the token
    it picked (cumulative probability; for greedy decoding the smallest gap between the best
    and second-best logit). Float64 rounding is about 1e-16: a margin far above it means no
    other machine can pick another byte."""

    prompt: str
    ids: list[int]
    text: str
    min_margin: float


@torch.no_grad()
def sample(model: GPT, prompt: str, max_new_tokens: int, temperature: float = 0.8,
           seed: int = 0, dtype: torch.dtype = torch.float64) -> SampleResult:
    """Continue ``prompt`` by ``max_new_tokens`` bytes, sampled at ``temperature`` with a
    generator seeded by ``seed`` (0: greedy), through the model's cache.

    The model is copied and run in ``dtype`` (float64 by default), and each byte is drawn by
    inverting the cumulative distribution at one ``torch.rand`` draw of the generator, so the
    same weights, prompt and seed give the same bytes on any machine unless a draw lands within
    rounding of a boundary (``min_margin`` says how far the closest one was).
    """
    check_instance(model, "model", GPT)
    if not isinstance(prompt, str) or not prompt:
        raise ValueError(f"prompt must be a non-empty str, got {prompt!r}")
    n = check_int(max_new_tokens, "max_new_tokens", 0)
    temperature = check_finite_number(temperature, "temperature", 1, allow_zero=True)
    seed = check_int(seed, "seed", 0)
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    idx = _text.encode(prompt)[None]
    if idx.shape[1] + n > model.config.block_size:
        raise ValueError(f"prompt ({idx.shape[1]} bytes) + max_new_tokens ({n}) exceeds "
                         f"block_size={model.config.block_size}")
    net = copy.deepcopy(model).to(dtype).eval()
    gen = torch.Generator().manual_seed(seed)
    cache = net.new_cache(1, idx.shape[1] + n)
    logits = net(idx, cache=cache)[0, -1]
    ids, margin = [], math.inf
    for i in range(n):
        if temperature == 0:
            top = torch.topk(logits, 2).values
            nxt = int(logits.argmax())
            margin = min(margin, float(top[0] - top[1]))
        else:
            probs = torch.softmax(logits.double() / temperature, dim=-1)
            cdf = probs.cumsum(0)
            u = float(torch.rand((), generator=gen, dtype=torch.float64)) * float(cdf[-1])
            nxt = min(int(torch.searchsorted(cdf, torch.tensor(u, dtype=torch.float64), right=True)),
                      probs.numel() - 1)
            lo = float(cdf[nxt - 1]) if nxt > 0 else 0.0
            margin = min(margin, u - lo, float(cdf[nxt]) - u)
        ids.append(nxt)
        if i + 1 < n:
            logits = net(torch.tensor([[nxt]]), cache=cache)[0, -1]
    return SampleResult(prompt=prompt, ids=ids, text=_text.decode(ids), min_margin=margin)


# ------------------------------------------------------------------ training
@dataclass
class TextRun:
    """One training run and its evaluation.

    ``losses``: training bits per byte at every step. ``curve``: ``(step, validation bits per
    byte)`` at :meth:`TextTrainConfig.curve_steps`. ``position_bits[l]``: per-position bits at
    evaluation length ``l`` (``None`` where the model cannot run), ``length_bits[l]`` their
    mean. ``decode_bytes[l]``: cache bytes per sequence after ``l`` bytes. ``train_seconds``:
    wall time of the training steps only. ``model``: the trained model (not serialised).
    """

    mixer: str
    seed: int
    sizes: dict
    params: dict
    losses: list[float]
    curve: list[tuple[int, float]]
    position_bits: dict[int, list[float] | None]
    length_bits: dict[int, float | None]
    decode_bytes: dict[int, int | None]
    train_seconds: float
    tokens: int
    sample: SampleResult | None = None
    model: GPT | None = field(default=None, repr=False)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.train_seconds if self.train_seconds > 0 else float("nan")

    @property
    def val_bits(self) -> float:
        """Validation bits per byte at the training length."""
        if not self.length_bits:
            raise ValueError("the run has no final evaluation (it was trained with final_eval=False)")
        return self.length_bits[min(self.length_bits)]


def _check_data(data) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(data, _text.KJVData):
        return data.train, data.validation
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(
            isinstance(t, torch.Tensor) and t.dim() == 1 for t in data):
        return data[0], data[1]
    raise ValueError("data must be a gpt2k3.experiments.corpus.KJVData or a (train, validation) pair of 1-D "
                     "byte tensors")


def train(mixer: str, data, model: TextModelConfig = TextModelConfig(),
          config: TextTrainConfig = TextTrainConfig(), seed: int = 0,
          callback: Callable[[int, float], None] | None = None, until: int | None = None,
          threads: int | None = 1, final_eval: bool = True,
          sample_args: Mapping | None = None, start: Callable[[GPT], None] | None = None) -> TextRun:
    """Train a fresh ``mixer`` model on ``data`` (a :class:`gpt2k3.experiments.corpus.KJVData`, or a
    ``(train, validation)`` pair of byte tensors) and evaluate it.

    Deterministic in ``seed``: it fixes the initial weights and, through a generator of its
    own, the training windows. ``callback(step, bits)`` is called after every step. ``until``
    stops after that many steps of the *same* run (same learning-rate schedule), so the start
    of a long run and its validation points there can be reproduced cheaply. With
    ``final_eval`` the model is scored at every length of ``model.lengths`` and its cache
    measured; ``sample_args`` (``prompt``, ``max_new_tokens``, ``temperature``, ``seed``) also
    has it write a sample. ``start(model)``, if given, changes the freshly built model before
    training (under the seed's random state: :data:`GPT2_STARTS`). ``threads`` sets torch's intra-op threads for the run (restored
    afterwards; ``None`` leaves them): one by default, which on a shared CPU is as fast for
    models this small and does not spin-wait.
    """
    check_choice(mixer, "mixer", MIXERS)
    train_data, val_data = _check_data(data)
    check_instance(model, "model", TextModelConfig)
    check_instance(config, "config", TextTrainConfig)
    seed = check_int(seed, "seed", 0)
    n_steps = steps_to_run(config, until)
    if callback is not None and not callable(callback):
        raise ValueError("callback must be None or callable")
    if start is not None and not callable(start):
        raise ValueError("start must be None or a callable changing the built model")
    _text.eval_windows(val_data, model.max_context, config.eval_windows)  # checks the sizes
    with torch_threads(threads):
        sizes = matched_sizes(mixer, model)
        net = build_model(mixer, model, seed, sizes)
        if start is not None:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                start(net)
        gen = torch.Generator().manual_seed(seed * _BATCH_SEED_BASE + 7)
        curve_x, curve_y = _text.eval_windows(val_data, model.context, config.curve_windows)
        curve = []

        def val_point(step):
            curve.append((step, float(position_bits(net, curve_x, curve_y).mean())))

        losses, seconds = fit(
            net, config, lambda s: _text.sample_batch(train_data, config.batch_size, model.context, gen),
            byte_loss, n_steps, evaluate=val_point,
            eval_at={s for s in config.curve_steps() if s <= n_steps},
            callback=None if callback is None else (lambda s, loss: callback(s, loss * _BITS)))
        net.eval()
        result = TextRun(mixer=mixer, seed=seed, sizes=sizes, params=param_counts(net),
                         losses=[loss * _BITS for loss in losses], curve=curve, position_bits={},
                         length_bits={}, decode_bytes={}, train_seconds=seconds,
                         tokens=n_steps * config.batch_size * model.context, model=net)
        if final_eval:
            windows = _text.eval_windows(val_data, model.max_context, config.eval_windows)
            for length, bits in evaluate(net, windows, model.lengths).items():
                result.position_bits[length] = None if bits is None else bits.tolist()
                result.length_bits[length] = None if bits is None else float(bits.mean())
            result.decode_bytes = decode_bytes(net, windows[0][:1], model.lengths)
        if sample_args is not None:
            result.sample = sample(net, **dict(sample_args))
    return result


def byte_loss(net: GPT, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy (nats) of ``net`` predicting every next byte of the windows ``batch``."""
    x, y = batch
    logits = net(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def _round(x, digits: int = 5):
    if x is None:
        return None
    return float(f"{x:.{digits - 1}e}")


def run_record(run: TextRun, bins: Mapping[int, Sequence[tuple[int, int]]] | None = None) -> dict:
    """A JSON-ready record of ``run`` (floats at 5 significant digits, lengths as string keys):
    per-position curves are averaged over ``bins[length]`` (default :func:`position_bins`)."""
    check_instance(run, "run", TextRun)
    pos = {}
    for length, values in run.position_bits.items():
        b = (bins or {}).get(length) or position_bins(length)
        pos[str(length)] = None if values is None else [_round(v) for v in bin_positions(values, b)]
    record = {
        "mixer": run.mixer, "seed": run.seed, "sizes": run.sizes, "params": run.params,
        "tokens": run.tokens, "train_seconds": round(run.train_seconds, 2),
        "tokens_per_second": round(run.tokens_per_second, 1),
        "val_bits": _round(run.val_bits) if run.length_bits else None,
        "losses": [_round(v) for v in run.losses],
        "curve": [{"step": s, "bits": _round(b)} for s, b in run.curve],
        "length_bits": {str(k): _round(v) for k, v in run.length_bits.items()},
        "position_bits": pos,
        "decode_bytes": {str(k): v for k, v in run.decode_bytes.items()},
    }
    if run.sample is not None:
        record["sample"] = {"prompt": run.sample.prompt, "text": run.sample.text,
                            "ids": run.sample.ids, "min_margin": float(f"{run.sample.min_margin:.2e}")}
    return record


def eval_ngram_baselines(data, model: TextModelConfig, train: TextTrainConfig,
                         ranges: Mapping[str, tuple[int, int]] | None = None) -> dict[str, float]:
    """The byte bigram, trigram and four-gram tables scored on the models' own evaluation bytes:
    the ``train.eval_windows`` windows of ``model.max_context`` bytes the final evaluation uses.

    Returns ``{"bigram_eval": ..., "trigram_eval": ..., "fourgram_eval": ...}`` and, for each ``name: (lo, hi)`` of
    ``ranges`` (positions ``lo .. hi - 1`` of every window), ``"ng2_<name>"`` and
    ``"ng3_<name>"``: the tables on those positions only. ``data`` is a
    :func:`gpt2k3.experiments.corpus.kjv_data` split. ``benchmarks/text_lm.py --baselines`` stores the result
    in the results file, so the chapter needs no corpus to read it.
    """
    if not isinstance(model, TextModelConfig) or not isinstance(train, TextTrainConfig):
        raise ValueError("model and train must be a TextModelConfig and a TextTrainConfig")
    win = _text.eval_windows(data.validation, model.max_context, train.eval_windows)
    out = {f"{name}_eval": round(_text.ngram_window_bits(data.train, win, n), 4)
           for n, name in ((2, "bigram"), (3, "trigram"), (4, "fourgram"))}
    for name, (lo, hi) in (ranges or {}).items():
        if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo < hi <= model.max_context):
            raise ValueError(f"ranges[{name!r}] must be (lo, hi) with 0 <= lo < hi <= "
                             f"{model.max_context}, got {(lo, hi)!r}")
        part = (win[0][:, lo:hi], win[1][:, lo:hi])
        for n in (2, 3):
            out[f"ng{n}_{name}"] = round(_text.ngram_window_bits(data.train, part, n), 4)
    return out
