#!/usr/bin/env python3
"""The demo model's corpus: the King James Bible as Debian's bible-kjv package prints it.

    python3 tools/train/corpus.py build     # Debian with bible-kjv: rewrite data/kjv-*.txt*
    python3 tools/train/corpus.py check     # anywhere: verify data/ against data/SHA256SUMS

Source: `bible -l100000 Gen1:1-Rev22:21` (bible-kjv 4.38 with bible-kjv-text 4.38, Debian 12;
-l100000 turns off line wrapping, so the output does not depend on the terminal). Its output is
a heading "Book N" per chapter, a blank line, and one line per verse "  <n> <text>". We keep the
headings (they read as section titles), drop the verse numbers, collapse the few runs of two
spaces inside verses to one and strip trailing spaces; nothing else is changed (the text is
plain ASCII). Every chapter is written as its heading line and one paragraph, its verses joined
by single spaces, so that the text reads as prose:

    Genesis 1
    In the beginning God created the heaven and the earth. And the earth was without form, ...

with one blank line between chapters and a newline at the end of the file. (A paragraph also
suits the Llama-style tokenizer: a word after a newline has no leading space and tokenizes
worse, so line breaks are kept rare. tokenizer.py trains on the verses, one per line.)

Split by books (no chapter is in two parts):
    train    Genesis .. Philemon   (58 books) - training, tokenizer training, AWQ calibration
    valid    Hebrews               (1 book)   - validation loss during training (early stopping)
    heldout  James .. Revelation   (8 books)  - perplexity of fp16 / AWQ / RTN, never trained on

Files (data/): kjv-train.txt.gz (gzip, mtime 0, so the bytes repeat), kjv-valid.txt,
kjv-heldout.txt, and SHA256SUMS with the sha256 of the uncompressed texts (and of
tokenizer.model, written by tokenizer.py). `build` refuses to write text whose structure is not
the expected 66 books / 1189 chapters / 31102 verses.

Licence (Debian's /usr/share/doc/bible-kjv-text/copyright): "The copyright for the King James
Version text of the Bible is expired since the translation was done in 1611"; the program and
packaging are GPL-2+ but only the text is used here. The KJV is public domain in most of the
world; in the United Kingdom the Crown's letters patent still govern its printing.
"""
import gzip
import hashlib
import io
import os
import re
import subprocess
import sys

from util import write_bytes_atomic

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
SPLITS = ("train", "valid", "heldout")
FILES = {"train": "kjv-train.txt.gz", "valid": "kjv-valid.txt", "heldout": "kjv-heldout.txt"}
VALID_BOOKS = ("Hebrews",)
HELDOUT_BOOKS = ("James", "1 Peter", "2 Peter", "1 John", "2 John", "3 John", "Jude", "Revelation")
N_BOOKS, N_CHAPTERS, N_VERSES = 66, 1189, 31102
BIBLE_CMD = ["bible", "-l100000", "Gen1:1-Rev22:21"]

HEAD = re.compile(r"^(\S.*) (\d+)$")
VERSE = re.compile(r"^  (\d+) (\S.*)$")


class CorpusError(Exception):
    """The bible output or a data file is not what this script expects."""


