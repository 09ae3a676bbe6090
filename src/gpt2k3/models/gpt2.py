"""GPT-2 from its public checkpoints: the Hugging Face state-dict loader.

The model itself is :class:`gpt2k3.model.GPT` with no parts given; this module only reads the
public layout into it.
"""

from __future__ import annotations

from collections.abc import Mapping

import re

import torch

from gpt2k3.config import GPTConfig
from gpt2k3.model import GPT

__all__ = ["from_hf_state_dict"]

#: Hugging Face stores these four projections as ``Conv1D``, shape ``(in, out)``.
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
_BUFFERS = re.compile(r"\.attn\.(bias|masked_bias)$")  # mask buffers of older checkpoints


def from_hf_state_dict(sd: dict, n_head: int = 12, dropout: float = 0.0) -> GPT:
    """A :class:`GPT` (in ``eval()`` mode) from a state dict in the public GPT-2 layout (Hugging
    Face ``GPT2LMHeadModel`` / ``GPT2Model``, with or without the ``transformer.`` prefix).

    Every size but the head count is read off the tensors. The four ``Conv1D`` projection
    weights are transposed into ``nn.Linear``'s ``(out, in)``.
    """
    if not isinstance(sd, Mapping):
        raise ValueError(f"sd must be a state dict (a mapping of names to tensors), got "
                         f"{type(sd).__name__}")
    sd = {k if k.startswith(("transformer.", "lm_head.")) else f"transformer.{k}": v
          for k, v in sd.items()}
    sd = {k: v for k, v in sd.items() if not _BUFFERS.search(k)}
    for key in ("transformer.wte.weight", "transformer.wpe.weight"):
        if key not in sd:
            raise ValueError(f"sd is missing {key!r}: not a GPT-2 state dict")
    vocab_size, n_embd = sd["transformer.wte.weight"].shape
    block_size = sd["transformer.wpe.weight"].shape[0]
    layers = {int(m.group(1)) for k in sd if (m := re.match(r"transformer\.h\.(\d+)\.", k))}
    if not layers or layers != set(range(max(layers) + 1)):
        raise ValueError(f"sd must hold layers transformer.h.0..N-1, found {sorted(layers)}")
    bias = "transformer.h.0.attn.c_attn.bias" in sd
    config = GPTConfig(block_size=block_size, vocab_size=vocab_size, n_layer=len(layers),
                       n_head=n_head, n_embd=n_embd, dropout=dropout, bias=bias)
    model = GPT(config)
    head = sd.pop("lm_head.weight", None)
    if head is not None and not torch.equal(head, sd["transformer.wte.weight"]):
        raise ValueError("sd has an lm_head.weight that differs from wte: GPT-2 ties them")
    own = model.state_dict()
    new = {}
    for k, v in sd.items():
        if k not in own:
            raise ValueError(f"sd has an unexpected key {k!r}")
        v = v.t() if k.endswith(CONV1D) else v
        if v.shape != own[k].shape:
            raise ValueError(f"sd[{k!r}] has shape {tuple(v.shape)}, expected {tuple(own[k].shape)}")
        new[k] = v
    new["lm_head.weight"] = new["transformer.wte.weight"]
    missing = set(own) - set(new)
    if missing:
        raise ValueError(f"sd is missing {sorted(missing)}")
    model.load_state_dict(new)
    return model.eval()
