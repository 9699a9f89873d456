"""The character corpus: encode/decode round trip, the fixed split, windows and their targets."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist import data
from minidist.data.text import TextCorpus, load_text

CORPUS = load_text()


def test_load_text_is_the_bundled_help_text_split_90_10():
    from pydoc_data.topics import topics

    assert data.load_text is load_text
    assert CORPUS.text.startswith(topics[min(topics)]) and len(CORPUS.text) > 100_000
    assert len(CORPUS.train) + len(CORPUS.val) == len(CORPUS.text)
    assert abs(len(CORPUS.val) / len(CORPUS.text) - 0.1) < 1e-4
    np.testing.assert_array_equal(np.concatenate([CORPUS.train, CORPUS.val]), CORPUS.encode(CORPUS.text))
    assert CORPUS.vocab_size == len(set(CORPUS.text)) and CORPUS.chars == sorted(CORPUS.chars)


@given(st.text(alphabet=CORPUS.chars, max_size=40))
def test_encode_decode_round_trip(s):
    ids = CORPUS.encode(s)
    assert ids.dtype == np.int64 and CORPUS.decode(ids) == s


@given(b=st.integers(1, 4), t=st.integers(1, 16), seed=st.integers(0, 2**32 - 1))
def test_windows_are_contiguous_with_shifted_targets(b, t, seed):
    x, y = CORPUS.windows("val", b, t, np.random.default_rng(seed))
    x2, _ = CORPUS.windows("val", b, t, np.random.default_rng(seed))
    assert x.shape == y.shape == (b, t) and np.array_equal(x, x2)
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
    for row_x, row_y in zip(x, y, strict=True):
        s = CORPUS.decode(np.append(row_x, row_y[-1]))
        assert s in CORPUS.text[len(CORPUS.train):]


def test_unigram_baseline_is_below_uniform():
    assert 2.5 < CORPUS.unigram_loss() < np.log(CORPUS.vocab_size)
    tiny = TextCorpus("aab" * 10 + "ab", val_fraction=0.25)
    counts = np.bincount(tiny.train, minlength=2) + 1.0
    assert tiny.unigram_loss() == pytest.approx(-np.log(counts / counts.sum())[tiny.val].mean())


def test_text_bad_input():
    with pytest.raises(ValueError, match="not in the vocabulary"):
        CORPUS.encode("\x00")
    with pytest.raises(TypeError, match="str"):
        CORPUS.encode(b"abc")
    with pytest.raises(ValueError, match=r"\[0, "):
        CORPUS.decode([CORPUS.vocab_size])
    with pytest.raises(TypeError, match="integer ids"):
        CORPUS.decode([1.0])
    with pytest.raises(ValueError, match="'train' or 'val'"):
        CORPUS.windows("test", 2, 4, np.random.default_rng(0))
    with pytest.raises(TypeError, match="rng"):
        CORPUS.windows("train", 2, 4, None)
    with pytest.raises(ValueError, match="block_size"):
        CORPUS.windows("val", 2, len(CORPUS.val), np.random.default_rng(0))
    with pytest.raises(ValueError, match="val_fraction"):
        TextCorpus("abc", val_fraction=1.0)


def test_window_sizes_are_integers_and_every_split_has_a_window():
    """windows(…, 2.5, …) used to fail inside NumPy; TextCorpus("abc") left an empty validation split
    whose unigram loss was NaN."""
    rng = np.random.default_rng(0)
    for batch_size, block_size in ((2, 2.5), (2.0, 2), (True, 2), (2, True)):
        with pytest.raises(ValueError, match="must be an integer >= 1"):
            CORPUS.windows("train", batch_size, block_size, rng)
    with pytest.raises(ValueError, match="leaves 3 training and 0 validation characters"):
        TextCorpus("abc")
    with pytest.raises(TypeError, match="val_fraction"):
        TextCorpus("abcd" * 10, val_fraction="0.1")
    assert np.isfinite(TextCorpus("abcd" * 5, val_fraction=0.1).unigram_loss())
