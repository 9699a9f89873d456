"""Partition arithmetic of spatial parallelism: who computes which output rows, which input rows that
needs, and which slabs must travel between ranks (the halo). Pure arithmetic: no processes here.

"Distributed Deep Learning (Part II)" slides, "Spatial Parallelism" (Jin, Ginsburg &
Keutzer, "Spatially Parallel Convolutions", 2018). One axis of a layer with kernel k, stride s and
padding p maps n_in rows to n_out = (n_in + 2p − k) // s + 1; output row o reads rows o·s − p ...
o·s − p + k − 1 (outside [0, n_in): zero padding).

The OUTPUT is split evenly (collectives.pieces): grid index i computes output rows [o0, o1), so its window is

    window = [o0·s − p,  (o1 − 1)·s − p + k)          (length (o1 − o0 − 1)·s + k)

The input is split evenly too (it is the previous layer's output): index i owns rows [a, b), and

    halo_before = a − window_lo      halo_after = window_hi − b       (clipped window [lo, hi))

A halo can be asymmetric (stride > 1), zero, or negative (owned rows nobody reads are trimmed); one
wider than the neighbour's piece reaches the next rank ("multi-hop"): a transfer is simply "the owned
rows of rank j that lie in the window of rank i". 2-D grids (Ph × Pw, rank = i·Pw + j) exchange one
axis at a time: row slabs along H first, then column slabs of that result along W, so the corners ride
along and an interior rank sends 4 messages, not 8.
"""

from __future__ import annotations

from dataclasses import dataclass

from minidist.collectives.pieces import split_bounds
from minidist.nn.checks import check_count
from minidist.parallel.mesh import MeshShape

Range = tuple[int, int]  # half-open [start, stop)


def intersect(a: Range, b: Range) -> Range:
    """The overlap of two half-open ranges (empty ranges come back as (x, x))."""
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return (lo, max(lo, hi))


def length(r: Range) -> int:
    return r[1] - r[0]


@dataclass(frozen=True)
class AxisPartition:
    """One axis of a conv/pool layer split over ``parts`` grid indices.

    own[i]     input rows grid index i holds            (even split of n_in)
    out[i]     output rows it computes                 (even split of n_out)
    window[i]  input rows it reads, clipped to [0, n_in)
    pad[i]     (before, after) padding rows it adds itself, so pad + clipped window = full window
    """

    n_in: int
    kernel: int
    stride: int
    padding: int
    parts: int
    n_out: int
    own: tuple[Range, ...]
    out: tuple[Range, ...]
    window: tuple[Range, ...]
    pad: tuple[tuple[int, int], ...]

    @classmethod
    def build(cls, n_in: int, kernel: int, stride: int, padding: int, parts: int,
              axis: str = "H") -> AxisPartition:
        n_in = check_count(n_in, f"input size along {axis}", 1)
        kernel = check_count(kernel, "kernel_size", 1)
        stride = check_count(stride, "stride", 1)
        padding = check_count(padding, "padding", 0)
        parts = check_count(parts, f"number of ranks along {axis}", 1)
        n_out = (n_in + 2 * padding - kernel) // stride + 1
        if n_in + 2 * padding < kernel:
            raise ValueError(f"kernel {kernel} is larger than the padded input along {axis} "
                             f"({n_in} + 2·{padding} = {n_in + 2 * padding})")
        if parts > n_out:
            lines = "rows" if axis == "H" else "columns"
            raise ValueError(f"{parts} ranks along {axis} but the output has only {n_out} {lines}: every "
                             f"rank needs at least one; use at most {n_out} ranks along {axis}")
        out = split_bounds(n_out, parts)
        windows, pads = [], []
        for o0, o1 in out:
            lo, hi = o0 * stride - padding, (o1 - 1) * stride - padding + kernel   # full window
            clip_lo = min(max(lo, 0), n_in)
            windows.append((clip_lo, max(min(hi, n_in), clip_lo)))
            pads.append((max(0, min(hi, 0) - lo), max(0, hi - max(lo, n_in))))  # rows < 0, rows >= n_in
        return cls(n_in, kernel, stride, padding, parts, n_out, tuple(split_bounds(n_in, parts)),
                   tuple(out), tuple(windows), tuple(pads))

    def halo(self, i: int) -> tuple[int, int]:
        """(before, after) rows grid index i needs beyond its own piece; negative means it trims."""
        (a, b), (lo, hi) = self.own[i], self.window[i]
        return a - lo, hi - b

    def overlap(self, i: int) -> Range:
        """The rows grid index i both owns and reads (copied locally, never sent)."""
        return intersect(self.own[i], self.window[i])


