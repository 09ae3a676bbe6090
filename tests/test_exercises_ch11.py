"""Chapter 11's exercise solutions give what their prose states, checked independently."""

from __future__ import annotations

import math
import shutil

import pytest
import torch

from gpt2k3.book.exercises import ch11
from gpt2k3.book.results import exists, load
from gpt2k3.experiments import checkpoint, corpus
from gpt2k3.experiments.corpus import VOCAB_SIZE, _keys, ngram_score

PASSAGE = ("In the beginning was the Word, and the Word was with God, and the Word was God. "
           "The same was in the beginning with God.")


def test_11_1_a_nat_is_one_over_ln_2_bits():
    out = ch11.nats_to_bits(checkpoint.load_gpt2(), PASSAGE, 3.25)
    assert out["ratio"] == pytest.approx(math.log(2), abs=1e-6)
    assert out["uniform_bits"] == 8 and out["uniform_nats"] == pytest.approx(8 * math.log(2))
    assert out["recorded_nats"] == pytest.approx(3.25 * math.log(2))
    assert out["perplexity"] == pytest.approx(math.exp(out["recorded_nats"]))  # 2^bits = e^nats
    assert 1 < out["bits"] < 8


def _plateau():
    """A plateau record by hand: two bins, the first crossing twice the even share at step 20,
    the second never; the loss passes below the bigram table (3.0) at step 30."""
    layers = lambda a, b: [[a, b], [a / 2, b / 2]]  # noqa: E731
    return {"config": {"attention_bins": [[1, 4], [4, 16]], "uniform": [0.3, 0.1]},
            "baselines": {"bigram": 3.0},
            "runs": [{"variant": "published_1200", "steps": 40,
                      "curve": [{"step": s, "bits": b} for s, b in ((0, 8.0), (10, 3.2), (20, 3.1),
                                                                    (30, 2.9), (40, 2.7))],
                      "attention": [{"step": s, "layers": layers(a, 0.15)}
                                    for s, a in ((0, 0.3), (10, 0.5), (20, 0.61), (30, 0.7), (40, 0.9))]}]}


def test_11_2_head_onset_by_hand():
    out = ch11.head_onset(_plateau())
    assert out["onset"] == {(1, 4): 20, (4, 16): None}
    assert out["bits_at_onset"] == {(1, 4): 3.1, (4, 16): None}
    assert out["final_ratio"][(1, 4)] == pytest.approx(3.0) and out["factor"] == 2.0
    with pytest.raises(ValueError, match="variant"):
        ch11.head_onset(_plateau(), variant="nothing")


@pytest.mark.skipif(not exists("text_lm_plateau.json") or not load("text_lm_plateau.json")["complete"],
                    reason="no finished plateau results")
def test_11_2_on_the_stored_plateau_run():
    plateau = load("text_lm_plateau.json")
    out = ch11.head_onset(plateau)
    run = next(r for r in plateau["runs"] if r["variant"] == "published_1200")
    steps = [p["step"] for p in run["attention"]]
    for b, step in out["onset"].items():
        assert step is None or step in steps
    assert all(v is None or v > 0 for v in out["final_ratio"].values())


def _small():
    train = corpus.encode("and the earth was without form, and void; and darkness was upon "
                          "the face of the deep. " * 3, torch.uint8)
    return train


def test_11_3_backoff_is_the_chapter_table_where_the_context_was_seen():
    train = _small()
    val = corpus.encode("and the deep was dark; and the earth was void.", torch.uint8)
    keys = _keys(val, 4)
    p = ch11.ngram_probs_backoff(train, keys, 4, 0.01)
    ctx_seen = torch.isin(keys // VOCAB_SIZE, _keys(train[:-1], 3))
    assert ctx_seen.any() and (~ctx_seen).any()
    plain = torch.tensor([2.0 ** -ngram_score(train, k[None], 4, 0.01) for k in keys], dtype=torch.float64)
    torch.testing.assert_close(p[ctx_seen], plain[ctx_seen])
    lower = ch11.ngram_probs_backoff(train, keys % VOCAB_SIZE ** 3, 3, 0.01)
    torch.testing.assert_close(p[~ctx_seen], lower[~ctx_seen])
    # every context, seen or not, still gives a distribution over the next byte
    for k in (keys[ctx_seen][0], keys[~ctx_seen][0]):
        row = (k // VOCAB_SIZE) * VOCAB_SIZE + torch.arange(VOCAB_SIZE)
        assert float(ch11.ngram_probs_backoff(train, row, 4, 0.01).sum()) == pytest.approx(1.0)


def test_11_3_orders_score_the_same_targets():
    train = _small()
    val = corpus.encode("and the deep was dark; and the earth was void. " * 4, torch.uint8)
    windows = corpus.eval_windows(val, 40, 3)
    out = ch11.ngram_orders(train, windows)
    rows = torch.cat([windows[0][:, :1], windows[1]], dim=1)
    keys = torch.cat([_keys(r, 4) for r in rows])
    assert out["targets"] == keys.numel() == 3 * (41 - 3)
    assert out["fourgram"] == pytest.approx(ngram_score(train, keys, 4, 0.01))
    assert out["trigram"] == pytest.approx(ngram_score(train, keys % VOCAB_SIZE ** 3, 3, 0.01))
    assert 0 < out["unseen"] < 1


@pytest.mark.skipif(shutil.which("bible") is None, reason="Debian's bible-kjv is not installed")
def test_11_3_on_the_corpus_the_fourgram_beats_the_trigram_and_backing_off_barely_matters():
    data = corpus.kjv_data()
    out = ch11.ngram_orders(data.train, corpus.eval_windows(data.validation, 2048, 16))
    assert out["fourgram"] < out["trigram"] - 0.3
    assert abs(out["fourgram_backoff"] - out["fourgram"]) < 0.01 and out["unseen"] < 0.01
