"""Sequence ops: pure functions over ``(B, H, T, D)`` tensors, a token-by-token reference form
beside each fast form (the layout of flash-linear-attention's ``ops/*/naive.py``).

* :mod:`~gpt2k3.ops.softmax` -- causal softmax attention (a chunk of queries after a cache);
* :mod:`~gpt2k3.ops.linear` -- linear attention, a fixed-size state ``(S, z)``;
* :mod:`~gpt2k3.ops.delta` -- DeltaNet, the delta-rule write;
* :mod:`~gpt2k3.ops.wy` -- the chunkwise DeltaNet derivation piece by piece, and its cost;
* :mod:`~gpt2k3.ops.gated_delta` -- Gated DeltaNet and Kimi Delta Attention;
* :mod:`~gpt2k3.ops.depth` -- Attention Residuals' softmax over depth.

One signature convention, fla-style::

    o, final_state = op.chunkwise(q, k, v, [beta], [g], *, initial_state=None, chunk_size=64)

Each form is a pure body (it casts its inputs, creates its state, does its arithmetic) behind
one door, :func:`gpt2k3.checks.checked`, which checks the arguments' types and shapes (never a
value) and changes nothing, once per public call: a door reached inside another door's call
runs its body alone.
The fast delta-rule forms share their steps, listed in :mod:`gpt2k3.ops.chunks`.

Ops import no layer and no model.
"""
