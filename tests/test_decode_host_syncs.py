"""No decode step waits on the device: for every model kind the book decodes, a generated token
costs no host read (``.item()``, ``bool(tensor)``, ``.tolist()``, ...). ``generate`` checks its
arguments once per call; the prefill may read back (the batched expert dispatch sorts its
routes), a step of one token must not."""

import pytest
import torch

from gpt2k3.config import GPTConfig
from gpt2k3.layers.deltanet import KDA, BoundedKDA, DeltaNet, GatedDeltaNet
from gpt2k3.layers.linear_attention import LinearAttention
from gpt2k3.model import GPT, generate
from gpt2k3.models.hybrid import hybrid_gpt
from gpt2k3.models.k3 import tiny_k3
from mixer_testing import count_host_syncs  # noqa: E402

CFG = dict(block_size=64, vocab_size=97, n_layer=4, n_head=2, n_embd=32)


def _mixer(cls):
    return lambda config, i: cls(config)


MODELS = {
    "GPT-2": lambda c: GPT(c),
    "linear attention": lambda c: GPT(c, mixer=_mixer(LinearAttention)),
    "DeltaNet": lambda c: GPT(c, mixer=_mixer(DeltaNet)),
    "Gated DeltaNet": lambda c: GPT(c, mixer=_mixer(GatedDeltaNet)),
    "KDA": lambda c: GPT(c, mixer=_mixer(KDA)),
    "bounded KDA": lambda c: GPT(c, mixer=_mixer(BoundedKDA)),
    "KDA/softmax hybrid": lambda c: hybrid_gpt(c),
    "tiny Kimi K3": lambda c: tiny_k3(c),
}


def host_syncs_per_token(model, monkeypatch, temperature=0.0) -> float:
    """Host reads per generated token: the difference between generating 12 and 4 tokens, / 8."""
    idx = torch.randint(0, 97, (2, 5), generator=torch.Generator().manual_seed(0))
    counts = count_host_syncs(monkeypatch)
    per_call = []
    for n in (4, 12):
        counts["n"] = 0
        generate(model, idx, n, temperature=temperature,
                 generator=torch.Generator().manual_seed(0))
        per_call.append(counts["n"])
    return (per_call[1] - per_call[0]) / 8


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("kind", list(MODELS))
def test_a_decode_step_reads_nothing_back_to_the_host(kind, temperature, monkeypatch):
    """Was 13 per token for a 4-layer tiny K3 (value checks and the dispatch's tolist) and 3
    for the KDA/softmax hybrid."""
    torch.manual_seed(0)
    model = MODELS[kind](GPTConfig(**CFG)).eval()
    assert host_syncs_per_token(model, monkeypatch, temperature) == 0
