"""Column-, row-parallel Linear and the Megatron MLP block on P = 1..4 ranks, against the single-process
layers.

Every shard is cut from the full layer built with the same seed; its output, its input gradient and its
weight and bias gradients must equal the matching slice of the single-process layer's (float64). One
cluster run per hypothesis example checks a whole list of shapes at once.
"""

import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from minidist.cluster import ClusterError, run
from minidist.nn import Linear, ReLU, Sequential
from minidist.parallel.tensor import ColumnParallelLinear, MegatronMLP, RowParallelLinear

TOL = {"rtol": 1e-11, "atol": 1e-12}
# A cluster run costs ~0.1-1 s: few examples, and no shrinking (a failure is reported as drawn).
CLUSTER_SETTINGS = settings(max_examples=2, phases=(Phase.explicit, Phase.reuse, Phase.generate))


class OneRank:
    """A group of one rank: the helpers send nothing, so no processes are needed."""

    rank, world_size = 0, 1


def _width(draw, parts):
    """A width of at least ``parts`` features that ``parts`` does not divide (any width when P = 1)."""
    if parts == 1:
        return draw(st.integers(1, 7))
    return parts * draw(st.integers(1, 3)) + draw(st.integers(1, parts - 1))


@st.composite
def cases(draw, parts):
    return [
        {
            "d_in": _width(draw, parts),
            "d_out": _width(draw, parts),
            "hidden": _width(draw, parts),
            "batch": draw(st.integers(1, 6)),
            "bias": draw(st.booleans()),
            "seed": draw(st.integers(0, 2**16)),
        }
        for _ in range(draw(st.integers(1, 2)))
    ]


def _data(c):
    rng = np.random.default_rng(c["seed"] + 1)
    return rng.standard_normal((c["batch"], c["d_in"])), rng.standard_normal((c["batch"], c["d_out"]))


def _grads(layer):
    return layer.weight.grad.copy(), None if layer.bias is None else layer.bias.grad.copy()


def _full_rng(c):
    return np.random.default_rng(c["seed"])  # the same full layer on every rank and in the test


def _linear_shards(comm, case_list):
    """On each rank: every kind of shard's (output, input gradient, weight grad, bias grad, its slice)."""
    out = []
    for c in case_list:
        x, dy = _data(c)
        res = {}
        full = Linear(c["d_in"], c["d_out"], c["bias"], rng=_full_rng(c), dtype=np.float64)
        col = ColumnParallelLinear(comm, full)
        res["column_gather"] = (col(x), col.backward(dy), *_grads(col), col.rows)
        col = ColumnParallelLinear(comm, full, gather_output=False)
        res["column_sharded"] = (col(x), col.backward(dy[:, col.rows]), *_grads(col), col.rows)
        row = RowParallelLinear(comm, full)
        res["row_parallel"] = (row(x[:, row.cols]), row.backward(dy), *_grads(row), row.cols)
        row = RowParallelLinear(comm, full, input_is_parallel=False)
        res["row_whole"] = (row(x), row.backward(dy), *_grads(row), row.cols)
        first, second = _mlp_layers(c)  # kept sharded: a column layer feeding a row layer, as Modules
        pair = Sequential(ColumnParallelLinear(comm, first, gather_output=False), ReLU(),
                          RowParallelLinear(comm, second, input_is_parallel=True))
        res["column_then_row"] = (
            pair(x),
            pair.backward(dy),
            *_grads(pair[0]),
            *_grads(pair[2]),
            pair[0].rows,
        )
        out.append(res)
    return out


def _megatron_shards(comm, case_list):
    out = []
    for c in case_list:
        x, dz = _data(c)
        first, second = _mlp_layers(c)
        block = MegatronMLP(comm, first, second, ReLU())
        z, dx = block(x), block.backward(dz)
        out.append((z, dx, *_grads(block.up), *_grads(block.down), block.up.rows, block.down.cols))
    return out


def _mlp_layers(c):
    rng = np.random.default_rng(c["seed"])
    return (Linear(c["d_in"], c["hidden"], c["bias"], rng=rng, dtype=np.float64),
            Linear(c["hidden"], c["d_out"], c["bias"], rng=rng, dtype=np.float64))


def _close(actual, expected):
    if expected is None:
        assert actual is None
    else:
        np.testing.assert_allclose(actual, expected, **TOL)


