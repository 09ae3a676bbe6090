"""The decoder's sizes, shared by the model and every layer built for it."""

from __future__ import annotations

from dataclasses import dataclass, fields

from gpt2k3.checks import check_bool, check_positive_int, is_real


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of a GPT-2-style model.  Defaults are GPT-2 small with nanoGPT's padded vocabulary.

    ``vocab_size`` 50304 is 50257 (GPT-2's BPE vocabulary) rounded up to a multiple
    of 64, which nanoGPT uses for faster matmuls; the public checkpoints use 50257.
    """

    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True
    #: ``"learned"``: GPT-2's position table ``wpe``; ``"none"``: no position embedding (NoPE,
    #: Kimi Linear and K3 -- order then comes only from causal masking and the recurrent mixers)
    position: str = "learned"
    #: GPT-2 ties the head to the token embedding; DeepSeek, Kimi K2 and K3 do not
    tie_embeddings: bool = True

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "position":
                if value not in ("learned", "none"):
                    raise ValueError(f"position must be 'learned' or 'none', got {value!r}")
            elif f.name in ("tie_embeddings", "bias"):
                check_bool(value, f.name)
            elif f.name == "dropout":
                if not is_real(value) or not 0.0 <= value < 1.0:
                    raise ValueError(f"dropout must be in [0, 1), got {value!r}")
            else:  # a float like 12.0 is a mistake, not a size
                check_positive_int(value, f.name)
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head
