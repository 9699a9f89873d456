"""parallelize refuses what it cannot train like one process before it touches the model
(minidist/parallel/compose/refusals.py), and train_step what a step cannot use (compose/trainer.py).

Every refused parallelize leaves the model bitwise as it was (its state_dict, and no sub-module swapped):
the checks all run before the model is labelled and split. Each case runs on every rank of one 4-rank
cluster (a refusal is local: no rank waits for another), then the train_step refusals: a sequence longer
than block_size, and ranks given different batches (a digest compared by ``comm.all_equal``, free on the
simulated clock).
"""

import re

import numpy as np
import pytest

from minidist.cluster import run
from minidist.nn import GPT, CrossEntropyLoss, SwitchTransformer
from minidist.optim import AdamW
from minidist.parallel import Mesh, parallelize
from minidist.parallel.tensor import tensor_parallel
from minidist.precision import BF16

N, T, V = 8, 8, 11


def gpt(**options) -> GPT:
    return GPT(V, T, 2, 8, 2, rng=np.random.default_rng(5), dtype=np.float64, **options)


def adamw(params):
    return AdamW(params, lr=0.01)


class ForwardOnly:
    def forward(self, y, target):
        return 0.0


# case: (mesh sizes, model options or "switch", parallelize keywords, the error's type, its message)
CASES = {
    "tied weights over a pipeline": (dict(data=2, pipeline=2), dict(tie_weights=True), {}, ValueError,
                                     "cannot stay tied over a pipeline axis"),
    "tied weights under ZeRO-3": (dict(data=4), dict(tie_weights=True), dict(zero=3), ValueError,
                                  "tied weights cannot stay tied under ZeRO-3"),
    "dropout": (dict(data=4), dict(dropout=0.1), {}, ValueError, r"dropout 0 only .*, got dropout \[0.1\]"),
    "interleaved stages past the units": (dict(pipeline=4), {}, dict(schedule="interleaved", chunks=4,
                                          micro_batches=4), ValueError,
                                          "has 16 stages but the model has 5 units"),
    "mixed with an unknown keyword": (dict(data=4), {}, dict(mixed=dict(fmt=BF16, loss_scale=8.0)),
                                      ValueError, r"mixed takes MixedPrecisionTrainer's keywords"),
    "mixed over a pipeline": (dict(pipeline=2, data=2), {}, dict(mixed=dict(fmt=BF16)), ValueError,
                              "mixed precision runs with zero=0, without a pipeline axis"),
    "mixed on float64 weights": (dict(data=4), {}, dict(mixed=dict(fmt=BF16)), TypeError,
                                 r"float32 master weights: build the model with dtype=np.float32, "
                                 r"got \['float64'\]"),
    "an optimizer that is not a function": (dict(data=4), {}, dict(optimizer="adamw"), TypeError,
                                            "optimizer must be a function of a list of Parameters"),
    "an optimizer factory returning None": (dict(data=4), {}, dict(optimizer=lambda params: None), TypeError,
                                            r"optimizer\(params\) must return an optimizer"),
    "no loss": (dict(data=4), {}, dict(loss_fn=None), TypeError, "loss_fn must have forward"),
    "a loss without backward": (dict(data=4), {}, dict(loss_fn=ForwardOnly()), TypeError,
                                "loss_fn must have forward"),
    "ZeRO-2 over a pipeline": (dict(data=2, pipeline=2), {}, dict(zero=2), ValueError,
                               "ZeRO-2 runs without a pipeline axis"),
    "sequence parallelism of experts": (dict(tensor=4), "switch", dict(sequence_parallel=True), ValueError,
                                        "a dense GPT"),
    "no micro-batches": (dict(data=4), {}, dict(micro_batches=0), ValueError,
                         "micro_batches must be an integer >= 1"),
    "routing groups": (dict(data=4), "switch", {}, ValueError, "routes groups=1, but the mesh routes"),
}


