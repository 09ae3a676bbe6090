r"""A real corpus for chapter 11: the King James Bible, byte by byte.

The text comes from Debian's ``bible-kjv`` package (``apt-get install bible-kjv``; it pulls in
``bible-kjv-text``), whose ``bible`` program prints any range of verses. ``bible
"gen1:1-rev22:21"`` prints all of it, about 4.3 MB, in a few hundredths of a second:

.. code-block:: text

    <blank line>
    Genesis 1
    <blank line>
      1 In the beginning God created the heaven and the earth.
      2 And the earth was without form, and void; and darkness was upon the face of
    the deep. And the Spirit of God moved upon the face of the waters.

-- one heading line per chapter (``"Genesis 1"``, ``"1 Samuel 3"``, ``"Song of Solomon 2"``)
between blank lines, and numbered verses wrapped over lines. The translation dates from 1611;
its copyright has long expired (``/usr/share/doc/bible-kjv/copyright``), so the corpus can be
used, and quoted in the book, freely. ``scripts/setup_env.sh`` installs the package when the
program is missing. Nothing is cached on disk: the program is fast, so :func:`load_kjv` runs it
once per process and keeps the parsed books in memory.

**Documents.** :func:`parse_bible` turns the program's output into the 66 books
(:class:`Book`), each a document of verse text, one verse per line: the wrapped lines of a
verse are joined with a space, and the verse numbers and chapter headings are dropped. Both
are bookkeeping, not prose; a byte-level model would spend much of its capacity predicting
the digits ``1, 2, 3, ...`` and the book names, which say nothing about the language. Books
are joined with one blank line between them (:func:`join_books`).

**Split.** A fixed, deterministic split by book: :data:`VALIDATION_BOOKS` -- Ruth, Ecclesiastes,
Daniel and Jonah from the Old Testament (narrative, wisdom, apocalyptic, a short prophetic
tale), John, Galatians and James from the New (a gospel, two letters) -- are held out, about
5 % of the bytes; the other 59 books train. Holding out whole books, not random verses,
measures how well a model writes text it has not seen rather than how well it remembers
neighbouring verses. (John is chosen over the synoptic gospels on purpose: Mark's verses
reappear nearly word for word in Matthew and Luke, which would leak into the validation set.)

**Bytes, not tokens.** The models read UTF-8 bytes (:data:`VOCAB_SIZE` = 256; this text is pure
ASCII, so a byte is a character). No tokenizer has to be downloaded or trained, so everything
runs offline and in Colab unchanged; the embedding table is small (256 rows), so at a small
parameter budget the parameters go into the mixers being compared rather than into a 50,257-row
vocabulary; and the loss in **bits per byte** does not depend on any tokenizer's choices, so
it compares models -- and corpora -- directly.

:func:`sample_batch` draws training windows with an explicit :class:`torch.Generator` (the same
generator state gives the same batch); :func:`eval_windows` cuts fixed, evenly spaced windows for
evaluation.

**Repeats.** The Bible repeats itself: refrains (*vanity and vexation of spirit*), formulas
(*her mother in law said unto her*), whole verses. :func:`find_repeats` finds the stretches
of a byte stream that occur verbatim a second time within one window of text, the material
of chapter 11's test of whether a model reads far back in its context.
"""

from __future__ import annotations

import bisect
import functools
import operator
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from gpt2k3.checks import check_positive_int, check_positive_number, is_int

__all__ = ["BIBLE_PROGRAM", "KJV_RANGE", "INSTALL_HINT", "BOOKS", "OLD_TESTAMENT", "NEW_TESTAMENT",
           "VALIDATION_BOOKS", "VOCAB_SIZE", "Book", "Split", "KJVData", "find_bible", "dump_kjv",
           "parse_bible", "load_kjv", "split_books", "join_books", "encode", "decode",
           "kjv_data", "sample_batch", "eval_windows", "corpus_stats", "ngram_bits",
           "ngram_window_bits", "Repeat", "find_repeats"]

