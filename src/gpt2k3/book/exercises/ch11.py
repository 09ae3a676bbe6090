"""Solutions to chapter 11's exercises (byte-level language models on the King James Bible).

Nothing here trains a model: the solutions read the stored results
(``benchmarks/results/text_lm.json``, ``text_lm_plateau.json``), run the shipped GPT-2 on a
short passage, or count byte tables on the corpus with the chapter's own functions.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gpt2k3.experiments import corpus
from gpt2k3.experiments.corpus import VOCAB_SIZE, _keys, ngram_score
from gpt2k3.experiments.text_lm import position_bits


# ---------------------------------------------------------------------------- 11.1 derive
def nats_to_bits(model, passage: str, recorded_bits: float) -> dict[str, float]:
    """The training loss is a cross-entropy in nats; the chapter reports bits per byte. Since
    ``log2 p = ln p / ln 2``, bits = nats / ln 2. Checked on ``model`` (the shipped GPT-2): its
    mean cross-entropy on ``passage`` (``F.cross_entropy``, nats) against the chapter's
    :func:`gpt2k3.experiments.text_lm.position_bits` on the same bytes (bits). Also the uniform
    guess in both units and, for ``recorded_bits``, the loss in nats and the per-byte
    perplexity ``2 ** bits`` (the number of equally likely bytes that would cost as much)."""
    ids = corpus.encode(passage)[None]
    x, y = ids[:, :-1], ids[:, 1:]
    with torch.no_grad():
        logits = model.eval()(x).double()
        nats = float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)))
    bits = float(position_bits(model, x, y).mean())
    return {"nats": nats, "bits": bits, "ratio": nats / bits, "ln2": math.log(2),
            "uniform_nats": math.log(VOCAB_SIZE), "uniform_bits": math.log2(VOCAB_SIZE),
            "recorded_bits": recorded_bits, "recorded_nats": recorded_bits * math.log(2),
            "perplexity": 2.0 ** recorded_bits}


# ---------------------------------------------------------------- 11.2 predict, then check
def head_onset(plateau: dict, variant: str = "published_1200", factor: float = 2.0) -> dict:
    """When GPT-2 starts to look at the previous byte, position by position: for every position
    bin of the plateau run's attention record, the first recorded step at which some layer's
    best head gives the previous byte at least ``factor`` times the even share (``1 / (t +
    1)``; ``None``: never within the run), the validation bits at that step, and the share
    reached at the end; with the validation curve, to see whether the loss falls first."""
    run = next((r for r in plateau["runs"] if r["variant"] == variant), None)
    if run is None:
        raise ValueError(f"the plateau results hold no run of variant {variant!r}")
    bins = [tuple(b) for b in plateau["config"]["attention_bins"]]
    uniform = plateau["config"]["uniform"]
    curve = {p["step"]: p["bits"] for p in run["curve"]}
    onset, final = {}, {}
    for i, b in enumerate(bins):
        above = [p["step"] for p in run["attention"]
                 if max(layer[i] for layer in p["layers"]) >= factor * uniform[i]]
        onset[b] = above[0] if above else None
        final[b] = max(layer[i] for layer in run["attention"][-1]["layers"]) / uniform[i]
    return {"onset": onset, "bits_at_onset": {b: curve.get(s) for b, s in onset.items()},
            "final_ratio": final, "curve": curve, "steps": run["steps"], "factor": factor}


# ------------------------------------------------------------------- 11.3 change the code
def ngram_probs_backoff(train: torch.Tensor, val: torch.Tensor, order: int, alpha: float) -> torch.Tensor:
    """:func:`gpt2k3.experiments.corpus.ngram_score`, changed in two ways: it returns the
    probability of every key rather than the mean bits, and where the table never counted a
    key's context it asks the table one byte shorter (recursively, down to byte frequencies)
    instead of spreading the probability evenly over all 256 bytes. Every context still gives
    a distribution that sums to one."""

    def counts_of(keys, order, query):  # how often each key of ``query`` occurs among ``keys``
        if VOCAB_SIZE ** order <= 1 << 24:  # up to 3 bytes: one counter per possible key
            return torch.bincount(keys, minlength=VOCAB_SIZE ** order)[query].double()
        values, n = torch.unique(keys, return_counts=True)  # longer: only the keys that occur
        at = torch.searchsorted(values, query).clamp(max=values.numel() - 1)
        return torch.where(values[at] == query, n[at].double(), torch.zeros((), dtype=torch.float64))

    joint = counts_of(_keys(train, order), order, val)
    if order > 1:
        context = counts_of(_keys(train[:-1], order - 1), order - 1, val // VOCAB_SIZE)
    else:  # no context: every byte of train counts
        context = torch.full_like(joint, float(train.numel()))
    p = (joint + alpha) / (context + VOCAB_SIZE * alpha)
    if order > 1 and bool((context == 0).any()):  # a context never counted: back off
        shorter = ngram_probs_backoff(train, val % VOCAB_SIZE ** (order - 1), order - 1, alpha)
        p = torch.where(context > 0, p, shorter)
    return p


def ngram_orders(train: torch.Tensor, windows: tuple[torch.Tensor, torch.Tensor],
                 alpha: float = 0.01) -> dict:
    """Bits per byte of the add-``alpha`` tables of orders 3 and 4
    (:func:`gpt2k3.experiments.corpus.ngram_score`) and of the order-4 table that backs off
    (:func:`ngram_probs_backoff`), all scored on the same targets: those of the evaluation
    ``windows`` (:func:`gpt2k3.experiments.corpus.eval_windows`, the bytes the models are scored
    on) that have three bytes of their window before them; and the share of those targets whose
    three-byte context the training books never show."""
    x, y = windows
    rows = torch.cat([x[:, :1], y], dim=1).long()
    keys4 = torch.cat([_keys(row, 4) for row in rows])  # context of three bytes, then the target
    seen = torch.bincount(_keys(train[:-1], 3), minlength=VOCAB_SIZE ** 3) > 0
    return {"trigram": ngram_score(train, keys4 % VOCAB_SIZE ** 3, 3, alpha),
            "fourgram": ngram_score(train, keys4, 4, alpha),
            "fourgram_backoff": float(-torch.log2(ngram_probs_backoff(train, keys4, 4, alpha)).mean()),
            "unseen": float((~seen[keys4 // VOCAB_SIZE]).double().mean()),
            "targets": keys4.numel(), "alpha": alpha}