@pytest.mark.parametrize("parts", [1, 2, 3, 4])
@CLUSTER_SETTINGS
@given(data=st.data())
def test_parallel_tensor_linear_shards_equal_slices(parts, data):
    case_list = data.draw(cases(parts))
    per_rank = run(_linear_shards, parts, case_list, timeout=60.0)
    for i, c in enumerate(case_list):
        x, dy = _data(c)
        full = Linear(
            c["d_in"], c["d_out"], c["bias"], rng=np.random.default_rng(c["seed"]), dtype=np.float64
        )
        y, dx = full(x), full.backward(dy)
        dw, db = full.weight.grad, None if full.bias is None else full.bias.grad
        first, second = _mlp_layers(c)
        mlp = Sequential(first, ReLU(), second)
        z_mlp, dx_mlp = mlp(x), mlp.backward(dy)
        covered = {kind: np.zeros(full.weight.shape, bool) for kind in ("column_gather", "column_sharded",
                                                                         "row_parallel", "row_whole")}
        for rank in range(parts):
            res = per_rank[rank][i]
            y_g, dx_g, dw_g, db_g, rows = res["column_gather"]
            (
                _close(y_g, y),
                _close(dx_g, dx),
                _close(dw_g, dw[rows]),
                _close(db_g, None if db is None else db[rows]),
            )
            y_s, dx_s, dw_s, db_s, rows_s = res["column_sharded"]
            assert rows_s == rows
            _close(y_s, y[:, rows]), _close(dx_s, dx), _close(dw_s, dw[rows])
            _close(db_s, None if db is None else db[rows])
            for kind in ("row_parallel", "row_whole"):
                z, dx_r, dw_r, db_r, cols = res[kind]
                _close(z, y), _close(dw_r, dw[:, cols]), _close(db_r, db)
                _close(dx_r, dx[:, cols] if kind == "row_parallel" else dx)
                covered[kind][:, cols] = True
            covered["column_gather"][rows] = covered["column_sharded"][rows] = True
            z_p, dx_p, dw1, db1, dw2, db2, hidden = res["column_then_row"]
            _close(z_p, z_mlp), _close(dx_p, dx_mlp)
            _close(dw1, first.weight.grad[hidden]), _close(dw2, second.weight.grad[:, hidden])
            _close(db1, None if first.bias is None else first.bias.grad[hidden])
            _close(db2, None if second.bias is None else second.bias.grad)
        assert all(mask.all() for mask in covered.values()), "the shards must cover the whole weight"


@pytest.mark.exercise("megatron_mlp")
@pytest.mark.parametrize("parts", [1, 2, 3, 4])
@CLUSTER_SETTINGS
@given(data=st.data())
def test_parallel_tensor_megatron_block_equals_single_process(parts, data):
    case_list = data.draw(cases(parts))
    per_rank = run(_megatron_shards, parts, case_list, timeout=60.0)
    for i, c in enumerate(case_list):
        x, dz = _data(c)
        first, second = _mlp_layers(c)
        mlp = Sequential(first, ReLU(), second)
        z, dx = mlp(x), mlp.backward(dz)
        for rank in range(parts):
            z_p, dx_p, dw1, db1, dw2, db2, rows, cols = per_rank[rank][i]
            assert rows == cols  # the hidden units a rank owns: rows of W1, columns of W2
            _close(z_p, z), _close(dx_p, dx)
            _close(dw1, first.weight.grad[rows]), _close(dw2, second.weight.grad[:, cols])
            _close(db1, None if first.bias is None else first.bias.grad[rows])
            _close(db2, None if second.bias is None else second.bias.grad)


def _bad_layer(comm, kind):
    if kind == "too_many_shards":
        ColumnParallelLinear(comm, Linear(4, 2, rng=np.random.default_rng(0)))
    elif kind == "row_too_many_shards":
        RowParallelLinear(comm, Linear(2, 4, rng=np.random.default_rng(0)))
    elif kind == "mismatched_column":
        ColumnParallelLinear(comm, Linear(4, 6 + comm.rank % 2, rng=np.random.default_rng(0)))
    elif kind == "mismatched_row":
        RowParallelLinear(comm, Linear(5, 3, bias=comm.rank == 0, rng=np.random.default_rng(0)))
    return "no error"