#: The program that prints the text (Debian package ``bible-kjv``).
BIBLE_PROGRAM = "bible"
#: The whole Bible, first verse to last, as the program's argument.
KJV_RANGE = "gen1:1-rev22:21"
#: What to do when the program is missing.
INSTALL_HINT = ("install Debian's bible-kjv package: `sudo apt-get install bible-kjv` "
                "(scripts/setup_env.sh does it; in Colab: `!apt-get install -y bible-kjv`)")
#: Byte-level vocabulary.
VOCAB_SIZE = 256

#: The 66 books in the order the program prints them (the KJV's order).
BOOKS = (
    "Genesis", "Exodus", "Leviticus", "Numbers", "Deuteronomy", "Joshua", "Judges", "Ruth",
    "1 Samuel", "2 Samuel", "1 Kings", "2 Kings", "1 Chronicles", "2 Chronicles", "Ezra",
    "Nehemiah", "Esther", "Job", "Psalms", "Proverbs", "Ecclesiastes", "Song of Solomon",
    "Isaiah", "Jeremiah", "Lamentations", "Ezekiel", "Daniel", "Hosea", "Joel", "Amos",
    "Obadiah", "Jonah", "Micah", "Nahum", "Habakkuk", "Zephaniah", "Haggai", "Zechariah",
    "Malachi",
    "Matthew", "Mark", "Luke", "John", "Acts", "Romans", "1 Corinthians", "2 Corinthians",
    "Galatians", "Ephesians", "Philippians", "Colossians", "1 Thessalonians",
    "2 Thessalonians", "1 Timothy", "2 Timothy", "Titus", "Philemon", "Hebrews", "James",
    "1 Peter", "2 Peter", "1 John", "2 John", "3 John", "Jude", "Revelation",
)
OLD_TESTAMENT = BOOKS[:39]
NEW_TESTAMENT = BOOKS[39:]
#: The held-out books (a fixed choice spanning both testaments; see the module docstring).
VALIDATION_BOOKS = ("Ruth", "Ecclesiastes", "Daniel", "Jonah", "John", "Galatians", "James")

_HEADING = re.compile(r"(?P<book>\S.*\S|\S) (?P<chapter>\d+)")
_VERSE = re.compile(r"  (?P<number>\d+) (?P<text>.*)")


@dataclass(frozen=True)
class Book:
    """One book: its ``name``, number of ``chapters`` and its ``verses`` (text only, in order)."""

    name: str
    chapters: int
    verses: tuple[str, ...]

    @property
    def testament(self) -> str:
        """``"old"`` or ``"new"``."""
        return "old" if self.name in OLD_TESTAMENT else "new"

    @property
    def text(self) -> str:
        """The document: one verse per line, each line ending in a newline."""
        return "".join(v + "\n" for v in self.verses)


@dataclass(frozen=True)
class Split:
    """Books for training and for validation (each in the order of the corpus)."""

    train: tuple[Book, ...]
    validation: tuple[Book, ...]

    @property
    def train_text(self) -> str:
        return join_books(self.train)

    @property
    def validation_text(self) -> str:
        return join_books(self.validation)


@dataclass(frozen=True)
class KJVData:
    """The encoded corpus: ``train`` and ``validation`` byte streams (``uint8`` tensors)."""

    split: Split
    train: torch.Tensor
    validation: torch.Tensor


def find_bible(program: str | None = None) -> str:
    """The path of the ``bible`` program (``program``: a name on ``PATH`` or a path; default
    :data:`BIBLE_PROGRAM`). ``ValueError`` saying how to install it when it is missing."""
    name = BIBLE_PROGRAM if program is None else program
    if not isinstance(name, str) or not name:
        raise ValueError(f"program must be None or a program name or path, got {program!r}")
    path = shutil.which(name)
    if path is None:
        raise ValueError(f"the King James Bible needs the `{name}` program, which was not found; "
                         f"{INSTALL_HINT}")
    return path


