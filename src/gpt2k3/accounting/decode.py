"""The one model of the bytes a decode step moves, with the experts a batch wakes up.

A decode step of ``B`` sequences, each at ``T`` cached positions, reads

* the **weights** it needs, once for the whole batch (:func:`weights_read_per_step`): every
  parameter except the embedding tables (``B`` rows are read; a tied head still reads the
  whole table) and the routed experts no token picked -- the expected number of distinct
  experts under uniform, independent routing, ``E (1 - (1 - k/E)^B)`` per MoE layer
  (:func:`expected_distinct_experts`): ``k`` at batch 1, nearly all ``E`` for large batches;
* every sequence's **KV cache** (:func:`~gpt2k3.accounting.memory.kv_cache_bytes`);
* every sequence's linear-attention **state**, read and written back
  (:func:`~gpt2k3.accounting.memory.state_bytes`, float32 by default).

:func:`decode_bytes` returns the three parts per step (and per token); every chapter's bytes
per step -- chapter 2's bars and crossover, chapter 7's table, chapter 9's roofline -- are
this function.  Real routing is correlated, so the expert term is a model, not a measurement;
activations and the cache write of the new token are ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpt2k3.accounting.memory import _kv_cache_bytes, _state_bytes
from gpt2k3.accounting.params import _count_params
from gpt2k3.accounting.spec import ArchSpec, check_spec
from gpt2k3.accounting.units import STATE_DTYPE_BYTES
from gpt2k3.checks import check_bytes, check_nonnegative_int, check_positive_int, checked, is_int

__all__ = ["expected_distinct_experts", "weights_read_per_step", "DecodeBytes", "decode_bytes",
           "decode_bytes_per_token", "weight_and_cache_bytes", "cache_bound_context"]


def expected_distinct_experts(n_experts: int, top_k: int, batch: int) -> float:
    """Expected number of distinct experts ``batch`` tokens touch in one MoE layer, when each
    token picks ``top_k`` of ``n_experts`` uniformly and independently of the others:
    ``n_experts * (1 - (1 - top_k / n_experts) ** batch)``."""
    check_positive_int(n_experts, "n_experts")
    check_positive_int(batch, "batch")
    if not is_int(top_k) or not 1 <= top_k <= n_experts:
        raise ValueError(f"top_k must be an int in [1, n_experts={n_experts}], got {top_k!r}")
    return n_experts * (1.0 - (1.0 - top_k / n_experts) ** batch)


def check_weights_read(spec: ArchSpec, batch: int = 1) -> None:
    """:func:`weights_read_per_step`'s door: a valid spec and a positive ``batch``."""
    check_spec(spec)
    check_positive_int(batch, "batch")


@checked(check_weights_read)
def weights_read_per_step(spec: ArchSpec, batch: int = 1) -> float:
    """Parameters one decode step of ``batch`` sequences reads from memory: every parameter
    except the embedding tables (``batch`` rows of each are read; a tied head still reads the
    whole token table) and the routed experts no token picked (:func:`expected_distinct_experts`
    per MoE layer).  A float, because that expectation is not whole."""
    c = _count_params(spec)
    d = spec.n_embd
    weights = (c.total - c.detail["token embeddings"] - c.detail["position embeddings"]
               - c.detail["routed experts"])
    if spec.is_moe:
        touched = expected_distinct_experts(spec.n_routed_experts, spec.top_k, batch)
        weights += spec.n_moe_layers * touched * spec.expert_params
    weights += c.detail["token embeddings"] if spec.tied_embeddings else batch * d
    if spec.position == "learned" and spec.max_positions:
        weights += batch * d
    return weights


@dataclass(frozen=True)
class DecodeBytes:
    """Bytes one decode step moves (see :func:`decode_bytes`), for the whole batch.

    ``weights``: the weights read (once for the batch); ``cache``: every sequence's KV cache
    read; ``state``: every sequence's linear-attention state read and written;
    ``experts_per_layer``: the distinct routed experts read per MoE layer (0 for a dense
    model).
    """

    batch: int
    context_len: int
    weights: float
    cache: float
    state: float
    experts_per_layer: float

    @property
    def total(self) -> float:
        """Bytes per step: weights + cache + state."""
        return self.weights + self.cache + self.state

    @property
    def per_token(self) -> float:
        """Bytes per output token: ``total / batch``."""
        return self.total / self.batch

    @property
    def weights_per_token(self) -> float:
        return self.weights / self.batch

    @property
    def per_sequence(self) -> float:
        """Cache and state bytes one sequence moves per step."""
        return (self.cache + self.state) / self.batch


