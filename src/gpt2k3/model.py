"""GPT-2, small enough to read in one sitting, and the decoder the later chapters grow from it.

:class:`GPT2` is chapter 1's model, module for module nanoGPT's (and so the seed article's):
token embedding ``wte``, learned position embedding ``wpe``, a stack of pre-LayerNorm blocks
(:class:`GPT2Block`), a final LayerNorm and a language-model head tied to ``wte``. One
deliberate difference: the MLP uses the tanh form of GELU, which is what OpenAI's GPT-2 (and
Hugging Face's ``GPT2LMHeadModel``) compute, so the public weights give the same logits here as
there (see the oracle test).

:class:`GPT` is the book's general decoder: GPT-2 with its parts made replaceable (a token
mixer per block, a channel mixer, a norm, a residual rule, no position table) and a cache
(:meth:`GPT.new_cache`, chapter 2). Given no parts it builds the same modules in the same order
as :class:`GPT2`, so a seed gives the same weights and both compute the same logits.
:func:`generate` decodes either; :func:`sample` picks each token.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2k3.cache import ModelCache, check_cache, check_layer_cache
from gpt2k3.checks import (check_bool, check_float_tensor, check_int, check_positive_int,
                           check_sampling, check_token_ids, checked)
from gpt2k3.config import GPTConfig
from gpt2k3.layers.attention import CausalSelfAttention, GPT2Attention
from gpt2k3.layers.mlp import MLP

__all__ = ["GPT2Block", "GPT2", "Block", "GPT", "generate", "sample", "check_forward"]


def check_gpt2_config(model, config) -> None:
    """:class:`GPT2`'s door: a :class:`GPTConfig` with GPT-2's learned positions and tied head."""
    if not isinstance(config, GPTConfig):
        raise ValueError(f"config must be a GPTConfig, got {type(config).__name__}")
    if config.position != "learned" or not config.tie_embeddings:
        raise ValueError("config must have GPT-2's learned positions and tied head "
                         "(position='learned', tie_embeddings=True); GPT builds the others")


def check_forward(model, idx, cache=None) -> None:
    """``forward``'s door, once per call: token ids in the vocabulary, a cache with one layer cache
    per block, made for this batch, with room, and ``past + T <= block_size``. One host sync (the
    range of the ids)."""
    check_token_ids(idx, model.config.vocab_size)
    past = 0
    if cache is not None:
        check_cache(cache, model.config.n_layer)
        check_cache_kinds(model, cache)
        cache.check_batch(idx.shape[0])
        cache.check_room(idx.shape[1])
        past = cache.length
    if past + idx.shape[1] > model.config.block_size:
        raise ValueError(f"idx makes the sequence {past + idx.shape[1]} tokens long (cached {past} "
                         f"+ new {idx.shape[1]}), more than block_size={model.config.block_size}")


def check_cache_kinds(model, cache) -> None:
    """Each block's layer cache is of a kind its token mixer accepts (``mixer.cache_types``): a
    layer inside the model's door is not checked again."""
    for i, (block, c) in enumerate(zip(model.transformer.h, cache.layers)):
        check_layer_cache(block.attn, c, f" for block {i} ({type(block.attn).__name__})")


def init_module(module: nn.Module) -> None:
    """GPT-2's start for one module: linear and embedding weights ``N(0, 0.02^2)``, biases 0."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)


class GPT2Block(nn.Module):
    """One GPT-2 layer: attention, then the MLP, each behind a LayerNorm and added to the stream."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = GPT2Attention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT2(nn.Module):
    """GPT-2: ``forward(idx)`` turns token ids ``(B, T)`` into logits ``(B, T, vocab_size)``."""

    @checked(check_gpt2_config)
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([GPT2Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias)))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying, as in GPT-2
        self.init_weights()

    def init_weights(self) -> None:
        """GPT-2's start: every weight ``N(0, 0.02^2)``, biases 0, and the projections into the
        residual stream (``c_proj``) scaled down by ``sqrt(2 n_layer)``."""
        self.apply(init_module)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * self.config.n_layer))

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count (tied weights counted once). ``non_embedding`` drops the position
        embedding, as nanoGPT's reported figure does (nothing, without one)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and "wpe" in self.transformer:
            n -= self.transformer.wpe.weight.numel()
        return n

    @checked(check_forward)
    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(0, idx.shape[1], device=idx.device)  # positions 0 .. T-1
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        x = self.transformer.drop(x)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


