"""FP16 accumulation in chunks (Wang et al. 2018): its error against float64 falls with the chunk size as
the theory says, and the FP8 recipe's Linear GEMMs are exactly lowp_matmul's rounding sequence."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from minidist.nn import Linear, ReLU, Sequential
from minidist.nn.loss import CrossEntropyLoss
from minidist.nn.runner import StepRunner
from minidist.optim import SGD
from minidist.precision import FP8_E5M2, FP16, lowp_dot, lowp_matmul, quantize
from minidist.precision.accumulation import LowpAccumulation
from minidist.precision.fp8_training import fp8_trainer


def test_error_falls_with_the_chunk_to_near_sqrt_n():
    """n = 4096 positive products: a sequential FP16 sum errs ~ n·u, chunks of c ~ (c + n/c)·u, least
    near c = sqrt(n) = 64; from c = 1 (the sequential sum) the error falls at every doubling up to 64."""
    rng = np.random.default_rng(0)
    x, y = rng.uniform(0, 1, (2, 32, 4096))
    exact = np.einsum("tk,tk->t", quantize(x, FP8_E5M2), quantize(y, FP8_E5M2))   # exact in float64

    def error(chunk):
        return float(np.mean(np.abs(lowp_dot(x, y, FP8_E5M2, FP16, chunk) - exact) / exact))

    sequential = error(None)
    falling = [error(c) for c in (1, 2, 4, 8, 16, 32, 64)]
    assert falling[0] == sequential                       # chunks of one product: the sequential sum
    assert all(b < a for a, b in zip(falling[:-1], falling[1:], strict=True)), falling
    assert falling[-1] < sequential / 20                  # chunked << unchunked
    assert error(4096) == sequential                      # one chunk of n: sequential again


def by_hand(model, x, target, chunk):
    """Forward and backward of Linear-ReLU-Linear written out with lowp_matmul (bias, ReLU in float32)."""
    first, _, last = model

    def mm(a, b):
        return lowp_matmul(a, b, FP8_E5M2, FP16, chunk=chunk).astype(np.float32)

    h = mm(x, first.weight.data.T) + first.bias.data
    r = np.maximum(h, 0)
    out = mm(r, last.weight.data.T) + last.bias.data
    loss = CrossEntropyLoss()
    loss.forward(out, target)
    dy = loss.backward()
    dh = mm(dy, last.weight.data) * (h > 0)
    return out, mm(dy.T, r), mm(dh.T, x)


@settings(max_examples=15)
@given(st.integers(1, 12), st.one_of(st.none(), st.integers(1, 9)), st.integers(0, 2**32 - 1))
def test_the_attachment_runs_the_layers_gemms_as_lowp_matmul(batch, chunk, seed):
    rng = np.random.default_rng(seed)
    model = Sequential(Linear(7, 5, rng=rng), ReLU(), Linear(5, 3, rng=rng))
    x = rng.standard_normal((batch, 7)).astype(np.float32)
    target = rng.integers(0, 3, batch)
    out, d_last, d_first = by_hand(model, x, target, chunk)
    runner = StepRunner(model, CrossEntropyLoss(), [LowpAccumulation(FP16, chunk)])
    assert np.array_equal(runner.forward(x), out)
    for _ in range(2):                                    # gradients accumulate over passes
        runner.forward_backward(x, target)
    assert np.array_equal(model[2].weight.grad, 2 * d_last)
    assert np.array_equal(model[0].weight.grad, 2 * d_first)


def test_fp8_trainer_accumulates_in_fp16_chunks_by_default():
    rng = np.random.default_rng(1)
    model = Sequential(Linear(6, 4, rng=rng), ReLU(), Linear(4, 3, rng=rng))
    trainer = fp8_trainer(model, SGD(model.parameters(), lr=0.1), CrossEntropyLoss(), rng)
    accumulation = trainer.runner.attachments[1]
    assert isinstance(accumulation, LowpAccumulation)
    assert (accumulation.accum_fmt, accumulation.chunk) == (FP16, 64)
    plain = fp8_trainer(model, SGD(model.parameters(), lr=0.1), CrossEntropyLoss(), rng, accum_fmt=None,
                        half_storage=False)
    assert plain.runner.attachments == [plain]
