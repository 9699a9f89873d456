"""Gradient checkpointing (minidist/nn/checkpoint.py): bitwise the plain segment's results, less memory.

Each model is built twice from the same seed (plain and wrapped), fed the same data, and compared
bitwise: outputs, dx, every parameter's gradient, BatchNorm's running statistics (updated once, not
twice), Dropout's masks (replayed by rewinding the generator) and the generators' states afterwards.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minidist.nn import GELU, BatchNorm1d, Dropout, LayerNorm, Linear, Module, ReLU, Sequential, Tanh
from minidist.nn.checkpoint import Checkpoint, forward_flops, forward_saving
from minidist.nn.gradcheck import gradcheck
from minidist.nn.nbytes import nbytes_of


def build(kinds: list[str], width: int, seed: int) -> Sequential:
    rng = np.random.default_rng(seed)
    layers: list[Module] = []
    for kind in kinds:
        if kind == "linear":
            layers.append(Linear(width, width, rng=rng, dtype=np.float64))
        elif kind == "dropout":
            layers.append(Dropout(0.3, rng=np.random.default_rng(rng.integers(2**32))))
        elif kind == "batchnorm":
            layers.append(BatchNorm1d(width, dtype=np.float64))
        elif kind == "layernorm":
            layers.append(LayerNorm(width, dtype=np.float64))
        else:
            layers.append({"relu": ReLU, "tanh": Tanh, "gelu": GELU}[kind]())
    return Sequential(*layers)


KINDS = st.sampled_from(["linear", "relu", "tanh", "gelu", "dropout", "batchnorm", "layernorm"])


@given(kinds=st.lists(KINDS, min_size=1, max_size=6), batch=st.integers(2, 7), width=st.integers(1, 5),
       seed=st.integers(0, 2**16), steps=st.integers(1, 3))
def test_parallel_pipeline_checkpoint_is_bitwise_the_plain_segment(kinds, batch, width, seed, steps):
    plain, wrapped = build(kinds, width, seed), Checkpoint(build(kinds, width, seed))
    data = np.random.default_rng(seed + 1)
    for _ in range(steps):  # several rounds: generators and running statistics must stay in step
        x = data.normal(size=(batch, width))
        dy = data.normal(size=(batch, width))
        assert np.array_equal(plain.forward(x), wrapped.forward(x.copy()))
        assert np.array_equal(plain.backward(dy), wrapped.backward(dy))
    for (name, p), q in zip(plain.named_parameters(), wrapped.segment.parameters(), strict=True):
        assert np.array_equal(p.grad, q.grad), name
    for (name, b), (_, c) in zip(plain.named_buffers(), wrapped.segment.named_buffers(), strict=True):
        assert np.array_equal(b, c), f"buffer {name} updated a different number of times"
    for p, q in zip(plain.layers, wrapped.segment.layers, strict=True):
        if isinstance(p, Dropout):
            assert p.rng.bit_generator.state == q.rng.bit_generator.state


def test_parallel_pipeline_checkpoint_gradcheck(rng):
    """Central differences with a random upstream gradient (float64), Dropout's mask held fixed."""
    wrapped = Checkpoint(build(["linear", "tanh", "dropout", "linear", "gelu", "layernorm"], 4, 7))
    dropout = wrapped.segment.layers[2]
    errors = gradcheck(wrapped, rng.normal(size=(3, 4)), rng,
                       before_forward=lambda: setattr(dropout, "rng", np.random.default_rng(5)))
    assert max(errors.values()) < 1e-6, errors


def test_parallel_pipeline_checkpoint_holds_only_its_input(rng):
    kinds = ["linear", "relu", "linear", "tanh", "dropout", "linear"]
    plain, wrapped = build(kinds, 6, 3), Checkpoint(build(kinds, 6, 3))
    x = rng.normal(size=(5, 6))
    _, saved_plain = forward_saving(plain, x)
    _, saved_wrapped = forward_saving(wrapped, x.copy())
    assert saved_wrapped.nbytes == x.nbytes  # only the input survives the forward pass
    # plain: 3 Linear inputs (the first is x itself), a ReLU mask (bool), Tanh's output, a Dropout mask
    assert saved_plain.nbytes == 3 * x.nbytes + x.size + x.nbytes + x.nbytes
    wrapped.backward(np.ones((5, 6)))
    assert wrapped.recompute_nbytes == saved_plain.nbytes - x.nbytes  # held only during backward
    assert all(value is None for layer in wrapped.segment.modules() for name, value in vars(layer).items()
               if name.startswith(("_x2d", "_mask")))


def test_parallel_pipeline_checkpoint_saved_activations_restore_per_micro_batch(rng):
    """Two forwards, then the two backwards in either order: restore() brings each one's activations back."""
    model, reference = build(["linear", "tanh", "linear"], 4, 0), build(["linear", "tanh", "linear"], 4, 0)
    xs = [rng.normal(size=(3, 4)), rng.normal(size=(2, 4))]
    dys = [rng.normal(size=(3, 4)), rng.normal(size=(2, 4))]
    stashes = [forward_saving(model, x)[1] for x in xs]
    for m in (1, 0):
        stashes[m].restore()
        reference.forward(xs[m])
        assert np.array_equal(model.backward(dys[m]), reference.backward(dys[m]))
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert np.array_equal(p.grad, q.grad)


def test_parallel_pipeline_checkpoint_flops_and_sizes(rng):
    seg = build(["linear", "relu", "linear"], 5, 0)
    wrapped = Checkpoint(seg)
    x = rng.normal(size=(4, 5))
    wrapped.forward(x)
    assert wrapped.flops((4, 5)) == sum(forward_flops(layer, (4, 5)) for layer in seg.layers) > 0
    with pytest.raises(ValueError, match="run forward on that shape"):
        wrapped.flops((7, 5))
    assert nbytes_of(x, x[1:], x.reshape(5, 4), [x]) == x.nbytes  # views count once


def test_parallel_pipeline_checkpoint_bad_input(rng):
    with pytest.raises(TypeError, match="expects a Module"):
        Checkpoint([Linear(2, 2)])
    wrapped = Checkpoint(build(["linear"], 2, 0))
    with pytest.raises(RuntimeError, match="before forward"):
        wrapped.backward(np.ones((1, 2)))
    with pytest.raises(TypeError, match="numpy array"):
        wrapped.forward([[1.0, 2.0]])
    wrapped.forward(np.ones((1, 2)))
    wrapped.backward(np.ones((1, 2)))
    with pytest.raises(RuntimeError, match="twice"):
        wrapped.backward(np.ones((1, 2)))
