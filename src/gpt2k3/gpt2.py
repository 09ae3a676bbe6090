"""GPT-2, small enough to read in one sitting.

The model follows nanoGPT (and so the seed article) module for module — token
embedding ``wte``, learned position embedding ``wpe``, a stack of pre-LayerNorm
blocks, a final LayerNorm and a language-model head tied to ``wte`` — with one
deliberate difference: the MLP uses the tanh approximation of GELU, which is what
OpenAI's GPT-2 (and Hugging Face's ``GPT2LMHeadModel``) compute.  With it, the
public GPT-2 weights give the same logits here as there (see the oracle test).

The forward pass optionally takes a :class:`gpt2k3.cache.ModelCache` from
:meth:`GPT.new_cache` -- one cache per block, created by that block's token mixer (a
:class:`gpt2k3.kv_cache.KVCache` for GPT-2's attention); see chapter 2 of the book.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._validate import check_positive_int
from .cache import ModelCache, check_cache
from .kv_cache import ConcatKVCache, KVCache
from .mixers import softmax as _softmax

__all__ = ["GPTConfig", "GPT", "generate", "FastDecoder", "trace_shapes"]


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of a GPT-2-style model.  Defaults are GPT-2 small with nanoGPT's padded vocabulary.

    ``vocab_size`` 50304 is 50257 (GPT-2's BPE vocabulary) rounded up to a multiple
    of 64, which nanoGPT uses for faster matmuls; the public checkpoints use 50257.
    """

    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True
    #: ``"learned"``: GPT-2's position table ``wpe``; ``"none"``: no position embedding (NoPE,
    #: Kimi Linear and K3 -- order then comes only from causal masking and the recurrent mixers)
    position: str = "learned"
    #: GPT-2 ties the head to the token embedding; DeepSeek, Kimi K2 and K3 do not
    tie_embeddings: bool = True

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "position":
                if value not in ("learned", "none"):
                    raise ValueError(f"position must be 'learned' or 'none', got {value!r}")
            elif f.name == "tie_embeddings":
                if not isinstance(value, bool):
                    raise ValueError(f"tie_embeddings must be a bool, got {value!r}")
            elif f.name == "dropout":
                if isinstance(value, bool) or not isinstance(value, (int, float)) \
                        or not 0.0 <= value < 1.0:
                    raise ValueError(f"dropout must be in [0, 1), got {value!r}")
            elif f.name == "bias":
                if not isinstance(value, bool):
                    raise ValueError(f"bias must be a bool, got {value!r}")
            elif not isinstance(value, int):  # a float like 12.0 is a mistake, not a size
                raise ValueError(f"{f.name} must be a positive int, got {value!r}")
            else:
                check_positive_int(value, f.name)
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with one fused QKV projection (``c_attn``).

    The token mixing itself is :func:`gpt2k3.mixers.softmax.parallel`; this layer adds GPT-2's
    projections and owns its cache, a :class:`gpt2k3.kv_cache.KVCache` (:meth:`new_cache`).
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = config.dropout
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd

    def new_cache(self, batch: int, max_len: int, *, dtype: torch.dtype | None = None,
                  device=None) -> KVCache:
        """An empty preallocated K/V cache for this layer (dtype and device of the weights)."""
        w = self.c_attn.weight
        return KVCache(batch, self.n_head, max_len, self.n_embd // self.n_head,
                       dtype=w.dtype if dtype is None else dtype,
                       device=w.device if device is None else device)

    def forward(self, x: torch.Tensor, cache: KVCache | ConcatKVCache | None = None) -> torch.Tensor:
        if cache is not None and not isinstance(cache, (KVCache, ConcatKVCache)):
            raise ValueError(f"cache must be a KVCache or ConcatKVCache (from new_cache or "
                             f"concat_cache), got {type(cache).__name__}")
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        # (B, T, C) -> (B, nh, T, hs): heads become a batch dimension
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if cache is not None:  # append this chunk; attend over everything cached so far
            k, v = cache.extend(k, v)
        # a cache checked its new entries as they were written: no scan of the whole cache
        y = _softmax.parallel(q, k, v, dropout_p=self.attn_dropout if self.training else 0.0,
                              check_kv=cache is None)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble the heads side by side
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    """Position-wise feed-forward network: ``n_embd -> 4 n_embd -> n_embd`` with GELU (tanh form)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


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
      ``x + sublayer(x)`` (K3's Attention Residuals, :class:`gpt2k3.k3.AttnResidual`);
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

    def check_tokens(self, idx, cache=None) -> tuple[int, int, int]:
        """Validate a batch of token ids for a forward pass (after ``cache.length`` cached
        positions); return ``(B, T, past)``."""
        if not isinstance(idx, torch.Tensor) or idx.dim() != 2 \
                or idx.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"idx must be an integer tensor of shape (B, T), got "
                             f"{getattr(idx, 'dtype', type(idx).__name__)} of shape "
                             f"{tuple(getattr(idx, 'shape', ()))}")
        B, T = idx.shape
        cache = check_cache(cache, self.config.n_layer)
        past = cache.length if cache is not None else 0
        if T == 0:
            raise ValueError("idx must hold at least one token (T >= 1)")
        if past + T > self.config.block_size:
            raise ValueError(f"sequence length {past + T} (cached {past} + new {T}) exceeds "
                             f"block_size={self.config.block_size}")
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= self.config.vocab_size:
            raise ValueError(f"idx must hold token ids in [0, vocab_size={self.config.vocab_size}), "
                             f"got values in [{lo}, {hi}]")
        if cache is not None:
            cache.check_room(T)
        return B, T, past

    def forward(self, idx: torch.Tensor, cache: ModelCache | None = None) -> torch.Tensor:
        """Logits ``(B, T, vocab_size)`` for token ids ``idx`` of shape ``(B, T)``.

        With a ``cache`` (from :meth:`new_cache`), ``idx`` holds only the new tokens: their
        positions start at ``cache.length``, and each block's token mixer reads and extends its
        own layer cache.
        """
        B, T, past = self.check_tokens(idx, cache)
        x = self.transformer.wte(idx)
        if "wpe" in self.transformer:
            pos = torch.arange(past, past + T, dtype=torch.long, device=idx.device)
            x = x + self.transformer.wpe(pos)
        x = self.transformer.drop(x)
        caches = cache.layers if cache is not None else [None] * len(self.transformer.h)
        if self.residual is None:
            for block, layer_cache in zip(self.transformer.h, caches):
                x = block(x, layer_cache)
        else:
            x = self.residual(self.transformer.h, x, caches)
        return self.lm_head(self.transformer.ln_f(x))

    # -- loading the public GPT-2 layout ------------------------------------------------
    _CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    _BUFFERS = re.compile(r"\.attn\.(bias|masked_bias)$")  # mask buffers of older checkpoints

    @classmethod
    def from_hf_state_dict(cls, sd: dict, n_head: int = 12, dropout: float = 0.0) -> "GPT":
        """Build a GPT from a state dict in the public GPT-2 layout (Hugging Face
        ``GPT2LMHeadModel`` / ``GPT2Model``, with or without the ``transformer.`` prefix).

        Every size but the head count is read off the tensors.  Hugging Face stores
        the four projection weights as ``Conv1D`` with shape ``(in, out)``; they are
        transposed into ``nn.Linear``'s ``(out, in)``.
        """
        sd = {k if k.startswith(("transformer.", "lm_head.")) else f"transformer.{k}": v
              for k, v in sd.items()}
        sd = {k: v for k, v in sd.items() if not cls._BUFFERS.search(k)}
        for key in ("transformer.wte.weight", "transformer.wpe.weight"):
            if key not in sd:
                raise ValueError(f"sd is missing {key!r}: not a GPT-2 state dict")
        vocab_size, n_embd = sd["transformer.wte.weight"].shape
        block_size = sd["transformer.wpe.weight"].shape[0]
        layers = {int(m.group(1)) for k in sd if (m := re.match(r"transformer\.h\.(\d+)\.", k))}
        if not layers or layers != set(range(max(layers) + 1)):
            raise ValueError(f"sd must hold layers transformer.h.0..N-1, found {sorted(layers)}")
        bias = "transformer.h.0.attn.c_attn.bias" in sd
        config = GPTConfig(block_size=block_size, vocab_size=vocab_size, n_layer=len(layers),
                           n_head=n_head, n_embd=n_embd, dropout=dropout, bias=bias)
        model = cls(config)
        head = sd.pop("lm_head.weight", None)
        if head is not None and not torch.equal(head, sd["transformer.wte.weight"]):
            raise ValueError("sd has an lm_head.weight that differs from wte: GPT-2 ties them")
        own = model.state_dict()
        new = {}
        for k, v in sd.items():
            if k not in own:
                raise ValueError(f"sd has an unexpected key {k!r}")
            if k.endswith(cls._CONV1D):
                v = v.t()
            if v.shape != own[k].shape:
                raise ValueError(f"sd[{k!r}] has shape {tuple(v.shape)}, expected {tuple(own[k].shape)}")
            new[k] = v
        new["lm_head.weight"] = new["transformer.wte.weight"]
        missing = set(own) - set(new)
        if missing:
            raise ValueError(f"sd is missing {sorted(missing)}")
        model.load_state_dict(new)
        return model.eval()


@torch.no_grad()
def generate(model: GPT, idx: torch.Tensor, max_new_tokens: int, use_cache: bool = True,
             temperature: float = 1.0, top_k: int | None = None,
             generator: torch.Generator | None = None, cache: ModelCache | None = None) -> torch.Tensor:
    """Append ``max_new_tokens`` tokens to ``idx`` ``(B, T)`` and return ``(B, T + max_new_tokens)``.

    ``temperature=0`` is greedy decoding (argmax); otherwise the next token is
    sampled from ``softmax(logits / temperature)``, restricted to the ``top_k`` most
    likely tokens when ``top_k`` is given.

    Without a cache (``use_cache=False``), every step runs the whole sequence through the
    model and keeps only the last position's logits.  With one, the prompt is run once
    (prefill) and every later step runs one token through the layers' caches.  Both give
    the same tokens (greedy) up to float rounding of the logits.  The cache is
    ``model.new_cache(B, T + max_new_tokens)`` -- whatever each layer keeps: a KV cache, a
    fixed-size state, an MLA latent -- unless an empty ``cache`` is passed (the seed's
    concatenating one, :func:`gpt2k3.kv_cache.concat_cache`, say).  :class:`FastDecoder`
    computes the same tokens for a plain GPT-2, rearranged for speed.
    """
    if not isinstance(model, GPT):
        raise ValueError(f"model must be a GPT, got {type(model).__name__}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative int, got {max_new_tokens!r}")
    _check_sampling(temperature, top_k, model.config.vocab_size)
    if not isinstance(use_cache, bool):
        raise ValueError(f"use_cache must be a bool, got {use_cache!r}")
    B, T, _ = model.check_tokens(idx)
    total = T + max_new_tokens
    if total > model.config.block_size:
        raise ValueError(f"prompt length {T} + max_new_tokens {max_new_tokens} exceeds "
                         f"block_size={model.config.block_size}")
    if cache is not None:
        if not use_cache:
            raise ValueError("cache was given with use_cache=False; pass one or the other")
        check_cache(cache, model.config.n_layer)
        if cache.length != 0:
            raise ValueError(f"cache must be empty (length 0), got length {cache.length}")
    was_training = model.training
    model.eval()
    if use_cache and cache is None:
        p = next(model.parameters())
        cache = model.new_cache(B, total, dtype=p.dtype, device=p.device)
    step_input = idx
    for _ in range(max_new_tokens):
        logits = model(step_input if use_cache else idx, cache=cache)[:, -1, :]
        nxt = _pick(logits, temperature, top_k, generator)
        idx = torch.cat((idx, nxt), dim=1)
        step_input = nxt
    model.train(was_training)
    return idx


def _check_sampling(temperature, top_k, vocab: int) -> None:
    """``temperature`` a finite number >= 0 (0: greedy; tiny positive values that overflow the
    logits are refused); ``top_k`` None or an int in ``[1, vocab]``."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if 0 < temperature < 1e-30:
        raise ValueError(f"temperature must be 0 (greedy) or at least 1e-30, got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)
                              or not 1 <= top_k <= vocab):
        raise ValueError(f"top_k must be None or an int in [1, {vocab}], got {top_k!r}")


