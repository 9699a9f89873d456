"""Wrong backward passes and optimizers fail first with a diagnosing message (issue 55): five wrong
Linear backwards and five wrong SGD/Adam updates (off-by-one, wrong direction, missing scale, wrong order,
in-place aliasing), planted with mutants.py's machinery, are named by dX/dW/db and the first index off,
or by the step and the state that diverged; the softmax_backward and lamb_trust_ratio mutants of
`exercises mutants` by the axis or the case; wrong cross_entropy_backward, lstm_cell_backward and
sync_batchnorm_backward solutions by dlogits and the shape, the gate or dc_prev, and dX/dγ/dβ on a rank;
wrong dynamic_loss_scaling updates by the step, the flag and the scale or clean-step count; wrong
stochastic_rounding by x, its two neighbours and what was picked or how often; wrong gpipe_schedule by
the stage, the task and its tick; wrong magnitude_prune masks by the count or the first weight misplaced."""

import functools
import types
from pathlib import Path

import numpy as np
import pytest

import minidist.parallel.sync_batchnorm as sync_batchnorm
from minidist_course.mutants import MUTANTS, Mutant, mutated_source
from tests.nn.backward_diagnosis import (
    diagnose_backward,
    diagnose_cross_entropy,
    diagnose_lstm_cell,
    diagnose_softmax_backward,
)
from tests.nn.pruning_diagnosis import diagnose_magnitude_mask
from tests.optim.optimizer_diagnosis import (
    adam_reference,
    diagnose_optimizer,
    diagnose_trust_ratio,
    sgd_reference,
)
from tests.parallel.schedule_diagnosis import diagnose_gpipe
from tests.parallel.sync_batchnorm_diagnosis import diagnose_sync_batchnorm
from tests.precision.rounding_diagnosis import diagnose_stochastic_round
from tests.precision.scaling_diagnosis import diagnose_loss_scaler

ROOT = Path(__file__).resolve().parent.parent
if "# BEGIN SOLUTION linear" not in (ROOT / "minidist/nn/linear.py").read_text():
    pytest.skip("a student copy: the reference solutions these tests use are cut", allow_module_level=True)
LINEAR, SGD_FILE, ADAM_FILE = "minidist/nn/linear.py", "minidist/optim/sgd.py", "minidist/optim/adam.py"
WRONG_BACKWARDS = (
    Mutant("linear", "off-by-one: db sums over the wrong axis", LINEAR, "dy2d.sum(axis=0)",
           "dy2d.sum(axis=1)[:1]"),
    Mutant("linear", "wrong direction: dx through W transposed the other way", LINEAR,
           "dx = dy2d @ self.weight.data", "dx = -(dy2d @ self.weight.data)"),
    Mutant("linear", "missing scale: dW halved", LINEAR, "self.weight.grad += dy2d.T @ self._x2d",
           "self.weight.grad += 0.5 * (dy2d.T @ self._x2d)"),
    Mutant("linear", "wrong order: dW from x first, dy second", LINEAR,
           "self.weight.grad += dy2d.T @ self._x2d",
           "self.weight.grad += (self._x2d.T @ dy2d).T[:, ::-1]"),
    Mutant("linear", "in-place aliasing: assigns the gradient instead of adding", LINEAR,
           "self.bias.grad += dy2d.sum(axis=0)", "self.bias.grad[...] = dy2d.sum(axis=0)"),
)
SGD_DECAY, SGD_ADD = ("                buf *= momentum\n",
                      "                buf += g if dampening == 0 else (1 - dampening) * g\n")
WRONG_UPDATES = (
    Mutant("adam", "off-by-one: bias correction with β^(t+1)", ADAM_FILE,
           "bias_correction1 = 1 - beta1**t",
           "bias_correction1 = 1 - beta1**(t + 1)"),
    Mutant("adam", "wrong direction: steps up the gradient", ADAM_FILE,
           "w -= step", "w += step"),
    Mutant("adam", "missing scale: v without (1 − β2)", ADAM_FILE,
           "        g2 *= 1 - beta2\n", ""),
    Mutant("sgd_momentum", "wrong order: adds g before scaling the buffer by μ", SGD_FILE,
           SGD_DECAY + SGD_ADD, SGD_ADD + SGD_DECAY),
    Mutant("sgd_momentum", "in-place aliasing: the first step rebinds the buffer", SGD_FILE,
           "buf[...] = g", "buf = g.copy()"),
)


