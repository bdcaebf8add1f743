#!/usr/bin/env python3
"""Generate the Unicode category tables of the tokenizer in model.c (section "Unicode tables").

Prints C arrays of codepoint ranges for \\p{L} (letters), \\p{N} (numbers) and \\p{P}
(punctuation), from Python's unicodedata. Each entry packs one range as
(first << 11) | (last - first); ranges longer than 2048 codepoints are split.
Entries are sorted by first codepoint, so model.c can binary-search them.

llama.cpp's unicode-data.cpp (as vendored by llama-cpp-python 0.3.36) is Unicode
15.1, which is what Python 3.13's unicodedata has: run it with Python 3.13 and the
three classes agree with llama.cpp for every codepoint. Older Pythons work too
(3.11 = Unicode 14.0) but then the ~5000 codepoints assigned since read as "other".

usage: python3.13 tests/gen_unicode.py > tables.c   (then paste over the tables in model.c)
"""
import sys
import unicodedata

if unicodedata.unidata_version != "15.1.0":
    print("warning: Unicode %s, llama.cpp uses 15.1.0" % unicodedata.unidata_version, file=sys.stderr)

MAX = 0x110000


def ranges(major):
    out, start = [], None
    for c in range(MAX + 1):
        hit = c < MAX and unicodedata.category(chr(c))[0] == major
        if hit and start is None:
            start = c
        if not hit and start is not None:
            out.append((start, c - 1))
            start = None
    return out


def packed(rs):
    out = []
    for a, b in rs:
        while a <= b:
            last = min(b, a + 2047)
            out.append((a << 11) | (last - a))
            a = last + 1
    return out


def emit(name, what, major):
    rs = ranges(major)
    vals = packed(rs)
    print("static const uint32_t %s[%d] = { /* %s: %d ranges */" % (name, len(vals), what, len(rs)))
    line = "    "
    for v in vals:
        item = "0x%x," % v
        if len(line) + len(item) > 110:
            print(line)
            line = "    "
        line += item
    print(line)
    print("};")


print("/* Unicode %s (Python %s unicodedata); entry = first << 11 | (last - first) */"
      % (unicodedata.unidata_version, ".".join(map(str, sys.version_info[:2]))))
emit("tok_letter", "\\p{L}", "L")
emit("tok_number", "\\p{N}", "N")
emit("tok_punct", "\\p{P}", "P")
