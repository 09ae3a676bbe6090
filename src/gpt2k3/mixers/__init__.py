"""Sequence mixers: the ways a token can read from the tokens before it.

One module per mechanism, in the book's reading order:

* :mod:`~gpt2k3.mixers.softmax` -- causal softmax attention (a chunk of queries after a cache);
* :mod:`~gpt2k3.mixers.linear` -- linear attention, a fixed-size state ``(S, z)``;
* :mod:`~gpt2k3.mixers.delta` -- DeltaNet, the delta-rule write;
* :mod:`~gpt2k3.mixers.wy` -- the chunkwise DeltaNet derivation piece by piece, and its cost;
* :mod:`~gpt2k3.mixers.gated_delta` -- Gated DeltaNet and Kimi Delta Attention;
* :mod:`~gpt2k3.mixers.mla` -- multi-head latent attention.

The sequence mixers are pure functions over ``(B, H, T, D)`` tensors with one signature
convention, fla-style::

    o, final_state = mixer.chunkwise(q, k, v, [beta], [g], *, initial_state=None, chunk_size=64)

Each has a reference form (``recurrent``, the token-by-token definition, a self-contained loop)
beside its fast form (``parallel`` / ``chunkwise``), and the tests prove them equal; they share
only the argument checks of :mod:`gpt2k3._validate`. Submodules are imported on first access, so
``gpt2k3.mixers.delta`` works after a bare ``import gpt2k3.mixers``.
"""

import importlib

_SUBMODULES = ("softmax", "linear", "delta", "wy", "gated_delta", "mla")

__all__ = list(_SUBMODULES)


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_SUBMODULES))