class Block(GPT2Block):
    """:class:`GPT2Block` with replaceable parts and a cache: a token mixer ``attn`` and a channel
    mixer ``mlp``, each behind a pre-norm (``ln_1``, ``ln_2``).

    :meth:`mix_tokens` is ``attn(ln_1(x), cache)`` and :meth:`mix_channels` is ``mlp(ln_2(x))``;
    :meth:`forward` adds each to the stream. Another residual rule (K3's Attention Residuals)
    calls the two itself. Defaults are GPT-2's parts, the attention with a KV cache; ``attn`` may
    be any module with ``forward(x, cache=None)`` and ``new_cache(batch, max_len, dtype=,
    device=)`` (linear attention, DeltaNet, KDA, MLA ...), ``mlp`` any ``(B, T, C) -> (B, T, C)``
    module (an MoE ...), and ``norm(dim)`` builds each norm.
    """

    def __init__(self, config: GPTConfig, attn: nn.Module | None = None,
                 mlp: nn.Module | None = None, norm=None):
        nn.Module.__init__(self)  # GPT2Block's modules, each of them replaceable
        norm = norm if norm is not None else (lambda d: nn.LayerNorm(d, bias=config.bias))
        self.ln_1 = norm(config.n_embd)
        self.attn = attn if attn is not None else CausalSelfAttention(config)
        self.ln_2 = norm(config.n_embd)
        self.mlp = mlp if mlp is not None else MLP(config)

    def mix_tokens(self, x: torch.Tensor, cache=None) -> torch.Tensor:
        return self.attn(self.ln_1(x), cache=cache)

    def mix_channels(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_2(x))

    def forward(self, x: torch.Tensor, cache=None) -> torch.Tensor:
        x = x + self.mix_tokens(x, cache)
        x = x + self.mix_channels(x)
        return x


def check_gpt_parts(model, config, mixer=None, mlp=None, norm=None, residual=None) -> None:
    """:class:`GPT`'s door: a :class:`GPTConfig`, part builders that are callables, a module for
    ``residual``."""
    if not isinstance(config, GPTConfig):
        raise ValueError(f"config must be a GPTConfig, got {type(config).__name__}")
    for name, part in (("mixer", mixer), ("mlp", mlp), ("norm", norm)):
        if part is not None and not callable(part):
            raise ValueError(f"{name} must be None or a callable building a module, got "
                             f"{type(part).__name__}")
    if residual is not None and not isinstance(residual, nn.Module):
        raise ValueError(f"residual must be None or an nn.Module, got {type(residual).__name__}")


