"""The corpus module: parsing the bible program's output, the fixed split, bytes, batches."""

import math
import shutil
import stat

import pytest
import torch

from gpt2k3.experiments import corpus as text

# A few chapters in the program's format: a heading between blank lines, numbered verses
# indented by two spaces, long verses wrapped onto unindented lines.
SMALL = """
Genesis 1

  1 In the beginning God created the heaven and the earth.
  2 And the earth was without form, and void; and darkness was upon the face of
the deep. And the Spirit of God moved upon the face of the waters.

Genesis 2

  1 Thus the heavens and the earth were finished, and all the host of them.

Ruth 1

  1 Now it came to pass in the days when the judges ruled, that there was a
famine in the land.
  2 And the name of the man was Elimelech.

John 1

  1 In the beginning was the Word, and the Word was with God, and the Word was
God.
  10 He was in the world, and the world was made by him, and the world knew him
not.
"""


def test_parse_books_verses_and_wrapping():
    books = text.parse_bible(SMALL)
    assert [b.name for b in books] == ["Genesis", "Ruth", "John"]
    assert [b.chapters for b in books] == [2, 1, 1]
    gen = books[0]
    assert gen.verses == (
        "In the beginning God created the heaven and the earth.",
        "And the earth was without form, and void; and darkness was upon the face of the deep. "
        "And the Spirit of God moved upon the face of the waters.",
        "Thus the heavens and the earth were finished, and all the host of them.")
    assert books[2].verses[1].endswith("knew him not.")
    # verse numbers and chapter headings are gone; one verse per line
    assert books[1].text == ("Now it came to pass in the days when the judges ruled, that there "
                             "was a famine in the land.\nAnd the name of the man was Elimelech.\n")
    assert "Genesis" not in gen.text and "  1 " not in gen.text
    assert [b.testament for b in books] == ["old", "old", "new"]


def test_parse_accepts_windows_line_ends_and_no_leading_blank():
    books = text.parse_bible(SMALL.lstrip("\n").replace("\n", "\r\n"))
    assert books == text.parse_bible(SMALL)


@pytest.mark.parametrize("raw, match", [
    ("  1 a verse before any heading\n", "before the first chapter heading"),
    ("\nGenesis 1\n\n", "no verse"),
    ("\nGenesis 1\n\n\nGenesis 2\n\n  1 x\n", "has no verse"),
    ("\nMordor 1\n\n  1 x\n", "unknown book"),
    ("\nGenesis 1\n\n  1 x\n\nRuth 1\n\n  1 y\n\nGenesis 2\n\n  1 z\n", "starts again"),
    ("", "no chapter heading"),
])
def test_parse_rejects_other_formats(raw, match):
    with pytest.raises(ValueError, match=match):
        text.parse_bible(raw)


def test_parse_rejects_non_text():
    with pytest.raises(ValueError, match="raw must be"):
        text.parse_bible(b"Genesis 1")


def test_split_is_fixed_and_deterministic():
    books = text.parse_bible(SMALL)
    a = text.split_books(books, ("Ruth", "John"))
    b = text.split_books(list(books), ["Ruth", "John"])
    assert a == b
    assert [x.name for x in a.train] == ["Genesis"]
    assert [x.name for x in a.validation] == ["Ruth", "John"]
    assert a.validation_text == books[1].text + "\n" + books[2].text
    assert not set(a.train_text.splitlines()) & set(a.validation_text.splitlines()) - {""}


@pytest.mark.parametrize("validation, match", [
    (("Ruth", "Jude"), "not found"), ((), "must name books"), ("Ruth", "string"),
    (("Genesis", "Ruth", "John"), "nothing is left"),
])
def test_split_rejects_bad_validation_sets(validation, match):
    with pytest.raises(ValueError, match=match):
        text.split_books(text.parse_bible(SMALL), validation)


def test_the_held_out_books_span_both_testaments():
    assert len(text.BOOKS) == 66 and len(set(text.BOOKS)) == 66
    assert len(text.OLD_TESTAMENT) == 39 and len(text.NEW_TESTAMENT) == 27
    assert set(text.VALIDATION_BOOKS) <= set(text.BOOKS)
    assert set(text.VALIDATION_BOOKS) & set(text.OLD_TESTAMENT)
    assert set(text.VALIDATION_BOOKS) & set(text.NEW_TESTAMENT)
    assert "Mark" not in text.VALIDATION_BOOKS  # its verses recur in Matthew and Luke


@pytest.mark.parametrize("s", ["In the beginning", "", "naïve café — ✓", "line\nbreak\ttab"])
def test_bytes_round_trip(s):
    ids = text.encode(s)
    assert ids.dtype == torch.long and ids.dim() == 1
    assert ids.numel() == len(s.encode("utf-8"))
    assert text.decode(ids) == s
    assert text.decode(ids.tolist()) == s
    assert text.decode(text.encode(s, torch.uint8)) == s