def dump_kjv(program: str | None = None, verses: str = KJV_RANGE) -> str:
    """What ``bible <verses>`` prints (by default the whole Bible), as text."""
    if not isinstance(verses, str) or not verses:
        raise ValueError(f"verses must be a non-empty range such as {KJV_RANGE!r}, got {verses!r}")
    path = find_bible(program)
    try:
        done = subprocess.run([path, verses], capture_output=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ValueError(f"running `{path} {verses}` failed ({err}); {INSTALL_HINT}") from None
    if done.returncode != 0:
        raise ValueError(f"`{path} {verses}` exited with status {done.returncode}: "
                         f"{done.stderr.decode(errors='replace').strip()}")
    try:
        return done.stdout.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"`{path}` printed text that is not UTF-8 ({err})") from None


def parse_bible(raw: str) -> tuple[Book, ...]:
    """The books in the ``bible`` program's output (see the module docstring for its format).

    A heading is a line between blank lines of the form ``"<book> <chapter>"``, with a book of
    :data:`BOOKS`; a verse starts with two spaces and its number; any other non-blank line
    continues the verse before it. Verse numbers and headings are dropped, a verse's wrapped
    lines joined by one space. Anything else -- text before the first heading, an unknown
    book, a book that comes back after another, a chapter with no verse -- is a
    ``ValueError``: it means the program's format is not the one this parser reads.
    """
    if not isinstance(raw, str):
        raise ValueError(f"raw must be the program's output as a str, got {type(raw).__name__}")
    lines = raw.split("\n")
    books: list[dict] = []
    verse: list[str] | None = None

    def close_verse():
        nonlocal verse
        if verse is not None:
            books[-1]["verses"].append(" ".join(verse))
            verse = None

    for i, line in enumerate(lines):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        before = i == 0 or not lines[i - 1].strip()
        after = i + 1 == len(lines) or not lines[i + 1].strip()
        heading = _HEADING.fullmatch(line) if before and after else None
        if heading:
            close_verse()
            name = heading.group("book")
            if name not in BOOKS:
                raise ValueError(f"line {i + 1}: {line!r} is a chapter heading of an unknown book "
                                 f"{name!r}")
            if not books or books[-1]["name"] != name:
                if any(b["name"] == name for b in books):
                    raise ValueError(f"line {i + 1}: book {name!r} starts again after another book")
                books.append({"name": name, "chapters": 0, "verses": []})
            elif books[-1]["empty"]:
                raise ValueError(f"line {i + 1}: the chapter before {line!r} has no verse")
            books[-1]["chapters"] += 1
            books[-1]["empty"] = True
            continue
        if not books:
            raise ValueError(f"line {i + 1}: {line!r} comes before the first chapter heading")
        m = _VERSE.fullmatch(line)
        if m:
            close_verse()
            verse = [m.group("text").strip()]
            books[-1]["empty"] = False
        elif verse is not None:
            verse.append(line.strip())
        else:
            raise ValueError(f"line {i + 1}: {line!r} is neither a verse nor part of one")
    if books:
        close_verse()
        if books[-1]["empty"]:
            raise ValueError("the last chapter has no verse")
    if not books:
        raise ValueError("raw holds no chapter heading: not the output of the bible program")
    return tuple(Book(b["name"], b["chapters"], tuple(b["verses"])) for b in books)


@functools.lru_cache(maxsize=4)
def _load(path: str) -> tuple[Book, ...]:
    return parse_bible(dump_kjv(path))


def load_kjv(program: str | None = None) -> tuple[Book, ...]:
    """The 66 books of the King James Bible, parsed from ``bible "gen1:1-rev22:21"``.

    Runs the program once per process (per program path) and keeps the books in memory.
    ``ValueError`` with install instructions when the program is missing.
    """
    books = _load(find_bible(program))
    return books


