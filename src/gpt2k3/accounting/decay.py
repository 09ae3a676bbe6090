"""KDA's per-step log-decay, in plain floats: Kimi Linear's unbounded form and Kimi K3's
bounded one (the same parameters, a different range)."""

from __future__ import annotations

import math

from gpt2k3.accounting.spec import ArchSpec, check_spec
from gpt2k3.checks import check_finite_number

__all__ = ["kda_log_decay", "kda_log_decay_range"]


def kda_log_decay(x: float, a_log: float = 0.0, dt_bias: float = 0.0,
                  lower_bound: float | None = None) -> float:
    """One channel's per-step log-decay ``g`` (the state is multiplied by ``exp(g)``) for
    gate pre-activation ``x``, in plain floats.

    Kimi Linear (``lower_bound=None``): ``-exp(a_log) * softplus(x + dt_bias)``, anywhere in
    ``(-inf, 0)``.  Kimi K3 (``lower_bound=b < 0``, fla-core's ``naive_kda_lowerbound_gate``):
    ``b * sigmoid(exp(a_log) * (x + dt_bias))``, inside ``(b, 0)``: a channel keeps at least
    ``exp(b)`` of its state per step (``e^-5`` ~ 0.67% for K3) and never more than all of it.
    """
    for name, value in (("x", x), ("a_log", a_log), ("dt_bias", dt_bias)):
        check_finite_number(value, name)
    z = x + dt_bias
    if lower_bound is None:
        softplus = z + math.log1p(math.exp(-z)) if z > 0 else math.log1p(math.exp(z))
        return -math.exp(a_log) * softplus
    check_finite_number(lower_bound, "lower_bound", -1)
    u = math.exp(a_log) * z
    sigmoid = 1 / (1 + math.exp(-u)) if u >= 0 else math.exp(u) / (1 + math.exp(u))
    return lower_bound * sigmoid


def kda_log_decay_range(spec: ArchSpec) -> tuple[float, float]:
    """The open interval ``(lowest, highest)`` a KDA layer's per-step log-decay can take:
    ``(kda_gate_lower_bound, 0)`` for a bounded gate, ``(-inf, 0)`` for Kimi Linear's."""
    check_spec(spec)
    if not spec.kda_layers:
        raise ValueError(f"{spec.name} has no KDA layers")
    low = spec.kda_gate_lower_bound
    return (float(low) if low is not None else -math.inf, 0.0)


