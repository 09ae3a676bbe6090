"""Solutions to chapter 10's exercises (learned recall).

Nothing here trains a model: the solutions read the stored sweep
(``benchmarks/results/mqar.json``), count with the chapter's own functions, or write pairs into
a state by hand with the book's ops, in well under a second.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpt2k3.book.figures import recall_summary
from gpt2k3.experiments import recall
from gpt2k3.experiments.mqar import MQARConfig, mqar
from gpt2k3.ops import delta, linear


# ---------------------------------------------------------------- 10.1 predict, then check
def drop_past_D(data: dict) -> dict[str, dict[str, float]]:
    """Each mixer's mean accuracy (%) at the last checkpoint at ``P = D`` and ``P = 2D``, and the
    drop between them, from the stored sweep (what Figure 10.1 shows at its last step)."""
    tasks, model, _ = recall.sweep_config(data)
    D = model.head_dim
    pairs = [t.n_pairs for t in tasks]
    if D not in pairs or 2 * D not in pairs:
        raise ValueError(f"the sweep must include P = D = {D} and P = 2D, got {pairs}")
    summary = recall_summary(data)
    out = {}
    for mixer, s in summary.items():
        at_d, at_2d = 100 * s[D]["mean"], 100 * s[2 * D]["mean"]
        out[mixer] = {"at_D": at_d, "at_2D": at_2d, "drop": at_d - at_2d}
    return out


# ---------------------------------------------------------------------------- 10.2 derive
def cache_meets_state(data: dict) -> dict[str, int]:
    """The sequence length at which softmax attention's cache holds as many numbers as one
    DeltaNet state, derived (``2 T d = H D^2``, so ``T = H D^2 / 2d = D / 2``: the convolution
    tails are the same on both sides and cancel) and found by counting with the chapter's
    :func:`gpt2k3.experiments.recall.state_numbers`."""
    _, model, _ = recall.sweep_config(data)
    H, D, d = model.n_head, model.head_dim, model.n_embd
    derived = H * D * D // (2 * d)
    counted = next(T for T in range(1, 10 * D)
                   if recall.state_numbers("softmax", model, T)
                   >= recall.state_numbers("deltanet", model, T))
    return {"derived": derived, "counted": counted, "D": D, "pairs": derived // 2,
            "equal": recall.state_numbers("softmax", model, derived)
            == recall.state_numbers("deltanet", model, derived)}


# ------------------------------------------------------------------- 10.3 change the code
def written_memory_recall(n_pairs: int, rule: str, D: int = 16, n_sequences: int = 32,
                          seed: int = 0) -> dict[str, float]:
    """Accuracy of one ``D x D`` state that is *written by hand*, not trained, on the chapter's
    MQAR sequences (:func:`gpt2k3.experiments.mqar.mqar`): the change is to replace the trained
    model by near-orthogonal keys and chapter 4's write rules.

    Each sequence's ``P`` keys are rows of a random orthogonal matrix cut to ``D`` columns and
    normalised (orthonormal while ``P <= D``), its values random unit vectors; the pairs are written with the delta rule
    (``beta = 1``, :func:`gpt2k3.ops.delta.recurrent`) or additively (linear attention without
    its normaliser, :func:`gpt2k3.ops.linear.recurrent`), and each query reads ``q S`` and
    answers with the nearest of the sequence's values.  Returns the accuracy over all queries,
    over the queries for the oldest quarter of the pairs, and for the newest quarter.
    """
    if rule not in ("delta", "additive"):
        raise ValueError(f"rule must be 'delta' or 'additive', got {rule!r}")
    cfg = MQARConfig(n_pairs=n_pairs, vocab_size=128)
    P, B = cfg.n_pairs, n_sequences
    batch = mqar(cfg, B, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    n = max(P, D)                         # P rows of a random orthogonal matrix, cut to D columns
    basis, _ = torch.linalg.qr(torch.randn(B, n, n, generator=g, dtype=torch.float64))
    k = F.normalize(basis[:, :P, :D], dim=-1)[:, None]                       # (B, 1, P, D)
    table = F.normalize(torch.randn(cfg.vocab_size, D, generator=g, dtype=torch.float64), dim=-1)
    keys, values = batch.inputs[:, 0:2 * P:2], batch.inputs[:, 1:2 * P:2]    # (B, P)
    v = table[values][:, None]
    if rule == "delta":
        _, S = delta.recurrent(k, k, v, torch.ones(B, 1, P, dtype=torch.float64))
    else:
        _, (S, _) = linear.recurrent(k, k, v, normalize=False)
    asked = (batch.inputs[:, :, None] == keys[:, None, :]).double().argmax(-1)  # pair of a query
    q = k[:, 0].gather(1, asked[..., None].expand(-1, -1, D))                 # (B, T, D)
    read = q @ S[:, 0]                                                        # q S
    answer = values.gather(1, (read @ table[values].transpose(1, 2)).argmax(-1))
    right, age = (answer == batch.targets)[batch.mask].double(), asked[batch.mask]
    quarter = max(P // 4, 1)
    return {"all": right.mean().item(), "oldest": right[age < quarter].mean().item(),
            "newest": right[age >= P - quarter].mean().item()}


def written_memory_sweep(pairs=(4, 8, 16, 24, 32), D: int = 16) -> dict[int, dict[str, dict]]:
    """:func:`written_memory_recall` for both rules at each pair count."""
    return {P: {rule: written_memory_recall(P, rule, D) for rule in ("additive", "delta")}
            for P in pairs}