class GPT(GPT2):
    """The book's one decoder: :class:`GPT2` with replaceable parts and a cache. With no parts
    given it is GPT-2 (the same modules, built in the same order, so a seed gives the same
    weights). Every model in the book is this class with other parts:

    * ``mixer(config, i)`` builds block ``i``'s token mixer in place of causal self-attention
      (linear attention, DeltaNet, Gated DeltaNet, KDA, MLA, or a hybrid schedule of them);
    * ``mlp(config, i)`` builds its channel mixer in place of GPT-2's MLP (an MoE, a SiTU-GLU);
    * ``norm(dim)`` builds every norm in place of LayerNorm (RMSNorm);
    * ``residual``, a module called as ``residual(blocks, x, caches)``, replaces the plain sum
      ``x + sublayer(x)`` (K3's Attention Residuals, :class:`gpt2k3.layers.residual.AttnResidual`);
    * ``config.position`` and ``config.tie_embeddings`` drop the position table and untie the
      head.

    Each token mixer creates its own cache (:meth:`new_cache` collects them into a
    :class:`gpt2k3.cache.ModelCache`); :meth:`forward` hands block ``i`` its layer's cache.
    """

    @checked(check_gpt_parts)
    def __init__(self, config: GPTConfig, mixer=None, mlp=None, norm=None,
                 residual: nn.Module | None = None):
        nn.Module.__init__(self)  # GPT2's modules, in its order, each of them replaceable
        self.config = config
        parts = dict(wte=nn.Embedding(config.vocab_size, config.n_embd))
        if config.position == "learned":
            parts["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        parts["drop"] = nn.Dropout(config.dropout)
        parts["h"] = nn.ModuleList([
            Block(config, mixer(config, i) if mixer is not None else None,
                  mlp(config, i) if mlp is not None else None, norm)
            for i in range(config.n_layer)])
        parts["ln_f"] = norm(config.n_embd) if norm is not None else \
            nn.LayerNorm(config.n_embd, bias=config.bias)
        self.transformer = nn.ModuleDict(parts)
        self.residual = residual
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.transformer.wte.weight = self.lm_head.weight  # weight tying, as in GPT-2
        self.init_weights()

    def new_cache(self, batch: int = 1, max_len: int | None = None, *,
                  dtype: torch.dtype | None = None, device=None) -> ModelCache:
        """An empty cache for ``batch`` sequences of up to ``max_len`` tokens (default: the
        block size): each block's token mixer creates its own."""
        check_positive_int(batch, "batch")
        max_len = self.config.block_size if max_len is None else check_positive_int(max_len, "max_len")
        if max_len > self.config.block_size:
            raise ValueError(f"max_len must be at most block_size={self.config.block_size}, got {max_len}")
        return ModelCache(b.attn.new_cache(batch, max_len, dtype=dtype, device=device)
                          for b in self.transformer.h)

    @checked(check_forward)
    def forward(self, idx: torch.Tensor, cache: ModelCache | None = None) -> torch.Tensor:
        past = cache.length if cache is not None else 0  # tokens already in the cache
        pos = torch.arange(past, past + idx.shape[1], device=idx.device)  # positions past .. past+T-1
        x = self.transformer.wte(idx)
        if "wpe" in self.transformer:  # a model without positions (NoPE) has no table
            x = x + self.transformer.wpe(pos)
        x = self.transformer.drop(x)
        caches = cache.layers if cache is not None else [None] * len(self.transformer.h)
        if self.residual is None:
            for block, layer_cache in zip(self.transformer.h, caches):
                x = block(x, layer_cache)
        else:  # another rule for adding up the sub-layers (K3's Attention Residuals)
            x = self.residual(self.transformer.h, x, caches)
        return self.lm_head(self.transformer.ln_f(x))


def check_generate(model, idx, max_new_tokens, use_cache=True, temperature=1.0, top_k=None,
                   generator=None, cache=None) -> None:
    """:func:`generate`'s door: every argument, once per call (the ids' range is the one host
    sync). A cache must be empty, made for this batch, with room for the whole sequence."""
    if not isinstance(model, GPT2):
        raise ValueError(f"model must be a GPT2 or GPT, got {type(model).__name__}")
    check_int(max_new_tokens, "max_new_tokens", 0)
    check_bool(use_cache, "use_cache")
    check_sampling(temperature, top_k, model.config.vocab_size)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be None or a torch.Generator, got {type(generator).__name__}")
    B, T = check_token_ids(idx, model.config.vocab_size)
    if T + max_new_tokens > model.config.block_size:
        raise ValueError(f"prompt length {T} + max_new_tokens {max_new_tokens} exceeds "
                         f"block_size={model.config.block_size}")
    if use_cache and not isinstance(model, GPT):
        raise ValueError("use_cache=True needs a GPT (GPT2 has no cache): pass use_cache=False")
    if cache is not None:
        if not use_cache:
            raise ValueError("cache was given with use_cache=False; pass one or the other")
        check_cache(cache, model.config.n_layer)
        if cache.length != 0:
            raise ValueError(f"cache must be empty (length 0), got length {cache.length}")
        cache.check_batch(B)
        cache.check_room(T + max_new_tokens)


@checked(check_generate)
@torch.no_grad()
def generate(model: GPT2, idx: torch.Tensor, max_new_tokens: int, use_cache: bool = True,
             temperature: float = 1.0, top_k: int | None = None,
             generator: torch.Generator | None = None, cache: ModelCache | None = None) -> torch.Tensor:
    """Append ``max_new_tokens`` tokens to ``idx`` ``(B, T)``; return ``(B, T + max_new_tokens)``.

    ``temperature=0`` is greedy; otherwise each token is drawn by :func:`sample`. With a cache
    (a :class:`GPT`) the prompt runs once and every later step runs one token through it; without
    one (``use_cache=False``) every step reruns the whole sequence. The cache is
    ``model.new_cache(B, T + max_new_tokens)`` unless an empty ``cache`` is passed. The door
    checks the arguments once; no step reads anything back to the host (whether every step's
    logits were finite is read once, at the end).
    """
    was_training = model.training
    model.eval()
    if use_cache and cache is None:
        p = next(model.parameters())
        cache = model.new_cache(idx.shape[0], idx.shape[1] + max_new_tokens,
                                dtype=p.dtype, device=p.device)
    finite, nxt = True, idx
    for _ in range(max_new_tokens):
        logits = model(nxt, cache) if use_cache else model(idx)  # inside the door: no re-check
        finite = finite & torch.isfinite(logits[:, -1]).all()  # stays on the device until the end
        nxt = sample(logits[:, -1], temperature, top_k, generator)
        idx = torch.cat((idx, nxt), dim=1)
    model.train(was_training)
    if not finite:
        raise ValueError("model gave non-finite logits (NaN or inf): check its weights")
    return idx


def check_sample(logits, temperature=1.0, top_k=None, generator=None) -> None:
    """:func:`sample`'s door: float logits ``(B, V)`` and the sampling arguments (no host sync)."""
    check_sampling(temperature, top_k, check_float_tensor(logits, "logits", 2).shape[-1])


@checked(check_sample)
def sample(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """The next token ``(B, 1)`` from last-position logits ``(B, V)``: the argmax when
    ``temperature == 0``, else a draw from ``softmax(logits / temperature)`` over the ``top_k``
    most likely tokens (all when ``None``)."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1, generator=generator)
