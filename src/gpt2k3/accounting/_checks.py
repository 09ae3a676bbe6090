"""Argument checks shared by the accounting modules (private: one order, ``(name, value)``).

Every check raises ``ValueError`` naming the argument and what was expected.
"""

from __future__ import annotations

import math


def is_int(value) -> bool:
    """An ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def positive_int(name: str, value) -> None:
    if not is_int(value) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def nonneg_int(name: str, value) -> None:
    if not is_int(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")


def positive_number(name: str, value, what: str = "number") -> None:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or value <= 0):
        raise ValueError(f"{name} must be a positive {what}, got {value!r}")


def positive_bytes(name: str, value) -> None:
    positive_number(name, value, "number of bytes")


def finite_number(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


def as_bytes(x: float) -> int | float:
    """Whole bytes as an ``int``; sub-byte formats (int4) may leave a fraction."""
    return int(x) if float(x).is_integer() else x


def byte_sizes(**sizes) -> None:
    """Each ``name=value`` a positive finite number of bytes (``expert_bytes`` may be ``None``:
    "the same as ``weight_bytes``")."""
    for name, value in sizes.items():
        if not (value is None and name == "expert_bytes"):
            positive_bytes(name, value)
