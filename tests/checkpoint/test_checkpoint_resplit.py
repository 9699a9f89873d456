"""save / load round trips of parallelized runs: every parallelize axis and ZeRO stage.

On 4 ranks each case trains 2 AdamW steps (float64), saves, trains 2 more (state A); a fresh trainer on
the same mesh loads and trains the 2 steps again: bitwise A on every rank. A fresh trainer on another mesh
(another ZeRO stage) loads and trains them: the one process's state after 4 steps to 1e-9 — the
checkpoint re-split. The batches come from a generator the checkpoint keeps. Two cluster runs in all.
"""

import numpy as np
import pytest

from minidist.checkpoint import load, save
from minidist.cluster import run

from .helpers import one_process, train, trainer_on

# (saved mesh, its ZeRO stage, loaded mesh, its ZeRO stage, Switch model)
CASES = {
    "dense": [({"data": 2, "tensor": 2}, 0, {"data": 4}, 0, False),
              ({"data": 2, "tensor": 2}, 0, {"tensor": 2, "pipeline": 2}, 0, False),
              ({"data": 2, "pipeline": 2}, 1, {"data": 2, "tensor": 2}, 0, False),
              ({"context": 2, "data": 2}, 0, {"data": 4}, 3, False)],
    "zero_expert": [({"data": 4}, 2, {"data": 2, "tensor": 2}, 1, False),
                    ({"data": 4}, 3, {"data": 2, "context": 2}, 0, False),
                    ({"expert": 2, "data": 2}, 0, {"data": 4}, 2, True)],
}


def round_trips(comm, root, cases):
    out = []
    for k, (saved, zero, other, other_zero, switch) in enumerate(cases):
        where = f"{root}/case{k}"
        rng = np.random.default_rng(9)
        trainer = trainer_on(comm, saved, zero, switch)
        train(trainer, rng, 2)
        save(trainer, where, 2, rngs={"batches": rng}, extra={"epoch": 0, "batch": 2})   # a loader's place
        train(trainer, rng, 2)
        states = [trainer.full_state_dict()]
        for sizes, stage in ((saved, zero), (other, other_zero)):
            rng = np.random.default_rng(0)           # another seed: the checkpoint's state must win
            resumed = trainer_on(comm, sizes, stage, switch)
            done = load(resumed, where, rngs={"batches": rng})
            assert done["step"] == 2 and done["extra"] == {"epoch": 0, "batch": 2}
            train(resumed, rng, 2)
            states.append(resumed.full_state_dict())
        out.append(states)
    return out


@pytest.mark.parametrize("group", sorted(CASES))
def test_round_trip_same_mesh_bitwise_other_mesh_equals_one_process(group, tmp_path):
    results = run(round_trips, 4, str(tmp_path), CASES[group], timeout=240)
    for k, (saved, zero, other, other_zero, switch) in enumerate(CASES[group]):
        reference = one_process(4, switch)
        for rank in range(4):
            uninterrupted, same_mesh, other_mesh = results[rank][k]
            for name, value in reference.items():
                assert np.array_equal(same_mesh[name], uninterrupted[name]), (k, rank, name)
                assert np.array_equal(other_mesh[name], results[0][k][2][name]), (k, rank, name)
                np.testing.assert_allclose(other_mesh[name], value, rtol=0, atol=1e-9,
                                           err_msg=f"{saved} z{zero} -> {other} z{other_zero}: {name}")