@pytest.mark.parametrize(
    "kind, message",
    [
        ("too_many_shards", "cannot split 2 features into 3 shards"),
        ("row_too_many_shards", "cannot split 2 features into 3 shards"),
        (
            "mismatched_column",
            r"ColumnParallelLinear \(in_features, out_features, bias\) differs across the ranks",
        ),
        ("mismatched_row", r"RowParallelLinear \(in_features, out_features, bias\) differs across the ranks"),
    ],
)
def test_parallel_tensor_bad_shards_raise_clear_errors(kind, message):
    with pytest.raises(ClusterError, match=message):
        run(_bad_layer, 3, kind, timeout=30.0)


def test_parallel_tensor_megatron_rejects_mismatched_layers():
    from minidist.parallel.tensor import megatron_parallel_mlp

    with pytest.raises(ValueError, match="second layer's in_features"):
        MegatronMLP(OneRank(), Linear(3, 4), Linear(5, 2))
    with pytest.raises(ValueError, match="not the start of a"):
        megatron_parallel_mlp(OneRank(), Sequential(Linear(3, 4), ReLU()))


def _mismatched_batch(comm, kind):
    rng = np.random.default_rng(0)
    x = np.ones((3 + comm.rank, 5))  # each rank a different batch: a bug in the caller
    if kind == "gather":
        ColumnParallelLinear(comm, Linear(5, 4, rng=rng, dtype=np.float64))(x)
    else:
        RowParallelLinear(comm, Linear(5, 4, rng=rng, dtype=np.float64), input_is_parallel=False)(x)
    return "no error"


@pytest.mark.parametrize(
    "kind, message",
    [
        (
            "gather",
            r"must all see the same batch; their output slices have shapes "
            r"rank 0: \(3, 2\), rank 1: \(4, 2\)",
        ),
        (
            "allreduce",
            (
                r"collective mismatch: rank \d called reduce_scatter\(op='sum', size=\d+, dtype=float64\), "
                r"but not every rank made the same call"
            ),
        ),
    ],
)
def test_parallel_tensor_mismatched_batches_raise_not_hang(kind, message):
    with pytest.raises(ClusterError, match=message):
        run(_mismatched_batch, 2, kind, timeout=30.0)


def test_parallel_tensor_one_rank_layers_pass_gradcheck(rng):
    """With P = 1 no message is sent: the shards are the whole layers, checked by finite differences."""
    from minidist.nn.gradcheck import gradcheck

    x = rng.standard_normal((3, 4))
    for layer in (ColumnParallelLinear(OneRank(), Linear(4, 5, rng=rng, dtype=np.float64)),
                  RowParallelLinear(OneRank(), Linear(4, 5, rng=rng, dtype=np.float64),
                                    input_is_parallel=False)):
        errors = gradcheck(layer, x, rng)
        assert max(errors.values()) < 1e-6, (layer, errors)


@pytest.mark.exercise("megatron_mlp")
def test_parallel_tensor_one_rank_megatron_passes_gradcheck(rng):
    from minidist.nn.gradcheck import gradcheck

    block = MegatronMLP(
        OneRank(), Linear(4, 6, rng=rng, dtype=np.float64), Linear(6, 3, rng=rng, dtype=np.float64)
    )
    errors = gradcheck(block, rng.standard_normal((5, 4)), rng)
    assert max(errors.values()) < 1e-6, errors


def _flops_of_shards(comm, shape):
    rng = np.random.default_rng(3)
    first, second = Linear(7, 5, rng=rng), Linear(5, 4, rng=rng)
    column = ColumnParallelLinear(comm, first, gather_output=False)
    row = RowParallelLinear(comm, second, input_is_parallel=False)
    block = MegatronMLP(comm, first, second, ReLU())
    return column.flops(shape), row.flops((*shape[:-1], 5)), block.flops(shape)


@pytest.mark.parametrize("parts", [1, 2, 3])
def test_parallel_tensor_flops_are_each_ranks_share_of_the_whole_layers(parts):
    """The shards' forward FLOPs add up to the single-process layers' (5 hidden units: uneven for 2, 3),
    so the simulated clock charges each rank its share of the products."""
    shape = (2, 3, 7)
    first, second = Linear(7, 5), Linear(5, 4)
    column, row, block = np.sum(run(_flops_of_shards, parts, shape), axis=0)
    assert column == first.flops(shape) and row == second.flops((2, 3, 5))
    assert block == first.flops(shape) + ReLU().flops((2, 3, 5)) + second.flops((2, 3, 5))
    with pytest.raises(ValueError, match=r"input shape \(\.\.\., 7\)"):
        ColumnParallelLinear(OneRank(), Linear(7, 5)).flops((2, 6))
