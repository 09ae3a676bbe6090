"""Multi-head latent attention (MLA), as in DeepSeek-V2/V3 and Kimi K2.

MLA is ordinary causal softmax attention whose keys and values are generated from a small
per-token *latent* vector, so that the decode-time cache holds only that latent.

For a token with hidden state ``x`` (row vector of size ``n_embd``), one layer computes

* queries, optionally through a low-rank bottleneck with an RMSNorm in the middle::

      c_q = RMSNorm(x W_DQ)                     (q_lora_rank)       "q_a_proj", "q_a_layernorm"
      [q_nope_h, q_rope_h] = c_q W_UQ           (per head)          "q_b_proj"

  (with ``q_lora_rank=None`` a single ``q_proj`` replaces the bottleneck);

* one shared key/value latent plus one shared rotary key (a single "MQA" head)::

      [c_kv, k_rope] = x W_DKV                  (kv_lora_rank + qk_rope_head_dim)
      c_kv = RMSNorm(c_kv)                                          "kv_a_proj_with_mqa",
                                                                    "kv_a_layernorm"

* per-head keys and values decompressed from the latent::

      [k_nope_h, v_h] = c_kv W_UKV_h            (qk_nope_head_dim + v_head_dim)   "kv_b_proj"

RoPE is applied only to the decoupled parts ``q_rope_h`` and ``k_rope``; the key of head ``h`` is
``[k_nope_h, RoPE(k_rope)]`` and the score is
``(q_nope_h . k_nope_h + RoPE(q_rope_h) . RoPE(k_rope)) / sqrt(qk_nope_head_dim + qk_rope_head_dim)``.
The head outputs are concatenated and mapped back by ``o_proj``.

The cache (:class:`LatentCache`) stores, per token and layer, only ``c_kv`` (normalised) and the
roped ``k_rope``: ``kv_lora_rank + qk_rope_head_dim`` numbers (576 for DeepSeek-V3).

Two equivalent decode paths read that cache:

* :meth:`MLA.extend` decompresses ``k_nope`` and ``v`` for every cached position with
  ``kv_b_proj`` and then runs ordinary attention (it is also the prefill: any number of new
  tokens).
* :meth:`MLA.decode_absorbed` uses associativity instead. Writing ``W_UK_h`` for the
  ``(qk_nope_head_dim, kv_lora_rank)`` key block of ``kv_b_proj`` and ``W_UV_h`` for the value
  block, ``q_nope_h . (W_UK_h c_s) = (W_UK_h^T q_nope_h) . c_s``: the key up-projection is folded
  into the query once per new token, and scores are taken directly against the cached latents.
  Likewise ``sum_s p_s W_UV_h c_s = W_UV_h (sum_s p_s c_s)``: attention averages latents, and the
  value up-projection is applied once to the result. No per-head key or value of a past token is
  ever formed.

Sources: MLA and the absorbed decode are DeepSeek-V2's (DeepSeek-AI, 2024, arXiv:2405.04434,
section 2.1: "W_UK can be absorbed into W_UQ, and W_UV into W_O"); the layout and parameter names
are those of DeepSeek-V3 (arXiv:2412.19437) as implemented by Hugging Face's
``DeepseekV3Attention``, against which ``tests/test_mla.py`` checks this module.

Kimi K3's MLA is the same class with two fields of :class:`MLAConfig` set: ``rope=False``
(``mla_use_nope``: nothing rotated, the ``qk_rope_head_dim`` part used as it is) and
``output_gate=True`` (``mla_use_output_gate``: the head outputs multiplied by
``sigmoid(x W_g)`` before ``o_proj``). Every form -- training, naive and absorbed decode --
runs through the same helpers, so each change sits on one line.

RoPE convention: with ``rope_interleave=True`` (DeepSeek's checkpoints) the rotary dimensions are
paired as ``(x0, x1), (x2, x3), ...``; with ``False`` they are paired as ``(x_i, x_{i+d/2})``
("rotate half"). Pair ``i`` is rotated by angle ``position * rope_theta ** (-2 i / d)``.
YaRN context extension (and its attention-scale correction) is not modelled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from gpt2k3.cache import LayerCache, check_layer_cache
from gpt2k3.checks import (check_bool, check_layer_input, check_positive_float, check_positive_int,
                          checked, is_int, is_real)
from gpt2k3.layers.norms import RMSNorm

__all__ = ["MLAConfig", "MLA", "LatentCache", "apply_rope", "latent_numbers_per_token", "mha_equivalent_numbers_per_token", "compare_decodes"]


@dataclass
class MLAConfig:
    """Sizes of one MLA layer (field names follow the DeepSeek-V3 config where they exist).

    ``n_embd`` is the model width (``hidden_size``); ``n_heads`` the number of query heads.
    ``q_lora_rank=None`` means queries come from a direct ``q_proj`` (DeepSeek-V2-Lite style).
    ``max_len`` is the default capacity of a cache made by :meth:`MLA.new_cache`.
    ``rope_interleave`` selects the RoPE pairing (see the module docstring); ``norm_eps`` is the
    epsilon of the two RMSNorms (DeepSeek uses 1e-6 for both). Kimi K3's two changes: ``rope``
    False is ``mla_use_nope`` (nothing rotated), ``output_gate`` True is ``mla_use_output_gate``
    (a sigmoid gate on the head outputs, see :class:`MLA`).
    """

    n_embd: int
    n_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_theta: float = 10000.0
    max_len: int = 4096
    rope_interleave: bool = True
    norm_eps: float = 1e-6
    rope: bool = True
    output_gate: bool = False

    def __post_init__(self) -> None:
        for name in ("n_embd", "n_heads", "kv_lora_rank", "qk_nope_head_dim",
                     "qk_rope_head_dim", "v_head_dim", "max_len"):
            check_positive_int(getattr(self, name), name)
        if self.q_lora_rank is not None:
            check_positive_int(self.q_lora_rank, "q_lora_rank")
        if self.qk_rope_head_dim % 2:
            raise ValueError("qk_rope_head_dim must be even (RoPE rotates pairs of dims), "
                             f"got {self.qk_rope_head_dim}")
        if not (is_real(self.rope_theta) and 1 < self.rope_theta < math.inf):
            raise ValueError(f"rope_theta must be a finite number > 1, got {self.rope_theta!r}")
        check_positive_float(self.norm_eps, "norm_eps")
        for name in ("rope_interleave", "rope", "output_gate"):
            check_bool(getattr(self, name), name)

    @property
    def hidden_size(self) -> int:
        """Alias of ``n_embd`` (the Hugging Face name)."""
        return self.n_embd

    @property
    def qk_head_dim(self) -> int:
        """Per-head query/key width: ``qk_nope_head_dim + qk_rope_head_dim``."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def softmax_scale(self) -> float:
        """``qk_head_dim ** -0.5``: the usual 1/sqrt(d) over the full (nope + rope) key width."""
        return self.qk_head_dim ** -0.5

    @classmethod
    def deepseek_v3(cls) -> "MLAConfig":
        """DeepSeek-V3 / R1 attention sizes.

        From the config.json of deepseek-ai/DeepSeek-V3 (``hidden_size`` 7168,
        ``num_attention_heads`` 128, ``q_lora_rank`` 1536, ``kv_lora_rank`` 512,
        ``qk_nope_head_dim`` 128, ``qk_rope_head_dim`` 64, ``v_head_dim`` 128, ``rope_theta``
        10000, ``max_position_embeddings`` 163840); transformers' ``DeepseekV3Config`` has the
        same defaults.  YaRN scaling (factor 40) is not modelled.  The sizes come from
        :data:`gpt2k3.archs.DEEPSEEK_V3` (:meth:`from_spec`), the one place they are written;
        ``rope_theta`` is not part of a spec and is given here.
        """
        from gpt2k3.archs import DEEPSEEK_V3

        return cls.from_spec(DEEPSEEK_V3, rope_theta=10000.0)

    @classmethod
    def kimi_k2(cls) -> "MLAConfig":
        """Kimi K2 attention sizes: DeepSeek-V3's MLA with 64 heads instead of 128.

        From the config.json of moonshotai/Kimi-K2-Instruct (``num_attention_heads`` 64,
        ``rope_theta`` 50000, ``max_position_embeddings`` 131072, the MLA ranks and head dims as
        in DeepSeek-V3); the Kimi K2 report (arXiv:2507.20534) motivates the halved head count by
        its inference cost at long context.  YaRN scaling is not modelled.  The sizes come from
        :data:`gpt2k3.archs.KIMI_K2` (:meth:`from_spec`); ``rope_theta`` is given here.
        """
        from gpt2k3.archs import KIMI_K2

        return cls.from_spec(KIMI_K2, rope_theta=50000.0)

    @classmethod
    def from_spec(cls, spec, **overrides) -> "MLAConfig":
        """The MLA layer of an :class:`gpt2k3.accounting.ArchSpec` with ``attention="mla"``.

        ``max_len`` defaults to the spec's ``max_positions``, ``rope`` is on unless the spec's
        ``position`` is ``"none"`` (Kimi Linear, Kimi K3), ``output_gate`` is the spec's
        ``mla_output_gate``; other fields (``rope_theta``, ...) keep their defaults unless given
        in ``overrides``.
        """
        if getattr(spec, "attention", None) != "mla":
            raise ValueError(f"spec must be an ArchSpec with attention='mla', got {spec!r}")
        sizes = dict(n_embd=spec.n_embd, n_heads=spec.n_head, q_lora_rank=spec.q_lora_rank,
                     kv_lora_rank=spec.kv_lora_rank, qk_nope_head_dim=spec.qk_nope_head_dim,
                     qk_rope_head_dim=spec.qk_rope_head_dim, v_head_dim=spec.v_head_dim,
                     max_len=spec.max_positions or 4096, rope=spec.position != "none",
                     output_gate=spec.mla_output_gate)
        return cls(**{**sizes, **overrides})


