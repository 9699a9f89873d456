"""The README says each thing once: no sentence of its prose is repeated (a merge once left "writes its
figures to `figures/`. Each runs in under a minute…" twice, two lines apart)."""

import re
from collections import Counter
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def prose_sentences(text: str) -> list[str]:
    """The sentences of the paragraphs outside code blocks, tables and headings, whitespace normalised."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    lines = [line for line in text.splitlines() if not line.lstrip().startswith(("|", "#"))]
    prose = " ".join(" ".join(lines).split())
    return [s for s in re.split(r"(?<=[.!?])\s+", prose) if len(s) >= 30]


def test_no_sentence_of_the_readme_is_repeated():
    counts = Counter(prose_sentences(README.read_text(encoding="utf-8")))
    repeated = {sentence: n for sentence, n in counts.items() if n > 1}
    assert not repeated, repeated