def split_books(books: Sequence[Book], validation: Iterable[str] = VALIDATION_BOOKS) -> Split:
    """The fixed split by book: the books named in ``validation`` held out, the rest to train.

    Deterministic (no randomness: the same books give the same split). ``ValueError`` if a
    validation book is not among ``books`` or no book is left to train on.
    """
    books = tuple(books)
    if not books or not all(isinstance(b, Book) for b in books):
        raise ValueError("books must be a non-empty sequence of Book (from parse_bible)")
    if isinstance(validation, str):
        raise ValueError(f"validation must be a sequence of book names, got the string {validation!r}")
    held = tuple(validation)
    names = [b.name for b in books]
    missing = [v for v in held if v not in names]
    if missing or not held:
        raise ValueError(f"validation must name books of the corpus, got {list(held)}"
                         + (f" ({missing} not found)" if missing else ""))
    train = tuple(b for b in books if b.name not in held)
    if not train:
        raise ValueError("validation holds every book: nothing is left to train on")
    return Split(train=train, validation=tuple(b for b in books if b.name in held))


def join_books(books: Iterable[Book]) -> str:
    """The books' texts in order, a blank line between one book and the next."""
    books = list(books)
    if not all(isinstance(b, Book) for b in books):
        raise ValueError("books must be Book objects (from parse_bible)")
    return "\n".join(b.text for b in books)