def planted(mutant: Mutant) -> types.ModuleType:
    package = mutant.path.removesuffix(".py").replace("/", ".").rpartition(".")[0]
    module = types.ModuleType(f"{package}._mutated")
    module.__package__ = package      # the file's relative imports resolve against the real package
    exec(compile(mutated_source(ROOT, mutant), mutant.path, "exec"), module.__dict__)
    return module


@pytest.mark.parametrize("mutant", WRONG_BACKWARDS, ids=[m.kind.split(":")[0] for m in WRONG_BACKWARDS])
def test_a_wrong_backward_is_named_by_its_array_and_first_index(mutant):
    rng = np.random.default_rng(0)
    layer = planted(mutant).Linear(3, 2, rng=rng, dtype=np.float64)
    message = diagnose_backward(layer, rng.standard_normal((4, 3)), rng, "Linear(3, 2)")
    assert message is not None, f"{mutant.kind}: nothing found"
    print(f"{mutant.kind}: {message}")
    named = any(f"backward: {name}" in message for name in ("dX", "dW", "db")) or "second backward" in message
    assert named, f"{mutant.kind}: {message}"
    assert "first index off" in message or "add, do not assign" in message, f"{mutant.kind}: {message}"


@pytest.mark.parametrize("mutant", WRONG_UPDATES, ids=[m.kind.split(":")[0] for m in WRONG_UPDATES])
def test_a_wrong_update_is_named_by_its_step_and_state(mutant):
    module = planted(mutant)
    if mutant.exercise == "adam":
        message = diagnose_optimizer(lambda params: module.Adam(params, lr=0.01),
                                     functools.partial(adam_reference, lr=0.01), "Adam")
    else:
        message = diagnose_optimizer(lambda params: module.SGD(params, lr=0.1, momentum=0.9),
                                     functools.partial(sgd_reference, lr=0.1, momentum=0.9), "SGD")
    assert message is not None, f"{mutant.kind}: nothing found"
    print(f"{mutant.kind}: {message}")
    assert ", step " in message and ("state[" in message or "the parameter" in message), \
        f"{mutant.kind}: {message}"


SOFTMAX_LAMB = [m for m in MUTANTS if m.exercise in ("softmax_backward", "lamb_trust_ratio")]


@pytest.mark.parametrize("mutant", SOFTMAX_LAMB,
                         ids=lambda m: f"{m.exercise}-{m.kind.split(':')[0]}")
def test_the_softmax_and_lamb_mutants_are_named_by_axis_or_case(mutant):
    module = planted(mutant)
    if mutant.exercise == "softmax_backward":
        message = diagnose_softmax_backward(module.softmax_backward, np.random.default_rng(3))
        expected = "softmax_backward along axis "
    else:
        message = diagnose_trust_ratio(module.lamb_trust_ratio)
        expected = "lamb_trust_ratio with "
    print(f"{mutant.kind}: {message}")
    assert message is not None and message.startswith(expected), f"{mutant.kind}: {message}"