class FastDecoder:
    """Cached decoding of a plain GPT-2 at the memory-bandwidth limit of a CPU.

    :func:`generate` with a :class:`KVCache` is the decode loop chapter 2 teaches: readable,
    module by module. This class computes the same thing for a :class:`GPT` built with
    GPT-2's own attention, rearranged for speed at small batch, where a decode step is a chain
    of matrix-vector products whose cost is the bytes of weights they stream:

    * **each weight in the layout that streams fastest.** ``nn.Linear`` stores ``(out, in)``
      and computes ``x @ W.T``. For a single row ``x`` the BLAS streams a weight with a long
      output (the fused q/k/v projection, the MLP's up-projection, the square attention
      output, and above all the tied head, 50,257 outputs long) faster when it is stored
      ``(in, out)`` and multiplied as ``x @ W_t``; the MLP's down-projection, with a long
      *input*, streams faster as it is. ``benchmarks/decode.py`` measures both layouts for
      every shape and records them. So the weights with ``out >= in`` -- the head included, as
      ``wte.T`` of shape ``(n_embd, vocab)`` -- are copied once, at construction, into
      ``(in, out)``; the others are kept ``(out, in)``;
    * **preallocated buffers.** The KV cache (one K and one V tensor per layer, as in
      :class:`KVCache`) and a step's activations are allocated once; a step writes into them
      with ``out=`` products and in-place adds;
    * **no per-step bookkeeping.** No validation, no module calls, fewer operations (the
      attention scale ``1/sqrt(D)`` is folded into the query weights, exact for GPT-2's
      ``D = 64``), and logits only for the positions that are sampled: the prompt's last.

    Every product is the reference forward's, up to the BLAS kernel's rounding, so decoding
    gives the same tokens (tested: against :func:`generate`, and against Hugging Face's
    ``generate`` with the same weights). The packed copy costs a second set of weights in
    memory; build one decoder per model and reuse it. Later changes to the model's weights
    are not seen by the decoder, and it always decodes as in ``eval()`` mode (no dropout).

    Args:
        model: a :class:`GPT` whose blocks use GPT-2's causal self-attention (the default).
        max_len: longest sequence (prompt + new tokens) it decodes; defaults to the block size.
        batch: sequences decoded together.
    """

    def __init__(self, model: GPT, max_len: int | None = None, batch: int = 1):
        if not isinstance(model, GPT):
            raise ValueError(f"model must be a GPT, got {type(model).__name__}")
        if not all(type(b.attn) is CausalSelfAttention and type(b.mlp) is MLP
                   and type(b.ln_1) is nn.LayerNorm and type(b.ln_2) is nn.LayerNorm
                   for b in model.transformer.h) or model.residual is not None \
                or "wpe" not in model.transformer or not model.config.tie_embeddings:
            raise ValueError("model must be a plain GPT-2: causal self-attention, the GELU MLP and "
                             "LayerNorm in every block, learned positions, a tied head and the "
                             "plain residual (FastDecoder packs exactly those weights)")
        cfg = model.config
        max_len = cfg.block_size if max_len is None else max_len
        check_positive_int(max_len, "max_len")
        if max_len > cfg.block_size:
            raise ValueError(f"max_len must be at most block_size={cfg.block_size}, got {max_len}")
        check_positive_int(batch, "batch")
        self.config, self.max_len, self.batch = cfg, max_len, batch
        t = model.transformer
        self.dtype, self.device = t.wte.weight.dtype, t.wte.weight.device
        C, H = cfg.n_embd, cfg.n_head
        D = C // H
        kw = dict(dtype=self.dtype, device=self.device)

        def vec(x: torch.Tensor | None, n: int) -> torch.Tensor:  # a bias, or zeros without one
            return torch.zeros(n, **kw) if x is None else x.detach().clone()

        def norm(ln: nn.LayerNorm) -> tuple:
            return (vec(ln.weight, C), vec(ln.bias, C), ln.eps)

        with torch.no_grad():
            self.wte = t.wte.weight.detach().clone()  # rows looked up by token id
            self.wpe = t.wpe.weight.detach().clone()
            self.head = self.pack(model.lm_head.weight)  # (C, vocab)
            self.ln_f = norm(t.ln_f)
            self.layers = []
            for b in t.h:
                a, m = b.attn, b.mlp
                w_qkv, b_qkv = self.pack(a.c_attn.weight), vec(a.c_attn.bias, 3 * C)
                # 1/sqrt(D) folded into the query columns: exact when it is a power of two
                # (D a power of four, as in every GPT-2), a rounding difference otherwise
                w_qkv[:, :C] *= 1.0 / math.sqrt(D)
                b_qkv[:C] *= 1.0 / math.sqrt(D)
                self.layers.append(dict(
                    ln_1=norm(b.ln_1), w_qkv=w_qkv, b_qkv=b_qkv,
                    w_o=self.pack(a.c_proj.weight), b_o=vec(a.c_proj.bias, C),
                    ln_2=norm(b.ln_2),
                    w_fc=self.pack(m.c_fc.weight), b_fc=vec(m.c_fc.bias, 4 * C),
                    w_mp=self.pack(m.c_proj.weight), b_mp=vec(m.c_proj.bias, C),
                ))
        self.k = [torch.zeros(batch, H, max_len, D, **kw) for _ in range(cfg.n_layer)]
        self.v = [torch.zeros(batch, H, max_len, D, **kw) for _ in range(cfg.n_layer)]
        # one step's activations, written in place, and views of them by head
        self._x = torch.empty(batch, C, **kw)
        self._qkv = torch.empty(batch, 3 * C, **kw)
        self._y = torch.empty(batch, C, **kw)
        self._fc = torch.empty(batch, 4 * C, **kw)
        self._o = torch.empty(batch, C, **kw)
        self._logits = torch.empty(batch, cfg.vocab_size, **kw)
        heads = self._qkv.view(batch, 3, H, D)
        self._q, self._k_new, self._v_new = heads[:, 0], heads[:, 1], heads[:, 2]  # (B, H, D)
        self._y_heads = self._y.view(batch * H, 1, D)

    @staticmethod
    def pack(weight: torch.Tensor) -> torch.Tensor:
        """``weight`` ``(out, in)`` as the ``(in, out)`` operand of ``x @ w``: a contiguous copy
        of ``weight.T`` when ``out >= in``, otherwise a transposed view of a copy of ``weight``
        (see the class docstring for why the layout depends on the shape)."""
        out_features, in_features = weight.shape
        w = weight.detach()
        return w.t().contiguous() if out_features >= in_features else w.clone().t()

    @property
    def nbytes(self) -> int:
        """Bytes held: the packed weights and the preallocated cache."""
        ts = [self.wte, self.wpe, self.head, *self.ln_f[:2], *self.k, *self.v]
        for layer in self.layers:
            ts += [x for v in layer.values() for x in (v[:2] if isinstance(v, tuple) else (v,))]
        return sum(x.numel() * x.element_size() for x in ts)

    @torch.no_grad()
    def _prefill(self, idx: torch.Tensor) -> torch.Tensor:
        """Run the prompt ``(B, T)`` through every layer, filling the cache; logits of its
        last position ``(B, vocab)``."""
        B, T = idx.shape
        C, H = self.config.n_embd, self.config.n_head
        x = self.wte[idx] + self.wpe[:T]  # (B, T, C)
        for li, L in enumerate(self.layers):
            h = F.layer_norm(x, (C,), *L["ln_1"])
            qkv = torch.addmm(L["b_qkv"], h.view(B * T, C), L["w_qkv"]).view(B, T, 3, H, C // H)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, D)
            self.k[li][:, :, :T] = k
            self.v[li][:, :, :T] = v
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0)  # q pre-scaled
            y = y.transpose(1, 2).reshape(B * T, C)
            x = x + torch.addmm(L["b_o"], y, L["w_o"]).view(B, T, C)
            h = F.layer_norm(x, (C,), *L["ln_2"]).view(B * T, C)
            f = F.gelu(torch.addmm(L["b_fc"], h, L["w_fc"]), approximate="tanh")
            x = x + torch.addmm(L["b_mp"], f, L["w_mp"]).view(B, T, C)
        self._x.copy_(x[:, -1])
        h = F.layer_norm(self._x, (C,), *self.ln_f)
        return torch.mm(h, self.head, out=self._logits)

    @torch.no_grad()
    def _step(self, tok: torch.Tensor, pos: int) -> torch.Tensor:
        """One token per sequence (``tok`` of shape ``(B,)``) at position ``pos``, attending to
        the ``pos`` cached positions and itself; logits ``(B, vocab)``."""
        C, H = self.config.n_embd, self.config.n_head
        B, n = self.batch, pos + 1
        x, qkv, fc, o = self._x, self._qkv, self._fc, self._o
        torch.add(self.wte[tok], self.wpe[pos], out=x)
        for L, K, V in zip(self.layers, self.k, self.v):
            h = F.layer_norm(x, (C,), *L["ln_1"])
            torch.addmm(L["b_qkv"], h, L["w_qkv"], out=qkv)  # q comes out scaled by 1/sqrt(D)
            q = self._q.reshape(B * H, 1, C // H)  # a view at batch 1, a copy otherwise
            K[:, :, pos] = self._k_new
            V[:, :, pos] = self._v_new
            K, V = K.view(B * H, -1, C // H)[:, :n], V.view(B * H, -1, C // H)[:, :n]
            att = torch.softmax(torch.bmm(q, K.transpose(1, 2)), dim=-1)  # (B*H, 1, n)
            torch.bmm(att, V, out=self._y_heads)
            x.add_(torch.addmm(L["b_o"], self._y, L["w_o"], out=o))
            h = F.layer_norm(x, (C,), *L["ln_2"])
            torch.addmm(L["b_fc"], h, L["w_fc"], out=fc)
            x.add_(torch.addmm(L["b_mp"], F.gelu(fc, approximate="tanh"), L["w_mp"], out=o))
        h = F.layer_norm(x, (C,), *self.ln_f)
        return torch.mm(h, self.head, out=self._logits)

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """Same contract as :func:`generate` with ``use_cache=True``: ``(B, T + max_new_tokens)``.

        ``idx`` must have this decoder's batch size and ``T + max_new_tokens <= max_len``.
        """
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be a non-negative int, got {max_new_tokens!r}")
        _check_sampling(temperature, top_k, self.config.vocab_size)
        if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"idx must be an integer tensor of shape (B, T), got "
                             f"{getattr(idx, 'dtype', type(idx).__name__)} of shape "
                             f"{tuple(getattr(idx, 'shape', ()))}")
        B, T = idx.shape
        if B != self.batch or T == 0:
            raise ValueError(f"idx must have shape (B, T) = ({self.batch}, T >= 1) for this decoder, "
                             f"got {tuple(idx.shape)}")
        if T + max_new_tokens > self.max_len:
            raise ValueError(f"prompt length {T} + max_new_tokens {max_new_tokens} exceeds "
                             f"max_len={self.max_len}")
        out = torch.empty(B, T + max_new_tokens, dtype=idx.dtype, device=idx.device)
        out[:, :T] = idx
        if max_new_tokens == 0:
            return out
        logits = self._prefill(idx.to(self.device).long())
        for i in range(max_new_tokens):
            nxt = _pick(logits, temperature, top_k, generator)  # (B, 1)
            out[:, T + i] = nxt[:, 0]
            if i + 1 < max_new_tokens:
                logits = self._step(nxt[:, 0], T + i)
        return out


def _pick(logits: torch.Tensor, temperature: float, top_k: int | None,
          generator: torch.Generator | None) -> torch.Tensor:
    """Choose the next token ``(B, 1)`` from last-position logits ``(B, V)``."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = F.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)


@torch.no_grad()
def trace_shapes(model: GPT, idx: torch.Tensor) -> list[tuple[str, tuple[int, ...]]]:
    """Run ``model(idx)`` and record ``(stage, output shape)`` for each step of the
    forward pass of the first block and the ends of the network (for chapter 1)."""
    rows: list[tuple[str, tuple[int, ...]]] = [("token ids idx", tuple(idx.shape))]
    t, h0 = model.transformer, model.transformer.h[0]
    stages = [
        (t.wte, "token embeddings wte(idx)"),
        (t.wpe, "position embeddings wpe(pos)"),
        (h0.ln_1, "block 0: ln_1(x)"),
        (h0.attn.c_attn, "block 0: c_attn -> q, k, v packed"),
        (h0.attn, "block 0: attention output"),
        (h0.mlp.c_fc, "block 0: MLP c_fc (4x wider)"),
        (h0.mlp, "block 0: MLP output"),
        (h0, "block 0 output (residual stream)"),
        (t.ln_f, "final ln_f"),
        (model.lm_head, "logits"),
    ]
    handles = []
    for module, label in stages:
        def hook(_m, _inp, out, label=label):
            rows.append((label, tuple(out.shape)))
        handles.append(module.register_forward_hook(hook))
    try:
        model(idx)
    finally:
        for h in handles:
            h.remove()
    heads = (idx.shape[0], model.config.n_head, idx.shape[1], model.config.head_dim)
    # q, k, v per head are views, not modules: insert their shape after c_attn
    at = next(i for i, (label, _) in enumerate(rows) if label.startswith("block 0: c_attn"))
    rows.insert(at + 1, ("block 0: q, k, v split into heads", heads))
    rows.insert(at + 2, ("block 0: attention weights softmax(q k^T / sqrt(hs))",
                         (idx.shape[0], model.config.n_head, idx.shape[1], idx.shape[1])))
    return rows
