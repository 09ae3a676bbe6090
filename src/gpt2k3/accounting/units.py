"""Number formats: bytes per number of the storage formats the chapters compare."""

from __future__ import annotations

__all__ = ["DTYPE_BYTES", "STATE_DTYPE_BYTES", "dtype_bytes"]

#: Bytes per number of the storage formats the chapters compare.
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp8": 1, "int4": 0.5}

#: Bytes per number of a linear-attention (KDA) state: float32, as the recurrent kernels keep
#: it (fla's ``fused_recurrent_*`` and chunk kernels accumulate the state in float32).  The
#: default precision of every state size in the book.
STATE_DTYPE_BYTES = 4


def dtype_bytes(name: str, dtype: str, allowed=None) -> float:
    """Bytes per number of the format ``dtype`` (a key of :data:`DTYPE_BYTES`, restricted to
    ``allowed`` if given); ``ValueError`` naming ``name`` otherwise."""
    choices = tuple(DTYPE_BYTES) if allowed is None else tuple(allowed)
    if not isinstance(dtype, str) or dtype not in choices or dtype not in DTYPE_BYTES:
        raise ValueError(f"{name} must be one of {choices}, got {dtype!r}")
    return DTYPE_BYTES[dtype]


def as_bytes(x: float) -> int | float:
    """Whole bytes as an ``int``; sub-byte formats (int4) may leave a fraction."""
    return int(x) if float(x).is_integer() else x
