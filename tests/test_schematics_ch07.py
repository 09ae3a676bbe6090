"""Chapter 7's two schematics draw what the code computes: the routing picture's chosen experts
and weights are the Router's, and the MLA picture names the absorbed path's three lanes."""

import pytest
import torch

from gpt2k3.book.figures.mla_moe import mla_absorption_schematic, routing_schematic
from gpt2k3.layers.moe import MoEConfig, Router


def test_routing_schematic_draws_the_routers_choice():
    fig = routing_schematic(n_experts=8, top_k=2, n_embd=16, seed=0)
    scores = torch.tensor(fig.scores)
    assert len(fig.scores) == 8 and len(fig.picked) == 2
    # the picked experts are the two highest scores (no bias yet), the weights their share
    assert set(fig.picked) == set(scores.topk(2).indices.tolist())
    assert sum(fig.weights) == pytest.approx(1.0)
    assert fig.weights == pytest.approx((scores[fig.picked] / scores[fig.picked].sum()).tolist())
    assert fig.caption and fig.alt and "expert" in fig.alt
    png = fig._repr_png_()
    assert png[0][:8] == b"\x89PNG\r\n\x1a\n" and png[1]["caption"] == fig.caption


def test_routing_schematic_is_the_router_on_one_token():
    fig = routing_schematic(n_experts=6, top_k=3, n_embd=4, seed=3)
    gen = torch.Generator().manual_seed(3)
    router = Router(MoEConfig(n_embd=4, n_routed_experts=6, n_shared_experts=0, top_k=3,
                              d_expert=1, score_func="sigmoid")).double()
    with torch.no_grad():
        router.weight.copy_(torch.randn(6, 4, generator=gen, dtype=torch.float64) * 4 ** -0.5)
        x = torch.randn(1, 4, generator=gen, dtype=torch.float64)
        w, idx = router(x)
    assert fig.picked == idx[0].tolist() and fig.weights == pytest.approx(w[0].tolist())


@pytest.mark.parametrize("kw", [{"top_k": 8}, {"n_experts": 1}, {"seed": -1}, {"top_k": True},
                                {"n_embd": 2.0}])
def test_routing_schematic_rejects_bad_arguments(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        routing_schematic(**kw)


def test_mla_absorption_schematic_has_three_lanes_and_a_caption():
    fig = mla_absorption_schematic()
    assert list(fig.lanes) == ["cache", "scores", "output"]
    assert "absorbed into the query" in fig.caption and "into the output" in fig.caption
    assert "W_UK" in fig.alt and "W_UV" in fig.alt
    assert fig._repr_png_()[0][:4] == b"\x89PNG"