def encode(text: str, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """The UTF-8 bytes of ``text`` as a 1-D tensor of ids in ``[0, 256)``."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    if dtype not in (torch.uint8, torch.int32, torch.int64):
        raise ValueError(f"dtype must be torch.uint8, torch.int32 or torch.int64, got {dtype}")
    data = text.encode("utf-8")
    if not data:
        return torch.empty(0, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dtype)


def decode(ids) -> str:
    """Text from byte ids (a 1-D tensor or a sequence of ints in ``[0, 256)``); a sequence cut
    inside a multi-byte character decodes it as U+FFFD."""
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 1 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise ValueError(f"ids must be a 1-D integer tensor, got {ids.dtype} of shape "
                             f"{tuple(ids.shape)}")
        ids = ids.tolist()
    try:
        values = [operator.index(i) for i in ids]
    except TypeError:
        raise ValueError("ids must be a 1-D tensor or a sequence of ints") from None
    if any(not 0 <= i < VOCAB_SIZE for i in values):
        raise ValueError(f"ids must be byte values in [0, {VOCAB_SIZE})")
    return bytes(values).decode("utf-8", errors="replace")


def kjv_data(program: str | None = None, validation: Iterable[str] = VALIDATION_BOOKS) -> KJVData:
    """The corpus split and encoded: ``uint8`` byte streams of the training and validation books."""
    split = split_books(load_kjv(program), validation)
    return KJVData(split=split, train=encode(split.train_text, torch.uint8),
                   validation=encode(split.validation_text, torch.uint8))


def _check_stream(data, block_size: int, name: str = "data") -> torch.Tensor:
    if not isinstance(data, torch.Tensor) or data.dim() != 1 or data.dtype.is_floating_point:
        raise ValueError(f"{name} must be a 1-D integer tensor of byte ids, got "
                         f"{getattr(data, 'dtype', type(data).__name__)}")
    block_size = check_positive_int(block_size, "block_size")
    if data.numel() < block_size + 1:
        raise ValueError(f"{name} holds {data.numel()} bytes, fewer than block_size + 1 = "
                         f"{block_size + 1}")
    return data


def sample_batch(data: torch.Tensor, batch_size: int, block_size: int,
                 generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)``, each ``(batch_size, block_size)`` int64: windows of ``data`` starting at
    positions drawn uniformly with ``generator``, and the same windows shifted by one byte
    (the next-byte targets). The same generator state gives the same batch."""
    _check_stream(data, block_size)
    batch_size = check_positive_int(batch_size, "batch_size")
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    starts = torch.randint(0, data.numel() - block_size, (batch_size,), generator=generator)
    offsets = torch.arange(block_size + 1)
    rows = data[starts[:, None] + offsets].long()
    return rows[:, :-1], rows[:, 1:]


def eval_windows(data: torch.Tensor, block_size: int, n_windows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)``, each ``(n_windows, block_size)`` int64: fixed windows of ``data`` whose starts
    are spread evenly from the first byte to the last possible start (no randomness). They do
    not overlap when ``data`` is long enough, ``n_windows * (block_size + 1)`` bytes or more."""
    _check_stream(data, block_size)
    n_windows = check_positive_int(n_windows, "n_windows")
    last = data.numel() - block_size - 1
    starts = torch.tensor([round(i * last / max(1, n_windows - 1)) for i in range(n_windows)])
    if n_windows == 1:
        starts = torch.zeros(1, dtype=torch.long)
    rows = data[starts[:, None] + torch.arange(block_size + 1)].long()
    return rows[:, :-1], rows[:, 1:]


def corpus_stats(split: Split) -> dict:
    """Sizes of a split, JSON-ready: books, verses and bytes per side, and the held-out names."""
    if not isinstance(split, Split):
        raise ValueError(f"split must be a Split, got {type(split).__name__}")

    def side(books):
        return {"books": len(books), "verses": sum(len(b.verses) for b in books),
                "bytes": len(join_books(books).encode("utf-8")),
                "old_testament": sum(b.testament == "old" for b in books),
                "new_testament": sum(b.testament == "new" for b in books)}

    return {"train": side(split.train), "validation": side(split.validation),
            "validation_books": [b.name for b in split.validation]}


def _keys(data: torch.Tensor, order: int) -> torch.Tensor:
    """Every window of ``order`` bytes as one integer (base 256), ``(len - order + 1,)``."""
    keys = torch.zeros(data.numel() - order + 1, dtype=torch.long)
    for j in range(order):
        keys = keys * VOCAB_SIZE + data[j:data.numel() - order + 1 + j].long()
    return keys


def ngram_bits(train: torch.Tensor, validation: torch.Tensor, order: int, alpha: float = 0.01) -> float:
    """Bits per byte of a byte n-gram model on ``validation``: the probability of each byte given
    the ``order - 1`` bytes before it, counted in ``train`` with add-``alpha`` smoothing,
    ``(c(context, byte) + alpha) / (c(context) + 256 alpha)``. Scored from the ``order``-th
    validation byte on. ``order=1`` is the byte frequencies, 2 a bigram table, 3 a trigram table:
    the level a model reaches by knowing only the last ``order - 1`` bytes."""
    if not is_int(order) or not 1 <= order <= 4:
        raise ValueError(f"order must be an int in [1, 4], got {order!r}")
    check_positive_number(alpha, "alpha")
    for name, d in (("train", train), ("validation", validation)):
        if not isinstance(d, torch.Tensor) or d.dim() != 1 or d.dtype.is_floating_point:
            raise ValueError(f"{name} must be a 1-D integer tensor of byte ids")
        if d.numel() < order:
            raise ValueError(f"{name} holds {d.numel()} bytes, fewer than order = {order}")

    return ngram_score(train, _keys(validation, order), order, alpha)


def ngram_score(train: torch.Tensor, val: torch.Tensor, order: int, alpha: float) -> float:
    """Mean bits of the ``order``-byte keys ``val`` under the add-``alpha`` table of ``train``:
    each byte costs ``-log2 (c(context, byte) + alpha) / (c(context) + 256 alpha)``, with ``c``
    counting the windows of ``order`` and ``order - 1`` bytes of ``train``."""

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
    return float(-torch.log2(p).mean())


def ngram_window_bits(train: torch.Tensor, windows: tuple[torch.Tensor, torch.Tensor], order: int,
                      alpha: float = 0.01) -> float:
    """:func:`ngram_bits` scored on the targets of evaluation windows (:func:`eval_windows`), the
    bytes the models are scored on, rather than on the whole validation stream.

    ``windows`` is ``(x, y)``, each ``(N, L)``, with ``y`` the bytes after ``x``. Each window's
    bytes ``x[:, 0], y[:, 0], ..., y[:, -1]`` are one row; its targets are scored from the
    ``order``-th byte of the row on, given the ``order - 1`` bytes before each inside the row (so
    a trigram table skips each window's first target, which has one byte before it). Equal to
    the mean of :func:`ngram_bits` over the rows, with the table counted once."""
    if not is_int(order) or not 1 <= order <= 4:
        raise ValueError(f"order must be an int in [1, 4], got {order!r}")
    check_positive_number(alpha, "alpha")
    if not isinstance(train, torch.Tensor) or train.dim() != 1 or train.dtype.is_floating_point \
            or train.numel() < order:
        raise ValueError(f"train must be a 1-D integer tensor of at least order = {order} byte ids")
    try:
        x, y = windows
    except (TypeError, ValueError):
        raise ValueError("windows must be a pair (x, y) of (N, L) integer tensors") from None
    for name, d in (("windows[0]", x), ("windows[1]", y)):
        if not isinstance(d, torch.Tensor) or d.dim() != 2 or d.dtype.is_floating_point or d.numel() == 0:
            raise ValueError(f"{name} must be a non-empty (N, L) integer tensor of byte ids")
    if x.shape != y.shape or not torch.equal(x[:, 1:], y[:, :-1]):
        raise ValueError("windows must be (x, y) of one shape with y the bytes after x (y[:, :-1] == x[:, 1:])")
    rows = torch.cat([x[:, :1], y], dim=1).long()
    if rows.shape[1] < order:
        raise ValueError(f"windows of {x.shape[1]} targets are too short for order = {order}")
    keys = torch.cat([_keys(row, order) for row in rows])
    return ngram_score(train, keys, order, alpha)


@dataclass(frozen=True)
class Repeat:
    """A stretch of ``length`` bytes at ``second`` that equals the one at ``first`` (earlier)."""

    first: int
    second: int
    length: int

    @property
    def distance(self) -> int:
        """How far back the earlier copy starts: ``second - first`` bytes."""
        return self.second - self.first

    @property
    def span(self) -> int:
        """Bytes from the earlier copy's first byte to the later copy's last: the window that
        holds both."""
        return self.second + self.length - self.first


def find_repeats(data: torch.Tensor, min_length: int = 32, window: int = 2048) -> list[Repeat]:
    """The verbatim repeats of ``data`` (a 1-D byte stream) that fit in one ``window``.

    Scanning from the start, a position begins a repeat when the ``min_length`` bytes from it
    occurred before, ending at least ``min_length`` bytes earlier (the copies do not overlap)
    and close enough that both fit in ``window`` bytes; the most recent such copy is taken and
    the match extended byte by byte while it holds, the copies do not overlap and both still
    fit (``span <= window``). The scan resumes after the repeat. A repeat is kept only if its
    earlier copy is a *first* occurrence: none of its ``min_length``-byte pieces occurred in
    the ``window`` bytes before it. So the earlier copy is read with no copy of itself in view
    and the later one with at least one: the pair a model's memory can be tested on.
    Deterministic; pure Python over the bytes (a fraction of a second for the validation books).
    """
    if not isinstance(data, torch.Tensor) or data.dim() != 1 or data.dtype.is_floating_point:
        raise ValueError("data must be a 1-D integer tensor of byte ids")
    n = check_positive_int(min_length, "min_length")
    window = check_positive_int(window, "window")
    if window < 2 * n:
        raise ValueError(f"window must hold two copies of min_length = {n} bytes, got {window}")
    b = bytes(data.tolist()) if data.numel() else b""
    starts: dict[bytes, list[int]] = {}
    for i in range(len(b) - n + 1):
        starts.setdefault(b[i:i + n], []).append(i)

    def copy_before(i: int, reach: int) -> int | None:
        """The most recent start of ``b[i:i+n]`` ending before ``i`` and starting within
        ``reach`` bytes of it, if any."""
        earlier = starts[b[i:i + n]]
        for j in reversed(earlier[:bisect.bisect_left(earlier, i)]):
            if i - j > reach:
                return None
            if i - j >= n:
                return j
        return None

    out, i = [], 0
    while i <= len(b) - n:
        j = copy_before(i, window - n)
        if j is None:
            i += 1
            continue
        length = n
        while (i + length < len(b) and j + length < i and i + length + 1 - j <= window
               and b[i + length] == b[j + length]):
            length += 1
        if all(copy_before(t, window) is None for t in range(j, j + length - n + 1)):
            out.append(Repeat(first=j, second=i, length=length))
        i += length
    return out
