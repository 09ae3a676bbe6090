"""Serving on paper: memory, devices, the memory-limited batch, the roofline and serving plans.

:func:`serving_memory`, :func:`devices_needed` and :func:`max_batch` say what fits;
:func:`roofline` turns the bytes of :func:`gpt2k3.accounting.decode_bytes` and the FLOPs of
:func:`gpt2k3.accounting.flops_per_token` into a lower bound on the time of a decode step, and
:func:`roofline_band` computes it at both ends of :data:`~gpt2k3.accounting.H200_BAND`
(datasheet and measured bandwidth); :func:`hybrid_speedups` sets a hybrid against its
all-attention variant; :func:`serving_plan` lays a model out over devices by tensor and expert
parallelism, and :func:`plan_roofline` times a step by the plan's busiest device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ._checks import is_int, nonneg_int, positive_bytes
from .decode import decode_bytes, expected_distinct_experts, weights_read_per_step
from .flops import flops_per_token
from .hardware import H200, H200_BAND, Hardware
from .memory import kv_cache_bytes, memory_per_sequence, state_bytes
from .params import count_params
from .spec import ArchSpec, full_attention
from .units import STATE_DTYPE_BYTES

__all__ = ["serving_memory", "devices_needed", "max_batch", "Roofline", "roofline",
           "roofline_band", "hybrid_speedups", "ServingPlan", "serving_plan", "plan_roofline"]


def _check_hardware(hardware) -> None:
    if not isinstance(hardware, Hardware):
        raise ValueError(f"hardware must be a Hardware, got {type(hardware).__name__}")


def serving_memory(spec: ArchSpec, context_len: int, batch: int = 1, weight_bytes: float = 2,
                   cache_bytes: float = 2, state_dtype_bytes: float = STATE_DTYPE_BYTES) -> dict[str, float]:
    """Bytes that must sit in accelerator memory to decode ``batch`` sequences of
    ``context_len`` tokens: ``{"weights", "cache", "state", "total"}``.

    Every parameter is stored in the weight format (a real quantized checkpoint keeps a few
    tensors -- norms, the router, sometimes the embeddings -- wider, and adds scales);
    activations, workspace and the runtime's own reserve are not counted.
    """
    nonneg_int("batch", batch)
    positive_bytes("weight_bytes", weight_bytes)
    weights = count_params(spec).total * weight_bytes
    cache = kv_cache_bytes(spec, context_len, batch, cache_bytes)
    state = state_bytes(spec, batch, state_dtype_bytes)
    return {"weights": weights, "cache": cache, "state": state, "total": weights + cache + state}


def devices_needed(spec: ArchSpec, context_len: int, batch: int = 1, hardware: Hardware = None,
                   weight_bytes: float = 2, cache_bytes: float = 2,
                   state_dtype_bytes: float = STATE_DTYPE_BYTES) -> int:
    """The fewest devices whose pooled memory holds the weights and every sequence's cache
    and state (:func:`serving_memory`): a lower bound that assumes every byte can go
    anywhere.  :func:`serving_plan` lays the same bytes out by tensor and expert parallelism,
    which can need more."""
    hardware = H200 if hardware is None else hardware
    _check_hardware(hardware)
    total = serving_memory(spec, context_len, batch, weight_bytes, cache_bytes,
                           state_dtype_bytes)["total"]
    return max(1, math.ceil(total / hardware.memory_bytes))


def max_batch(spec: ArchSpec, context_len: int, hardware: Hardware = None, n_devices: int = 1,
              weight_bytes: float = 2, cache_bytes: float = 2, state_dtype_bytes: float = STATE_DTYPE_BYTES) -> int:
    """The most sequences of ``context_len`` tokens whose caches and states fit beside the
    weights in the pooled memory of ``n_devices`` devices (0 when the weights alone do not
    fit): the *memory-limited batch*."""
    hardware = H200 if hardware is None else hardware
    _check_hardware(hardware)
    if not is_int(n_devices) or n_devices < 1:
        raise ValueError(f"n_devices must be a positive int, got {n_devices!r}")
    if not is_int(context_len) or context_len < 1:
        raise ValueError(f"context_len must be a positive int, got {context_len!r}")
    free = n_devices * hardware.memory_bytes - serving_memory(
        spec, context_len, 0, weight_bytes, cache_bytes, state_dtype_bytes)["weights"]
    per_sequence = memory_per_sequence(spec, context_len, cache_bytes, state_dtype_bytes)
    return max(0, int(free // per_sequence))


@dataclass(frozen=True)
class Roofline:
    """What the roofline model predicts for one decode step (see :func:`roofline`).

    ``bytes_per_step`` and ``flops_per_step`` are for the whole batch; ``memory_s`` and
    ``compute_s`` the times to move and to compute them on ``n_devices`` devices working in
    perfect parallel.  The step takes the larger of the two.
    """

    batch: int
    n_devices: int
    bytes_per_step: float
    flops_per_step: float
    memory_s: float
    compute_s: float

    @property
    def step_s(self) -> float:
        """Seconds per decode step: every sequence of the batch gains one token."""
        return max(self.memory_s, self.compute_s)

    @property
    def per_token_s(self) -> float:
        """Seconds per output token over the whole batch (the inverse of throughput)."""
        return self.step_s / self.batch

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved; compare with :attr:`Hardware.ridge`."""
        return self.flops_per_step / self.bytes_per_step


