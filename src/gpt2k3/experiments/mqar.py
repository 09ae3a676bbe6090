r"""Multi-query associative recall (MQAR): the synthetic task of chapter 10.

A sequence first lists ``P`` key-value pairs, then asks for some of the keys again; at every
query the model must output the value that was paired with that key::

    k_1 v_1 k_2 v_2 ... k_P v_P | q_1 q_2 ... q_Q        target at q_j: the value of key q_j

This is the task of Zoology (Arora et al., 2023), which the DeltaNet, Gated DeltaNet and Kimi
Linear papers use to measure in-context recall. Nothing but the sequence itself tells the model
which value goes with which key -- the pairs are drawn afresh for every sequence -- so a model can
only solve it by *storing* the pairs as it reads them and *retrieving* one per query. Softmax
attention keeps every token and can look back at the key; a fixed-size state must hold all
``P`` associations at once, which is what chapter 10 measures.

The vocabulary is split in three: token ``0`` is a blank (filler), keys are drawn from the
tokens ``1 .. n_key_tokens``, values from the rest. Keys within a sequence are distinct unless
``distinct_keys=False``; then a key may be written several times and the answer to a query is
the value written *last* (an overwrite, which the delta rule can do and plain additive linear
attention cannot). Values are drawn independently and uniformly, so two keys may share a value.

A longer ``seq_len`` than the ``2P + Q`` tokens the pairs and queries need spreads the queries
over the query region at random positions, with blanks between them.

:func:`mqar` returns inputs, targets and a loss mask aligned position by position: the model
reads ``inputs[:, :t + 1]`` and must predict ``targets[:, t]``; only positions where ``mask`` is
true (the queries) are scored. Everything is drawn from one ``torch.Generator`` seeded with
``seed``, so a batch is a pure function of its configuration, size and seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from gpt2k3.checks import check_bool, check_instance, check_int, is_int

__all__ = ["BLANK", "IGNORE", "MQARConfig", "MQARBatch", "mqar", "as_table"]

#: The filler token between queries.
BLANK = 0
#: The target at positions that are not scored (``torch.nn.functional.cross_entropy``'s default
#: ``ignore_index``).
IGNORE = -100


@dataclass(frozen=True)
class MQARConfig:
    """The shape of an MQAR sequence.

    Args:
        n_pairs: ``P``, key-value pairs written at the start of each sequence.
        vocab_size: total vocabulary, blank included; keys take ``(vocab_size - 1) // 2`` tokens,
            values the remaining ones.
        n_queries: ``Q``, keys asked for after the pairs (default ``P``: every key once). With
            distinct keys ``Q <= P`` and each query asks for a different key; with repeated keys
            the queries are independent draws among the keys of the sequence.
        seq_len: total length (default ``2P + Q``, the queries back to back). Longer sequences put
            blanks between the queries.
        distinct_keys: ``True`` (default): the ``P`` keys of a sequence are all different.
            ``False``: keys are drawn with replacement, and a query's answer is the latest value
            written under its key.
    """

    n_pairs: int = 8
    vocab_size: int = 128
    n_queries: int | None = None
    seq_len: int | None = None
    distinct_keys: bool = True

    def __post_init__(self):
        P = check_int(self.n_pairs, "n_pairs", 1)
        V = check_int(self.vocab_size, "vocab_size", 5)
        check_bool(self.distinct_keys, "distinct_keys")
        n_keys = (V - 1) // 2
        if self.distinct_keys and P > n_keys:
            raise ValueError(f"n_pairs must be <= {n_keys}, the number of key tokens of a "
                             f"vocab_size={V} vocabulary, when keys are distinct; got {P}")
        if self.n_queries is not None:
            Q = check_int(self.n_queries, "n_queries", 1)
            if self.distinct_keys and Q > P:
                raise ValueError(f"n_queries must be <= n_pairs = {P} (each query asks for a "
                                 f"different key); got {Q}")
        if self.seq_len is not None:
            need = 2 * P + self.queries
            if check_int(self.seq_len, "seq_len", 1) < need:
                raise ValueError(f"seq_len must be >= 2 * n_pairs + n_queries = {need}, "
                                 f"got {self.seq_len}")

    @property
    def queries(self) -> int:
        """``Q``, the number of queries per sequence."""
        return self.n_pairs if self.n_queries is None else self.n_queries

    @property
    def length(self) -> int:
        """Tokens per sequence."""
        return 2 * self.n_pairs + self.queries if self.seq_len is None else self.seq_len

    @property
    def n_key_tokens(self) -> int:
        """Keys are the tokens ``1 .. n_key_tokens``."""
        return (self.vocab_size - 1) // 2

    @property
    def n_value_tokens(self) -> int:
        """Values are the tokens ``n_key_tokens + 1 .. vocab_size - 1``."""
        return self.vocab_size - 1 - self.n_key_tokens

    def is_key(self, tokens: torch.Tensor) -> torch.Tensor:
        return (tokens >= 1) & (tokens <= self.n_key_tokens)

    def is_value(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens > self.n_key_tokens


class MQARBatch(NamedTuple):
    """A batch of MQAR sequences, each tensor ``(B, T)``.

    ``inputs``: token ids. ``targets``: at a query, the value the model must output there;
    :data:`IGNORE` elsewhere. ``mask``: ``True`` exactly at the queries (the scored positions).
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor


