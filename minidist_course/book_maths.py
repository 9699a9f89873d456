"""Maths in the lessons' Markdown typeset at build time, as MathML (no script, no network: browsers draw it).

The book finds the maths in a Markdown cell itself, by pandoc's rules for dollars, so that prices are
not maths: ``$$ ... $$`` and ``\\[ ... \\]`` are display maths; ``$ ... $`` is inline maths only when the
opening ``$`` has a non-space character on its right and the next ``$`` a non-space character on its left
and no digit right after it ("$4.6M ... $1.50" stays text); ``\\( ... \\)`` is inline maths; ``\\$`` is a
dollar. Code (fenced blocks and backtick spans) is left as it is. Each formula is replaced by a
placeholder (letters and digits, which Markdown leaves alone); after nbconvert has made the page,
``fill`` puts the MathML (latex2mathml, the ``[notebook]`` extra) where the placeholders are. Dollars that
are not maths become ``&#36;``, which no Markdown maths extension pairs up.
"""

from __future__ import annotations

import re

CODE = re.compile(r"(^|\n)(```|~~~).*?(\n\2[^\n]*(?=\n|$)|$)|(`+)[^`].*?\4", re.S)
DISPLAY = re.compile(r"\$\$(.+?)\$\$|\\\[(.+?)\\\]", re.S)
INLINE_LATEX = re.compile(r"\\\((.+?)\\\)", re.S)


def _inline_dollars(text: str, formulas: list[tuple[str, bool]]) -> str:
    """Replace pandoc-style ``$x$`` in ``text`` (no code in it) by placeholders; other dollars by &#36;."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\" and text.startswith("\\$", i):
            out.append("&#36;")
            i += 2
            continue
        if c == "$" and i + 1 < len(text) and not text[i + 1].isspace():
            j = i + 1
            while j < len(text):
                if text[j] == "\\":
                    j += 2
                    continue
                if text[j] == "$":                       # inline maths holds no other dollar
                    if text[j - 1].isspace() or text[j + 1:j + 2].isdigit():
                        j = len(text)
                    break
                if text.startswith("\n\n", j):           # inline maths never crosses a paragraph
                    j = len(text)
                    break
                j += 1
            if j < len(text):
                out.append(_placeholder(text[i + 1:j], False, formulas))
                i = j + 1
                continue
            out.append("&#36;")
            i += 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _placeholder(latex: str, display: bool, formulas: list[tuple[str, bool]]) -> str:
    formulas.append((latex.strip(), display))
    return f"MINIDISTMATH{len(formulas) - 1}X"


def extract(markdown: str, formulas: list[tuple[str, bool]]) -> str:
    """``markdown`` with each formula replaced by a placeholder; its (latex, display) appended to ``formulas``
    (display maths first, then inline maths)."""
    pieces, start = [], 0
    for code in CODE.finditer(markdown):
        pieces.append((markdown[start:code.start()], False))
        pieces.append((code.group(0), True))
        start = code.end()
    pieces.append((markdown[start:], False))
    out = []
    for text, is_code in pieces:
        if not is_code:
            text = DISPLAY.sub(lambda m: _placeholder(m.group(1) or m.group(2), True, formulas), text)
            text = INLINE_LATEX.sub(lambda m: _placeholder(m.group(1), False, formulas), text)
            text = _inline_dollars(text, formulas)
        out.append(text)
    return "".join(out)


def fill(page: str, formulas: list[tuple[str, bool]]) -> str:
    """``page`` (HTML) with each placeholder replaced by its formula's MathML."""
    from latex2mathml.converter import convert

    def mathml(m: re.Match) -> str:
        latex, display = formulas[int(m.group(1))]
        return convert(latex, display="block" if display else "inline")

    return re.sub(r"MINIDISTMATH(\d+)X", mathml, page)
