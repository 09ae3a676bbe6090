"""Serving on paper: memory, devices, the memory-limited batch, the roofline and serving plans.

:func:`serving_memory`, :func:`devices_needed` and :func:`max_batch` say what fits;
:func:`roofline` turns the bytes of :func:`gpt2k3.accounting.decode_bytes` and the FLOPs of
:func:`gpt2k3.accounting.flops_per_token` into a lower bound on the time of a decode step, and
:func:`roofline_band` computes it at both ends of :data:`~gpt2k3.accounting.H200_BAND`
(datasheet and measured bandwidth); :func:`hybrid_speedups` sets a hybrid against its
all-attention variant; :func:`serving_plan` lays a model out over devices by tensor and expert
parallelism, and :func:`plan_roofline` times a step by the plan's busiest device
(:func:`expected_busiest_experts`: the expected most-loaded device of each MoE layer).

Weights are stored in ``weight_bytes`` per number; every function also takes
``expert_bytes``, the bytes per number of the routed experts when they are stored in another
format (``None``: the same as the rest).  :data:`WEIGHT_FORMATS` names the formats the
chapters compare, among them ``"mxfp4"``, the released Kimi K3 checkpoint's: routed experts in
MXFP4 (:func:`~gpt2k3.accounting.params.packed_bytes_per_weight`, 0.53125 bytes a weight with
its scale), everything else bf16.

*Time per output token* has two readings (:func:`tpot_readings`): the time one request waits
for each of its tokens, which is the step time whatever the batch (serving benchmarks' TPOT),
and the step time over the batch, the inverse of throughput (``Roofline.per_token_s``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpt2k3.accounting.decode import decode_bytes, expected_distinct_experts, weights_read_per_step
from gpt2k3.accounting.experts import _busiest_experts
from gpt2k3.accounting.flops import _flops_per_token
from gpt2k3.accounting.hardware import H200, H200_BAND, Hardware
from gpt2k3.accounting.memory import _kv_cache_bytes, _memory_per_sequence, _state_bytes
from gpt2k3.accounting.params import _count_params, packed_bytes_per_weight
from gpt2k3.accounting.spec import ArchSpec, check_spec, full_attention
from gpt2k3.accounting.units import DTYPE_BYTES, STATE_DTYPE_BYTES
from gpt2k3.checks import (
    check_bool,
    check_byte_sizes,
    check_bytes,
    check_nonnegative_int,
    check_positive_int,
    checked,
    is_int,
)

__all__ = ["serving_memory", "devices_needed", "max_batch", "Roofline", "roofline", "roofline_band", "hybrid_speedups", "ServingPlan", "serving_plan", "plan_roofline", "WEIGHT_FORMATS", "weight_format", "tpot_readings"]

#: Weight formats as ``(weight_bytes, expert_bytes)``: bytes per number of every weight, and
#: of the routed experts (``None``: the same).  ``"mxfp4"`` is the released Kimi K3
#: checkpoint's layout: routed experts in MXFP4 (4-bit, one 8-bit scale per 32 weights),
#: everything else in bf16.
WEIGHT_FORMATS = {
    "bf16": (DTYPE_BYTES["bf16"], None),
    "fp8": (DTYPE_BYTES["fp8"], None),
    "int4": (DTYPE_BYTES["int4"], None),
    "mxfp4": (DTYPE_BYTES["bf16"], packed_bytes_per_weight(4, 32)),
}


def weight_format(name: str, allowed=None) -> tuple[float, float | None]:
    """``(weight_bytes, expert_bytes)`` of the format ``name`` (a key of
    :data:`WEIGHT_FORMATS`, restricted to ``allowed`` if given); ``ValueError`` otherwise."""
    choices = tuple(WEIGHT_FORMATS) if allowed is None else tuple(allowed)
    if not isinstance(name, str) or name not in choices or name not in WEIGHT_FORMATS:
        raise ValueError(f"weight format must be one of {choices}, got {name!r}")
    return WEIGHT_FORMATS[name]


def _expert_bytes(weight_bytes: float, expert_bytes: float | None) -> float:
    if expert_bytes is None:
        return weight_bytes
    check_bytes(expert_bytes, "expert_bytes")
    return expert_bytes


def _routed_read(spec: ArchSpec, batch: int) -> float:
    """Routed-expert parameters one decode step of ``batch`` sequences reads."""
    if not spec.is_moe or batch == 0:
        return 0.0
    return (spec.n_moe_layers * expected_distinct_experts(spec.n_routed_experts, spec.top_k, batch)
            * spec.expert_params)


def _hardware(hardware) -> Hardware:
    """``hardware``, or the H200 when it is ``None``; ``ValueError`` for anything else."""
    hardware = H200 if hardware is None else hardware
    if not isinstance(hardware, Hardware):
        raise ValueError(f"hardware must be a Hardware, got {type(hardware).__name__}")
    return hardware


def _n_devices(n_devices) -> int:
    if not is_int(n_devices) or n_devices < 1:
        raise ValueError(f"n_devices must be a positive int, got {n_devices!r}")
    return n_devices


def serving_memory(spec: ArchSpec, context_len: int, batch: int = 1, weight_bytes: float = 2,
                   cache_bytes: float = 2, state_dtype_bytes: float = STATE_DTYPE_BYTES,
                   expert_bytes: float | None = None) -> dict[str, float]:
    """Bytes that must sit in accelerator memory to decode ``batch`` sequences of
    ``context_len`` tokens: ``{"weights", "cache", "state", "total"}``.

    Every parameter is stored in ``weight_bytes``, the routed experts in ``expert_bytes`` if
    given (``packed_bytes_per_weight(4, 32)`` for MXFP4 with its scales); a uniform format is
    an approximation (a real quantized checkpoint keeps a few tensors -- norms, the router --
    wider); activations, workspace and the runtime's own reserve are not counted.
    """
    check_spec(spec)
    check_byte_sizes(cache_bytes=cache_bytes, state_dtype_bytes=state_dtype_bytes,
               expert_bytes=expert_bytes)
    check_nonnegative_int(batch, "batch")
    check_bytes(weight_bytes, "weight_bytes")
    check_nonnegative_int(context_len, "context_len")
    return _serving_memory(spec, context_len, batch, weight_bytes, cache_bytes,
                           state_dtype_bytes, expert_bytes)


def _serving_memory(spec, context_len, batch, weight_bytes, cache_bytes, state_dtype_bytes,
                    expert_bytes) -> dict[str, float]:
    eb = _expert_bytes(weight_bytes, expert_bytes)
    c = _count_params(spec)
    routed = c.parts["routed experts"]
    weights = (c.total - routed) * weight_bytes + routed * eb
    cache = _kv_cache_bytes(spec, context_len, batch, cache_bytes)
    state = _state_bytes(spec, batch, state_dtype_bytes)
    return {"weights": weights, "cache": cache, "state": state, "total": weights + cache + state}


def devices_needed(spec: ArchSpec, context_len: int, batch: int = 1, hardware: Hardware = None,
                   weight_bytes: float = 2, cache_bytes: float = 2,
                   state_dtype_bytes: float = STATE_DTYPE_BYTES,
                   expert_bytes: float | None = None) -> int:
    """The fewest devices whose pooled memory holds the weights and every sequence's cache
    and state (:func:`serving_memory`): a lower bound that assumes every byte can go
    anywhere.  :func:`serving_plan` lays the same bytes out by tensor and expert parallelism,
    which can need more."""
    check_spec(spec)
    check_byte_sizes(weight_bytes=weight_bytes, cache_bytes=cache_bytes,
               state_dtype_bytes=state_dtype_bytes, expert_bytes=expert_bytes)
    hardware = _hardware(hardware)
    check_nonnegative_int(context_len, "context_len")
    check_nonnegative_int(batch, "batch")
    total = _serving_memory(spec, context_len, batch, weight_bytes, cache_bytes,
                            state_dtype_bytes, expert_bytes)["total"]
    return max(1, math.ceil(total / hardware.memory_bytes))


def max_batch(spec: ArchSpec, context_len: int, hardware: Hardware = None, n_devices: int = 1,
              weight_bytes: float = 2, cache_bytes: float = 2,
              state_dtype_bytes: float = STATE_DTYPE_BYTES,
              expert_bytes: float | None = None) -> int:
    """The most sequences of ``context_len`` tokens whose caches and states fit beside the
    weights in the pooled memory of ``n_devices`` devices (0 when the weights alone do not
    fit): the *memory-limited batch*."""
    check_spec(spec)
    check_byte_sizes(weight_bytes=weight_bytes, cache_bytes=cache_bytes,
               state_dtype_bytes=state_dtype_bytes, expert_bytes=expert_bytes)
    hardware = _hardware(hardware)
    _n_devices(n_devices)
    if not is_int(context_len) or context_len < 1:
        raise ValueError(f"context_len must be a positive int, got {context_len!r}")
    return _max_batch(spec, context_len, hardware, n_devices, weight_bytes, cache_bytes,
                      state_dtype_bytes, expert_bytes)


def _max_batch(spec, context_len, hardware, n_devices, weight_bytes, cache_bytes,
               state_dtype_bytes, expert_bytes) -> int:
    free = n_devices * hardware.memory_bytes - _serving_memory(
        spec, context_len, 0, weight_bytes, cache_bytes, state_dtype_bytes,
        expert_bytes)["weights"]
    per_sequence = _memory_per_sequence(spec, context_len, cache_bytes, state_dtype_bytes)
    return max(0, int(free // per_sequence))


@dataclass(frozen=True)
class Roofline:
    """What the roofline model predicts for one decode step (see :func:`roofline`).

    ``bytes_per_step`` and ``flops_per_step`` are for the whole batch; ``memory_s`` and
    ``compute_s`` the times to move and to compute them on ``n_devices`` devices working in
    perfect parallel.  The step takes the larger of the two.  ``bytes_by_part``, where given
    (:func:`plan_roofline`), splits ``bytes_per_step`` into what it is made of.
    """

    batch: int
    n_devices: int
    bytes_per_step: float
    flops_per_step: float
    memory_s: float
    compute_s: float
    bytes_by_part: dict[str, float] | None = field(default=None, compare=False)

    @property
    def step_s(self) -> float:
        """Seconds per decode step: every sequence of the batch gains one token."""
        return max(self.memory_s, self.compute_s)

    @property
    def per_token_s(self) -> float:
        """Seconds per output token over the whole batch: ``step_s / batch``, the inverse of
        throughput.  Not what serving benchmarks call TPOT: a request waits ``step_s`` for
        each of its tokens (:func:`tpot_readings`)."""
        return self.step_s / self.batch

    @property
    def tpot_s(self) -> float:
        """Time per output token of one request (serving benchmarks' TPOT): every sequence of
        the batch gains one token per step, so it is the step time, ``step_s``."""
        return self.step_s

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved; compare with :attr:`Hardware.ridge`."""
        return self.flops_per_step / self.bytes_per_step


def check_roofline(spec: ArchSpec, context_len: int, batch: int = 1, hardware: Hardware = None,
                   n_devices: int = 1, weight_bytes: float = 2, cache_bytes: float = 2,
                   state_dtype_bytes: float = STATE_DTYPE_BYTES, mla_absorbed: bool = True,
                   expert_bytes: float | None = None) -> None:
    """:func:`roofline`'s door: a valid spec, counts, byte sizes, hardware and a bool."""
    check_spec(spec)
    check_byte_sizes(weight_bytes=weight_bytes, cache_bytes=cache_bytes,
                     state_dtype_bytes=state_dtype_bytes, expert_bytes=expert_bytes)
    _hardware(hardware)
    _n_devices(n_devices)
    check_nonnegative_int(context_len, "context_len")
    check_positive_int(batch, "batch")
    check_bool(mla_absorbed, "mla_absorbed")


@checked(check_roofline)
def roofline(spec: ArchSpec, context_len: int, batch: int = 1, hardware: Hardware = None,
             n_devices: int = 1, weight_bytes: float = 2, cache_bytes: float = 2,
             state_dtype_bytes: float = STATE_DTYPE_BYTES, mla_absorbed: bool = True,
             expert_bytes: float | None = None) -> Roofline:
    """The roofline of one decode step: ``batch`` sequences at ``context_len`` cached tokens.

    Time is the larger of bytes moved over bandwidth and FLOPs over peak::

        t = max(decode_bytes(...).total / (n * bandwidth),
                batch * flops_per_token(...) / (n * peak_flops))

    The weights a step needs are read once for the whole batch, caches and states once per
    sequence (:func:`gpt2k3.accounting.decode_bytes`); every token does its own FLOPs
    (:func:`flops_per_token`).  Matmuls run at ``peak_flops`` whatever the weight format
    (weight-only quantization: weights are stored narrow and multiplied in bf16).  ``n``
    devices split bytes and FLOPs evenly and never wait for each other: communication
    (all-to-all for the experts, all-reduce for tensor parallelism), kernel launches and
    imperfect overlap are left out, so the prediction is a lower bound on the time.  With
    ``expert_bytes`` the routed experts a step reads take that many bytes per number.
    """
    return _roofline(spec, context_len, batch, _hardware(hardware), n_devices, weight_bytes,
                     cache_bytes, state_dtype_bytes, mla_absorbed, expert_bytes)


def _roofline(spec, context_len, batch, hardware, n_devices, weight_bytes, cache_bytes,
              state_dtype_bytes, mla_absorbed, expert_bytes) -> Roofline:
    moved = decode_bytes(spec, context_len, batch, weight_bytes, cache_bytes,
                          state_dtype_bytes).total
    eb = _expert_bytes(weight_bytes, expert_bytes)
    if eb != weight_bytes:
        moved += _routed_read(spec, batch) * (eb - weight_bytes)
    flops = _flops_per_token(spec, context_len, mla_absorbed) * batch
    return Roofline(batch=batch, n_devices=n_devices, bytes_per_step=moved, flops_per_step=flops,
                    memory_s=moved / (n_devices * hardware.bandwidth),
                    compute_s=flops / (n_devices * hardware.peak_flops))


def roofline_band(spec: ArchSpec, context_len: int, batch: int = 1, band: dict | None = None,
                  n_devices: int = 1, weight_bytes: float = 2, cache_bytes: float = 2,
                  state_dtype_bytes: float = STATE_DTYPE_BYTES,
                  mla_absorbed: bool = True,
                  expert_bytes: float | None = None) -> dict[str, Roofline]:
    """:func:`roofline` once per hardware of ``band`` (default
    :data:`~gpt2k3.accounting.H200_BAND`: ``{"datasheet": H200, "measured": H200_MEASURED}``):
    the sensitivity of the prediction to the bandwidth assumed.  The datasheet's 4.8 TB/s gives
    the fast end, the measured 4.55 TB/s decode read the slow end."""
    check_spec(spec)
    check_byte_sizes(weight_bytes=weight_bytes, cache_bytes=cache_bytes,
               state_dtype_bytes=state_dtype_bytes, expert_bytes=expert_bytes)
    band = H200_BAND if band is None else band
    if (not isinstance(band, dict) or not band
            or not all(isinstance(hw, Hardware) for hw in band.values())):
        raise ValueError(f"band must be a non-empty dict of Hardware, got {band!r}")
    _n_devices(n_devices)
    check_nonnegative_int(context_len, "context_len")
    check_positive_int(batch, "batch")
    check_bool(mla_absorbed, "mla_absorbed")
    return {name: _roofline(spec, context_len, batch, hw, n_devices, weight_bytes, cache_bytes,
                            state_dtype_bytes, mla_absorbed, expert_bytes)
            for name, hw in band.items()}


def tpot_readings(spec: ArchSpec, context_len: int, batch: int = 1, hardware: Hardware = None,
                  n_devices: int = 1, weight_bytes: float = 2, cache_bytes: float = 2,
                  state_dtype_bytes: float = STATE_DTYPE_BYTES,
                  expert_bytes: float | None = None) -> dict[str, float]:
    """The two readings of "time per output token" for one decode step of ``batch``
    sequences (:func:`roofline`), in seconds.

    ``"per_request"``: what serving benchmarks call TPOT -- the time one request waits for
    each of its tokens, which is the step time (every sequence gains one token per step), and
    which grows with the batch; ``"per_output_token"``: the step time over the batch, the
    inverse of throughput, which shrinks with it; ``"tokens_per_s"``: the throughput.  At
    batch 1 the two times are equal.
    """
    r = roofline(spec, context_len, batch, hardware, n_devices, weight_bytes, cache_bytes,
                 state_dtype_bytes, True, expert_bytes)
    return {"per_request": r.tpot_s, "per_output_token": r.per_token_s,
            "tokens_per_s": batch / r.step_s}


def check_hybrid_speedups(spec: ArchSpec, context_len: int = 1 << 20, hardware: Hardware = None,
                          n_devices: int = 1, weight_bytes: float = 2, cache_bytes: float = 2,
                          state_dtype_bytes: float = STATE_DTYPE_BYTES,
                          expert_bytes: float | None = None) -> None:
    """:func:`hybrid_speedups`' door: :func:`check_roofline`'s, with at least one token of context."""
    check_roofline(spec, context_len, 1, hardware, n_devices, weight_bytes, cache_bytes,
                   state_dtype_bytes, True, expert_bytes)
    if context_len < 1:
        raise ValueError(f"context_len must be a positive int, got {context_len!r}")


@checked(check_hybrid_speedups)
def hybrid_speedups(spec: ArchSpec, context_len: int = 1 << 20, hardware: Hardware = None,
                    n_devices: int = 1, weight_bytes: float = 2, cache_bytes: float = 2,
                    state_dtype_bytes: float = STATE_DTYPE_BYTES,
                    expert_bytes: float | None = None) -> dict:
    """A hybrid against its all-attention variant (:func:`gpt2k3.accounting.full_attention`)
    at ``context_len`` tokens, by the roofline, under both readings of time per output token
    (:func:`tpot_readings`).

    ``"kv_reduction"``: the share of the KV cache the hybrid removes; ``"memory_reduction"``:
    the same with the KDA states counted; ``"batch1"``: speedup at batch 1 (the two readings
    agree there); ``"batch"``: the memory-limited batch of each model on ``n_devices``
    devices (:func:`max_batch`).

    Throughput reading (step time over batch): ``"memory_limited"``, the speedup when each
    runs at its own memory-limited batch (``None`` if either cannot hold one sequence);
    ``"ceiling"``, the most any batch sizes can give -- the baseline at batch 1 against the
    hybrid with its weights read for free.

    Per-request reading (TPOT, the step time): ``"equal_batch"``, the batch both can hold
    (the all-attention model's memory-limited batch, ``None`` if 0); ``"per_request"``, the
    ratio of step times at that batch; ``"per_request_ceiling"``, the most equal batches can
    give on bytes: as the batch grows the step time of each tends to its per-sequence cache
    and state traffic, so the ratio tends to the ratio of those bytes (about the cache ratio).

    ``"ms"`` holds the predicted times (milliseconds) behind each ratio; ``"full"`` the
    all-attention spec.
    """
    hardware = _hardware(hardware)
    full = full_attention(spec)
    kw = dict(weight_bytes=weight_bytes, cache_bytes=cache_bytes,
              state_dtype_bytes=state_dtype_bytes, expert_bytes=expert_bytes)
    kv_h, kv_f = (_kv_cache_bytes(s, context_len, 1, cache_bytes) for s in (spec, full))
    mem_h, mem_f = (_memory_per_sequence(s, context_len, cache_bytes, state_dtype_bytes)
                    for s in (spec, full))
    pair = (("hybrid", spec), ("full", full))
    step = dict(hardware=hardware, n_devices=n_devices, mla_absorbed=True, **kw)
    one = {name: _roofline(s, context_len, 1, **step).per_token_s for name, s in pair}
    batch = {name: _max_batch(s, context_len, hardware, n_devices, **kw) for name, s in pair}
    limited = equal = None
    if min(batch.values()) > 0:
        limited = {name: _roofline(s, context_len, batch[name], **step).per_token_s
                   for name, s in pair}
        b = min(batch.values())
        equal = {name: _roofline(s, context_len, b, **step).tpot_s for name, s in pair}
    # the hybrid with weights free: its cache and state traffic, or its FLOPs, per token
    seq = {name: decode_bytes(s, context_len, 1, weight_bytes, cache_bytes,
                               state_dtype_bytes).per_sequence for name, s in pair}
    per_seq = seq["hybrid"] / (n_devices * hardware.bandwidth)
    floor = max(per_seq, _flops_per_token(spec, context_len, True)
                / (n_devices * hardware.peak_flops))
    ms = {"batch 1": {k: 1e3 * v for k, v in one.items()}}
    if limited:
        ms["memory-limited"] = {k: 1e3 * v for k, v in limited.items()}
        ms["equal batch"] = {k: 1e3 * v for k, v in equal.items()}
    return {"full": full, "kv_reduction": 1 - kv_h / kv_f, "memory_reduction": 1 - mem_h / mem_f,
            "batch1": one["full"] / one["hybrid"], "batch": batch,
            "memory_limited": limited and limited["full"] / limited["hybrid"],
            "ceiling": one["full"] / floor,
            "equal_batch": min(batch.values()) or None,
            "per_request": equal and equal["full"] / equal["hybrid"],
            "per_request_ceiling": seq["full"] / seq["hybrid"], "ms": ms}


@dataclass(frozen=True)
class ServingPlan:
    """A layout of one model over ``n_devices`` devices (see :func:`serving_plan`).

    ``per_device`` holds the bytes on the fullest device: ``"shared weights"`` (everything
    but the routed experts, split ``tp`` ways), ``"routed experts"`` (``experts_per_device``
    of every MoE layer), ``"cache"`` and ``"state"`` (its sequences), and ``"total"``.
    """

    n_devices: int
    tp: int
    machines: int
    experts_per_device: int
    sequences_per_group: int
    per_device: dict[str, float]

    @property
    def ep(self) -> int:
        """Expert-parallel degree: the routed experts are spread over every device."""
        return self.n_devices

    @property
    def dp(self) -> int:
        """Data-parallel groups: each holds its own share of the sequences."""
        return self.n_devices // self.tp


def _plan_sizes(spec: ArchSpec, context_len: int, tp: int, wb: float, cb: float,
                sb: float, eb: float | None = None) -> tuple[float, float, float, float]:
    """(shared weights per device, bytes of one routed expert in every MoE layer, cache and
    state of one sequence per device) for tensor-parallel degree ``tp``; routed experts in
    ``eb`` bytes per number (``None``: ``wb``)."""
    c = _count_params(spec)
    shared = (c.total - c.detail["routed experts"]) * wb / tp
    expert_layers = spec.n_moe_layers * spec.expert_params * _expert_bytes(wb, eb)
    # An MLA latent belongs to the token, not to a head: every rank of a tensor-parallel group
    # keeps all of it.  MHA/GQA caches and KDA states split by head.
    if spec.attention == "mla":
        cache_share = 1.0
    else:
        cache_share = math.ceil(spec.kv_heads / tp) / spec.kv_heads
    state_share = (math.ceil(spec.kda_n_head / tp) / spec.kda_n_head) if spec.kda_layers else 0.0
    cache = _kv_cache_bytes(spec, context_len, 1, cb) * cache_share
    state = _state_bytes(spec, 1, sb) * state_share
    return shared, expert_layers, cache, state


def serving_plan(spec: ArchSpec, context_len: int, batch: int = 1, hardware: Hardware = None,
                 tp: int = 1, weight_bytes: float = 2, cache_bytes: float = 2,
                 state_dtype_bytes: float = STATE_DTYPE_BYTES, max_devices: int = 8192,
                 expert_bytes: float | None = None) -> ServingPlan | None:
    """The fewest devices (a multiple of ``tp``) that hold ``spec`` and ``batch`` sequences
    of ``context_len`` tokens under tensor and expert parallelism, planned on paper.

    The plan, in the style of DeepSeek-V3's and Kimi K2's serving:

    * **expert parallelism** over all ``n`` devices: each holds ``ceil(E / n)`` routed experts
      of every MoE layer, and each token's ``top_k`` experts are reached by all-to-all;
    * **tensor parallelism** of degree ``tp`` (at most one machine) for everything else --
      embeddings, attention and KDA layers, dense MLPs, routers, shared experts, head --
      split ``tp`` ways and replicated in each of the ``n / tp`` data-parallel groups;
    * the sequences are shared out over the groups.  Inside a group, MHA/GQA caches and KDA
      states split by head, but an MLA latent is per token, so every rank of the group keeps
      it whole: tensor parallelism multiplies MLA's cache by ``tp``, which is why ``tp=1``
      (data-parallel attention) suits MLA.

    Returns ``None`` if nothing up to ``max_devices`` fits (a single sequence's cache can
    outgrow one device).  Only memory is planned; :func:`roofline` gives the time.
    """
    check_spec(spec)
    check_byte_sizes(expert_bytes=expert_bytes)
    hardware = _hardware(hardware)
    check_nonnegative_int(context_len, "context_len")
    if not is_int(batch) or batch < 1:
        raise ValueError(f"batch must be a positive int, got {batch!r}")
    if not is_int(tp) or not 1 <= tp <= hardware.per_machine:
        raise ValueError(f"tp must be an int in [1, per_machine={hardware.per_machine}] (tensor "
                         f"parallelism stays inside one machine), got {tp!r}")
    for name, value in (("weight_bytes", weight_bytes), ("cache_bytes", cache_bytes),
                        ("state_dtype_bytes", state_dtype_bytes)):
        check_bytes(value, name)
    if not is_int(max_devices) or max_devices < tp:
        raise ValueError(f"max_devices must be an int >= tp, got {max_devices!r}")
    shared, expert_layers, cache, state = _plan_sizes(spec, context_len, tp, weight_bytes,
                                                      cache_bytes, state_dtype_bytes,
                                                      expert_bytes)

    def layout(n: int) -> ServingPlan:
        experts = math.ceil(spec.n_routed_experts / n) if spec.is_moe else 0
        seqs = math.ceil(batch / (n // tp))
        per_device = {"shared weights": shared, "routed experts": experts * expert_layers,
                      "cache": seqs * cache, "state": seqs * state}
        per_device["total"] = sum(per_device.values())
        return ServingPlan(n_devices=n, tp=tp, machines=math.ceil(n / hardware.per_machine),
                           experts_per_device=experts, sequences_per_group=seqs,
                           per_device=per_device)

    # The bytes on the fullest device never grow as devices are added: search the multiples
    # of tp for the first that fits, if the largest allowed does.
    fits = lambda k: layout(k * tp).per_device["total"] <= hardware.memory_bytes  # noqa: E731
    lo, hi = 1, max_devices // tp
    if not fits(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return layout(lo * tp)


def plan_roofline(spec: ArchSpec, plan: ServingPlan, context_len: int, batch: int,
                  hardware: Hardware = None, weight_bytes: float = 2, cache_bytes: float = 2,
                  state_dtype_bytes: float = STATE_DTYPE_BYTES, mla_absorbed: bool = True,
                  expert_bytes: float | None = None) -> Roofline:
    """The roofline of one decode step on a :class:`ServingPlan`, set by its busiest device.

    :func:`roofline` with ``n_devices`` splits every byte and FLOP evenly, which a real layout
    cannot do: a sequence's cache lives in one data-parallel group, an MLA latent is read
    whole by every rank of its group, and a token's experts sit on a few devices.  Here the
    device that serves the fullest group (``plan.sequences_per_group`` sequences) reads

    * its ``1/tp`` share of the shared weights those sequences need,
    * in every MoE layer, the experts any of the ``batch`` tokens picked on the *busiest*
      device of that layer (uniform, independent routing): a layer waits for its most loaded
      device, so this is :func:`expected_busiest_experts`, not the mean load
      ``ceil(E/n) (1 - (1 - k/E)^batch)`` (at batch 1 on 56 devices holding 16 experts each,
      about 2.0 experts against a mean of 0.29),
    * the caches and states of its group's sequences (an MLA latent whole, MHA/GQA caches and
      KDA states by head),

    and does the matching FLOPs (attention split by head; the expert FLOPs are the device's
    mean share, since a step at these batches is memory-bound).  The returned :class:`Roofline`
    describes that device (``n_devices=1``); its ``step_s`` is the step time of the whole
    deployment and ``per_token_s`` divides it by ``batch``.  Its ``bytes_by_part`` holds the
    four parts of ``bytes_per_step``: ``"shared weights"`` (the device's share of the
    always-read weights), ``"routed experts"``, ``"cache"`` and ``"state"`` (its share, read
    and written back).  Communication is still ignored.
    """
    check_spec(spec)
    check_nonnegative_int(context_len, "context_len")
    check_byte_sizes(weight_bytes=weight_bytes, cache_bytes=cache_bytes,
               state_dtype_bytes=state_dtype_bytes, expert_bytes=expert_bytes)
    hardware = _hardware(hardware)
    if not isinstance(plan, ServingPlan):
        raise ValueError(f"plan must be a ServingPlan, got {type(plan).__name__}")
    if not is_int(batch) or batch < 1:
        raise ValueError(f"batch must be a positive int, got {batch!r}")
    tp, n = plan.tp, plan.n_devices
    experts_needed = math.ceil(spec.n_routed_experts / n) if spec.is_moe else 0
    c = _count_params(spec)
    shared_needed = (c.total - c.detail["routed experts"]) * weight_bytes / tp
    if (plan.experts_per_device != experts_needed
            or not math.isclose(plan.per_device.get("shared weights", -1.0), shared_needed,
                                rel_tol=1e-9)):
        raise ValueError(f"plan must be a ServingPlan made for this spec ({spec.name}) and "
                         f"weight_bytes ({weight_bytes}) by serving_plan; it holds "
                         f"{plan.experts_per_device} experts and "
                         f"{plan.per_device.get('shared weights')} shared-weight bytes per "
                         f"device, this spec needs {experts_needed} and {shared_needed:g}")
    seqs = min(plan.sequences_per_group, batch)
    _, expert_layers, cache, state = _plan_sizes(spec, context_len, tp, weight_bytes, cache_bytes,
                                                 state_dtype_bytes, expert_bytes)
    expert = spec.expert_params
    touched_all = (expected_distinct_experts(spec.n_routed_experts, spec.top_k, seqs)
                   if spec.is_moe else 0.0)
    shared_read = weights_read_per_step(spec, seqs) - spec.n_moe_layers * touched_all * expert
    busiest = _busiest_experts(spec.n_routed_experts, spec.top_k, batch, n) if spec.is_moe else 0.0
    experts_read = busiest * expert_layers
    parts = {"shared weights": shared_read * weight_bytes / tp, "routed experts": experts_read,
             "cache": seqs * cache, "state": seqs * 2 * state}   # by _plan_sizes' shares
    moved = sum(parts.values())
    # FLOPs: the group's tokens through the shared matmuls (split tp ways), the device's share
    # of all tokens' expert work, and attention / state updates split by head.
    routed_active = c.active_detail["routed experts"]
    shared_flops = 2 * seqs * (c.matmul_active - routed_active) / tp
    expert_flops = (2 * batch * routed_active * plan.experts_per_device / spec.n_routed_experts
                    if spec.is_moe else 0.0)
    check_bool(mla_absorbed, "mla_absorbed")
    mixing = _flops_per_token(spec, context_len, mla_absorbed) - 2 * c.matmul_active
    flops = shared_flops + expert_flops + seqs * mixing / tp
    return Roofline(batch=batch, n_devices=1, bytes_per_step=moved, flops_per_step=flops,
                    memory_s=moved / hardware.bandwidth, compute_s=flops / hardware.peak_flops,
                    bytes_by_part=parts)
