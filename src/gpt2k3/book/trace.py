"""Chapter 1's shape trace: what each stage of GPT-2's forward pass outputs."""

from __future__ import annotations

import torch

from gpt2k3.model import GPT


@torch.no_grad()
def trace_shapes(model: GPT, idx: torch.Tensor) -> list[tuple[str, tuple[int, ...]]]:
    """Run ``model(idx)`` and record ``(stage, output shape)`` for each step of the
    forward pass of the first block and the ends of the network (for chapter 1)."""
    rows: list[tuple[str, tuple[int, ...]]] = [("token ids idx", tuple(idx.shape))]
    t, h0 = model.transformer, model.transformer.h[0]
    stages = [
        (t.wte, "token embeddings wte(idx)"),
        (t.wpe, "position embeddings wpe(pos)"),
        (h0.ln_1, "block 0: ln_1(x)"),
        (h0.attn.c_attn, "block 0: c_attn -> q, k, v packed"),
        (h0.attn, "block 0: attention output"),
        (h0.mlp.c_fc, "block 0: MLP c_fc (4x wider)"),
        (h0.mlp, "block 0: MLP output"),
        (h0, "block 0 output (residual stream)"),
        (t.ln_f, "final ln_f"),
        (model.lm_head, "logits"),
    ]
    handles = []
    for module, label in stages:
        def hook(_m, _inp, out, label=label):
            rows.append((label, tuple(out.shape)))
        handles.append(module.register_forward_hook(hook))
    try:
        model(idx)
    finally:
        for h in handles:
            h.remove()
    heads = (idx.shape[0], model.config.n_head, idx.shape[1], model.config.head_dim)
    # q, k, v per head are views, not modules: insert their shape after c_attn
    at = next(i for i, (label, _) in enumerate(rows) if label.startswith("block 0: c_attn"))
    rows.insert(at + 1, ("block 0: q, k, v split into heads", heads))
    rows.insert(at + 2, ("block 0: attention weights softmax(q k^T / sqrt(hs))",
                         (idx.shape[0], model.config.n_head, idx.shape[1], idx.shape[1])))
    return rows
