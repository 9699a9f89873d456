"""The base class every optimizer shares: the parameter list, per-parameter state, lr, saving and loading.

An optimizer owns a fixed, ordered list of ``Parameter`` s (``model.parameters()``). Each call of
``step()`` reads every ``p.grad`` and updates ``p.data`` *in place*; the arrays the update keeps between
steps (momentum buffers, running averages...) live in ``optimizer.state[i]``, a dict of arrays of
parameter i's shape and dtype. ``zero_grad()`` clears the gradients for the next backward pass.

A training loop therefore reads::

    optimizer.zero_grad()          # or model.zero_grad(): gradients accumulate otherwise
    loss = criterion.forward(model(x), y)
    model.backward(criterion.backward())
    optimizer.step()

``state_dict()`` returns copies of everything a run needs to continue (the hyper-parameters, the step
counter and every state array); ``load_state_dict`` puts them back, and the resumed run then produces
bitwise the same parameters as the uninterrupted one.

Unlike torch.optim there are no parameter groups: one set of hyper-parameters for all parameters.

Every ``step()`` first checks the gradients (``_check_grads``), before any parameter changes: among other
things it refuses a parameter whose gradient is still a partial sum over a split model's group
(``Parameter.partial_pending``: see minidist.nn.Parameter and minidist.collectives.sum_partial_gradients).

Why the updates run in chunks: each element-wise NumPy operation of an update makes a temporary the
size of the parameter and streams it through memory. Applied to slices of ``CHUNK_ELEMENTS`` elements the
same code keeps its temporaries in the CPU cache, with bitwise the same result (benchmarks/optim_step.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from minidist.nn.module import Parameter

#: elements per slice in ``in_chunks``: 2^15 float32 = 128 KiB, so a slice of w, of g and a temporary
#: fit together in a 512 KiB L2 cache
CHUNK_ELEMENTS = 1 << 15


def in_chunks(data: np.ndarray, grad: np.ndarray, state: dict[str, np.ndarray]
              ) -> Iterator[tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]]:
    """Yield matching flat slices (views) of a parameter, its gradient and its state arrays.

    Writing into a yielded slice writes into the parameter. Arrays that are not C-contiguous (no flat
    view exists) are yielded whole.
    """
    arrays = [data, grad, *state.values()]
    if not all(a.flags.c_contiguous for a in arrays):
        yield data, grad, state
        return
    flat_data, flat_grad = data.reshape(-1), grad.reshape(-1)
    flat_state = {name: a.reshape(-1) for name, a in state.items()}
    for start in range(0, data.size, CHUNK_ELEMENTS):
        piece = slice(start, start + CHUNK_ELEMENTS)
        yield flat_data[piece], flat_grad[piece], {name: a[piece] for name, a in flat_state.items()}


def check_number(name: str, value: Any, *, low: float = 0.0, high: float = math.inf,
                 low_open: bool = False, high_open: bool = False) -> float:
    """Return ``value`` as a float, or raise ValueError saying which interval is allowed.

    ``low_open`` / ``high_open`` exclude the end points: e.g. ``check_number("momentum", m, high=1,
    high_open=True)`` allows [0, 1).
    """
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open or high == math.inf else ']'}"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number in {interval}, got {value!r}")
    value = float(value)
    too_low = value <= low if low_open else value < low
    too_high = value >= high if high_open else value > high
    if not math.isfinite(value) or too_low or too_high:
        raise ValueError(f"{name} must be a finite number in {interval}, got {value!r}")
    return value



def check_betas(betas: Any) -> tuple[float, float]:
    """Adam's and LAMB's (β1, β2) as a pair of floats, each in [0, 1); ValueError/TypeError otherwise."""
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"betas must be a pair (beta1, beta2), each in [0, 1), got {betas!r}")
    return (check_number("betas[0]", betas[0], high=1.0, high_open=True),
            check_number("betas[1]", betas[1], high=1.0, high_open=True))

class Optimizer:
    """Base class: subclasses set their hyper-parameters, then define ``_init_state`` and ``_update``.

    A subclass's ``__init__`` stores its hyper-parameters as attributes, calls
    ``check_hyper_parameters()``, then ``super().__init__(params, lr)``. ``step()`` counts the step and
    calls ``_update(w, g, state)`` on each parameter (in chunks, see the module docstring).

    Attributes:
        params: the Parameters, in the order given.
        state: ``state[i]`` is a dict name -> array (shape and dtype of ``params[i]``).
        step_count: number of ``step()`` calls so far (torch's per-parameter ``state["step"]``).
        lr: the learning rate; assign to it to change it (a schedule does so every step).
    """

    #: names of the hyper-parameters saved by state_dict (besides lr); subclasses fill it in
    hyper_parameters: tuple[str, ...] = ()
    #: names of the per-parameter state arrays a subclass may keep
    state_names: tuple[str, ...] = ()

    def __init__(self, params: Iterable[Parameter], lr: float):
        self.params: list[Parameter] = list(params)
        if not self.params:
            raise ValueError(f"{type(self).__name__} got an empty parameter list")
        for i, p in enumerate(self.params):
            if not isinstance(p, Parameter):
                raise TypeError(f"{type(self).__name__}: params[{i}] is a {type(p).__name__}, expected a "
                                f"minidist.nn.Parameter (pass model.parameters())")
        if len({id(p) for p in self.params}) != len(self.params):
            raise ValueError(f"{type(self).__name__}: a Parameter appears more than once in params")
        eps = getattr(self, "eps", None)
        for i, p in enumerate(self.params):
            if eps is not None and p.data.dtype.type(eps) == 0:  # x / (sqrt(0) + 0) would be NaN
                raise ValueError(f"{type(self).__name__}: eps={eps:g} rounds to 0 in params[{i}]'s dtype "
                                 f"{p.data.dtype}; use a larger eps or float32 master weights")
        self.lr = lr
        self.step_count = 0
        self.state: list[dict[str, np.ndarray]] = [self._init_state(p) for p in self.params]

    # -- the learning rate, settable (and checked) at any time -------------------------------------------
    @property
    def lr(self) -> float:
        return self._lr

    @lr.setter
    def lr(self, value: float) -> None:
        self._lr = check_number("lr", value)

    # -- what a subclass defines ---------------------------------------------------------------------------
    def _init_state(self, p: Parameter) -> dict[str, np.ndarray]:
        """The state arrays of one parameter before the first step (none by default)."""
        return {}

    def check_hyper_parameters(self) -> None:
        """Raise ValueError if a hyper-parameter is out of range (subclasses extend it)."""

    def _update(self, w: np.ndarray, g: np.ndarray, state: dict[str, np.ndarray]) -> None:
        """Update w in place from its gradient g and its state (all of one shape); subclasses define it."""
        raise TypeError(f"{type(self).__name__} does not define _update(w, g, state)")

    def step(self) -> None:
        """One update of every parameter from its ``.grad`` (the gradients themselves are not changed)."""
        self._check_grads()
        self.step_count += 1
        for p, state in zip(self.params, self.state):
            for w, g, s in in_chunks(p.data, p.grad, state):
                self._update(w, g, s)

    # -- shared behaviour ------------------------------------------------------------------------------------
    def zero_grad(self) -> None:
        """Set every parameter's gradient to zero (backward passes add into it)."""
        for p in self.params:
            p.zero_grad()

    def _check_grads(self) -> None:
        """Before any parameter changes: every grad an array of its data's shape, and none a partial sum.

        A parameter of a split model whose ``partial_over`` sums have not run since its last backward
        (``Parameter.partial_pending``, over a group of more than one rank) holds only this rank's share of
        its gradient: stepping on it would train each rank on its own tokens. Refused, naming it.
        """
        for i, p in enumerate(self.params):
            if not isinstance(p.grad, np.ndarray) or p.grad.shape != p.data.shape:
                raise ValueError(f"params[{i}]: grad must be an array of the data's shape {p.data.shape}, "
                                 f"got {getattr(p.grad, 'shape', type(p.grad).__name__)}")
            if p.partial_pending and any(c.world_size > 1 for c in p.partial_over):
                raise ValueError(self._partial_message(i, p))

    def _partial_message(self, i: int, p: Parameter) -> str:
        name = f"{p.name!r}, " if p.name is not None else ""
        sizes = ", ".join(str(c.world_size) for c in p.partial_over)
        return (f"{type(self).__name__}.step: params[{i}] ({name}shape {p.shape}) of its parameter group "
                f"(the {len(self.params)} parameters it was given) holds a partial gradient: it is partial "
                f"over groups of {sizes} ranks (Parameter.partial_over) and was not summed since its last "
                f"backward; call minidist.collectives.sum_partial_gradients(model.parameters()) after "
                f"backward (a step runner's GradientSync does it), then step()")

    def state_dict(self) -> dict[str, Any]:
        """Copies of the hyper-parameters, the step counter and every state array."""
        return {
            "optimizer": type(self).__name__,
            "lr": self.lr,
            "hyper_parameters": {name: getattr(self, name) for name in self.hyper_parameters},
            "step_count": self.step_count,
            "state": [{name: array.copy() for name, array in s.items()} for s in self.state],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what ``state_dict()`` returned; the arrays are copied, the caller's stay untouched."""
        name = type(self).__name__
        if state_dict.get("optimizer") != name:
            raise ValueError(f"state_dict is for {state_dict.get('optimizer')!r}, this is a {name}")
        saved = state_dict["state"]
        if len(saved) != len(self.params):
            raise ValueError(f"state_dict has state for {len(saved)} parameters, this {name} has "
                             f"{len(self.params)}")
        for i, (p, arrays) in enumerate(zip(self.params, saved)):
            for key, array in arrays.items():
                if key not in self.state_names:
                    raise ValueError(f"params[{i}]: unknown state {key!r}; {name} keeps {self.state_names}")
                if np.shape(array) != p.shape:
                    raise ValueError(f"params[{i}].{key}: expected shape {p.shape}, got {np.shape(array)}")
        previous = {key: getattr(self, key) for key in self.hyper_parameters}
        try:
            for key, value in state_dict["hyper_parameters"].items():
                if key not in self.hyper_parameters:
                    raise ValueError(f"unknown hyper-parameter {key!r} for {name}")
                setattr(self, key, value)
            self.check_hyper_parameters()
            self.lr = state_dict["lr"]
        except (TypeError, ValueError):
            for key, value in previous.items():  # leave the optimizer as it was
                setattr(self, key, value)
            raise
        self.step_count = int(state_dict["step_count"])
        self.state = [{key: np.array(array, dtype=p.data.dtype, copy=True) for key, array in arrays.items()}
                      for p, arrays in zip(self.params, saved)]

    def __repr__(self) -> str:
        hypers = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.hyper_parameters)
        return f"{type(self).__name__}({len(self.params)} params, lr={self.lr!r}, {hypers})"
