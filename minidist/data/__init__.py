"""The input pipeline: datasets, which examples each rank reads, loading them ahead of the step.

One module per concept:

    datasets.py     the 8×8 digits (bundled with scikit-learn), MNIST from IDX files, spirals and blobs
    text.py         CPython's help() text as a character-level corpus (TextCorpus, load_text)
    sampler.py      DistributedSampler (rank r's indices in epoch e), batched, iterate_batches, shard
    loader.py       Loader: k worker processes load batches ahead of the training loop
    columnar.py     Parquet columns on disk, Arrow in memory, and the bytes a column read costs
    input_clock.py  the loader on a simulated clock: when does a step wait for its data?

Everything a user calls is importable from here (``from minidist.data import load_digits, Loader``);
columnar.py needs pyarrow only when it is called.
"""

from .columnar import CountingFile, column_chunk_bytes, read_columns, write_parquet
from .datasets import DIGITS_SPLIT_SEED, DIGITS_TEST_SIZE, Dataset, blobs, load_digits, load_mnist, spirals
from .input_clock import InputTimeline, simulate_input_pipeline
from .loader import Loader, LoaderError
from .sampler import DistributedSampler, batched, iterate_batches, shard
from .text import TextCorpus, load_text

__all__ = [
    "DIGITS_SPLIT_SEED", "DIGITS_TEST_SIZE", "CountingFile", "Dataset", "DistributedSampler", "InputTimeline",
    "Loader", "LoaderError", "TextCorpus", "batched", "blobs", "column_chunk_bytes", "iterate_batches",
    "load_digits", "load_mnist", "load_text", "read_columns", "shard", "simulate_input_pipeline", "spirals",
    "write_parquet",
]