def check_decode_bytes(spec: ArchSpec, context_len: int, batch: int = 1, weight_bytes: float = 2,
                       cache_bytes: float = 2, state_dtype_bytes: float = STATE_DTYPE_BYTES) -> None:
    """:func:`decode_bytes`'s door: a valid spec, counts and byte sizes."""
    check_spec(spec)
    check_nonnegative_int(context_len, "context_len")
    check_positive_int(batch, "batch")
    check_bytes(weight_bytes, "weight_bytes")
    check_bytes(cache_bytes, "cache_bytes")
    check_bytes(state_dtype_bytes, "state_dtype_bytes")


@checked(check_decode_bytes)
def decode_bytes(spec: ArchSpec, context_len: int, batch: int = 1, weight_bytes: float = 2,
                 cache_bytes: float = 2,
                 state_dtype_bytes: float = STATE_DTYPE_BYTES) -> DecodeBytes:
    """Bytes one decode step of ``batch`` sequences at ``context_len`` cached positions moves,
    by part (see the module docstring): weights in ``weight_bytes`` per number, the KV cache in
    ``cache_bytes``, the state in ``state_dtype_bytes`` (float32 by default)."""
    experts = (expected_distinct_experts(spec.n_routed_experts, spec.top_k, batch)
               if spec.is_moe else 0.0)
    return DecodeBytes(batch=batch, context_len=context_len,
                       weights=weights_read_per_step(spec, batch) * weight_bytes,
                       cache=_kv_cache_bytes(spec, context_len, batch, cache_bytes),
                       state=2 * _state_bytes(spec, batch, state_dtype_bytes),  # read, written
                       experts_per_layer=experts)


def decode_bytes_per_token(spec: ArchSpec, context_len: int, batch: int = 1,
                           weight_bytes: float = 2, cache_bytes: float = 2,
                           state_dtype_bytes: float = STATE_DTYPE_BYTES) -> float:
    """Bytes moved between memory and the processor per decoded token, for a batch of
    ``batch`` sequences each at ``context_len`` cached positions: :func:`decode_bytes`'s
    ``per_token``::

        weights_read_per_step(spec, batch) * weight_bytes / batch
        + kv_cache_bytes(spec, context_len, 1, cache_bytes)
        + 2 * state_bytes(spec, 1, state_dtype_bytes)

    The state is float32 (4 bytes) unless ``state_dtype_bytes`` says otherwise.
    """
    return decode_bytes(spec, context_len, batch, weight_bytes, cache_bytes,
                        state_dtype_bytes).per_token


def weight_and_cache_bytes(spec: ArchSpec, context_len: int, batch: int = 1,
                           weight_bytes: float = 2, cache_bytes: float = 2,
                           state_dtype_bytes: float = STATE_DTYPE_BYTES) -> tuple[float, float]:
    """Bytes one decode step reads, in two parts: ``(weights, cache)`` -- the weights the
    batch needs, read once (with the experts the batch wakes up), and every sequence's KV
    cache plus its state (read and written).  Their sum is :func:`decode_bytes`'s ``total``."""
    b = decode_bytes(spec, context_len, batch, weight_bytes, cache_bytes, state_dtype_bytes)
    return b.weights, b.cache + b.state


def cache_bound_context(spec: ArchSpec, batch: int = 1, weight_bytes: float = 2,
                        cache_bytes: float = 2,
                        state_dtype_bytes: float = STATE_DTYPE_BYTES) -> float:
    """The context length at which a decode step of ``batch`` sequences reads as many cache
    and state bytes as weight bytes (:func:`weight_and_cache_bytes`): beyond it the step is
    cache-bound.

    ``(W(B) b_w / B - 2 state) / kv``, with ``kv`` the cache bytes of one token of one
    sequence.  For a dense model ``W(B)`` hardly depends on ``B``, so the crossover falls as
    ``1/B``; for a mixture of experts a larger batch wakes more experts, ``W(B)`` grows, and
    the crossover falls more slowly.  ``math.inf`` for a model with no growing cache; 0 when the
    states alone outweigh the weights.  A float (the crossover need not be a whole token).
    """
    b = decode_bytes(spec, 0, batch, weight_bytes, cache_bytes, state_dtype_bytes)
    kv = _kv_cache_bytes(spec, 1, 1, cache_bytes)
    if kv == 0:
        return math.inf
    return max(0.0, (b.weights / batch - b.state / batch) / kv)


# --------------------------------------------------------------------------- chapter 2 additions
# (appended: the exact weights-vs-cache crossing of chapter 2's cache-growth figure, and the
# cache traffic of the concatenating and preallocated caches over a decode)