LOSS, RNN, SYNC_BN = "minidist/nn/loss.py", "minidist/nn/rnn.py", "minidist/parallel/sync_batchnorm.py"
WRONG_CROSS_ENTROPY = (
    Mutant("cross_entropy_backward", "missing scale: no / N", LOSS, "        dlogits /= n\n", ""),
    Mutant("cross_entropy_backward", "off-by-one: subtracts 1 at the next class", LOSS,
           "dlogits[np.arange(n), self._target] -= 1",
           "dlogits[np.arange(n), (self._target + 1) % dlogits.shape[1]] -= 1"),
    Mutant("cross_entropy_backward", "wrong direction: softmax + onehot", LOSS,
           "dlogits[np.arange(n), self._target] -= 1", "dlogits[np.arange(n), self._target] += 1"),
    Mutant("cross_entropy_backward", "wrong scale on sequences: divides by B, not B·T", LOSS,
           "n = self._probs.shape[0]", "n = self._probs.shape[0]\n        scale = self._logits_shape[0]"
           "\n        dlogits = self._probs.copy()\n        dlogits[np.arange(n), self._target] -= 1"
           "\n        return (dlogits / scale).reshape(self._logits_shape)"),
)
WRONG_LSTM = (
    Mutant("lstm_cell_backward", "missing term: h's path into c without tanh'", RNN,
           "dc = dc + dh * o * (1.0 - tanh_c ** 2)", "dc = dc + dh * o"),
    Mutant("lstm_cell_backward", "wrong order: the f and g gates swapped", RNN,
           "df * f * (1.0 - f), dg * (1.0 - g ** 2)", "dg * (1.0 - g ** 2), df * f * (1.0 - f)"),
    Mutant("lstm_cell_backward", "missing scale: dc_prev without the forget gate", RNN,
           "return dgates, dc * f", "return dgates, dc"),
    Mutant("lstm_cell_backward", "wrong derivative: σ' of o as 1 − o", RNN, "do * o * (1.0 - o)",
           "do * (1.0 - o)"),
)
WRONG_SYNC_BN = (
    Mutant("sync_batchnorm_backward", "missing allreduce: dx from this rank's sums", SYNC_BN,
           "total = self._allreduce(local) if need_total else local", "total = local"),
    Mutant("sync_batchnorm_backward", "wrong sums: dγ, dβ the global ones", SYNC_BN,
           "sums = total if self.global_parameter_gradients else local", "sums = total"),
    Mutant("sync_batchnorm_backward", "missing term: no path through σ²", SYNC_BN,
           "return self._inv_std * (g - g_mean - x_hat * gx_mean)", "return self._inv_std * (g - g_mean)"),
)
BACKWARD_CASES = WRONG_CROSS_ENTROPY + WRONG_LSTM + WRONG_SYNC_BN


@pytest.mark.parametrize("mutant", BACKWARD_CASES,
                         ids=[f"{m.exercise}-{m.kind.split(':')[0]}" for m in BACKWARD_CASES])
def test_a_wrong_loss_lstm_or_sync_batchnorm_backward_names_its_gradient(monkeypatch, mutant):
    module = planted(mutant)
    if mutant.exercise == "cross_entropy_backward":
        message = diagnose_cross_entropy(module.CrossEntropyLoss, np.random.default_rng(4))
        expected = ("CrossEntropyLoss backward, logits (", ": dlogits: first index off")
    elif mutant.exercise == "lstm_cell_backward":
        message = diagnose_lstm_cell(module.lstm_cell_forward, module.lstm_cell_backward,
                                     np.random.default_rng(5))
        expected = ("lstm_cell_backward (", "first index off")
    else:
        monkeypatch.setattr(sync_batchnorm, "SyncBatchNorm", module.SyncBatchNorm)   # the forked ranks see it
        found = (diagnose_sync_batchnorm(w, np.random.default_rng(w)) for w in (1, 2, 3))
        message = next(filter(None, found), None)
        expected = ("SyncBatchNorm backward, global batch (", " on rank ")
    print(f"{mutant.kind}: {message}")
    assert message is not None and all(part in message for part in expected), f"{mutant.kind}: {message}"


SCALING = "minidist/precision/scaling.py"
WRONG_SCALERS = (
    Mutant("dynamic_loss_scaling", "off-by-one: grows one clean step late", SCALING,
           "if self.clean_steps == self.growth_interval:", "if self.clean_steps > self.growth_interval:"),
    Mutant("dynamic_loss_scaling", "missing reset: an overflow keeps the clean-step count", SCALING,
           "            self.scale *= self.backoff_factor\n            self.clean_steps = 0\n",
           "            self.scale *= self.backoff_factor\n"),
    Mutant("dynamic_loss_scaling", "wrong direction: an overflow grows the scale", SCALING,
           "self.scale *= self.backoff_factor", "self.scale *= self.growth_factor"),
    Mutant("dynamic_loss_scaling", "missing guard: grows into Inf", SCALING,
           "                if math.isfinite(grown):  # as GradScaler: never grow into Inf\n"
           "                    self.scale = grown", "                self.scale = grown"),
)


