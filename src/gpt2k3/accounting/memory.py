"""Memory a sequence keeps: KV-cache bytes (grow with context) and state bytes (fixed).

One function sizes every recurrent state in the book, :func:`mixer_state_numbers`: the state
matrices ``H x Dk x Dv`` (plus linear attention's normaliser ``z``, ``H x Dk``) and the last
``conv_kernel - 1`` inputs of the short convolutions on q, k and v.  :func:`state_bytes` is its
byte count for a spec, in float32 (:data:`~gpt2k3.accounting.units.STATE_DTYPE_BYTES`, 4
bytes per number, as the recurrent kernels keep the state) unless another precision is asked
for.
"""

from __future__ import annotations

from gpt2k3.accounting.spec import ArchSpec, check_spec, hybrid_spec
from gpt2k3.accounting.units import STATE_DTYPE_BYTES, as_bytes
from gpt2k3.checks import (check_bool, check_byte_sizes, check_bytes, check_nonnegative_int,
                          check_positive_int, is_int)

__all__ = ["kv_numbers_per_layer", "kv_numbers_per_token", "kv_cache_bytes",
           "mixer_state_numbers", "state_numbers_per_layer", "state_bytes",
           "memory_per_sequence", "hybrid_cache_bytes", "mla_cache_variants"]


# ---------------------------------------------------------------------------- KV cache
def kv_numbers_per_layer(spec: ArchSpec) -> int:
    """Numbers one softmax-attention layer caches per token.

    MHA/GQA: a key and a value per K/V head, ``2 * n_kv_head * head_dim``.  MLA: the latent and
    the shared rotary key, ``kv_lora_rank + qk_rope_head_dim`` (DeepSeek-V3: 576).
    """
    check_spec(spec)
    return _kv_numbers_per_layer(spec)


def _kv_numbers_per_layer(spec: ArchSpec) -> int:
    if spec.attention == "mla":
        return spec.kv_lora_rank + spec.qk_rope_head_dim
    return 2 * spec.kv_heads * spec.head_dim


def kv_numbers_per_token(spec: ArchSpec) -> int:
    """Numbers the whole model caches per token: linear-state layers add nothing."""
    check_spec(spec)
    return _kv_numbers_per_token(spec)


def _kv_numbers_per_token(spec: ArchSpec) -> int:
    return spec.n_attention_layers * _kv_numbers_per_layer(spec)


def kv_cache_bytes(spec: ArchSpec, context_len: int, batch: int = 1,
                   dtype_bytes: float = 2) -> int | float:
    """Bytes of the KV cache of ``batch`` sequences of ``context_len`` tokens.

    Grows linearly with context in every softmax-attention layer (see
    :func:`kv_numbers_per_layer`) and not at all in linear-state layers (their memory is
    :func:`state_bytes`).  ``dtype_bytes`` may be fractional (0.5 for int4).
    """
    check_spec(spec)
    check_nonnegative_int(context_len, "context_len")
    check_nonnegative_int(batch, "batch")
    check_bytes(dtype_bytes, "dtype_bytes")
    return _kv_cache_bytes(spec, context_len, batch, dtype_bytes)


def _kv_cache_bytes(spec: ArchSpec, context_len: int, batch: int, dtype_bytes: float) -> int | float:
    return as_bytes(_kv_numbers_per_token(spec) * context_len * batch * dtype_bytes)


def mla_cache_variants(spec: ArchSpec, gqa_kv_heads: int = 8) -> dict[str, int]:
    """Numbers per token per attention layer that three caches of ``spec``'s attention hold.

    ``"MLA latent"``: ``kv_lora_rank + qk_rope_head_dim`` (:func:`kv_numbers_per_layer`);
    ``"MHA, same heads"``: every head's decompressed key (``qk_nope_head_dim +
    qk_rope_head_dim``) and value (``v_head_dim``), ``n_head * (qk_head_dim + v_head_dim)``
    (what :func:`gpt2k3.layers.mla.mha_equivalent_numbers_per_token` counts);
    ``"GQA, g K/V heads"``: a hypothetical grouped-query cache of ``gqa_kv_heads`` K/V heads of
    width ``v_head_dim``.
    """
    check_spec(spec)
    if spec.attention != "mla":
        raise ValueError(f"spec.attention must be 'mla', got {spec.attention!r}")
    if not is_int(gqa_kv_heads) or not 1 <= gqa_kv_heads <= spec.n_head:
        raise ValueError(f"gqa_kv_heads must be an int in [1, n_head={spec.n_head}], "
                         f"got {gqa_kv_heads!r}")
    return {"MLA latent": _kv_numbers_per_layer(spec),
            "MHA, same heads": spec.n_head * (spec.qk_head_dim + spec.v_head_dim),
            f"GQA, {gqa_kv_heads} K/V heads": 2 * gqa_kv_heads * spec.v_head_dim}