def roofline(spec: ArchSpec, context_len: int, batch: int = 1, hardware: Hardware = None,
             n_devices: int = 1, weight_bytes: float = 2, cache_bytes: float = 2,
             state_dtype_bytes: float = STATE_DTYPE_BYTES, mla_absorbed: bool = True) -> Roofline:
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
    imperfect overlap are left out, so the prediction is a lower bound on the time.
    """
    hardware = H200 if hardware is None else hardware
    _check_hardware(hardware)
    if not is_int(n_devices) or n_devices < 1:
        raise ValueError(f"n_devices must be a positive int, got {n_devices!r}")
    moved = decode_bytes(spec, context_len, batch, weight_bytes, cache_bytes,
                         state_dtype_bytes).total
    flops = flops_per_token(spec, context_len, mla_absorbed) * batch
    return Roofline(batch=batch, n_devices=n_devices, bytes_per_step=moved, flops_per_step=flops,
                    memory_s=moved / (n_devices * hardware.bandwidth),
                    compute_s=flops / (n_devices * hardware.peak_flops))


def roofline_band(spec: ArchSpec, context_len: int, batch: int = 1, band: dict | None = None,
                  n_devices: int = 1, weight_bytes: float = 2, cache_bytes: float = 2,
                  state_dtype_bytes: float = STATE_DTYPE_BYTES,
                  mla_absorbed: bool = True) -> dict[str, Roofline]:
    """:func:`roofline` once per hardware of ``band`` (default
    :data:`~gpt2k3.accounting.H200_BAND`: ``{"datasheet": H200, "measured": H200_MEASURED}``):
    the sensitivity of the prediction to the bandwidth assumed.  The datasheet's 4.8 TB/s gives
    the fast end, the measured 4.55 TB/s decode read the slow end."""
    band = H200_BAND if band is None else band
    if not isinstance(band, dict) or not band:
        raise ValueError(f"band must be a non-empty dict of Hardware, got {band!r}")
    return {name: roofline(spec, context_len, batch, hw, n_devices, weight_bytes, cache_bytes,
                           state_dtype_bytes, mla_absorbed)
            for name, hw in band.items()}


def hybrid_speedups(spec: ArchSpec, context_len: int = 1 << 20, hardware: Hardware = None,
                    n_devices: int = 1, weight_bytes: float = 2, cache_bytes: float = 2,
                    state_dtype_bytes: float = STATE_DTYPE_BYTES) -> dict:
    """A hybrid against its all-attention variant (:func:`gpt2k3.accounting.full_attention`)
    at ``context_len`` tokens, by the roofline.

    ``"kv_reduction"``: the share of the KV cache the hybrid removes; ``"memory_reduction"``:
    the same with the KDA states counted; ``"batch1"``: speedup per output token at batch 1;
    ``"batch"``: the memory-limited batch of each model on ``n_devices`` devices
    (:func:`max_batch`); ``"memory_limited"``: speedup per output token when each runs at its
    own memory-limited batch (``None`` if either cannot hold one sequence); ``"ceiling"``: the
    most any batch sizes can give -- the baseline at batch 1 against the hybrid with its
    weights read for free.  ``"ms"`` holds the predicted times per output token
    (milliseconds) behind each ratio; ``"full"`` the all-attention spec.
    """
    hardware = H200 if hardware is None else hardware
    _check_hardware(hardware)
    full = full_attention(spec)
    kw = dict(weight_bytes=weight_bytes, cache_bytes=cache_bytes,
              state_dtype_bytes=state_dtype_bytes)
    kv_h, kv_f = (kv_cache_bytes(s, context_len, 1, cache_bytes) for s in (spec, full))
    mem_h, mem_f = (memory_per_sequence(s, context_len, cache_bytes, state_dtype_bytes)
                    for s in (spec, full))
    pair = (("hybrid", spec), ("full", full))
    one = {name: roofline(s, context_len, 1, hardware, n_devices, **kw).per_token_s
           for name, s in pair}
    batch = {name: max_batch(s, context_len, hardware, n_devices, **kw) for name, s in pair}
    limited = None
    if min(batch.values()) > 0:
        limited = {name: roofline(s, context_len, batch[name], hardware, n_devices,
                                  **kw).per_token_s
                   for name, s in pair}
    # the hybrid with weights free: its cache and state traffic, or its FLOPs, per token
    per_seq = (decode_bytes(spec, context_len, 1, weight_bytes, cache_bytes,
                            state_dtype_bytes).per_sequence / (n_devices * hardware.bandwidth))
    floor = max(per_seq, flops_per_token(spec, context_len) / (n_devices * hardware.peak_flops))
    ms = {"batch 1": {k: 1e3 * v for k, v in one.items()}}
    if limited:
        ms["memory-limited"] = {k: 1e3 * v for k, v in limited.items()}
    return {"full": full, "kv_reduction": 1 - kv_h / kv_f, "memory_reduction": 1 - mem_h / mem_f,
            "batch1": one["full"] / one["hybrid"], "batch": batch,
            "memory_limited": limited and limited["full"] / limited["hybrid"],
            "ceiling": one["full"] / floor, "ms": ms}


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
                sb: float) -> tuple[float, float, float, float]:
    """(shared weights per device, bytes of one routed expert in every MoE layer, cache and
    state of one sequence per device) for tensor-parallel degree ``tp``."""
    c = count_params(spec)
    shared = (c.total - c.detail["routed experts"]) * wb / tp
    expert_layers = spec.n_moe_layers * spec.expert_params * wb
    # An MLA latent belongs to the token, not to a head: every rank of a tensor-parallel group
    # keeps all of it.  MHA/GQA caches and KDA states split by head.
    if spec.attention == "mla":
        cache_share = 1.0
    else:
        cache_share = math.ceil(spec.kv_heads / tp) / spec.kv_heads
    state_share = (math.ceil(spec.kda_n_head / tp) / spec.kda_n_head) if spec.kda_layers else 0.0
    cache = kv_cache_bytes(spec, context_len, 1, cb) * cache_share
    state = state_bytes(spec, 1, sb) * state_share
    return shared, expert_layers, cache, state


def serving_plan(spec: ArchSpec, context_len: int, batch: int = 1, hardware: Hardware = None,
                 tp: int = 1, weight_bytes: float = 2, cache_bytes: float = 2,
                 state_dtype_bytes: float = STATE_DTYPE_BYTES, max_devices: int = 8192) -> ServingPlan | None:
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
    hardware = H200 if hardware is None else hardware
    _check_hardware(hardware)
    nonneg_int("context_len", context_len)
    if not is_int(batch) or batch < 1:
        raise ValueError(f"batch must be a positive int, got {batch!r}")
    if not is_int(tp) or not 1 <= tp <= hardware.per_machine:
        raise ValueError(f"tp must be an int in [1, per_machine={hardware.per_machine}] (tensor "
                         f"parallelism stays inside one machine), got {tp!r}")
    for name, value in (("weight_bytes", weight_bytes), ("cache_bytes", cache_bytes),
                        ("state_dtype_bytes", state_dtype_bytes)):
        positive_bytes(name, value)
    if not is_int(max_devices) or max_devices < tp:
        raise ValueError(f"max_devices must be an int >= tp, got {max_devices!r}")
    shared, expert_layers, cache, state = _plan_sizes(spec, context_len, tp, weight_bytes,
                                                      cache_bytes, state_dtype_bytes)

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
                  state_dtype_bytes: float = STATE_DTYPE_BYTES, mla_absorbed: bool = True) -> Roofline:
    """The roofline of one decode step on a :class:`ServingPlan`, set by its busiest device.

    :func:`roofline` with ``n_devices`` splits every byte and FLOP evenly, which a real layout
    cannot do: a sequence's cache lives in one data-parallel group, an MLA latent is read
    whole by every rank of its group, and a token's experts sit on a few devices.  Here the
    device that serves the fullest group (``plan.sequences_per_group`` sequences) reads

    * its ``1/tp`` share of the shared weights those sequences need,
    * its experts that any of the ``batch`` tokens picked (uniform, independent routing: each
      of its ``ceil(E/n)`` experts per layer with probability ``1 - (1 - k/E)^batch``),
    * the caches and states of its group's sequences (an MLA latent whole, MHA/GQA caches and
      KDA states by head),

    and does the matching FLOPs (attention split by head).  The returned :class:`Roofline`
    describes that device (``n_devices=1``); its ``step_s`` is the step time of the whole
    deployment and ``per_token_s`` divides it by ``batch``.  Communication is still ignored.
    """
    hardware = H200 if hardware is None else hardware
    _check_hardware(hardware)
    if not isinstance(plan, ServingPlan):
        raise ValueError(f"plan must be a ServingPlan, got {type(plan).__name__}")
    if not is_int(batch) or batch < 1:
        raise ValueError(f"batch must be a positive int, got {batch!r}")
    tp, n = plan.tp, plan.n_devices
    seqs = min(plan.sequences_per_group, batch)
    _, expert_layers, cache, state = _plan_sizes(spec, context_len, tp, weight_bytes, cache_bytes,
                                                 state_dtype_bytes)
    c = count_params(spec)
    expert = spec.expert_params
    touched_all = (expected_distinct_experts(spec.n_routed_experts, spec.top_k, seqs)
                   if spec.is_moe else 0.0)
    shared_read = weights_read_per_step(spec, seqs) - spec.n_moe_layers * touched_all * expert
    picked = 1 - (1 - spec.top_k / spec.n_routed_experts) ** batch if spec.is_moe else 0.0
    experts_read = plan.experts_per_device * picked * expert_layers
    moved = shared_read * weight_bytes / tp + experts_read + seqs * (cache + 2 * state)
    # FLOPs: the group's tokens through the shared matmuls (split tp ways), the device's share
    # of all tokens' expert work, and attention / state updates split by head.
    routed_active = c.active_detail["routed experts"]
    shared_flops = 2 * seqs * (c.matmul_active - routed_active) / tp
    expert_flops = (2 * batch * routed_active * plan.experts_per_device / spec.n_routed_experts
                    if spec.is_moe else 0.0)
    mixing = flops_per_token(spec, context_len, mla_absorbed) - 2 * c.matmul_active
    flops = shared_flops + expert_flops + seqs * mixing / tp
    return Roofline(batch=batch, n_devices=1, bytes_per_step=moved, flops_per_step=flops,
                    memory_s=moved / hardware.bandwidth, compute_s=flops / hardware.peak_flops)
