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


def count_host_syncs(monkeypatch):
    """The decode-step host-sync tests' counter: count every Python-level read of a tensor's value back to the host."""
    counts = {"n": 0}
    for name in ("__bool__", "__int__", "__float__", "__index__", "item", "tolist"):
        orig = getattr(torch.Tensor, name)

        def counted(self, *a, _orig=orig, **kw):
            counts["n"] += 1
            return _orig(self, *a, **kw)
        monkeypatch.setattr(torch.Tensor, name, counted)
    return counts
