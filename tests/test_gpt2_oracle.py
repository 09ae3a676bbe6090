"""Oracle: Hugging Face transformers' GPT2LMHeadModel (random init, no download).

Its state dict, loaded with gpt2k3.models.gpt2.from_hf_state_dict, must give the same logits, and
both models must have the parameter count that gpt2k3.accounting predicts.
"""

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from gpt2k3.accounting import count_params  # noqa: E402
from gpt2k3.archs import spec_from_gpt_config  # noqa: E402
from gpt2k3.model import GPT  # noqa: E402
from gpt2k3.models.gpt2 import from_hf_state_dict  # noqa: E402

transformers.logging.set_verbosity_error()

CONFIGS = [
    dict(n_layer=2, n_head=4, n_embd=64, vocab_size=211, n_positions=48),
    dict(n_layer=3, n_head=6, n_embd=96, vocab_size=503, n_positions=64),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=["2L-4H-64", "3L-6H-96"])
def test_logits_match_hugging_face(cfg):
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(**cfg, bos_token_id=0, eos_token_id=0)).eval()
    ours = from_hf_state_dict(hf.state_dict(), n_head=cfg["n_head"])
    idx = torch.randint(0, cfg["vocab_size"], (3, cfg["n_positions"] - 5))
    with torch.no_grad():
        expected = hf(idx).logits
        got = ours(idx)
    assert (got - expected).abs().max().item() < 1e-5

    n_hf = sum(p.numel() for p in hf.parameters())
    assert n_hf == ours.num_params() == count_params(spec_from_gpt_config(ours.config)).total