def test_decode_of_a_cut_character_and_bad_ids():
    assert text.decode(text.encode("é")[:1]) == "\ufffd"
    with pytest.raises(ValueError, match="byte values"):
        text.decode([65, 256])
    with pytest.raises(ValueError, match="1-D integer"):
        text.decode(torch.zeros(3))
    with pytest.raises(ValueError, match="must be a str"):
        text.encode(b"bytes")
    with pytest.raises(ValueError, match="dtype"):
        text.encode("x", torch.float32)


def test_batches_follow_the_generator():
    data = text.encode("".join(chr(65 + i % 26) for i in range(500)), torch.uint8)
    x1, y1 = text.sample_batch(data, 4, 16, torch.Generator().manual_seed(3))
    x2, y2 = text.sample_batch(data, 4, 16, torch.Generator().manual_seed(3))
    x3, _ = text.sample_batch(data, 4, 16, torch.Generator().manual_seed(4))
    assert torch.equal(x1, x2) and torch.equal(y1, y2) and not torch.equal(x1, x3)
    assert x1.shape == y1.shape == (4, 16) and x1.dtype == torch.long
    assert torch.equal(x1[:, 1:], y1[:, :-1])  # targets are the next bytes
    with pytest.raises(ValueError, match="generator"):
        text.sample_batch(data, 4, 16, 0)
    with pytest.raises(ValueError, match="fewer than block_size"):
        text.sample_batch(data[:10], 1, 16, torch.Generator())
    with pytest.raises(ValueError, match="batch_size"):
        text.sample_batch(data, 0, 16, torch.Generator())


def test_batches_are_windows_of_the_stream():
    data = torch.arange(200, dtype=torch.long) % 256
    x, y = text.sample_batch(data, 8, 10, torch.Generator().manual_seed(0))
    starts = x[:, 0]
    assert torch.equal(x, starts[:, None] + torch.arange(10))
    assert torch.equal(y, starts[:, None] + 1 + torch.arange(10))
    assert int(starts.max()) + 10 < 200


def test_eval_windows_are_fixed_spread_and_disjoint():
    data = torch.arange(1000, dtype=torch.long) % 256
    x, y = text.eval_windows(torch.arange(1000), 50, 10)
    x2, _ = text.eval_windows(torch.arange(1000), 50, 10)
    assert torch.equal(x, x2) and x.shape == (10, 50)
    starts = x[:, 0].tolist()
    assert starts[0] == 0 and starts[-1] == 1000 - 51
    assert all(b - a >= 51 for a, b in zip(starts, starts[1:]))  # no overlap
    assert torch.equal(y, x + 1)
    assert text.eval_windows(data, 50, 1)[0][0, 0] == 0
    with pytest.raises(ValueError, match="n_windows"):
        text.eval_windows(data, 50, 0)


def _fake_bible(tmp_path, body: str, status: int = 0):
    """A stand-in for the ``bible`` program that prints ``body`` whatever it is asked."""
    (tmp_path / "out.txt").write_text(body)
    script = tmp_path / "bible"
    script.write_text(f"#!/bin/sh\ncat '{tmp_path / 'out.txt'}'\nexit {status}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_a_program_in_the_bible_format_is_loaded_and_split(tmp_path):
    program = _fake_bible(tmp_path, SMALL)
    books = text.load_kjv(program)
    assert [b.name for b in books] == ["Genesis", "Ruth", "John"]
    data = text.kjv_data(program, validation=("Ruth",))
    assert text.decode(data.train) == books[0].text + "\n" + books[2].text
    assert text.decode(data.validation) == books[1].text
    assert data.train.dtype == torch.uint8
    stats = text.corpus_stats(data.split)
    assert stats["validation_books"] == ["Ruth"]
    assert stats["train"]["books"] == 2 and stats["train"]["new_testament"] == 1
    assert stats["validation"]["bytes"] == data.validation.numel()


def test_a_failing_program_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="exited with status 3"):
        text.dump_kjv(_fake_bible(tmp_path, SMALL, status=3))


def test_a_missing_program_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setattr(text, "BIBLE_PROGRAM", "no-such-bible-program")
    with pytest.raises(ValueError, match=r"apt-get install bible-kjv"):
        text.load_kjv()
    with pytest.raises(ValueError, match="not found"):
        text.kjv_data()
    monkeypatch.setattr(text, "BIBLE_PROGRAM", "bible")
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty PATH: the real program is not found
    with pytest.raises(ValueError, match=r"apt-get install bible-kjv"):
        text.dump_kjv()
    with pytest.raises(ValueError, match="program must be"):
        text.find_bible(3)


@pytest.mark.skipif(shutil.which("bible") is None,
                    reason="Debian's bible-kjv is not installed (scripts/setup_env.sh installs it)")
def test_the_real_corpus():
    books = text.load_kjv()
    assert tuple(b.name for b in books) == text.BOOKS
    assert sum(len(b.verses) for b in books) == 31102  # the KJV's verse count
    assert sum(b.chapters for b in books) == 1189
    assert books[0].verses[0] == "In the beginning God created the heaven and the earth."
    assert books[-1].verses[-1] == "The grace of our Lord Jesus Christ be with you all. Amen."
    data = text.kjv_data()
    assert [b.name for b in data.split.validation] == list(text.VALIDATION_BOOKS)
    share = data.validation.numel() / (data.train.numel() + data.validation.numel())
    assert 0.03 < share < 0.1
    assert int(data.train.max()) < 128  # ASCII: a byte is a character
    assert text.kjv_data().split == data.split  # fixed


