"""GPT-2, small enough to read in one sitting.

The model follows nanoGPT (and so the seed article) module for module — token
embedding ``wte``, learned position embedding ``wpe``, a stack of pre-LayerNorm
blocks, a final LayerNorm and a language-model head tied to ``wte`` — with one
deliberate difference: the MLP uses the tanh approximation of GELU, which is what
OpenAI's GPT-2 (and Hugging Face's ``GPT2LMHeadModel``) compute.  With it, the
public GPT-2 weights give the same logits here as there (see the oracle test).

The forward pass optionally takes a :class:`gpt2k3.cache.ModelCache` from
:meth:`GPT.new_cache` -- one cache per block, created by that block's token mixer (a
:class:`gpt2k3.cache.KVCache` for GPT-2's attention); see chapter 2 of the book.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2k3.cache import ModelCache, check_cache
from gpt2k3.checks import check_positive_int, check_sampling, check_float_tensor, check_token_ids
from gpt2k3.config import GPTConfig
from gpt2k3.layers.attention import CausalSelfAttention
from gpt2k3.layers.mlp import MLP

__all__ = ["Block", "GPT", "generate", "sample"]


class Block(nn.Module):
    """One decoder layer: a token mixer ``attn`` and a channel mixer ``mlp``, each behind a
    pre-norm (``ln_1``, ``ln_2``).

    :meth:`mix_tokens` is ``attn(ln_1(x))`` and :meth:`mix_channels` is ``mlp(ln_2(x))``; the
    plain residual :meth:`forward` adds each to the stream, GPT-2's ``x + attn(ln_1(x))`` then
    ``x + mlp(ln_2(x))``. Another residual style (K3's Attention Residuals) calls the two
    sub-layers itself.

    Defaults are GPT-2's parts: causal self-attention, the GELU MLP and LayerNorm. ``attn`` may
    be any module with ``forward(x, cache=None)`` and ``new_cache(batch, max_len, dtype=,
    device=)`` (linear attention, DeltaNet, KDA, MLA ...); ``mlp`` any ``(B, T, C) -> (B, T, C)``
    module (an MoE ...); ``norm(dim)`` builds each norm.
    """

    def __init__(self, config: GPTConfig, attn: nn.Module | None = None, mlp: nn.Module | None = None,
                 norm=None):
        super().__init__()
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
        return x + self.mix_channels(x)


class GPT(nn.Module):
    """The book's one decoder. With no parts given it is GPT-2; ``forward(idx)`` returns logits
    for every position.

    Every model in the book is this class with other parts:

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

    def __init__(self, config: GPTConfig, mixer=None, mlp=None, norm=None, residual: nn.Module | None = None):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise ValueError(f"config must be a GPTConfig, got {type(config).__name__}")
        for name, part in (("mixer", mixer), ("mlp", mlp), ("norm", norm)):
            if part is not None and not callable(part):
                raise ValueError(f"{name} must be None or a callable building a module, got "
                                 f"{type(part).__name__}")
        if residual is not None and not isinstance(residual, nn.Module):
            raise ValueError(f"residual must be None or an nn.Module, got {type(residual).__name__}")
        self.config = config
        new_norm = norm if norm is not None else (lambda d: nn.LayerNorm(d, bias=config.bias))
        parts = dict(wte=nn.Embedding(config.vocab_size, config.n_embd))
        if config.position == "learned":
            parts["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        parts["drop"] = nn.Dropout(config.dropout)
        parts["h"] = nn.ModuleList([
            Block(config, mixer(config, i) if mixer is not None else None,
                  mlp(config, i) if mlp is not None else None, norm)
            for i in range(config.n_layer)])
        parts["ln_f"] = new_norm(config.n_embd)
        self.transformer = nn.ModuleDict(parts)
        self.residual = residual
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.transformer.wte.weight = self.lm_head.weight  # weight tying, as in GPT-2
        self.apply(self._init_weights)
        # GPT-2's scaled init of the residual projections: std 0.02 / sqrt(2 * n_layer)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count (tied weights counted once).  ``non_embedding`` drops the
        position embedding, as nanoGPT's reported figure does (nothing, without one)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and "wpe" in self.transformer:
            n -= self.transformer.wpe.weight.numel()
        return n

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

    def check_tokens(self, idx, cache=None) -> int:
        """:meth:`forward`'s front door (ids in the vocabulary, a cache with room, ``past + T <=
        block_size``); returns ``past``. One host sync, once per call: the range of the ids."""
        check_token_ids(idx, self.config.vocab_size)
        cache = check_cache(cache, self.config.n_layer)
        past, T = (cache.length if cache is not None else 0), idx.shape[1]
        if past + T > self.config.block_size:
            raise ValueError(f"idx makes the sequence {past + T} tokens long (cached {past} + new "
                             f"{T}), more than block_size={self.config.block_size}")
        if cache is not None:  # refused before any layer writes
            cache.check_batch(idx.shape[0])
            cache.check_room(T)
        return past

    def forward(self, idx: torch.Tensor, cache: ModelCache | None = None, *,
                check: bool = True) -> torch.Tensor:
        """Logits ``(B, T, vocab_size)`` for token ids ``idx`` ``(B, T)``. With a ``cache`` (from
        :meth:`new_cache`), ``idx`` holds only the new tokens, at positions from ``cache.length``.
        ``check=False`` skips :meth:`check_tokens` (:func:`generate`'s steps checked once)."""
        if check:
            self.check_tokens(idx, cache)
        past = cache.length if cache is not None else 0
        x = self.transformer.wte(idx)
        if "wpe" in self.transformer:
            pos = torch.arange(past, past + idx.shape[1], dtype=torch.long, device=idx.device)
            x = x + self.transformer.wpe(pos)
        x = self.transformer.drop(x)
        caches = cache.layers if cache is not None else [None] * len(self.transformer.h)
        if self.residual is None:
            for block, layer_cache in zip(self.transformer.h, caches):
                x = block(x, layer_cache)
        else:
            x = self.residual(self.transformer.h, x, caches)
        return self.lm_head(self.transformer.ln_f(x))


@torch.no_grad()
def generate(model: GPT, idx: torch.Tensor, max_new_tokens: int, use_cache: bool = True,
             temperature: float = 1.0, top_k: int | None = None,
             generator: torch.Generator | None = None, cache: ModelCache | None = None) -> torch.Tensor:
    """Append ``max_new_tokens`` tokens to ``idx`` ``(B, T)`` and return ``(B, T + max_new_tokens)``.

    ``temperature=0`` is greedy decoding (argmax); otherwise the next token is sampled from
    ``softmax(logits / temperature)``, restricted to the ``top_k`` most likely tokens when
    ``top_k`` is given (:func:`sample`).

    Without a cache (``use_cache=False``), every step runs the whole sequence through the
    model and keeps only the last position's logits. With one, the prompt is run once
    (prefill) and every later step runs one token through the layers' caches. Both give
    the same tokens (greedy) up to float rounding of the logits. The cache is
    ``model.new_cache(B, T + max_new_tokens)`` -- whatever each layer keeps: a KV cache, a
    fixed-size state, an MLA latent -- unless an empty ``cache`` is passed (the seed's
    concatenating one, :func:`gpt2k3.cache.concat_cache`, say). :class:`FastDecoder`
    computes the same tokens for a plain GPT-2, rearranged for speed.

    The arguments are checked once per call; a decode step reads nothing back to the host but
    the token it chooses (whether every step's logits were finite is read once, at the end).
    """
    _check_generate(model, idx, max_new_tokens, use_cache, temperature, top_k, cache)
    was_training = model.training
    model.eval()
    if use_cache and cache is None:
        p = next(model.parameters())
        cache = model.new_cache(idx.shape[0], idx.shape[1] + max_new_tokens,
                                dtype=p.dtype, device=p.device)
    finite, step_input = True, idx
    for _ in range(max_new_tokens):
        logits = model(step_input if use_cache else idx, cache, check=False)[:, -1, :]
        finite = finite & torch.isfinite(logits).all()  # stays on the device until the end
        nxt = sample(logits, temperature, top_k, generator)
        idx = torch.cat((idx, nxt), dim=1)
        step_input = nxt
    model.train(was_training)
    if not finite:
        raise ValueError("model gave non-finite logits (NaN or inf): check its weights")
    return idx


def _check_generate(model, idx, max_new_tokens, use_cache, temperature, top_k, cache) -> None:
    """:func:`generate`'s arguments, all of them, once per call."""
    if not isinstance(model, GPT):
        raise ValueError(f"model must be a GPT, got {type(model).__name__}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative int, got {max_new_tokens!r}")
    check_sampling(temperature, top_k, model.config.vocab_size)
    if not isinstance(use_cache, bool):
        raise ValueError(f"use_cache must be a bool, got {use_cache!r}")
    T = check_token_ids(idx, model.config.vocab_size)[1]
    if T + max_new_tokens > model.config.block_size:
        raise ValueError(f"prompt length {T} + max_new_tokens {max_new_tokens} exceeds "
                         f"block_size={model.config.block_size}")
    if cache is not None:
        if not use_cache:
            raise ValueError("cache was given with use_cache=False; pass one or the other")
        check_cache(cache, model.config.n_layer)
        if cache.length != 0:
            raise ValueError(f"cache must be empty (length 0), got length {cache.length}")
        cache.check_room(T + max_new_tokens)


def sample(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """The next token ``(B, 1)`` from last-position logits ``(B, V)``: the argmax when
    ``temperature == 0``, else a draw from ``softmax(logits / temperature)`` over the ``top_k``
    most likely tokens (all when ``None``). Arguments as :func:`gpt2k3.checks.check_sampling`
    accepts them."""
    check_sampling(temperature, top_k, check_float_tensor(logits, "logits", 2).shape[-1])  # no sync
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1, generator=generator)
