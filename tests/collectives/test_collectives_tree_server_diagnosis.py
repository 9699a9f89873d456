"""The tree and parameter-server all-reduces checked message by message (tree_server_diagnosis.py): these
run first under `pytest --exercise tree_allreduce` / `parameter_server_allreduce`, so a wrong solution's
first failure names the tree level, or the rank whose gradient the server's total lacks."""

import pytest

from minidist.cluster import run
from tests.collectives.tree_server_diagnosis import diagnose_op, diagnose_server, diagnose_tree, traffic_trace

WORLDS = (2, 3, 5, 8)


@pytest.mark.exercise("tree_allreduce")
@pytest.mark.diagnose
def test_tree_levels_send_the_partial_sums_of_their_subtrees():
    for p in WORLDS:
        wrong = diagnose_tree(run(traffic_trace, p, "tree", 3, timeout=60)) or \
            diagnose_op(run(traffic_trace, p, "tree", 3, "max", timeout=60), "max")
        assert wrong is None, f"P={p}: {wrong}"


@pytest.mark.exercise("parameter_server_allreduce")
@pytest.mark.diagnose
def test_the_server_total_holds_every_rank_gradient_once():
    for p in WORLDS:
        wrong = diagnose_server(run(traffic_trace, p, "parameter_server", 3, timeout=60)) or \
            diagnose_op(run(traffic_trace, p, "parameter_server", 3, "max", timeout=60), "max")
        assert wrong is None, f"P={p}: {wrong}"