def test_ngram_baselines_by_hand():
    train = text.encode("abab", torch.uint8)
    val = text.encode("ab", torch.uint8)
    a = 0.5
    # unigram: p(a) = p(b) = (2 + a) / (4 + 256 a)
    assert text.ngram_bits(train, val, 1, a) == pytest.approx(-math.log2((2 + a) / (4 + 256 * a)))
    # bigram: the contexts of "abab" are a, b, a; p(b | a) = (2 + a) / (2 + 256 a), scored once
    assert text.ngram_bits(train, val, 2, a) == pytest.approx(-math.log2((2 + a) / (2 + 256 * a)))
    unseen = text.encode("zz", torch.uint8)  # context never seen: uniform
    assert text.ngram_bits(train, unseen, 2, a) == pytest.approx(8.0)
    stream = text.encode("the cat sat on the mat. " * 20, torch.uint8)
    bits = [text.ngram_bits(stream, stream, n) for n in (1, 2, 3)]
    assert bits[0] > bits[1] > bits[2]  # more context, fewer bits (on text it has counted)
    with pytest.raises(ValueError, match="order"):
        text.ngram_bits(train, val, 0)
    with pytest.raises(ValueError, match="alpha"):
        text.ngram_bits(train, val, 1, 0)


def test_ngram_window_bits_equals_the_tables_on_each_window():
    """Reference: ngram_bits on each window's own bytes, averaged (every window scores as many
    targets); the fast form counts the table once."""
    train = text.encode("In the beginning God created the heaven and the earth. " * 8, torch.uint8)
    val = text.encode("And God said, Let there be light: and there was light. " * 4, torch.uint8)
    windows = text.eval_windows(val, 16, 5)
    rows = torch.cat([windows[0][:, :1], windows[1]], dim=1)
    for order in (1, 2, 3):
        ref = sum(text.ngram_bits(train, row, order) for row in rows) / rows.shape[0]
        assert text.ngram_window_bits(train, windows, order) == pytest.approx(ref, rel=1e-12)
    # one window covering the whole stream is ngram_bits on the stream
    whole = text.eval_windows(val, val.numel() - 1, 1)
    assert text.ngram_window_bits(train, whole, 2) == pytest.approx(text.ngram_bits(train, val, 2))
    x, y = windows
    with pytest.raises(ValueError, match="order"):
        text.ngram_window_bits(train, windows, 5)
    with pytest.raises(ValueError, match="alpha"):
        text.ngram_window_bits(train, windows, 2, alpha=-1)
    with pytest.raises(ValueError, match="windows"):
        text.ngram_window_bits(train, (x, x), 2)  # y is not x shifted
    with pytest.raises(ValueError, match="windows"):
        text.ngram_window_bits(train, x, 2)
    with pytest.raises(ValueError, match="train"):
        text.ngram_window_bits(train.float(), windows, 2)


def test_find_repeats_by_hand():
    a = "the voice of the turtle is heard in our land"        # 44 bytes
    b = "and the fig tree putteth forth her green figs"       # 45 bytes
    s = "Arise, my love, my fair one. " + a + " | " + b + " || " + a + " ... " + b + "."
    stream = text.encode(s, torch.uint8)
    reps = text.find_repeats(stream, 32, 200)
    assert [s[r.second:r.second + r.length] for r in reps] == [" " + a + " ", " " + b]
    for r in reps:  # verbatim, not overlapping, both copies in one window
        assert s[r.first:r.first + r.length] == s[r.second:r.second + r.length]
        assert r.first + r.length <= r.second and r.span <= 200
        assert r.distance == r.second - r.first and r.span == r.second + r.length - r.first
    # a window too short for both copies finds nothing; a longer minimum length neither
    assert text.find_repeats(stream, 32, 80) == []
    assert text.find_repeats(stream, 50, 200) == []


def test_find_repeats_keeps_only_first_occurrences_as_the_earlier_copy():
    a = "the voice of the turtle is heard in our land"
    s = a + " one " + a + " two " + a + " three"
    reps = text.find_repeats(text.encode(s, torch.uint8), 32, 200)
    # the second copy repeats the first; the third repeats the second, which is no first occurrence
    assert len(reps) == 1 and reps[0].first == 0 and reps[0].second == len(a + " one ")


@pytest.mark.parametrize("call, match", [
    (lambda: text.find_repeats("abc"), "data must be"),
    (lambda: text.find_repeats(torch.zeros(10), 4, 16), "data must be"),
    (lambda: text.find_repeats(torch.zeros(10, dtype=torch.long), 0, 16), "min_length"),
    (lambda: text.find_repeats(torch.zeros(10, dtype=torch.long), 8, 15), "window"),
])
def test_find_repeats_rejects_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()