def weights_cache_crossing(spec: ArchSpec, batch: int = 1, weight_bytes: float = 2,
                           cache_bytes: float = 2,
                           state_dtype_bytes: float = STATE_DTYPE_BYTES) -> float:
    """The exact context length at which the memory ``batch`` sequences' KV caches (plus any
    fixed linear-attention states) hold equals the memory of all the model's weights.

    ``(P b_w - state) / kv``: ``P`` every parameter (:func:`count_params` ``.total``: the whole
    position table too -- memory held, not read), ``state`` the batch's states
    (:func:`~gpt2k3.accounting.memory.state_bytes`, held once, so not doubled as in
    :func:`decode_bytes`), ``kv`` the cache bytes of one more token of every sequence.  This is
    where the cache line of chapter 2's cache-growth figure (:func:`gpt2k3.book.figures.cache_growth`)
    crosses its weights line; compare :func:`cache_bound_context`, the crossing against the
    weights one decode step *reads* (one row of the position table), which is a little earlier.
    A float; ``math.inf`` for a model with no growing cache, 0 when the states alone outweigh
    the weights.
    """
    check_spec(spec)
    check_positive_int(batch, "batch")
    check_bytes(weight_bytes, "weight_bytes")
    check_bytes(cache_bytes, "cache_bytes")
    check_bytes(state_dtype_bytes, "state_dtype_bytes")
    kv = _kv_cache_bytes(spec, 1, batch, cache_bytes)
    if kv == 0:
        return math.inf
    weights = _count_params(spec).total * weight_bytes
    return max(0.0, (weights - _state_bytes(spec, batch, state_dtype_bytes)) / kv)


@dataclass(frozen=True)
class CacheTraffic:
    """KV-cache bytes moved over ``n_new`` decode steps after a ``prompt_len``-token prefill,
    for ``batch`` sequences (see :func:`decode_cache_traffic`).

    ``attention_read``: what attention reads -- every cached position at every step, with
    either cache; ``append_write``: the preallocated cache's one new position per step;
    ``concat_read`` and ``concat_write``: what ``torch.cat`` reads (the old cache and the new
    position) and writes (the whole new cache) at every step of the concatenating cache.
    """

    prompt_len: int
    n_new: int
    batch: int
    attention_read: float
    append_write: float
    concat_read: float
    concat_write: float

    @property
    def preallocated(self) -> float:
        """Cache bytes the preallocated cache moves: attention's reads + one write per step."""
        return self.attention_read + self.append_write

    @property
    def concatenating(self) -> float:
        """Cache bytes the concatenating cache moves: attention's reads + the copy's read and
        write (the copy writes the new position too)."""
        return self.attention_read + self.concat_read + self.concat_write

    @property
    def ratio(self) -> float:
        """``concatenating / preallocated``: below 3 for any length, near 3 once the context is
        long (a constant factor, not a growing one)."""
        return self.concatenating / self.preallocated


def decode_cache_traffic(spec: ArchSpec, prompt_len: int, n_new: int, batch: int = 1,
                         dtype_bytes: float = 2) -> CacheTraffic:
    """KV-cache bytes read and written over ``n_new`` one-token decode steps after a
    ``prompt_len``-token prefill (the prefill's own traffic excluded).

    Step ``i`` (1 .. ``n_new``) appends one position and attends to ``prompt_len + i``, so
    with ``S = n_new * prompt_len + n_new (n_new + 1) / 2`` positions in all and ``kv`` the
    cache bytes of one position (every layer, K and V, every sequence):

    * attention reads ``kv * S`` with either cache;
    * the preallocated cache writes ``kv * n_new`` (one position per step);
    * the concatenating cache's ``torch.cat`` reads ``kv * S`` and writes ``kv * S``
      (:func:`gpt2k3.cache.concat_copy_bytes` counts those writes).

    So the concatenating cache moves ``3 S / (S + n_new)`` times the preallocated one's cache
    bytes, never 3 or more.  Weights, activations and the allocator's own work are not counted.
    """
    check_spec(spec)
    check_positive_int(prompt_len, "prompt_len")
    check_nonnegative_int(n_new, "n_new")
    check_positive_int(batch, "batch")
    check_bytes(dtype_bytes, "dtype_bytes")
    kv = _kv_cache_bytes(spec, 1, batch, dtype_bytes)
    positions = n_new * prompt_len + n_new * (n_new + 1) // 2
    return CacheTraffic(prompt_len=prompt_len, n_new=n_new, batch=batch,
                        attention_read=kv * positions, append_write=kv * n_new,
                        concat_read=kv * positions, concat_write=kv * positions)


__all__ += ["weights_cache_crossing", "CacheTraffic", "decode_cache_traffic"]