def latent_numbers_per_token(cfg: MLAConfig) -> int:
    """Numbers MLA caches per token per layer: the latent plus the shared rotary key.

    ``kv_lora_rank + qk_rope_head_dim``; DeepSeek-V3: 512 + 64 = 576.
    """
    return cfg.kv_lora_rank + cfg.qk_rope_head_dim


def mha_equivalent_numbers_per_token(cfg: MLAConfig) -> int:
    """Numbers per token per layer that a plain multi-head cache of the *same* heads would hold.

    Convention: every head caches its full key (``qk_nope_head_dim + qk_rope_head_dim``, i.e. the
    decompressed key with its rotary part) and its value (``v_head_dim``), so the count is
    ``n_heads * (qk_nope_head_dim + qk_rope_head_dim + v_head_dim)``. For DeepSeek-V3 this is
    128 * (192 + 128) = 40,960, against 576 for the latent cache (about 71x smaller).
    """
    return cfg.n_heads * (cfg.qk_head_dim + cfg.v_head_dim)


def check_rope(x, positions, theta, interleave) -> None:
    """:func:`apply_rope`'s door: ``x`` a float tensor ``(..., T, d)`` with ``d`` even,
    ``positions`` ``(T,)``, ``theta`` a finite number > 1, ``interleave`` a bool."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() < 2 \
            or x.shape[-1] % 2:
        raise ValueError(f"x must be a float tensor (..., T, d) with d even (RoPE rotates "
                         f"pairs), got {getattr(x, 'shape', type(x).__name__)}")
    if not isinstance(positions, torch.Tensor) or tuple(positions.shape) != (x.shape[-2],):
        raise ValueError(f"positions must be a tensor of shape (T={x.shape[-2]},), got "
                         f"{getattr(positions, 'shape', type(positions).__name__)}")
    if not is_real(theta) or not 1 < theta < math.inf:
        raise ValueError(f"theta must be a finite number > 1, got {theta!r}")
    check_bool(interleave, "interleave")


@checked(check_rope)
def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float, interleave: bool) -> torch.Tensor:
    """Rotate the last dim of ``x`` (size ``d``, even) by RoPE at integer ``positions``.

    ``x`` is ``(..., T, d)`` and ``positions`` is ``(T,)``. Pair ``i`` (see the module docstring
    for which dims form a pair) is multiplied by the rotation of angle ``pos * theta**(-2i/d)``:
    ``(a, b) -> (a cos - b sin, b cos + a sin)``. The output keeps the input's layout. Angles are
    computed in float64 and then cast, so float64 inputs get float64-exact rotations.
    """
    d = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    angles = positions.to(device=x.device, dtype=torch.float64)[:, None] * inv_freq  # (T, d/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    if interleave:
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)
    a, b = x[..., : d // 2], x[..., d // 2:]
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


class LatentCache(LayerCache):
    """Preallocated MLA cache for one layer (the protocol of :mod:`gpt2k3.cache`).

    Holds ``c_kv`` of shape ``(B, max_len, kv_lora_rank)`` (already RMS-normalised) and the
    already-rotated shared key ``k_rope`` of shape ``(B, max_len, qk_rope_head_dim)``; ``length``
    counts the filled positions, which are ``[0, length)`` for every batch row.
    """

    def __init__(self, batch_size: int, max_len: int, kv_lora_rank: int, qk_rope_head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> None:
        for name, value in (("batch_size", batch_size), ("max_len", max_len),
                            ("kv_lora_rank", kv_lora_rank), ("qk_rope_head_dim", qk_rope_head_dim)):
            check_positive_int(value, name)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        super().__init__()
        self.c_kv = torch.zeros(batch_size, max_len, kv_lora_rank, dtype=dtype, device=device)
        self.k_rope = torch.zeros(batch_size, max_len, qk_rope_head_dim, dtype=dtype, device=device)

    @property
    def batch_size(self) -> int:
        return self.c_kv.shape[0]

    batch = batch_size  # the name of the cache protocol (gpt2k3.cache.LayerCache)

    @property
    def max_len(self) -> int:
        return self.c_kv.shape[1]

    @property
    def numbers_per_token(self) -> int:
        """Numbers stored per token (per batch row): ``kv_lora_rank + qk_rope_head_dim``."""
        return self.c_kv.shape[2] + self.k_rope.shape[2]

    @property
    def nbytes(self) -> int:
        """Bytes of the preallocated buffers (full capacity, not just the filled part)."""
        return self.c_kv.nbytes + self.k_rope.nbytes

    @property
    def used_nbytes(self) -> int:
        """Bytes of the filled part: what one decode step reads."""
        return self.nbytes * self.length // self.max_len

    def extend(self, c_kv: torch.Tensor, k_rope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``T`` new positions at ``length`` (``c_kv`` ``(B, T, kv_lora_rank)`` normalised,
        ``k_rope`` ``(B, T, qk_rope_head_dim)`` rotated), move ``length`` by ``T`` and return the
        filled part (as :meth:`view`)."""
        t = c_kv.shape[1] if isinstance(c_kv, torch.Tensor) and c_kv.dim() == 3 else None
        for value, name, buffer in ((c_kv, "c_kv", self.c_kv), (k_rope, "k_rope", self.k_rope)):
            want = (self.batch_size, t, buffer.shape[2])
            if t is None or not isinstance(value, torch.Tensor) or tuple(value.shape) != want:
                got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                raise ValueError(f"{name} must have shape (B, T, {buffer.shape[2]}) = {want} (T "
                                 f"from c_kv), got {got}")
        start = self.length
        self._advance(t)
        self.c_kv[:, start:self.length] = c_kv
        self.k_rope[:, start:self.length] = k_rope
        return self.view()

    def view(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The filled part: ``(c_kv[:, :length], k_rope[:, :length])``."""
        return self.c_kv[:, :self.length], self.k_rope[:, :self.length]


def _check_mla(mla, x, cache, name: str, need_cache: bool) -> None:
    """``x`` ``(B, T, n_embd)`` -- or one token ``(B, n_embd)`` beside a cache -- in the weights'
    dtype; ``cache`` a :class:`LatentCache` made for this batch (``None`` unless ``need_cache``).
    Shapes and types only, so no host sync."""
    if need_cache and cache is None:
        raise ValueError("cache must be a LatentCache (from new_cache), got NoneType")
    check_layer_cache(mla, cache)
    block = x[:, None] if cache is not None and isinstance(x, torch.Tensor) and x.dim() == 2 else x
    check_layer_input(block, name, mla.cfg.n_embd, mla.kv_a_proj_with_mqa.weight.dtype,
                      shape=f"(B, T, n_embd={mla.cfg.n_embd})", finite=False)
    if cache is not None and cache.batch_size != block.shape[0]:
        raise ValueError(f"cache batch size {cache.batch_size} does not match x batch size "
                         f"{block.shape[0]}")


def check_mla_forward(mla, x, cache=None) -> None:
    """The door of :meth:`MLA.forward`: :func:`_check_mla`, the cache optional."""
    _check_mla(mla, x, cache, "x", need_cache=False)


def check_mla_prefill(mla, x, cache) -> None:
    """The door of :meth:`MLA.prefill`: :func:`_check_mla` with a cache."""
    _check_mla(mla, x, cache, "x", need_cache=True)


def check_mla_step(mla, x_t, cache) -> None:
    """The door of :meth:`MLA.extend` and :meth:`MLA.decode_absorbed`: :func:`_check_mla`."""
    _check_mla(mla, x_t, cache, "x_t", need_cache=True)


class MLA(nn.Module):
    """One multi-head latent attention layer; inputs and outputs are ``(B, T, n_embd)``.

    Parameter names match Hugging Face's ``DeepseekV3Attention`` (no biases), so its state dict
    loads directly. Two fields of :class:`MLAConfig` make it Kimi K3's layer (SGLang
    ``KimiK3MLAAttention``): ``rope=False`` (``mla_use_nope``) uses the ``qk_rope_head_dim``
    part of the queries and of the shared key unrotated, so no score depends on position
    (order reaches the layer through the causal mask and the KDA layers); ``output_gate=True``
    (``mla_use_output_gate``) multiplies the concatenated head outputs by ``sigmoid(x W_g)``,
    ``g_proj`` of ``n_embd x n_heads v_head_dim``, before ``o_proj``. Both enter every form.
    """

    #: with a cache, decode single tokens in the latent space (:meth:`decode_absorbed`); chunks of
    #: several tokens, and every step when False, use the expanded form (:meth:`extend`)
    absorb: bool = True
    cache_types = (LatentCache,)  #: the layer caches it accepts

    def __init__(self, cfg: MLAConfig) -> None:
        if not isinstance(cfg, MLAConfig):
            raise ValueError(f"cfg must be an MLAConfig, got {type(cfg).__name__}")
        super().__init__()
        self.cfg = cfg
        h, d = cfg.n_heads, cfg.n_embd
        if cfg.q_lora_rank is None:
            self.q_proj = nn.Linear(d, h * cfg.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(d, cfg.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.norm_eps)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, h * cfg.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d, cfg.kv_lora_rank + cfg.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, cfg.norm_eps)
        self.kv_b_proj = nn.Linear(cfg.kv_lora_rank, h * (cfg.qk_nope_head_dim + cfg.v_head_dim),
                                   bias=False)
        self.o_proj = nn.Linear(h * cfg.v_head_dim, d, bias=False)
        self.g_proj = nn.Linear(d, h * cfg.v_head_dim, bias=False) if cfg.output_gate else None

    # ------------------------------------------------------------------ public forms
    @checked(check_mla_forward)
    def forward(self, x: torch.Tensor, cache: LatentCache | None = None) -> torch.Tensor:
        """Without a cache, the training form: causal attention over ``x`` ``(B, T, n_embd)`` at
        positions ``0..T-1``. With this layer's :class:`LatentCache` (:meth:`new_cache`), ``x``
        continues the cached sequence: its latents are appended and it attends to all of them
        -- so :class:`gpt2k3.model.GPT` can hold MLA as a token mixer."""
        if cache is None:
            return self._attend_expanded(x, *self._latents(x, 0), q_start=0)
        one_token = isinstance(x, torch.Tensor) and x.dim() == 3 and x.shape[1] == 1
        return (self.decode_absorbed if self.absorb and one_token else self.extend)(x, cache)

    def new_cache(self, batch_size: int, max_len: int | None = None, *,
                  dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> LatentCache:
        """An empty :class:`LatentCache` for this layer (``max_len`` defaults to ``cfg.max_len``,
        dtype and device to the weights')."""
        w = self.kv_b_proj.weight
        return LatentCache(
            batch_size, self.cfg.max_len if max_len is None else max_len,
            self.cfg.kv_lora_rank, self.cfg.qk_rope_head_dim,
            dtype=w.dtype if dtype is None else dtype,
            device=w.device if device is None else device,
        )

    @checked(check_mla_prefill)
    def prefill(self, x: torch.Tensor, cache: LatentCache) -> torch.Tensor:
        """Append the latents of ``x`` ``(B, T, n_embd)`` to ``cache`` and return the outputs.

        On an empty cache the result equals ``forward(x)``; on a non-empty one ``x`` continues the
        cached sequence (chunked prefill).
        """
        return self.extend(x, cache)

    @checked(check_mla_step)
    def extend(self, x_t: torch.Tensor, cache: LatentCache) -> torch.Tensor:
        """The expanded form over a cache: append the latents of ``x_t``, decompress K and V for
        every cached position, attend. A prefill, a chunk of one, or a decode step.

        ``x_t`` is ``(B, n_embd)`` (one token; output ``(B, n_embd)``) or ``(B, T, n_embd)``
        (``T`` tokens continuing the cache, causal among themselves).
        """
        x, start, squeeze = self._append(x_t, cache)
        out = self._attend_expanded(x, *cache.view(), q_start=start)
        return out[:, 0] if squeeze else out

    @checked(check_mla_step)
    def decode_absorbed(self, x_t: torch.Tensor, cache: LatentCache) -> torch.Tensor:
        """:meth:`extend` with the up-projections absorbed (same inputs, outputs and cache
        update): attention runs in the latent space, ``O(H S (kv_lora_rank + qk_rope_head_dim))``
        work per new token, and no per-head key or value of a past token is ever formed."""
        x, start, squeeze = self._append(x_t, cache)
        c_kv, k_rope = cache.view()                                    # (B, S, r), (B, S, dr)
        q_nope, q_rope = self._queries(x, start)                       # (B, H, T, dn), (.., dr)
        w_uk, w_uv = self.up_weights()                                # (H, dn, r), (H, dv, r)
        q_lat = torch.einsum("bhtn,hnr->bhtr", q_nope, w_uk)           # W_UK folded into the query
        scores = (torch.einsum("bhtr,bsr->bhts", q_lat, c_kv)
                  + torch.einsum("bhtd,bsd->bhts", q_rope, k_rope))
        p = self._causal_softmax(scores * self.cfg.softmax_scale, start)
        o_lat = torch.einsum("bhts,bsr->bhtr", p, c_kv)                # attention averages latents
        o = torch.einsum("bhtr,hvr->bhtv", o_lat, w_uv)                # W_UV once, on the average
        out = self.output(o, x)
        return out[:, 0] if squeeze else out

    # ------------------------------------------------------------------ building blocks
    def _append(self, x_t: torch.Tensor, cache: LatentCache) -> tuple[torch.Tensor, int, bool]:
        """Append the latents of one token ``(B, n_embd)`` or a block ``(B, T, n_embd)``; return
        the block, its first position, and whether it was one token."""
        squeeze = x_t.dim() == 2
        x = x_t[:, None] if squeeze else x_t
        start = cache.length
        cache.extend(*self._latents(x, start))            # refuses, unwritten, when it is full
        return x, start, squeeze

    def rope(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """RoPE at positions ``start, start + 1, ...`` (dim -2); NoPE (``cfg.rope=False``): none."""
        if not self.cfg.rope:
            return x
        positions = torch.arange(start, start + x.shape[-2])
        return apply_rope(x, positions, self.cfg.rope_theta, self.cfg.rope_interleave)

    def _queries(self, x: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``q_nope`` ``(B, H, T, dn)`` and roped ``q_rope`` ``(B, H, T, dr)`` from ``start`` on."""
        cfg = self.cfg
        if cfg.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        b, t, _ = x.shape
        q = q.view(b, t, cfg.n_heads, cfg.qk_head_dim).transpose(1, 2)
        q_nope, q_rope = q.split([cfg.qk_nope_head_dim, cfg.qk_rope_head_dim], dim=-1)
        return q_nope, self.rope(q_rope, start)

    def _latents(self, x: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """What the cache stores: normalised ``c_kv`` ``(B, T, r)``, roped ``k_rope`` ``(B, T, dr)``."""
        c_kv, k_rope = self.kv_a_proj_with_mqa(x).split(
            [self.cfg.kv_lora_rank, self.cfg.qk_rope_head_dim], dim=-1
        )
        return self.kv_a_layernorm(c_kv), self.rope(k_rope, start)

    def up_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``kv_b_proj``'s blocks ``W_UK`` ``(H, dn, r)`` and ``W_UV`` ``(H, dv, r)``."""
        cfg = self.cfg
        w = self.kv_b_proj.weight.view(cfg.n_heads, -1, cfg.kv_lora_rank)
        return w[:, :cfg.qk_nope_head_dim], w[:, cfg.qk_nope_head_dim:]

    @staticmethod
    def _causal_softmax(scores: torch.Tensor, q_start: int) -> torch.Tensor:
        """Softmax of ``(B, H, T, S)`` scores; query ``i`` (at ``q_start + i``) sees keys up to it."""
        t, s = scores.shape[-2:]
        q_pos = torch.arange(q_start, q_start + t, device=scores.device)[:, None]
        k_pos = torch.arange(s, device=scores.device)[None, :]
        return scores.masked_fill(k_pos > q_pos, float("-inf")).softmax(dim=-1)

    def output(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``o_proj`` of the heads of ``o`` ``(B, H, T, dv)``, gated by ``sigmoid(g_proj(x))``."""
        b, _, t, _ = o.shape
        o = o.transpose(1, 2).reshape(b, t, -1)
        if self.g_proj is not None:
            o = o * torch.sigmoid(self.g_proj(x))
        return self.o_proj(o)

    def _expand(self, c_kv: torch.Tensor, k_rope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Decompress latents into per-head keys ``(B, H, S, qk_head_dim)`` and values
        ``(B, H, S, v_head_dim)``; the rotary key is shared by all heads."""
        cfg = self.cfg
        b, s, _ = c_kv.shape
        kv = self.kv_b_proj(c_kv).view(b, s, cfg.n_heads, -1).transpose(1, 2)
        k_nope, v = kv.split([cfg.qk_nope_head_dim, cfg.v_head_dim], dim=-1)
        k_rope = k_rope[:, None].expand(b, cfg.n_heads, s, cfg.qk_rope_head_dim)
        return torch.cat((k_nope, k_rope), dim=-1), v

    def _attend_expanded(self, x: torch.Tensor, c_kv: torch.Tensor, k_rope: torch.Tensor,
                         q_start: int) -> torch.Tensor:
        """Ordinary attention of the queries of ``x`` (positions ``q_start, ...``) over the
        decompressed keys and values of ``c_kv`` / ``k_rope``."""
        q = torch.cat(self._queries(x, q_start), dim=-1)
        k, v = self._expand(c_kv, k_rope)
        p = self._causal_softmax((q @ k.transpose(-2, -1)) * self.cfg.softmax_scale, q_start)
        return self.output(p @ v, x)


@torch.no_grad()
def compare_decodes(model: MLA, x: torch.Tensor, n_prefill: int = 1) -> dict[str, float]:
    """Decode ``x`` ``(B, T, n_embd)`` token by token with both paths and compare.

    The first ``n_prefill`` tokens are prefilled into two fresh caches; every later token is
    decoded once with :meth:`MLA.extend` and once with :meth:`MLA.decode_absorbed`.
    Returns the largest absolute differences over all decoded outputs: ``"naive_vs_absorbed"``,
    ``"naive_vs_forward"`` and ``"absorbed_vs_forward"`` (against the training form
    :meth:`MLA.forward` on the whole sequence), plus ``"scale"``, the largest absolute output,
    to judge them by.
    """
    check_mla_forward(model, x)
    t = x.shape[1]
    if not is_int(n_prefill) or not 1 <= n_prefill < t:
        raise ValueError(f"n_prefill must be an int in [1, T={t}), got {n_prefill!r}")
    ref = model(x)[:, n_prefill:]
    naive_cache, absorbed_cache = model.new_cache(x.shape[0], t), model.new_cache(x.shape[0], t)
    model.prefill(x[:, :n_prefill], naive_cache)
    model.prefill(x[:, :n_prefill], absorbed_cache)
    naive = torch.stack([model.extend(x[:, i], naive_cache) for i in range(n_prefill, t)], 1)
    absorbed = torch.stack([model.decode_absorbed(x[:, i], absorbed_cache)
                            for i in range(n_prefill, t)], 1)

    def diff(a, b):
        return (a - b).abs().max().item()

    return {"naive_vs_absorbed": diff(naive, absorbed), "naive_vs_forward": diff(naive, ref),
            "absorbed_vs_forward": diff(absorbed, ref), "scale": ref.abs().max().item()}
