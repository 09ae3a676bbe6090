"""The matplotlib matrix pictures: built without pyplot, deterministic, showing the right numbers."""

import warnings

import pytest
import torch
from matplotlib.figure import Figure

from gpt2k3.experiments import memory
from gpt2k3.book.figures import matrices
from gpt2k3.ops import softmax, wy


def png(fig):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. a glyph missing from the font
        data, meta = fig._repr_png_()
    assert meta["caption"] == fig.caption and meta["alt"] == fig.alt
    return data


@pytest.mark.parametrize("build", [matrices.state_before_after, matrices.causal_attention_weights,
                                   matrices.wy_ut_matrices, matrices.chunkwise_steps])
def test_builds_a_deterministic_figure(build):
    fig = build()
    assert isinstance(fig, Figure)
    data = png(fig)
    assert data.startswith(b"\x89PNG")
    assert data == png(build())  # the same picture every time
    again = build()
    for name, m in fig.matrices.items():
        assert torch.equal(m, again.matrices[name]), name


def test_state_before_after_is_one_delta_write():
    fig = matrices.state_before_after(d=6, n_stored=3, slot=1, beta=1.0, seed=2)
    before, after, diff = fig.matrices.values()
    torch.testing.assert_close(after - before, diff)
    assert torch.equal(before[3:], torch.zeros(3, 6))  # three stored pairs, rows 0..2
    assert torch.equal(after[[0, 2]], before[[0, 2]])  # the other rows are untouched
    # the written row now holds the new value: the key reads it back exactly
    k = torch.eye(6, dtype=torch.float64)[1]
    step = memory.read_erase_write(before, k, after[1], 1.0)
    torch.testing.assert_close(step.after, after)


def test_attention_weights_are_causal_softmax():
    fig = matrices.causal_attention_weights(T=7, d=4, seed=3)
    A, q, k = fig.matrices["softmax weights $A$"], fig.matrices["q"], fig.matrices["k"]
    assert torch.equal(A, A.tril())
    torch.testing.assert_close(A.sum(-1), torch.ones(7, dtype=torch.float64))
    v = torch.randn(7, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    o = softmax.parallel(q[None, None], k[None, None], v[None, None])[0, 0]
    torch.testing.assert_close(A @ v, o)


def test_wy_ut_matrices_come_from_the_wy_module():
    fig = matrices.wy_ut_matrices(C=5, d=3, seed=4)
    A, T_ut, W, U = list(fig.matrices.values())[:4]
    k, v, beta = fig.matrices["k"], fig.matrices["v"], fig.matrices["beta"][0]
    assert torch.equal(T_ut, wy.ut_transform(k, beta))
    torch.testing.assert_close(T_ut @ k, W)
    torch.testing.assert_close(T_ut @ v, U)
    assert torch.equal(A, A.tril(-1))


@pytest.mark.parametrize("call, match", [
    (lambda: matrices.state_before_after(d=4, n_stored=5), "n_stored must be <= d"),
    (lambda: matrices.state_before_after(beta=3.0), r"beta must be a float in \[0, 2\]"),
    (lambda: matrices.state_before_after(slot=8), r"slot must be in \[0, d = 8\)"),
    (lambda: matrices.causal_attention_weights(T=0), "T must be an int >= 1"),
    (lambda: matrices.causal_attention_weights(scale=-1.0), "scale must be None or a finite float > 0"),
    (lambda: matrices.wy_ut_matrices(C=1.5), "C must be an int >= 1"),
])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("build", [matrices.state_before_after, matrices.causal_attention_weights,
                                   matrices.wy_ut_matrices, matrices.chunkwise_steps])
def test_a_picture_has_a_caption_and_a_description_and_no_title_of_its_own(build):
    """The web book prints the caption under the picture and gives the description to readers
    who cannot see it; the picture holds only its panels (no title to repeat the caption)."""
    fig = build()
    assert fig.caption and fig.alt and len(fig.alt) > len(fig.caption)
    assert "$" not in fig.alt and "\\" not in fig.alt
    assert fig._suptitle is None


def test_chunkwise_steps_draws_every_chunk():
    fig = matrices.chunkwise_steps(n_chunks=3, C=5)
    assert torch.equal(fig.matrices["chunk_of_token"], torch.arange(3).repeat_interleave(5)[None])
    assert "3 chunks of 5 tokens" in fig.caption and "S0 to S3" in fig.alt
    with pytest.raises(ValueError, match="n_chunks"):
        matrices.chunkwise_steps(n_chunks=0)
