"""Shared helpers of the mixer tests (linear, delta, gated delta)."""

import torch
from hypothesis import strategies as st

#: (B, H, T, Dk, Dv) drawn small enough for float64 property tests to stay fast.
shapes = st.tuples(
    st.integers(1, 2),  # B
    st.integers(1, 3),  # H
    st.integers(1, 40),  # T
    st.integers(1, 6),  # Dk
    st.integers(1, 6),  # Dv
)


def make_state(B, H, Dk, Dv, seed=1, dtype=torch.float64):
    """A random delta-rule state (B, H, Dk, Dv)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, Dk, Dv, generator=g, dtype=dtype)


def assert_close(a, b, atol=1e-10, rtol=1e-10):
    torch.testing.assert_close(a, b, atol=atol, rtol=rtol)