@dataclass(frozen=True)
class Transfer:
    """One message: rank ``src`` sends ``dst`` the input block rows × cols (global coordinates).

    hop: grid index of dst minus grid index of src along the phase's axis (+1: to the next rank down
    or right, −1: up or left, ±2: past a neighbour whose piece is thinner than the halo).
    """

    phase: int  # 0: along H (row slabs), 1: along W (column slabs, full window height)
    hop: int
    src: int
    dst: int
    rows: Range
    cols: Range


def hop_order(parts: int) -> list[int]:
    """+1, −1, +2, −2, …: the order in which the shifts of one phase run."""
    return [sign * d for d in range(1, parts) for sign in (1, -1)]


@dataclass(frozen=True)
class HaloPlan:
    """The whole spatial partition of one conv/pool layer over a Ph × Pw grid of ranks.

    rows, cols: the AxisPartition of H and of W. A 1-D split of H is the grid (P, 1).
    transfers: every message of the forward halo exchange, grouped into *steps* (phase, hop): within
    one step every rank sends at most one message and receives at most one (a shift along a grid row or
    column); all ranks run the steps in the same order (phase 0 then 1; hops +1, −1, +2, −2, …).
    """

    grid: tuple[int, int]
    rows: AxisPartition
    cols: AxisPartition
    transfers: tuple[Transfer, ...]

    @classmethod
    def build(cls, input_hw: tuple[int, int], kernel_size, stride=1, padding=0,
              grid: tuple[int, int] = (1, 1)) -> HaloPlan:
        """Plan a layer with kernel/stride/padding (int or (h, w) pair) on an H × W input."""
        kh, kw = _pair(kernel_size, "kernel_size")
        sh, sw = _pair(stride, "stride")
        ph, pw = _pair(padding, "padding")
        height, width = _pair(input_hw, "input_hw", allow_int=False)
        grid_h, grid_w = _pair(grid, "grid", allow_int=False)
        rows = AxisPartition.build(height, kh, sh, ph, grid_h, axis="H")
        cols = AxisPartition.build(width, kw, sw, pw, grid_w, axis="W")
        transfers = []
        # Phase 0, along H: within each grid column j, rank (k, j) sends rank (k + hop, j) its own rows
        # that lie in that rank's window, across its whole own width.
        for hop in hop_order(grid_h):
            for j in range(grid_w):
                for k in range(max(0, -hop), min(grid_h, grid_h - hop)):
                    block = intersect(rows.own[k], rows.window[k + hop])
                    if length(block) and length(cols.own[j]):
                        transfers.append(Transfer(0, hop, k * grid_w + j, (k + hop) * grid_w + j, block,
                                                  cols.own[j]))
        # Phase 1, along W: ranks of grid row i share the same row window; (i, k) sends (i, k + hop)
        # the columns of its phase-0 buffer that lie in that rank's window, over the full window height.
        for hop in hop_order(grid_w):
            for i in range(grid_h):
                for k in range(max(0, -hop), min(grid_w, grid_w - hop)):
                    block = intersect(cols.own[k], cols.window[k + hop])
                    if length(block) and length(rows.window[i]):
                        transfers.append(Transfer(1, hop, i * grid_w + k, i * grid_w + k + hop,
                                                  rows.window[i], block))
        return cls((grid_h, grid_w), rows, cols, tuple(transfers))

    def steps(self, rank: int, phase: int) -> list[tuple[Transfer | None, Transfer | None]]:
        """(what rank sends, what it receives) in each step of ``phase`` it takes part in, in order."""
        result = []
        for hop in hop_order(self.grid[phase]):
            send = next((t for t in self.transfers if (t.phase, t.hop, t.src) == (phase, hop, rank)), None)
            recv = next((t for t in self.transfers if (t.phase, t.hop, t.dst) == (phase, hop, rank)), None)
            if send or recv:
                result.append((send, recv))
        return result

    @property
    def world_size(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def output_hw(self) -> tuple[int, int]:
        return self.rows.n_out, self.cols.n_out

    def grid_index(self, rank: int) -> tuple[int, int]:
        """(i, j) with rank = i·Pw + j; MeshShape checks the rank (the one rank <-> coordinate rule)."""
        at = MeshShape([("row", self.grid[0]), ("column", self.grid[1])]).coords(rank)
        return at["row"], at["column"]

    def own_block(self, rank: int) -> tuple[Range, Range]:
        i, j = self.grid_index(rank)
        return self.rows.own[i], self.cols.own[j]

    def out_block(self, rank: int) -> tuple[Range, Range]:
        i, j = self.grid_index(rank)
        return self.rows.out[i], self.cols.out[j]

    def window_block(self, rank: int) -> tuple[Range, Range]:
        i, j = self.grid_index(rank)
        return self.rows.window[i], self.cols.window[j]

    def padding_of(self, rank: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """((top, bottom), (left, right)) padding rank adds around its clipped window."""
        i, j = self.grid_index(rank)
        return self.rows.pad[i], self.cols.pad[j]

    def halo_elements(self, rank: int) -> tuple[int, int]:
        """(sent, received) elements per (sample, channel) plane in one forward exchange: the formula.

        With own piece h × w (i, j), window H_w × W_w and the overlaps h∩ = |own rows ∩ window rows|,
        w∩ = |own cols ∩ window cols|:
            received = (H_w − h∩)·w  +  H_w·(W_w − w∩)            (phase 0 + phase 1)
        which is H_w·W_w − h·w, "window minus interior", whenever the window covers the own piece.
        sent = Σ over other ranks r of the same grid column |own rows ∩ window rows of r|·w
             + Σ over other ranks r of the same grid row    |own cols ∩ window cols of r|·H_w.
        """
        i, j = self.grid_index(rank)
        r, c = self.rows, self.cols
        own_w = length(c.own[j])
        win_h, win_w = length(r.window[i]), length(c.window[j])
        received = (win_h - length(r.overlap(i))) * own_w + win_h * (win_w - length(c.overlap(j)))
        sent = sum(length(intersect(r.own[i], r.window[k])) for k in range(r.parts) if k != i) * own_w
        sent += sum(length(intersect(c.own[j], c.window[k])) for k in range(c.parts) if k != j) * win_h
        return sent, received

    def halo_bytes(self, rank: int, batch: int, channels: int, itemsize: int) -> tuple[int, int]:
        """(sent, received) payload bytes of rank's forward halo exchange (backward sends as many back)."""
        sent, received = self.halo_elements(rank)
        per_plane = batch * channels * itemsize
        return sent * per_plane, received * per_plane

    def messages(self, rank: int) -> tuple[int, int]:
        """(sent, received) message counts of rank's forward halo exchange."""
        return (sum(t.src == rank for t in self.transfers), sum(t.dst == rank for t in self.transfers))


def _pair(value, what: str, allow_int: bool = True) -> tuple[int, int]:
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return value[0], value[1]
    if allow_int and not isinstance(value, (tuple, list)):
        return value, value
    raise ValueError(f"{what} must be {'an int or ' if allow_int else ''}a pair (h, w), got {value!r}")
