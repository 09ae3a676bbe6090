"""The MQAR generator: correct answers, distinct keys unless configured, determinism, validation."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpt2k3.experiments.mqar import BLANK, IGNORE, MQARBatch, MQARConfig, mqar


def reference_answers(inputs: torch.Tensor, config: MQARConfig) -> torch.Tensor:
    """Targets computed the slow, obvious way: scan the pairs, keep the last value per key."""
    P = config.n_pairs
    out = torch.full_like(inputs, IGNORE)
    for b, row in enumerate(inputs.tolist()):
        table = {}
        for i in range(P):
            table[row[2 * i]] = row[2 * i + 1]  # a later write overwrites an earlier one
        for t in range(2 * P, len(row)):
            if row[t] != BLANK:
                out[b, t] = table[row[t]]
    return out


@settings(max_examples=40, deadline=None)
@given(P=st.integers(1, 12), extra_q=st.integers(0, 12), pad=st.integers(0, 10),
       vocab=st.integers(30, 80), distinct=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_answers_are_the_paired_values(P, extra_q, pad, vocab, distinct, seed):
    Q = max(1, P - extra_q) if distinct else 1 + extra_q
    cfg = MQARConfig(n_pairs=P, vocab_size=vocab, n_queries=Q, seq_len=2 * P + Q + pad,
                     distinct_keys=distinct)
    batch = mqar(cfg, 5, seed=seed)
    assert isinstance(batch, MQARBatch)
    x, y, m = batch
    assert x.shape == y.shape == m.shape == (5, cfg.length)
    assert x.dtype == y.dtype == torch.long and m.dtype == torch.bool
    # layout: keys and values alternate, then Q queries (keys) among blanks
    assert cfg.is_key(x[:, 0:2 * P:2]).all() and cfg.is_value(x[:, 1:2 * P:2]).all()
    tail = x[:, 2 * P:]
    assert torch.equal(m[:, 2 * P:], tail != BLANK) and not m[:, :2 * P].any()
    assert (m.sum(1) == Q).all() and cfg.is_key(tail[tail != BLANK]).all()
    # every scored target is the (latest) value of its key; nothing else is scored
    assert torch.equal(y, reference_answers(x, cfg))
    assert (y[~m] == IGNORE).all() and cfg.is_value(y[m]).all()


def test_keys_are_distinct_and_queries_ask_different_keys():
    cfg = MQARConfig(n_pairs=20, vocab_size=45)  # 22 key tokens for 20 keys: collisions likely if drawn freely
    x, _, m = mqar(cfg, 200, seed=3)
    for row, mask in zip(x, m):
        keys = row[0:40:2]
        assert keys.unique().numel() == 20
        assert row[mask].unique().numel() == 20  # all 20 keys asked once (Q = P by default)


def test_repeated_keys_when_configured_and_the_latest_value_wins():
    cfg = MQARConfig(n_pairs=12, vocab_size=9, distinct_keys=False)  # 4 key tokens, 12 writes
    x, y, m = mqar(cfg, 50, seed=0)
    keys = x[:, 0:24:2]
    assert all(k.unique().numel() < 12 for k in keys)  # pigeonhole: repeats are certain
    assert torch.equal(y, reference_answers(x, cfg))


def test_deterministic_from_the_seed():
    cfg = MQARConfig(n_pairs=6, seq_len=30, n_queries=4)
    a, b, c = mqar(cfg, 8, seed=7), mqar(cfg, 8, seed=7), mqar(cfg, 8, seed=8)
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert not torch.equal(a.inputs, c.inputs)
    torch.manual_seed(123)  # the global RNG plays no part
    assert torch.equal(mqar(cfg, 8, seed=7).inputs, a.inputs)


def test_defaults_and_vocabulary_split():
    cfg = MQARConfig(n_pairs=8, vocab_size=128)
    assert cfg.queries == 8 and cfg.length == 24
    assert cfg.n_key_tokens == 63 and cfg.n_value_tokens == 64
    x, _, _ = mqar(cfg, 64, seed=0)
    assert int(x.max()) < 128 and (x[:, :16] != BLANK).all()


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_pairs=0), "n_pairs"),
    (dict(n_pairs=2.5), "n_pairs"),
    (dict(vocab_size=4), "vocab_size"),
    (dict(n_pairs=40, vocab_size=64), "n_pairs"),  # only 31 key tokens
    (dict(n_pairs=4, n_queries=5), "n_queries"),
    (dict(n_pairs=4, n_queries=0), "n_queries"),
    (dict(n_pairs=4, seq_len=11), "seq_len"),
    (dict(distinct_keys=1), "distinct_keys"),
])
def test_bad_configs_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MQARConfig(**kwargs)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="config"):
        mqar({"n_pairs": 4}, 2)
    with pytest.raises(ValueError, match="n_examples"):
        mqar(MQARConfig(), 0)
    with pytest.raises(ValueError, match="seed"):
        mqar(MQARConfig(), 2, seed=-1)


def test_as_table_lays_out_one_sequence():
    from gpt2k3.experiments.mqar import as_table

    cfg = MQARConfig(n_pairs=2, vocab_size=11, n_queries=1, seq_len=7)
    batch = mqar(cfg, 3, seed=0)
    headers, rows = as_table(batch, cfg, index=1)
    assert headers == ["position", "0", "1", "2", "3", "4", "5", "6"]
    tokens, roles, targets = rows
    assert tokens[1:] == batch.inputs[1].tolist()
    assert roles[1:5] == ["key", "value", "key", "value"]
    assert sorted(roles[5:]) == ["blank", "blank", "query"]
    q = roles.index("query")
    assert targets[q] == batch.targets[1, q - 1].item() and targets.count("") == 6
    with pytest.raises(ValueError, match="index"):
        as_table(batch, cfg, index=3)