# ---------------------------------------------------------------------------- state
def mixer_state_numbers(n_head: int, d_key: int, d_value: int | None = None,
                        conv_kernel: int = 0, normalizer: bool = False) -> dict[str, int]:
    """The fixed-size memory of one recurrent token-mixing layer, per sequence, in numbers:
    **the one state-size function of the book**.

    ``"recurrent"``: the state matrices, ``n_head x d_key x d_value`` (``d_value`` defaults to
    ``d_key``), plus, with ``normalizer`` (linear attention), the normaliser ``z`` of
    ``n_head x d_key``.  ``"conv"``: the last ``conv_kernel - 1`` inputs of the short causal
    convolutions on q, k and v, ``(conv_kernel - 1) * n_head * (2 d_key + d_value)`` -- the
    minimum a decoder must keep (some kernels keep ``conv_kernel``); 0 without a convolution
    (``conv_kernel`` 0 or 1).  Multiply by the bytes per number of the precision the state is
    kept in (float32, 4 bytes, :data:`~gpt2k3.accounting.units.STATE_DTYPE_BYTES`, in the
    book).
    """
    check_positive_int(n_head, "n_head")
    check_positive_int(d_key, "d_key")
    if d_value is None:
        d_value = d_key
    check_positive_int(d_value, "d_value")
    check_nonnegative_int(conv_kernel, "conv_kernel")
    check_bool(normalizer, "normalizer")
    recurrent = n_head * d_key * d_value + (n_head * d_key if normalizer else 0)
    conv = max(conv_kernel - 1, 0) * n_head * (2 * d_key + d_value)
    return {"recurrent": recurrent, "conv": conv}


def state_numbers_per_layer(spec: ArchSpec) -> dict[str, int]:
    """The fixed-size memory of one KDA layer of ``spec``, per sequence
    (:func:`mixer_state_numbers` with ``kda_n_head``, ``kda_head_dim`` and
    ``kda_conv_kernel``): ``{"recurrent", "conv"}``; both 0 without KDA layers."""
    check_spec(spec)
    return _state_numbers_per_layer(spec)


def _state_numbers_per_layer(spec: ArchSpec) -> dict[str, int]:
    if not spec.kda_layers:
        return {"recurrent": 0, "conv": 0}
    return mixer_state_numbers(spec.kda_n_head, spec.kda_head_dim,
                               conv_kernel=spec.kda_conv_kernel)


def state_bytes(spec: ArchSpec, batch: int = 1,
                dtype_bytes: float = STATE_DTYPE_BYTES) -> int | float:
    """Bytes of the fixed linear-attention state of ``batch`` sequences (every KDA layer), in
    float32 (4 bytes per number) unless ``dtype_bytes`` says otherwise.

    Independent of the context length; see :func:`mixer_state_numbers` for what is held.
    """
    check_spec(spec)
    check_nonnegative_int(batch, "batch")
    check_bytes(dtype_bytes, "dtype_bytes")
    return _state_bytes(spec, batch, dtype_bytes)


def _state_bytes(spec: ArchSpec, batch: int, dtype_bytes: float) -> int | float:
    per_layer = sum(_state_numbers_per_layer(spec).values())
    return as_bytes(spec.n_kda_layers * per_layer * batch * dtype_bytes)


def memory_per_sequence(spec: ArchSpec, context_len: int, cache_bytes: float = 2,
                        state_dtype_bytes: float = STATE_DTYPE_BYTES) -> float:
    """Bytes one sequence keeps between decode steps: its KV cache at ``context_len`` tokens
    (:func:`kv_cache_bytes`) plus the fixed state of the linear-attention layers
    (:func:`state_bytes`, float32 by default)."""
    check_spec(spec)
    check_nonnegative_int(context_len, "context_len")
    check_byte_sizes(cache_bytes=cache_bytes, state_dtype_bytes=state_dtype_bytes)
    return _memory_per_sequence(spec, context_len, cache_bytes, state_dtype_bytes)


def _memory_per_sequence(spec: ArchSpec, context_len: int, cache_bytes: float,
                         state_dtype_bytes: float) -> float:
    return (_kv_cache_bytes(spec, context_len, 1, cache_bytes)
            + _state_bytes(spec, 1, state_dtype_bytes))


def hybrid_cache_bytes(spec: ArchSpec, ratio: int | None, context_len: int,
                       cache_dtype_bytes: float = 2,
                       state_dtype_bytes: float = STATE_DTYPE_BYTES) -> dict:
    """Memory of one sequence at ``context_len`` tokens in a ``ratio``:1 hybrid of ``spec``
    (:func:`gpt2k3.accounting.hybrid_spec`; ``ratio=None``: every layer KDA).

    Returns ``{"kv": ..., "state": ..., "total": ..., "per_layer": [...], "kinds": [...]}``:
    the attention layers' KV cache (:func:`kv_cache_bytes`, grows with context), the KDA
    layers' states (:func:`state_bytes`, fixed), and each layer's share and mixer kind.  KV
    entries are ``cache_dtype_bytes`` each (bf16: 2), states ``state_dtype_bytes`` (float32: 4).
    """
    check_spec(spec)
    check_nonnegative_int(context_len, "context_len")
    check_byte_sizes(cache_dtype_bytes=cache_dtype_bytes, state_dtype_bytes=state_dtype_bytes)
    s = hybrid_spec(spec, ratio)
    kv = _kv_cache_bytes(s, context_len, 1, cache_dtype_bytes)
    st = _state_bytes(s, 1, state_dtype_bytes)
    per_attn = as_bytes(_kv_numbers_per_layer(s) * context_len * cache_dtype_bytes)
    per_kda = as_bytes(sum(_state_numbers_per_layer(s).values()) * state_dtype_bytes)
    kinds = s.layer_mixers
    return {"kv": kv, "state": st, "total": kv + st, "kinds": list(kinds),
            "per_layer": [per_kda if k == "kda" else per_attn for k in kinds]}
