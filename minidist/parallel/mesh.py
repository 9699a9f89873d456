"""The mesh: the world's ranks as a grid of named axes, and one communicator per axis (picotron's
process-group manager, PyTorch's DeviceMesh).

Five axes, in rank order, slowest first — data, pipeline, context, expert, tensor:

    rank w = (((d·P + p)·C + k)·E + j)·T + q       d of D, p of P, k of C, j of E, q of T

so a tensor group is T consecutive ranks (the chattiest group stays inside a node), and a data group the
ranks P·C·E·T apart. An axis's group is the ranks that differ from this one only along that axis; a rank's
rank inside it is its coordinate on the axis. ``MeshShape`` is that arithmetic alone, in any axis order and
without a communicator (the planner's layouts, GridSpatial's placements); ``Mesh`` adds the communicators.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from minidist.nn.checks import check_distinct, is_count
from minidist.parallel.shards import check_communicator

AXES = ("data", "pipeline", "context", "expert", "tensor")      # rank order: slowest first


class MeshShape:
    """Named axis sizes in rank order (slowest first); no communicator.

    sizes: {axis: size} or [(axis, size), ...], sizes integers >= 1; the rank of coordinates (c_0, ...,
    c_n) is Σ_a c_a · stride(a), stride(a) = the product of the sizes after a.
    """

    def __init__(self, sizes: dict[str, int] | Iterable[tuple[str, int]]):
        pairs = list(sizes.items() if isinstance(sizes, dict) else sizes)
        check_distinct([axis for axis, _ in pairs], "mesh axis names")
        self.sizes = dict(pairs)
        for axis, size in self.sizes.items():
            if not is_count(size):
                raise ValueError(f"mesh axis {axis!r} must have an integer size >= 1, got {size!r}")
        self.axes = tuple(self.sizes)
        self.world_size = math.prod(self.sizes.values())

    def stride(self, axis: str) -> int:
        """Rank distance between neighbours along ``axis``: the product of the sizes of the axes after it."""
        return math.prod(self.sizes[inner] for inner in self.axes[self._index(axis) + 1:])

    def coords(self, rank: int) -> dict[str, int]:
        """{axis: coordinate} of ``rank`` (0 <= rank < world_size)."""
        if not is_count(rank, 0) or rank >= self.world_size:
            raise ValueError(f"rank must be an integer in 0..{self.world_size - 1}, got {rank!r}")
        return {axis: rank // self.stride(axis) % self.sizes[axis] for axis in self.axes}

    def rank(self, coords: dict[str, int]) -> int:
        """The rank at ``coords`` ({axis: coordinate}; axes left out are 0)."""
        for axis, c in coords.items():
            if not is_count(c, 0) or c >= self.sizes[self.axes[self._index(axis)]]:
                raise ValueError(f"coordinate {axis}={c!r} must be an integer in 0..{self.sizes[axis] - 1}")
        return sum(c * self.stride(axis) for axis, c in coords.items())

    def group_ranks(self, rank: int, axes: str | tuple[str, ...]) -> list[int]:
        """The ranks that differ from ``rank`` only along ``axes`` (one axis or several), ordered by their
        coordinates on them (so rank r's place in the list is its coordinate on a single axis)."""
        axes = self._axes(axes)
        base = self.coords(rank)
        ranks = [self.rank({**base, **{a: 0 for a in axes}})]
        for axis in sorted(axes, key=self._index, reverse=True):       # the slowest axis varies slowest
            ranks = [r + c * self.stride(axis) for c in range(self.sizes[axis]) for r in ranks]
        return ranks

    def _axes(self, axes: str | tuple[str, ...]) -> tuple[str, ...]:
        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        for axis in axes:
            self._index(axis)
        return axes

    def _index(self, axis: str) -> int:
        if axis not in self.axes:
            raise ValueError(f"unknown mesh axis {axis!r}; the axes are {self.axes}")
        return self.axes.index(axis)

    def __repr__(self) -> str:
        return "MeshShape(" + " × ".join(f"{a}={n}" for a, n in self.sizes.items()) + ")"


class Mesh:
    """``Mesh(comm, data=D, pipeline=P, tensor=T, context=C, expert=E)``: D·P·T·C·E == comm.world_size,
    axes left out are 1, ranks in AXES order (module docstring).

    sizes, coords: {axis: size}, {axis: this rank's coordinate}, all five axes. Building a Mesh is
    collective (comm.split, one per axis, in AXES order on every rank); ``group`` gives the communicators.
    """

    def __init__(self, comm, **sizes: int):
        check_communicator("comm", comm, optional=False)
        unknown = sorted(set(sizes) - set(AXES))
        if unknown:
            raise ValueError(f"unknown mesh axes {unknown}; the axes are {AXES}")
        shape = MeshShape({axis: sizes.get(axis, 1) for axis in AXES})
        if shape.world_size != comm.world_size:
            raise ValueError(f"mesh sizes {shape.sizes} multiply to {shape.world_size}, but the world size "
                             f"is {comm.world_size}")
        self._build(comm, shape)

    @classmethod
    def of_shape(cls, comm, shape: MeshShape) -> Mesh:
        """A mesh of any named axes in any order (grids/data_spatial.py's data × spatial and its
        placements) over comm; shape.world_size must be comm's."""
        check_communicator("comm", comm, optional=False)
        if shape.world_size != comm.world_size:
            raise ValueError(f"{shape} has {shape.world_size} ranks, the world size is {comm.world_size}")
        mesh = cls.__new__(cls)
        mesh._build(comm, shape)
        return mesh

    def _build(self, comm, shape: MeshShape) -> None:
        self.comm, self.shape = comm, shape
        self.sizes = dict(shape.sizes)
        self.coords = shape.coords(comm.rank)
        self._groups: dict[tuple[str, ...], object] = {}
        for axis in shape.axes:                            # collective: the same order on every rank
            self.group(axis)

    def group(self, axes: str | tuple[str, ...]):
        """The Communicator over the ranks that differ from this one only along ``axes`` (an axis name or
        a tuple of them); its rank is this rank's place in ``shape.group_ranks``. A tuple's group is made
        on first use, by comm.split: every rank must ask for it in the same order."""
        axes = self.shape._axes(axes)
        key = tuple(sorted(axes, key=self.shape._index))
        if key not in self._groups:
            members = self.shape.group_ranks(self.comm.rank, key)
            self._groups[key] = self.comm.split(color=members[0], key=members.index(self.comm.rank))
        return self._groups[key]

    def __repr__(self) -> str:
        sizes = " × ".join(f"{a}={n}" for a, n in self.sizes.items())
        return f"Mesh({sizes}; rank {self.comm.rank} at {self.coords})"