def _build(options):
    if options == "switch":
        return SwitchTransformer(V, T, 2, 8, 4, 2, 16, rng=np.random.default_rng(5), dtype=np.float64)
    return gpt(**options)


def _refusals(comm):
    """Per case: (type name, message, model unchanged bitwise) of what parallelize raised on this rank."""
    out = {}
    for case, (sizes, options, keywords, _, _) in CASES.items():
        model = _build(options)
        before = {name: value.copy() for name, value in model.state_dict().items()}
        kinds = [type(m) for m in model.modules()]
        mesh = Mesh(comm, **sizes)
        arguments = {**dict(loss_fn=CrossEntropyLoss(), optimizer=adamw), **keywords}
        try:
            parallelize(model, mesh, **arguments)
            out[case] = (None, "", True)
        except (TypeError, ValueError) as error:
            after = model.state_dict()
            same = set(after) == set(before) and all(
                after[name].dtype == value.dtype and np.array_equal(after[name], value)
                for name, value in before.items()) and [type(m) for m in model.modules()] == kinds
            out[case] = (type(error).__name__, str(error), same)
    return out


@pytest.fixture(scope="module")
def refusals():
    return run(_refusals, 4, timeout=120)


@pytest.mark.parametrize("case", list(CASES))
def test_parallel_parallelize_refuses_before_it_touches_the_model(case, refusals):
    *_, kind, message = CASES[case]
    for per_rank in refusals:
        name, text, unchanged = per_rank[case]
        assert name == kind.__name__, text
        assert re.search(message, text), text
        assert unchanged                               # the model's state_dict bitwise as before


def _split_twice(comm, how):
    """A model a Trainer split (data only: no sub-module swapped, the Trainer's mark), or a transform did."""
    model, mesh = gpt(), Mesh(comm, **({"data": 2} if how == "trainer" else {"tensor": 2}))
    if how == "trainer":
        parallelize(model, mesh, loss_fn=CrossEntropyLoss(), optimizer=adamw).prepare(T)
    else:
        tensor_parallel(model.blocks[0], mesh.group("tensor"))
    parallelize(model, mesh, loss_fn=CrossEntropyLoss(), optimizer=adamw)


@pytest.mark.parametrize("how,message", [
    ("trainer", r"already split \(by a Trainer or a transform: parallelize\)"),
    ("transform", "already split .*TensorParallelAttention"),
])
def test_parallel_parallelize_refuses_a_model_already_split(how, message):
    with pytest.raises(Exception, match=message):
        run(_split_twice, 2, how, timeout=60)


def _step(comm, case):
    model = gpt()
    trainer = parallelize(model, Mesh(comm, data=2), loss_fn=CrossEntropyLoss(), optimizer=adamw)
    rng = np.random.default_rng(9 + (comm.rank if case == "different batches" else 0))
    length = 10 if case == "too long" else T
    x, y = rng.integers(0, V, size=(N, length)), rng.integers(0, V, size=(N, length))
    trainer.train_step(x, y)


@pytest.mark.parametrize("case,message", [
    ("too long", "a sequence of 10 tokens is longer than the model's block_size = 8"),
    ("different batches", "the ranks were given different batches"),
])
def test_parallel_parallelize_train_step_refuses_what_a_step_cannot_use(case, message):
    with pytest.raises(Exception, match=message):
        run(_step, 2, case, timeout=60)


def test_parallel_parallelize_help_prints_the_recipe():
    """minidist.parallel.parallelize is the function (the package compose/ holds it: no module of that name
    shadows it), and its docstring is the recipe."""
    import minidist.parallel

    assert callable(minidist.parallel.parallelize) and minidist.parallel.parallelize is parallelize
    for line in ("mesh = Mesh(comm, data=2, tensor=2)", "loss = trainer.train_step(x, y)",
                 "state = trainer.full_state_dict()"):
        assert line in parallelize.__doc__
