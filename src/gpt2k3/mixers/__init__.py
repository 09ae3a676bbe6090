"""Sequence mixers: the ways a token can read from the tokens before it.

One module per mechanism, in the book's reading order:

* :mod:`~gpt2k3.mixers.softmax` -- causal softmax attention and its KV-cache decode step;
* :mod:`~gpt2k3.mixers.linear` -- linear attention, a fixed-size state ``(S, z)``;
* :mod:`~gpt2k3.mixers.delta` -- DeltaNet, the delta-rule write;
* :mod:`~gpt2k3.mixers.gated_delta` -- Gated DeltaNet and Kimi Delta Attention;
* :mod:`~gpt2k3.mixers.mla` -- multi-head latent attention.

Each recurrent mixer has a reference form (``recurrent``, the token-by-token definition) and a
fast form (``parallel`` / ``chunkwise``) that the tests prove equal. Submodules are imported on
first access, so ``gpt2k3.mixers.delta`` works after a bare ``import gpt2k3.mixers``.
"""

import importlib

_SUBMODULES = ("softmax", "linear", "delta", "gated_delta", "mla")

__all__ = list(_SUBMODULES)


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_SUBMODULES))
