"""Columnar data: a table stored column by column in Parquet on disk, read into Arrow in memory.

The "Scaling Up Training" slides ("Feed Data Fast") name two formats: Apache Parquet on disk and Apache
Arrow in memory. Parquet keeps each column of a row group in its own contiguous *column chunk*, and the
file's footer records where every chunk starts and how many bytes it has. A reader that needs 2 of 20
columns seeks to those 2 chunks and reads about 2/20 of the data (plus the footer):

    bytes read ≈ footer + Σ over row groups, over the chosen columns, of the chunk's size on disk

A row-major file (CSV, a pickled array of records) has to be read whole to get any one column.

``column_chunk_bytes`` takes the sizes from pyarrow's own metadata; ``CountingFile`` counts the bytes a
read actually pulls from the file, so the two can be compared (tests/data/test_columnar.py). Needs
pyarrow (``pip install -e ".[data]"``); the rest of minidist does not.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np


def _pq():
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ImportError('minidist.data.columnar needs pyarrow: pip install -e ".[data]"') from exc
    return pq


def write_parquet(path: str | Path, columns: dict[str, np.ndarray], row_group_size: int | None = None,
                  compression: str = "none") -> Path:
    """Write equal-length 1-D arrays as the columns of one Parquet file, plain-encoded (no dictionary) and
    uncompressed by default, so that a column's bytes on disk are its bytes in memory plus page headers."""
    import pyarrow as pa
    pq = _pq()
    lengths = {name: np.shape(a) for name, a in columns.items()}
    if not columns or len({s for s in lengths.values()}) != 1 or len(next(iter(lengths.values()))) != 1:
        raise ValueError(f"write_parquet expects one or more 1-D columns of one length, got shapes {lengths}")
    table = pa.table({name: pa.array(np.asarray(a)) for name, a in columns.items()})
    pq.write_table(table, str(path), row_group_size=row_group_size, compression=compression,
                   use_dictionary=False)
    return Path(path)


def read_columns(source, columns: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Read the named columns (all if None) of a Parquet file (path or binary file object) into NumPy.

    Only the chosen columns' chunks are read (projection). Returns {name: array of shape (rows,)}.
    """
    parquet = _pq().ParquetFile(source)
    table = parquet.read(columns=_chosen(columns, parquet.schema_arrow.names))
    return {name: table.column(name).to_numpy() for name in table.column_names}


def column_chunk_bytes(path: str | Path, columns: Sequence[str] | None = None) -> int:
    """Bytes on disk of the chosen columns' chunks (all columns if None), summed over the row groups,
    as the file's footer records them (``ColumnChunkMetaData.total_compressed_size``)."""
    parquet = _pq().ParquetFile(str(path))
    chosen = _chosen(columns, parquet.schema_arrow.names)
    meta, total = parquet.metadata, 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            if chosen is None or chunk.path_in_schema in chosen:
                total += chunk.total_compressed_size
    return total


def _chosen(columns: Sequence[str] | None, names: list[str]) -> list[str] | None:
    """The column names asked for (None: all), each one of the file's ``names``: a str is refused (it would
    be read as its letters), and so is a name the file does not have."""
    if columns is None:
        return None
    listed = None if isinstance(columns, (str, bytes)) or not isinstance(columns, Iterable) else list(columns)
    if listed is None or not all(isinstance(c, str) for c in listed):
        raise TypeError(f"columns must be a list of column names (or None for all), got {columns!r}")
    unknown = [c for c in listed if c not in names]
    if unknown:
        raise ValueError(f"no column(s) {unknown} in the file; it has {names}")
    return listed


class CountingFile(io.RawIOBase):
    """A read-only binary file that counts the bytes read through it (``bytes_read``) — the disk traffic
    of whoever reads it (pyarrow's Parquet reader seeks, then reads the ranges it needs)."""

    def __init__(self, path: str | Path):
        self._file = open(path, "rb")  # noqa: SIM115 - closed by close()
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self._file.readinto(buffer)
        self.bytes_read += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def close(self) -> None:
        self._file.close()
        super().close()