def mqar(config: MQARConfig, n_examples: int, seed: int = 0) -> MQARBatch:
    """``n_examples`` MQAR sequences of shape ``config``, drawn from ``torch.Generator`` ``seed``.

    The same ``(config, n_examples, seed)`` always gives the same batch.
    """
    check_instance(config, "config", MQARConfig)
    B = check_int(n_examples, "n_examples", 1)
    seed = check_int(seed, "seed", 0)
    g = torch.Generator().manual_seed(seed)
    P, Q, T = config.n_pairs, config.queries, config.length
    n_keys = config.n_key_tokens

    # keys: the first P of a random permutation (distinct), or P independent draws
    if config.distinct_keys:
        keys = torch.rand(B, n_keys, generator=g).argsort(dim=1)[:, :P] + 1
    else:
        keys = torch.randint(1, n_keys + 1, (B, P), generator=g)
    values = torch.randint(n_keys + 1, config.vocab_size, (B, P), generator=g)

    # the answer to a key is its *last* value: for each pair, is a later pair written to the same key?
    same = keys[:, :, None] == keys[:, None, :]  # (B, P, P): pair i and pair j share a key
    later = torch.ones(P, P, dtype=torch.bool).triu(1)  # j > i
    latest = ~(same & later).any(dim=2)  # (B, P): pair i is the last write to its key
    # queries, each asked through the latest pair of its key: Q different keys in random order,
    # or (with repeated keys) Q independent draws among the distinct keys
    if config.distinct_keys:
        asked = torch.rand(B, P, generator=g).argsort(dim=1)[:, :Q]  # (B, Q): pairs asked for
    else:
        asked = torch.multinomial(latest.double(), Q, replacement=True, generator=g)
    q_keys, q_values = keys.gather(1, asked), values.gather(1, asked)

    # query positions: Q of the T - 2P slots after the pairs, in order
    region = T - 2 * P
    slots = torch.rand(B, region, generator=g).argsort(dim=1)[:, :Q].sort(dim=1).values + 2 * P

    inputs = torch.full((B, T), BLANK, dtype=torch.long)
    inputs[:, 0:2 * P:2], inputs[:, 1:2 * P:2] = keys, values
    inputs.scatter_(1, slots, q_keys)
    targets = torch.full((B, T), IGNORE, dtype=torch.long).scatter_(1, slots, q_values)
    mask = torch.zeros(B, T, dtype=torch.bool).scatter_(1, slots, True)
    return MQARBatch(inputs, targets, mask)


def as_table(batch: MQARBatch, config: MQARConfig, index: int = 0) -> tuple[list[str], list[list]]:
    """One sequence of ``batch`` laid out for :func:`gpt2k3.book.display.md_table`: a column per
    position, rows for the token, its role (key, value, query, blank) and the target."""
    if not isinstance(batch, MQARBatch) or not isinstance(config, MQARConfig):
        raise ValueError("batch must be an MQARBatch and config its MQARConfig")
    if not is_int(index) or not 0 <= index < batch.inputs.shape[0]:
        raise ValueError(f"index must be in [0, {batch.inputs.shape[0]}), got {index!r}")
    tokens, targets, mask = (t[index].tolist() for t in batch)
    P = config.n_pairs
    roles = [("key" if t % 2 == 0 else "value") if t < 2 * P else ("query" if m else "blank")
             for t, m in enumerate(mask)]
    headers = ["position", *[str(t) for t in range(len(tokens))]]
    rows = [["token", *tokens], ["role", *roles],
            ["target", *[y if m else "" for y, m in zip(targets, mask)]]]
    return headers, rows
