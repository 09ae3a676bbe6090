"""The front doors a reader uses, each held to its own contract, for every model kind.

``tests/test_bad_input.py`` drives every public name with generic bad values. This file checks
fewer doors more thoroughly: the model's ``forward`` and ``generate`` and the cache a model
creates, for all ten token-mixer kinds of ``tests/test_core.py``, with the contract each door
states -- the token range, the batch, the capacity promised by ``new_cache(batch, max_len)``,
the block size -- and, for each, a ``ValueError`` that names the argument.
"""

from __future__ import annotations

import re

import pytest
import torch

from gpt2k3.model import generate
from gpt2k3.models.gpt2_fast import FastDecoder
from test_core import CFG, KINDS, _build


def _model(kind):
    torch.manual_seed(0)
    model, cache, _, _ = _build(kind)
    return model.eval(), cache


def _ids(B, T, seed=0):
    return torch.randint(0, CFG.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))


def _raises(arg, fn, *args, **kw):
    with pytest.raises(ValueError, match=re.escape(arg)):
        fn(*args, **kw)


@pytest.mark.parametrize("kind", KINDS)
def test_token_ids_outside_the_vocabulary(kind):
    model, _ = _model(kind)
    for bad in (-1, CFG.vocab_size):
        idx = _ids(2, 5)
        idx[1, 3] = bad
        _raises("idx", model, idx)
        _raises("idx", generate, model, idx, 2)


@pytest.mark.parametrize("kind", KINDS)
def test_an_empty_batch_or_an_empty_prompt(kind):
    model, _ = _model(kind)
    for idx in (torch.zeros(0, 4, dtype=torch.long), torch.zeros(2, 0, dtype=torch.long)):
        _raises("idx", model, idx)
        _raises("idx", generate, model, idx, 2)


@pytest.mark.parametrize("kind", KINDS)
def test_longer_than_the_block(kind):
    model, _ = _model(kind)
    _raises("block_size", model, _ids(1, CFG.block_size + 1))
    _raises("block_size", generate, model, _ids(1, CFG.block_size - 2), 3)


@pytest.mark.parametrize("kind", [k for k in KINDS if "concatenating" not in k])
def test_the_cache_holds_what_new_cache_promised(kind):
    """``new_cache(batch, max_len)`` promises room for ``max_len`` tokens of ``batch``
    sequences: more tokens, or another batch, is refused when written, and nothing is written."""
    model, _ = _model(kind)
    cache = model.new_cache(2, 6)
    with torch.no_grad():
        _raises("max_len", model, _ids(2, 7), cache=cache)
        assert cache.length == 0
        model(_ids(2, 4), cache=cache)
        _raises("max_len", model, _ids(2, 3), cache=cache)
        assert cache.length == 4
        _raises("batch", model, _ids(3, 1), cache=cache)
        assert cache.length == 4
        model(_ids(2, 2), cache=cache)  # exactly full is fine
        assert cache.length == 6


@pytest.mark.parametrize("kind", KINDS)
def test_generate_refuses_a_cache_that_is_too_small_or_in_use(kind):
    model, cache = _model(kind)
    small = model.new_cache(2, 5) if cache is None else None
    if small is not None:
        _raises("max_len", generate, model, _ids(2, 4), 3, cache=small)
    used = model.new_cache(2, 10) if cache is None else cache
    with torch.no_grad():
        model(_ids(2, 2), cache=used)
    _raises("cache", generate, model, _ids(2, 2), 2, cache=used)


def test_the_fast_decoder_takes_the_same_token_range():
    model, _ = _model("softmax (GPT-2)")
    fast = FastDecoder(model, max_len=12, batch=2)
    for bad in (-1, CFG.vocab_size):
        idx = _ids(2, 4)
        idx[0, 1] = bad
        _raises("idx", fast.generate, idx, 2)
    _raises("idx", fast.generate, torch.zeros(2, 0, dtype=torch.long), 2)
    _raises("idx", fast.generate, _ids(3, 4), 2)  # the decoder's batch is 2
    _raises("max_len", fast.generate, _ids(2, 10), 3)
