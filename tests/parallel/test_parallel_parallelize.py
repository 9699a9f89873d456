"""parallelize (minidist/parallel/compose/) on a Mesh trains a tiny GPT — a Switch Transformer where
the expert axis is used — like one process: every pair and every triple of {data, pipeline, tensor, context,
expert} with axis size 2, and one four-axis mesh on 16 ranks.

A float64 model (vocabulary 11, 8 positions, 2 blocks, d = 8, 2 heads; Switch: 2 experts of d_ff 16, top-1)
trains 3 AdamW steps; ``full_state_dict()`` must equal one process's ``state_dict()`` on every rank (bitwise
the same on all ranks), and each step's loss the one process's objective (cross-entropy plus router losses),
bitwise the same on every rank. The pairs run two at a time on the halves of one 8-rank cluster, the triples
one after another on another: three cluster runs in all.

Sequence parallelism (data × tensor, tensor × context) and ZeRO-2 (data × tensor, data × context) are checked
like the pairs; mixed precision (BF16) on data × tensor against DataParallel with the same recipe.

One process routes a Switch model's tokens in S·M groups (S = data × expert token sets, M micro-batches),
as the mesh does. With a context axis a group is a rank's zigzag positions, which no contiguous grouping
matches: capacity factor E (nothing dropped) and the z-loss only (as test_parallel_grid_expert.py).
"""

import itertools

import numpy as np
import pytest

from minidist.cluster import run
from minidist.nn import GPT, CrossEntropyLoss, SwitchTransformer
from minidist.optim import SGD, AdamW
from minidist.parallel import DataParallel, Mesh, parallelize
from minidist.precision import BF16, StaticLossScaler
from minidist.precision.mixed import MixedPrecisionTrainer

STEPS, N, T, V = 3, 8, 8, 11
AXES = ("data", "pipeline", "tensor", "context", "expert")
SCHEDULE = {"data": "gpipe", "tensor": "1f1b", "context": "zb-h1", "expert": "1f1b"}   # a pipeline's partner


def build(switch: bool, groups: int = 1, context: bool = False) -> GPT:
    rng = np.random.default_rng(5)
    if not switch:
        return GPT(V, T, 2, 8, 2, rng=rng, dtype=np.float64)
    routing = dict(capacity_factor=2.0, aux_loss_coef=0.0) if context else \
        dict(capacity_factor=1.0, aux_loss_coef=0.01)
    return SwitchTransformer(V, T, 2, 8, 2, 2, 16, z_loss_coef=0.001, groups=groups, **routing, rng=rng,
                             dtype=np.float64)


def batch():
    rng = np.random.default_rng(9)
    return rng.integers(0, V, size=(N, T)), rng.integers(0, V, size=(N, T))


def options(axes: tuple[str, ...]) -> dict:
    """parallelize's keywords for a case: 2 micro-batches, a schedule that varies with the pipeline's
    partner axis, ZeRO-1 where a pipeline has a data axis and a third axis."""
    opts = dict(micro_batches=2)
    if "pipeline" in axes:
        partner = [a for a in axes if a != "pipeline"][0]
        opts["schedule"] = SCHEDULE[partner]
        if "data" in axes and len(axes) == 3:
            opts["zero"] = 1
    return opts


def case_model(axes: tuple[str, ...]) -> GPT:
    sets = 2 ** len({"data", "expert"} & set(axes))
    return build("expert" in axes, groups=sets * options(axes)["micro_batches"], context="context" in axes)


def reference(axes: tuple[str, ...]):
    """One process: the model's state_dict after STEPS AdamW steps, and each step's objective."""
    model, (x, y) = case_model(axes), batch()
    loss_fn, opt, losses = CrossEntropyLoss(), AdamW(model.parameters(), lr=0.01), []
    for _ in range(STEPS):
        model.zero_grad()
        loss = loss_fn.forward(model.forward(x), y)
        losses.append(loss + getattr(model, "router_loss", 0.0))
        model.backward(loss_fn.backward())
        opt.step()
    return model.state_dict(), losses


