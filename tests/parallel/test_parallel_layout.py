"""The strategy folders keep the public names, and the buckets go through the checked allreduce."""

import importlib

import numpy as np
import pytest

from minidist.cluster import ClusterError, run
from minidist.nn import CrossEntropyLoss, Linear, Sequential
from minidist.optim import SGD

# What ``minidist.parallel`` exported before the strategies moved into folders (its __all__ then).
PUBLIC = ["ColumnParallelLinear", "DataParallel", "GridAllgather", "HaloPlan", "MegatronMLP",
          "Pipeline", "RowParallelLinear", "SpatialAvgPool2d", "SpatialConv2d", "SpatialMaxPool2d",
          "column_parallel_mlp", "format_schedule", "gather_from_grid", "hybrid_train_step", "make_schedule",
          "megatron_parallel_mlp", "scatter_to_grid", "spatialize"]


def test_parallel_layout_public_names_stay_importable():
    parallel = importlib.import_module("minidist.parallel")
    missing = [name for name in PUBLIC + ["bubble_fraction"] if not hasattr(parallel, name)]
    assert not missing, f"minidist.parallel lost {missing}"
    assert set(PUBLIC) <= set(parallel.__all__)


# The module of each strategy's own communication (data parallelism's: its gradient buckets).
COMMUNICATION = {"data": "buckets", "pipeline": "comm", "spatial": "comm", "tensor": "comm"}


@pytest.mark.parametrize("package", sorted(COMMUNICATION))
def test_parallel_layout_each_folder_exports_what_it_lists(package):
    module = importlib.import_module(f"minidist.parallel.{package}")
    importlib.import_module(f"minidist.parallel.{package}.{COMMUNICATION[package]}")
    unresolved = [name for name in module.__all__ if not hasattr(module, name)]
    assert module.__all__ and not unresolved, f"minidist.parallel.{package} lists {unresolved}"


def _mismatched_algorithms(comm, views):
    from minidist.parallel import DataParallel

    model = Sequential(Linear(3, 2, rng=np.random.default_rng(0), dtype=np.float64))
    dp = DataParallel(comm, model, SGD(model.parameters(), lr=0.1), CrossEntropyLoss(),
                      algorithm="ring" if comm.rank == 0 else "tree", gradient_as_bucket_view=views)
    dp.train_step(np.ones((4, 3)), np.zeros(4, dtype=int))


@pytest.mark.parametrize("views", [False, True])
def test_parallel_layout_bucket_allreduce_checks_that_the_ranks_agree(views):
    # The buckets go through minidist.collectives.allreduce, whose mismatch check names the two calls.
    with pytest.raises(ClusterError, match="collective mismatch"):
        run(_mismatched_algorithms, 2, views, timeout=60.0)
