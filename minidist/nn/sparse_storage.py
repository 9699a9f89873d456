"""Sparse storage formats and what their indices cost, in bytes (v = bytes per value, i = per index).

A matrix (rows, cols) with nnz non-zeros (a conv weight (O, C, kh, kw) is stored as (O, C·kh·kw)):
    dense                 rows·cols·v
    COO                   nnz·(v + 2i)                  a (row, col) pair per value
    CSR                   nnz·(v + i) + (rows + 1)·i    a column per value, a start offset per row
    BlockCSR (bh × bw)    nb·bh·bw·v + nb·i + (rows/bh + 1)·i    nb = blocks holding any non-zero
Fine-grained (unstructured) sparsity pays an index per value: with float32 values and int32 indices CSR
saves nothing until more than half the weights are zero. Blocks pay one index per bh·bw values, so
coarse-grained pruning (a whole filter, bh = 1, bw = C·kh·kw) saves space at much lower sparsity —
the tutorial's point, from Mao et al., "Exploring the Granularity of Sparsity in CNNs".
Source: "Hardware Accelerators for Training Deep Neural Networks" tutorial, chapter "Sparsity".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _matrix_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """The matrix view of an array of ``shape``: (d0, d1·d2·…), and a 1-D array (a bias) as one row (1, n)."""
    return (shape[0], int(np.prod(shape[1:]))) if len(shape) > 1 else (1, shape[0])


def _as_matrix(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    if a.ndim < 1 or a.size == 0 or not np.issubdtype(a.dtype, np.floating):
        raise ValueError(f"expected a non-empty float array, got dtype {a.dtype}, shape {a.shape}")
    return a.reshape(_matrix_shape(a.shape))


def _check_index_dtype(index_dtype, largest: int) -> np.dtype:
    index_dtype = np.dtype(index_dtype)
    if not np.issubdtype(index_dtype, np.integer):
        raise TypeError(f"index_dtype must be an integer dtype, got {index_dtype}")
    if largest > np.iinfo(index_dtype).max:
        raise ValueError(f"index {largest} does not fit in {index_dtype}; use a wider index_dtype")
    return index_dtype


def dense_nbytes(a: np.ndarray) -> int:
    """rows·cols·v: what the array takes as it is."""
    return int(np.asarray(a).nbytes)


@dataclass(frozen=True)
class COO:
    """Coordinates: values (nnz,), rows (nnz,), cols (nnz,) of the matrix view of an array of ``shape``."""

    shape: tuple[int, ...]
    values: np.ndarray
    rows: np.ndarray
    cols: np.ndarray

    @classmethod
    def from_dense(cls, a: np.ndarray, index_dtype=np.int32) -> COO:
        m = _as_matrix(a)
        index_dtype = _check_index_dtype(index_dtype, max(m.shape) - 1)
        rows, cols = np.nonzero(m)
        return cls(np.shape(a), m[rows, cols], rows.astype(index_dtype), cols.astype(index_dtype))

    def to_dense(self) -> np.ndarray:
        m = np.zeros(_matrix_shape(self.shape), dtype=self.values.dtype)
        m[self.rows, self.cols] = self.values
        return m.reshape(self.shape)

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + self.rows.nbytes + self.cols.nbytes


@dataclass(frozen=True)
class CSR:
    """Compressed sparse rows: values (nnz,), col_indices (nnz,), row_pointers (rows + 1,).

    Row r's values are values[row_pointers[r]:row_pointers[r + 1]].
    """

    shape: tuple[int, ...]
    values: np.ndarray
    col_indices: np.ndarray
    row_pointers: np.ndarray

    @classmethod
    def from_dense(cls, a: np.ndarray, index_dtype=np.int32) -> CSR:
        m = _as_matrix(a)
        nonzero = m != 0
        index_dtype = _check_index_dtype(index_dtype, max(m.shape[1] - 1, int(nonzero.sum())))
        rows, cols = np.nonzero(m)  # row-major order: row by row
        pointers = np.concatenate([[0], np.cumsum(nonzero.sum(axis=1))])
        return cls(np.shape(a), m[rows, cols], cols.astype(index_dtype), pointers.astype(index_dtype))

    def to_dense(self) -> np.ndarray:
        n_rows = self.row_pointers.size - 1
        m = np.zeros((n_rows, int(np.prod(self.shape)) // n_rows), dtype=self.values.dtype)
        rows = np.repeat(np.arange(n_rows), np.diff(self.row_pointers))
        m[rows, self.col_indices] = self.values
        return m.reshape(self.shape)

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + self.col_indices.nbytes + self.row_pointers.nbytes


@dataclass(frozen=True)
class BlockCSR:
    """CSR of (bh × bw) blocks: blocks (nb, bh, bw) that hold a non-zero, stored dense; block_cols (nb,);
    block_row_pointers (rows/bh + 1,). bh and bw must divide the matrix's rows and columns."""

    shape: tuple[int, ...]
    block: tuple[int, int]
    blocks: np.ndarray
    block_cols: np.ndarray
    block_row_pointers: np.ndarray

    @classmethod
    def from_dense(cls, a: np.ndarray, block: tuple[int, int], index_dtype=np.int32) -> BlockCSR:
        m = _as_matrix(a)
        bh, bw = (int(b) for b in block)
        if bh < 1 or bw < 1 or m.shape[0] % bh or m.shape[1] % bw:
            raise ValueError(f"block {block} must divide the matrix shape {m.shape}")
        grid = m.reshape(m.shape[0] // bh, bh, m.shape[1] // bw, bw).transpose(0, 2, 1, 3)  # (R, C, bh, bw)
        occupied = grid.reshape(*grid.shape[:2], -1).any(axis=2)                            # (R, C)
        index_dtype = _check_index_dtype(index_dtype, max(grid.shape[1] - 1, int(occupied.sum())))
        block_rows, block_cols = np.nonzero(occupied)
        pointers = np.concatenate([[0], np.cumsum(occupied.sum(axis=1))])
        return cls(np.shape(a), (bh, bw), grid[block_rows, block_cols].copy(), block_cols.astype(index_dtype),
                   pointers.astype(index_dtype))

    def to_dense(self) -> np.ndarray:
        bh, bw = self.block
        n_block_rows = self.block_row_pointers.size - 1
        cols = int(np.prod(self.shape)) // (n_block_rows * bh)
        grid = np.zeros((n_block_rows, cols // bw, bh, bw), dtype=self.blocks.dtype)
        block_rows = np.repeat(np.arange(n_block_rows), np.diff(self.block_row_pointers))
        grid[block_rows, self.block_cols] = self.blocks
        return grid.transpose(0, 2, 1, 3).reshape(self.shape)

    @property
    def nbytes(self) -> int:
        return self.blocks.nbytes + self.block_cols.nbytes + self.block_row_pointers.nbytes