def train(comm, axes: tuple[str, ...]):
    model, (x, y) = case_model(axes), batch()
    trainer = parallelize(model, Mesh(comm, **{a: 2 for a in axes}), loss_fn=CrossEntropyLoss(),
                          optimizer=lambda params: AdamW(params, lr=0.01), **options(axes))
    losses = [trainer.train_step(x, y) for _ in range(STEPS)]
    return trainer.full_state_dict(), losses


def _in_halves(comm, cases):
    """Rank r of 8 runs cases[r // 4] on its half of the world, one pair of cases after another."""
    results = []
    for two in cases:
        half = comm.split(color=comm.rank // 4, key=comm.rank % 4)
        results.append(train(half, two[comm.rank // 4]))
    return results


def _one_by_one(comm, cases):
    return [train(comm, axes) for axes in cases]


PAIRS = list(itertools.combinations(AXES, 2))
TRIPLES = list(itertools.combinations(AXES, 3))
FOUR = ("data", "pipeline", "tensor", "expert")


@pytest.fixture(scope="module")
def pairs():
    two_at_a_time = [PAIRS[i:i + 2] for i in range(0, len(PAIRS), 2)]
    per_rank = run(_in_halves, 8, two_at_a_time, timeout=300)
    return {pair: [per_rank[r][i // 2] for r in range(4 * (i % 2), 4 * (i % 2) + 4)]
            for i, pair in enumerate(PAIRS)}


@pytest.fixture(scope="module")
def triples():
    per_rank = run(_one_by_one, 8, TRIPLES, timeout=300)
    return {axes: [results[i] for results in per_rank] for i, axes in enumerate(TRIPLES)}


def check(axes, results):
    expected, expected_losses = reference(axes)
    first_state, first_losses = results[0]
    assert set(first_state) == set(expected)
    for name, value in expected.items():
        assert first_state[name].dtype == value.dtype
        np.testing.assert_allclose(first_state[name], value, rtol=1e-9, atol=1e-11, err_msg=name)
    for state, losses in results[1:]:                  # every rank: the same bits
        assert losses == first_losses
        for name, value in first_state.items():
            np.testing.assert_array_equal(state[name], value)
    np.testing.assert_allclose(first_losses, expected_losses, rtol=1e-10)


@pytest.mark.parametrize("axes", PAIRS, ids="x".join)
def test_parallel_parallelize_every_pair_of_axes_trains_like_one_process(axes, pairs):
    check(axes, pairs[axes])


@pytest.mark.parametrize("axes", TRIPLES, ids="x".join)
def test_parallel_parallelize_every_triple_of_axes_trains_like_one_process(axes, triples):
    check(axes, triples[axes])


def test_parallel_parallelize_four_axes_on_16_ranks_train_like_one_process():
    check(FOUR, [result for (result,) in run(_one_by_one, 16, [FOUR], timeout=300)])



NO_EXPERT_AXIS = [dict(data=2), dict(pipeline=2, tensor=2), dict(tensor=2), {}]


def _switch_without_expert_axis(comm):
    """A Switch model on meshes without an expert axis (each MoE stays whole on every rank), the four at
    once on ranks 0-1, 2-5, 6-7 and 8 of 9, each case as ``train`` runs it (2 micro-batches)."""
    starts = [0, 2, 6, 8]
    case = max(i for i, first in enumerate(starts) if comm.rank >= first)
    part = comm.split(color=case, key=comm.rank)
    sizes = NO_EXPERT_AXIS[case]
    model, (x, y) = build(True, groups=sizes.get("data", 1) * 2), batch()
    trainer = parallelize(model, Mesh(part, **sizes), loss_fn=CrossEntropyLoss(), micro_batches=2,
                          optimizer=lambda params: AdamW(params, lr=0.01))
    losses = [trainer.train_step(x, y) for _ in range(STEPS)]
    return case, (trainer.full_state_dict(), losses)


def test_parallel_parallelize_a_switch_model_without_an_expert_axis_trains_like_one_process():
    """data only, pipeline × tensor, tensor only and one rank: the experts whole (Megatron-split over a
    tensor axis), routed per rank and micro-batch as one process routes its S·M groups."""
    results = run(_switch_without_expert_axis, 9, timeout=180)
    for case, sizes in enumerate(NO_EXPERT_AXIS):
        expected, expected_losses = _reference_groups(sizes.get("data", 1) * 2)
        mine = [result for c, result in results if c == case]
        first_state, first_losses = mine[0]
        for name, value in expected.items():
            np.testing.assert_allclose(first_state[name], value, rtol=1e-9, atol=1e-11, err_msg=name)
        assert all(losses == first_losses for _, losses in mine)
        np.testing.assert_allclose(first_losses, expected_losses, rtol=1e-10)


def _reference_groups(groups: int):
    model, (x, y) = build(True, groups=groups), batch()
    loss_fn, opt, losses = CrossEntropyLoss(), AdamW(model.parameters(), lr=0.01), []
    for _ in range(STEPS):
        model.zero_grad()
        loss = loss_fn.forward(model.forward(x), y)
        losses.append(loss + model.router_loss)
        model.backward(loss_fn.backward())
        opt.step()
    return model.state_dict(), losses


SUPPORTED = [    # (mesh sizes, parallelize keywords, tied weights)
    (dict(data=2, tensor=2), {}, True),                                        # tied: one stage keeps them
    (dict(pipeline=2, tensor=2), dict(sequence_parallel=True, micro_batches=2), False),
    (dict(data=2, tensor=2), dict(zero=3, micro_batches=2), False),            # ZeRO-3 accumulating
    (dict(data=2, context=2), dict(zero=2), True),                             # tied under ZeRO-2
]


def _supported(comm):
    case = comm.rank // 4
    sizes, keywords, tied = SUPPORTED[case]
    part = comm.split(color=case, key=comm.rank % 4)
    model, (x, y) = GPT(V, T, 2, 8, 2, tie_weights=tied, rng=np.random.default_rng(5), dtype=np.float64), \
        batch()
    trainer = parallelize(model, Mesh(part, **sizes), loss_fn=CrossEntropyLoss(),
                          optimizer=lambda params: AdamW(params, lr=0.01), **keywords)
    losses = [trainer.train_step(x, y) for _ in range(STEPS)]
    return case, (trainer.full_state_dict(), losses)


def test_parallel_parallelize_tied_weights_sequence_parallel_pipelines_and_accumulating_zero():
    """Tied weights on one pipeline rank (the head's matrix is the token table: one Parameter, its two
    gradients summed before it is synchronised; with ZeRO-2 too), sequence parallelism across a pipeline,
    ZeRO-3 over two micro-batches: each like one process."""
    results = run(_supported, 16, timeout=180)
    for case, (_, _, tied) in enumerate(SUPPORTED):
        model, (x, y) = GPT(V, T, 2, 8, 2, tie_weights=tied, rng=np.random.default_rng(5),
                            dtype=np.float64), batch()
        loss_fn, opt, expected_losses = CrossEntropyLoss(), AdamW(model.parameters(), lr=0.01), []
        for _ in range(STEPS):
            model.zero_grad()
            expected_losses.append(loss_fn.forward(model.forward(x), y))
            model.backward(loss_fn.backward())
            opt.step()
        for c, (state, losses) in results:
            if c == case:
                np.testing.assert_allclose(losses, expected_losses, rtol=1e-10)
                for name, value in model.state_dict().items():
                    np.testing.assert_allclose(state[name], value, rtol=1e-9, atol=1e-11, err_msg=name)


def _sequence(comm, zero=0):
    """Two 4-rank meshes at once, on the halves of 8 ranks: data × tensor and tensor × context, each with
    sequence parallelism on the tensor axis (zero=2, 3: data × tensor and data × context with ZeRO)."""
    half = comm.split(color=comm.rank // 4, key=comm.rank % 4)
    sizes = [dict(data=2, tensor=2), dict(data=2, context=2) if zero else dict(tensor=2, context=2)]
    model, (x, y) = build(False), batch()
    mesh = Mesh(half, **sizes[comm.rank // 4])
    trainer = parallelize(model, mesh, loss_fn=CrossEntropyLoss(), zero=zero,
                          optimizer=lambda params: AdamW(params, lr=0.01), sequence_parallel=not zero)
    losses = [trainer.train_step(x, y) for _ in range(STEPS)]
    split = model.blocks[0].ln1.weight.partial_over       # the norms saw T/t tokens: summed over tensor
    stepped = sum(p.size for p in trainer.optimizer.params), sum(len(labels) for labels in trainer.labels)
    freed = all(p.data is None for p in trainer.held)     # ZeRO-3: between steps a rank holds its shards only
    sequence = any(group is mesh.group("tensor") for group in split)
    return trainer.full_state_dict(), losses, sequence, stepped, freed


def test_parallel_parallelize_sequence_parallelism_trains_like_one_process():
    results = run(_sequence, 8, timeout=120)
    assert all(result[2] for result in results)
    check(("data", "tensor"), [result[:2] for result in results[:4]])
    check(("tensor", "context"), [result[:2] for result in results[4:]])


@pytest.mark.parametrize("zero", [2, 3])
def test_parallel_parallelize_zero_on_the_data_axis_of_a_hybrid_trains_like_one_process(zero):
    """ZeRO-2 and ZeRO-3 (each unit's parameters gathered for its forward and backward, freed after) on the
    data axis of data × tensor and data × context."""
    results = run(_sequence, 8, zero, timeout=120)
    assert all(result[4] == (zero == 3) for result in results)
    for r in (0, 1, 4, 5):         # rank r and r + 2 are the two data replicas: each steps half the elements
        (mine, held), (partner, _) = results[r][3], results[r + 2][3]
        assert mine + partner == held and abs(mine - partner) <= 1
    check(("data", "tensor"), [result[:2] for result in results[:4]])
    check(("data", "context"), [result[:2] for result in results[4:]])


def _mixed(comm, how):
    """3 SGD steps in BF16 (static loss scale 256) of a float32 GPT: through parallelize on data 2 × tensor 2,
    through DataParallel on data 2, or (how="fp32") parallelize without the recipe."""
    model, (x, y) = GPT(V, T, 2, 8, 2, rng=np.random.default_rng(5)), batch()
    recipe = dict(fmt=BF16, scaler=StaticLossScaler(256.0))
    if how == "DataParallel":
        opt = SGD(model.parameters(), lr=0.1)
        mixed = MixedPrecisionTrainer(model, opt, CrossEntropyLoss(), **recipe)
        trainer = DataParallel(comm, model, opt, CrossEntropyLoss(), mixed=mixed)
        return [trainer.train_step(x, y) for _ in range(STEPS)], model.state_dict()
    trainer = parallelize(model, Mesh(comm, data=2, tensor=2), loss_fn=CrossEntropyLoss(),
                          optimizer=lambda params: SGD(params, lr=0.1),
                          mixed=recipe if how == "bf16" else None)
    return [trainer.train_step(x, y) for _ in range(STEPS)], trainer.full_state_dict()


def test_parallel_parallelize_mixed_precision_inside_a_hybrid_is_data_parallels_recipe():
    """data 2 × tensor 2 in BF16 equals DataParallel's BF16 recipe on data 2 per parameter (the tensor split
    changes only float32 rounding inside the blocks), and differs from float32 training by far more: the
    recipe ran. SGD, not AdamW: Adam's normalisation turns the BF16 rounding of a tiny gradient — rounded
    per replica here, once in one process — into a step of lr, so no tolerance would be meaningful."""
    (losses, state), *_ = run(_mixed, 4, "bf16", timeout=120)
    (first, expected), (second, _) = run(_mixed, 2, "DataParallel", timeout=120)
    (_, plain), *_ = run(_mixed, 4, "fp32", timeout=120)
    np.testing.assert_allclose(losses, np.add(first, second) / 2, rtol=1e-5)     # the replicas' mean
    for name, value in expected.items():
        np.testing.assert_allclose(state[name], value, rtol=0, atol=1e-5, err_msg=name)
    assert max(np.abs(plain[name] - value).max() for name, value in expected.items()) > 1e-4


def _bad(comm, case):
    sizes = {"heads": dict(tensor=4), "dense": dict(expert=4), "switch": dict(data=2, tensor=2)}.get(
        case, dict(data=2, context=2))
    options = {"zero": dict(zero=4), "schedule": dict(schedule="1F1B"),
               "sequence_parallel": dict(sequence_parallel=True)}.get(case, {})
    model = build(True, groups=2) if case == "switch_context" else build(case == "switch")
    if case == "switch_context":
        sizes = dict(data=2, context=2)
    trainer = parallelize(model, Mesh(comm, **sizes), loss_fn=CrossEntropyLoss(),
                          optimizer=lambda params: AdamW(params), micro_batches=1, **options)
    x, y = batch()
    if case == "batch":
        trainer.train_step(x[:3], y[:3])
    if case == "sequence":
        trainer.train_step(x[:, :6], y[:, :6])


@pytest.mark.parametrize("case,message", [
    ("heads", r"tensor = 4 must divide the heads \(2\)"),
    ("dense", "expert = 4 needs a SwitchTransformer, got a dense GPT"),
    ("switch", r"the Switch model routes groups=1, but the mesh routes data × expert × micro_batches = 2"),
    ("switch_context", "with a context axis a routing group is a rank's zigzag positions"),
    ("batch", r"a batch of 3 does not split into data × expert × micro_batches = 2 equal parts"),
    ("zero", "zero must be 0, 1, 2 or 3"),
    ("sequence_parallel", "sequence_parallel needs a tensor axis > 1"),
    ("schedule", r"schedule must be one of \['1f1b', 'chimera', 'gpipe', 'interleaved', 'naive', 'zb-h1'\]"),
    ("sequence", r"a sequence of 6 does not split into 2·context = 4 zigzag chunks"),
])
def test_parallel_parallelize_refuses_what_the_mesh_cannot_split(case, message):
    with pytest.raises(Exception, match=message):
        run(_bad, 4, case, timeout=60)


ZEROS = ((dict(data=2, tensor=2), (0, 1, 2, 3)), (dict(data=2, pipeline=2), (0, 1)))
ENGINE_CASES = [(sizes, dict(zero=zero, micro_batches=m, overlap=overlap)) for sizes, zeros in ZEROS
                for zero in zeros for m in (1, 2) for overlap in (True, False)]


def _engines(comm):
    results = []
    for sizes, keywords in ENGINE_CASES:
        model, (x, y) = build(False), batch()
        trainer = parallelize(model, Mesh(comm, **sizes), loss_fn=CrossEntropyLoss(),
                              optimizer=lambda params: AdamW(params, lr=0.01), **keywords)
        losses = [trainer.train_step(x, y) for _ in range(STEPS)]
        results.append((trainer.full_state_dict(), losses))
    return results


def test_parallel_parallelize_every_zero_stage_micro_batch_count_and_overlap_on_both_engines():
    """One pipeline rank (data × tensor: the step runner) with ZeRO 0-3, the executor (data × pipeline)
    with ZeRO 0 and 1, each on 1 and 2 micro-batches, buckets overlapped or sent after the backward."""
    per_rank = run(_engines, 4, timeout=180)
    for i, (sizes, _) in enumerate(ENGINE_CASES):
        check(tuple(sizes), [results[i] for results in per_rank])
