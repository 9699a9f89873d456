"""The mesh's arithmetic (minidist/parallel/mesh.py): rank <-> coordinates is a bijection in the documented
order (data slowest, tensor innermost), a group along some axes is exactly the ranks that agree on every
other axis, and a Mesh over a cluster gives each rank the group communicators that arithmetic names."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.cluster import run
from minidist.collectives import allgather
from minidist.parallel import Mesh
from minidist.parallel.mesh import AXES, MeshShape


@st.composite
def shapes(draw, most=16):
    """Five axis sizes with product <= most, in the mesh's order."""
    sizes, world = {}, 1
    for axis in AXES:
        size = draw(st.integers(1, most // world))
        sizes[axis] = size
        world *= size
    return MeshShape(sizes)


@settings(max_examples=300, deadline=None)
@given(shapes())
def test_parallel_mesh_rank_and_coordinates_are_a_bijection_in_the_documented_order(shape):
    s = shape.sizes
    seen = set()
    for rank in range(shape.world_size):
        c = shape.coords(rank)
        d, p, k, j, q = (c[a] for a in AXES)
        assert rank == (((d * s["pipeline"] + p) * s["context"] + k) * s["expert"] + j) * s["tensor"] + q
        assert shape.rank(c) == rank
        seen.add(tuple(c.values()))
    assert len(seen) == shape.world_size == int(np.prod(list(s.values())))


@settings(max_examples=200, deadline=None)
@given(shapes(), st.data())
def test_parallel_mesh_groups_are_the_ranks_that_agree_on_every_other_axis(shape, data):
    axes = data.draw(st.lists(st.sampled_from(AXES), min_size=1, max_size=3, unique=True))
    rank = data.draw(st.integers(0, shape.world_size - 1))
    mine = shape.coords(rank)
    others = [a for a in AXES if a not in axes]
    want = [r for r in range(shape.world_size)
            if all(shape.coords(r)[a] == mine[a] for a in others)]
    group = shape.group_ranks(rank, tuple(axes))
    assert group == want
    assert len(group) == int(np.prod([shape.sizes[a] for a in axes]))
    if len(axes) == 1:                       # a rank's place in its group is its coordinate on the axis
        assert group.index(rank) == mine[axes[0]]
    for member in group:                     # every member names the same group
        assert shape.group_ranks(member, tuple(axes)) == group


def test_parallel_mesh_shape_in_another_order_and_its_strides():
    across = MeshShape([("tensor", 2), ("pipeline", 3), ("data", 2)])     # data fastest: tensor_across
    assert [across.stride(a) for a in ("tensor", "pipeline", "data")] == [6, 2, 1]
    assert across.coords(7) == {"tensor": 1, "pipeline": 0, "data": 1}
    assert across.group_ranks(7, "tensor") == [1, 7]


def _mesh(comm, sizes):
    mesh = Mesh(comm, **sizes)
    groups = {}
    for axis in AXES:
        g = mesh.group(axis)
        members = [int(v[0]) for v in allgather(g, np.array([comm.rank]))]
        groups[axis] = (g.rank, g.world_size, members)
    both = mesh.group(("data", "expert"))
    return mesh.sizes, mesh.coords, groups, both.world_size


@pytest.mark.parametrize("sizes", [dict(data=2, pipeline=2, tensor=2), dict(context=2, expert=2, data=2)])
def test_parallel_mesh_over_a_cluster_gives_each_axis_its_group(sizes):
    shape = MeshShape({a: sizes.get(a, 1) for a in AXES})
    for rank, (got_sizes, coords, groups, both) in enumerate(run(_mesh, 8, sizes, timeout=60)):
        assert got_sizes == shape.sizes and coords == shape.coords(rank)
        for axis, (group_rank, size, members) in groups.items():
            assert group_rank == coords[axis] and size == shape.sizes[axis]
            assert members == shape.group_ranks(rank, axis)
        assert both == shape.sizes["data"] * shape.sizes["expert"]


class Four:
    rank, world_size = 0, 4


@pytest.mark.parametrize("sizes,message", [
    (dict(data=2, tensor=3), r"multiply to 6, but the world size is 4"),
    (dict(data=2, sideways=2), r"unknown mesh axes \['sideways'\]"),
    (dict(data=4, tensor=0), r"'tensor' must have an integer size >= 1, got 0"),
    (dict(data=2.0, tensor=2), r"'data' must have an integer size >= 1, got 2.0"),
    (dict(data=True, tensor=4), r"'data' must have an integer size >= 1, got True"),
])
def test_parallel_mesh_refuses_bad_sizes(sizes, message):
    with pytest.raises(ValueError, match=message):
        Mesh(Four(), **sizes)


def test_parallel_mesh_shape_refuses_unknown_axes_and_ranks():
    shape = MeshShape(dict(data=2, tensor=2))
    with pytest.raises(ValueError, match="unknown mesh axis 'pipe'"):
        shape.group_ranks(0, "pipe")
    with pytest.raises(ValueError, match=r"rank must be an integer in 0..3, got 4"):
        shape.coords(4)
    assert list(itertools.chain(*(shape.group_ranks(r, "tensor") for r in (0, 2)))) == [0, 1, 2, 3]