ROUNDING = "minidist/precision/rounding.py"
PICK = "rounded = np.where(bernoulli(p_up, rng), lo + spacing, lo)"
WRONG_ROUNDINGS = (
    Mutant("stochastic_rounding", "wrong direction: picks lo with P(hi)", ROUNDING, PICK,
           "rounded = np.where(bernoulli(p_up, rng), lo, lo + spacing)"),
    Mutant("stochastic_rounding", "off-by-one binade: spacing of 2^e, not 2^(e−1)", ROUNDING,
           "np.maximum(e - 1, fmt.emin)", "np.maximum(e, fmt.emin)"),
    Mutant("stochastic_rounding", "missing clamp: subnormals with a normal spacing", ROUNDING,
           "np.maximum(e - 1, fmt.emin) - fmt.man_bits", "(e - 1) - fmt.man_bits"),
    Mutant("stochastic_rounding", "wrong rule: rounds to nearest, no draw", ROUNDING, PICK,
           "rounded = np.where(p_up >= 0.5, lo + spacing, lo)"),
)


PIPELINE = "minidist/parallel/pipeline/schedule.py"
GPIPE_B = "ticks[(M + P - 1) + (P - 1 - s) + m].append(Op(s, \"B\", m))"
WRONG_GPIPES = (
    Mutant("gpipe_schedule", "wrong direction: the backward wave starts at stage 0", PIPELINE, GPIPE_B,
           "ticks[(M + P - 1) + s + m].append(Op(s, \"B\", m))"),
    Mutant("gpipe_schedule", "off-by-one: the backwards start a tick early", PIPELINE, GPIPE_B,
           "ticks[(M + P - 2) + (P - 1 - s) + m].append(Op(s, \"B\", m))"),
    Mutant("gpipe_schedule", "wrong order: the backwards take the micro-batches last first", PIPELINE,
           GPIPE_B,
           "ticks[(M + P - 1) + (P - 1 - s) + (M - 1 - m)].append(Op(s, \"B\", m))"),
)

PRUNING = "minidist/nn/pruning.py"
WRONG_PRUNINGS = (
    Mutant("magnitude_prune", "wrong direction: prunes the largest", PRUNING,
           "keep[order[:n_pruned]] = False", "keep[order[::-1][:n_pruned]] = False"),
    Mutant("magnitude_prune", "missing abs: prunes the most negative", PRUNING,
           "np.argsort(np.abs(weight), axis=None", "np.argsort(weight, axis=None"),
    Mutant("magnitude_prune", "off-by-one count: floor instead of round", PRUNING,
           "n_pruned = round(sparsity * weight.size)", "n_pruned = int(sparsity * weight.size)"),
)

#: exercise -> (what the diagnosis says of a planted module, phrases its message must all hold, one of which)
STEP_DIAGNOSES = {
    "dynamic_loss_scaling": (lambda module: diagnose_loss_scaler(module.DynamicLossScaler),
                             ("DynamicLossScaler(", ", step ", "(found_inf="),
                             ("the scale should be ", "clean_steps should be ")),
    "stochastic_rounding": (lambda module: diagnose_stochastic_round(module.stochastic_round),
                            ("stochastic_round(x = ", "the neighbours are "),
                            ("which is neither", "rounded away")),
    "gpipe_schedule": (lambda module: diagnose_gpipe(module.gpipe_schedule),
                       ("gpipe_schedule(P=", ": stage "), ("should be at tick ",)),
    "magnitude_prune": (lambda module: diagnose_magnitude_mask(module.magnitude_mask),
                        ("magnitude_mask(weight of shape ", ", sparsity "),
                        ("in magnitude order", "weights; it prunes ")),
}
STEP_CASES = WRONG_SCALERS + WRONG_ROUNDINGS + WRONG_GPIPES + WRONG_PRUNINGS


@pytest.mark.parametrize("mutant", STEP_CASES, ids=lambda m: f"{m.exercise}-{m.kind.split(':')[0]}")
def test_a_wrong_scaler_rounding_or_schedule_is_named_by_step_case_or_tick(mutant):
    diagnose, every, one_of = STEP_DIAGNOSES[mutant.exercise]
    message = diagnose(planted(mutant))
    print(f"{mutant.kind}: {message}")
    assert message is not None and all(part in message for part in every), f"{mutant.kind}: {message}"
    assert any(part in message for part in one_of), f"{mutant.kind}: {message}"