def parse_bible(out):
    """bible's output -> list of (book, chapter, [verse texts]) in order. Checks that chapters
    count 1, 2, ... within a book and verses 1, 2, ... within a chapter."""
    chapters = []
    for ln, line in enumerate(out.split("\n"), 1):
        if line == "":
            continue
        m = HEAD.match(line)
        if m:
            book, ch = m.group(1), int(m.group(2))
            prev = chapters[-1] if chapters else None
            want = prev[1] + 1 if prev and prev[0] == book else 1
            if ch != want:
                raise CorpusError("line %d: chapter %s %d, expected %d" % (ln, book, ch, want))
            chapters.append((book, ch, []))
            continue
        m = VERSE.match(line)
        if not m or not chapters:
            raise CorpusError("line %d: neither a heading nor a verse: %r" % (ln, line[:80]))
        verses = chapters[-1][2]
        if int(m.group(1)) != len(verses) + 1:
            raise CorpusError("line %d: verse %s, expected %d" % (ln, m.group(1), len(verses) + 1))
        verses.append(re.sub(r" {2,}", " ", m.group(2)).rstrip())
    books = []
    for b, _, _ in chapters:
        if not books or books[-1] != b:
            books.append(b)
    nv = sum(len(v) for _, _, v in chapters)
    if (len(books), len(chapters), nv) != (N_BOOKS, N_CHAPTERS, N_VERSES):
        raise CorpusError("got %d books, %d chapters, %d verses; expected %d, %d, %d" % (
            len(books), len(chapters), nv, N_BOOKS, N_CHAPTERS, N_VERSES))
    if set(VALID_BOOKS + HELDOUT_BOOKS) - set(books):
        raise CorpusError("split books missing from the text: %s" % (set(VALID_BOOKS + HELDOUT_BOOKS) - set(books)))
    return chapters


def chapter_text(book, ch, verses):
    return "%s %d\n%s\n" % (book, ch, " ".join(verses))


def split_texts(chapters):
    """-> {"train": str, "valid": str, "heldout": str}, chapters joined by one blank line."""
    parts = {s: [] for s in SPLITS}
    for book, ch, verses in chapters:
        s = "heldout" if book in HELDOUT_BOOKS else "valid" if book in VALID_BOOKS else "train"
        parts[s].append(chapter_text(book, ch, verses))
    return {s: "\n".join(p) for s, p in parts.items()}


def sha256(b):
    return hashlib.sha256(b).hexdigest()


def gzip_bytes(data):
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as g:
        g.write(data)
    return buf.getvalue()


def read_sums(data_dir=DATA):
    sums = {}
    path = os.path.join(data_dir, "SHA256SUMS")
    if os.path.exists(path):
        for line in open(path, encoding="ascii"):
            h, name = line.split()
            sums[name] = h
    return sums


def write_sums(sums, data_dir=DATA):
    body = "".join("%s  %s\n" % (sums[k], k) for k in sorted(sums))
    write_bytes_atomic(os.path.join(data_dir, "SHA256SUMS"), body.encode("ascii"))


def build(data_dir=DATA):
    try:
        out = subprocess.run(BIBLE_CMD, check=True, capture_output=True).stdout
    except FileNotFoundError:
        raise CorpusError("the `bible` program is missing: apt-get install -y bible-kjv")
    texts = split_texts(parse_bible(out.decode("ascii")))
    os.makedirs(data_dir, exist_ok=True)
    sums = read_sums(data_dir)
    for s in SPLITS:
        raw = texts[s].encode("ascii")
        name = FILES[s]
        write_bytes_atomic(os.path.join(data_dir, name), gzip_bytes(raw) if name.endswith(".gz") else raw)
        sums[name.replace(".gz", "")] = sha256(raw)
        print("%-8s %-18s %9d bytes %6d lines sha256 %s" % (s, name, len(raw), raw.count(b"\n"), sha256(raw)[:16]))
    write_sums(sums, data_dir)


def load(split, data_dir=DATA):
    """The text of one split (str), checked against SHA256SUMS."""
    name = FILES[split]
    with open(os.path.join(data_dir, name), "rb") as f:
        raw = f.read()
    if name.endswith(".gz"):
        raw = gzip.decompress(raw)
    want = read_sums(data_dir).get(name.replace(".gz", ""))
    if want is None or sha256(raw) != want:
        raise CorpusError("%s: sha256 %s does not match SHA256SUMS (%s)" % (name, sha256(raw), want))
    return raw.decode("ascii")


def check(data_dir=DATA):
    for s in SPLITS:
        t = load(s, data_dir)
        print("%-8s ok %8d bytes %5d chapters" % (s, len(t), t.count("\n\n") + 1))


def main(argv):
    if len(argv) != 2 or argv[1] not in ("build", "check"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 1
    try:
        build() if argv[1] == "build" else check()
    except CorpusError as e:
        print("corpus.py: %s" % e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
