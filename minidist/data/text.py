"""Real text without a download: CPython's language reference, as a character-level corpus.

Every CPython installation ships the text of its "help()" topics in ``pydoc_data.topics`` (about 0.46 MB
of English prose and code in Python 3.11: the reference manual's statements, operators, data model...).
``load_text()`` joins the topics in sorted order and makes it a language-modelling corpus:

* a character tokenizer: the vocabulary is the sorted set of characters (103 in 3.11), ``encode(str) ->
  int64 ids``, ``decode(ids) -> str``;
* a fixed split: the first 90 % of the characters train, the last 10 % validate (no rng involved);
* ``windows(split, batch_size, block_size, rng)``: B contiguous windows at offsets drawn from the rng,
  inputs x (B, T) and targets y (B, T) = the same windows shifted by one character;
* ``unigram_loss()``: the validation cross-entropy of the training set's character frequencies, the
  baseline a model must beat to have learnt anything about order (ln V nats would be uniform guessing).
"""

from __future__ import annotations

import numpy as np

from minidist.nn.checks import check_count, check_real


class TextCorpus:
    """A text, its character vocabulary, and its train/validation ids (see the module docstring)."""

    def __init__(self, text: str, val_fraction: float = 0.1):
        if not text:
            raise ValueError("TextCorpus needs a non-empty text")
        if not 0.0 < check_real(val_fraction, "val_fraction") < 1.0:
            raise ValueError(f"val_fraction must lie in (0, 1), got {val_fraction}")
        self.text = text
        self.chars = sorted(set(text))
        self.vocab_size = len(self.chars)
        self._index = {c: i for i, c in enumerate(self.chars)}
        ids = self.encode(text)
        n_train = round(len(ids) * (1.0 - val_fraction))
        self.train, self.val = ids[:n_train], ids[n_train:]
        if min(len(self.train), len(self.val)) < 2:   # fewer holds no (input, next character) pair
            raise ValueError(f"TextCorpus: a text of {len(ids)} characters with val_fraction={val_fraction} "
                             f"leaves {len(self.train)} training and {len(self.val)} validation characters; "
                             "each split needs at least 2")

    def encode(self, s: str) -> np.ndarray:
        """s: a string of characters from the vocabulary; returns their ids, int64, shape (len(s),)."""
        if not isinstance(s, str):
            raise TypeError(f"encode expects a str, got {type(s).__name__}")
        unknown = sorted(set(s) - self._index.keys())
        if unknown:
            raise ValueError(f"encode: characters not in the vocabulary: {unknown[:10]!r}")
        return np.array([self._index[c] for c in s], dtype=np.int64)

    def decode(self, ids) -> str:
        """ids: integer ids in [0, vocab_size), any 1-D sequence; returns the string."""
        ids = np.asarray(ids)
        if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
            raise TypeError("decode expects a 1-D sequence of integer ids, "
                            f"got shape {ids.shape}, dtype {ids.dtype}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"decode: ids must lie in [0, {self.vocab_size}), "
                             f"got [{ids.min()}, {ids.max()}]")
        return "".join(self.chars[i] for i in ids)

    def windows(self, split: str, batch_size: int, block_size: int,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """B contiguous windows of ``split`` ("train" or "val") at offsets drawn from rng: inputs x (B, T)
        and next-character targets y (B, T), y[b, t] = x[b, t + 1] (int64)."""
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"windows needs rng=numpy.random.Generator, got {type(rng).__name__}")
        ids = {"train": self.train, "val": self.val}.get(split)
        if ids is None:
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        check_count(batch_size, "windows batch_size")
        if check_count(block_size, "windows block_size") >= len(ids):
            raise ValueError(f"windows needs batch_size >= 1 and 1 <= block_size < {len(ids)}, "
                             f"got {batch_size}, {block_size}")
        starts = rng.integers(0, len(ids) - block_size, batch_size)
        rows = starts[:, None] + np.arange(block_size + 1)                 # (B, T + 1) positions
        chunk = ids[rows]
        return chunk[:, :-1], chunk[:, 1:]

    def unigram_loss(self) -> float:
        """Validation cross-entropy (nats per character) of the training character frequencies (add-one
        smoothed, so a character unseen in training costs a finite amount)."""
        counts = np.bincount(self.train, minlength=self.vocab_size) + 1.0
        log_p = np.log(counts / counts.sum())
        return float(-log_p[self.val].mean())

    def __repr__(self) -> str:
        return f"TextCorpus({len(self.text)} characters, vocab {self.vocab_size}, " \
               f"{len(self.train)} train / {len(self.val)} val)"


def load_text(val_fraction: float = 0.1) -> TextCorpus:
    """The help() topics of the running CPython (``pydoc_data.topics``), as a TextCorpus."""
    from pydoc_data.topics import topics  # part of the standard library: no download

    return TextCorpus("".join(topics[name] for name in sorted(topics)), val_fraction)
