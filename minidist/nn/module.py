"""Parameter, Module and Sequential: the skeleton every layer hangs on.

A ``Module`` computes ``y = forward(x)`` and keeps whatever its backward pass needs (the input, a mask,
normalisation statistics...). ``backward(dy)`` takes the gradient of the loss with respect to ``y`` and

* returns ``dx`` (the gradient with respect to ``x``), and
* *adds* each parameter's gradient into ``Parameter.grad`` (accumulation, as PyTorch does, so that
  gradient accumulation over micro-batches is just "call backward again").

There is no autograd: every layer writes its backward pass by hand, which is the point of the library.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from .backward import backward_through

FLOAT_DTYPES = (np.float16, np.float32, np.float64)


class Parameter:
    """A trainable array and its gradient, both NumPy arrays of one shape and dtype.

    ``grad`` starts at zero and is only ever *added to* by ``Module.backward``; optimizers read it and
    ``zero_grad()`` clears it. ``partial_over``: the Communicators over which ``grad`` is only a partial
    sum (each rank saw only its tokens, positions or rows); a split model's transforms append to it and
    the gradient sync (minidist.parallel.data.GradientSync) sums ``grad`` over each before the step.

    A partial gradient must not be stepped on. ``grad`` is a property: every assignment to it — a layer's
    backward writes ``p.grad += dW``, which Python runs as ``p.grad = p.grad.__iadd__(dW)`` — sets
    ``partial_pending`` on a parameter with ``partial_over``; the one partial sum
    (minidist.collectives.sum_partial_gradients, which GradientSync runs) and ``zero_grad()`` clear it, and
    every optimizer's ``step()`` refuses a parameter still pending over a group of more than one rank.
    Writing *into* the array (``p.grad[...] = g``, ``np.add.at(p.grad, ...)``) does not pass the setter:
    code that accumulates that way assigns ``p.grad`` afterwards (nn.Embedding does). A parameter without
    ``partial_over`` pays one list test per assignment.

    ``name``: the parameter's dotted name in its model, where something labelled it
    (``Module.label_parameters``, which the transforms run), else None; error messages use it.
    """

    def __init__(self, data: np.ndarray, name: str | None = None):
        if not isinstance(data, np.ndarray) or data.dtype.type not in FLOAT_DTYPES:
            raise TypeError(f"Parameter expects a float16/32/64 numpy array, got {type(data).__name__}"
                            f"{'' if not isinstance(data, np.ndarray) else ' of dtype ' + str(data.dtype)}")
        self.data = data
        self._grad = np.zeros_like(data)
        self.partial_over: list = []
        self.partial_pending = False
        self.name = name

    @property
    def grad(self) -> np.ndarray | None:
        return self._grad

    @grad.setter
    def grad(self, value: np.ndarray | None) -> None:
        self._grad = value
        if self.partial_over and value is not None:   # None: freed between steps (ZeRO-2/3)
            self.partial_pending = True

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    @property
    def size(self) -> int:
        return self.data.size

    def zero_grad(self) -> None:
        if self._grad is not None:         # None: freed between steps (ZeRO-2/3 keep only a shard of it)
            self._grad[...] = 0
        self.partial_pending = False

    def __repr__(self) -> str:
        named = f"{self.name!r}, " if self.name is not None else ""
        return f"Parameter({named}shape={self.data.shape}, dtype={self.data.dtype})"


class Module:
    """Base class of layers and models.

    Subclasses define ``forward(x)`` and ``backward(dy)``. Parameters, sub-modules and buffers are found
    by walking the instance's attributes in the order they were assigned (Python dicts keep insertion
    order), so ``parameters()`` has a fixed, reproducible order — data-parallel replicas and optimizers
    rely on that.
    """

    training: bool = True
    #: shape of the last forward's output, which backward's dy must have; None until forward has run
    _y_shape: tuple[int, ...] | None = None

    # -- the two methods every layer writes ------------------------------------------------------------
    def forward(self, x: np.ndarray) -> np.ndarray:
        raise TypeError(f"{type(self).__name__} does not define forward(x)")

    def backward(self, dy: np.ndarray) -> np.ndarray:
        raise TypeError(f"{type(self).__name__} does not define backward(dy)")

    # -- the check every backward makes first ------------------------------------------------------------
    def remember_output_shape(self, shape: tuple[int, ...]) -> None:
        """Called by forward: the shape of the output y, which backward's dy must match."""
        self._y_shape = tuple(shape)

    def check_upstream(self, dy) -> None:
        """Called first by backward, before anything changes: dy must be a float array of exactly the
        shape of forward's output (no broadcasting: PyTorch also refuses a mismatch)."""
        name = type(self).__name__
        if self._y_shape is None:
            raise RuntimeError(f"{name}.backward called before forward")
        check_float_array(dy, f"{name}.backward dy")
        if dy.shape != self._y_shape:
            raise ValueError(f"{name}.backward: expected dy of shape {self._y_shape} (the shape of "
                             f"forward's output), got {dy.shape}")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.forward(x)

    # -- walking the tree ------------------------------------------------------------------------------
    def named_children(self) -> Iterator[tuple[str, Module]]:
        for name, value in vars(self).items():
            if isinstance(value, Module):
                yield name, value
            elif isinstance(value, (list, tuple)):
                for i, item in enumerate(value):
                    if isinstance(item, Module):
                        yield f"{name}.{i}", item

    def children(self) -> list[Module]:
        return [m for _, m in self.named_children()]

    def modules(self) -> Iterator[Module]:
        """This module and every module below it, depth first."""
        yield self
        for child in self.children():
            yield from child.modules()

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        """(name, Parameter) pairs in a fixed order; a Parameter that two layers share (a GPT's tied
        head and embedding) is listed once, under its first name, as torch does."""
        seen: set[int] = set()
        for name, p in self._named_parameters_with_repeats(prefix):
            if id(p) not in seen:
                seen.add(id(p))
                yield name, p

    def _named_parameters_with_repeats(self, prefix: str) -> Iterator[tuple[str, Parameter]]:
        for name, value in vars(self).items():
            if isinstance(value, Parameter):
                yield prefix + name, value
        for name, child in self.named_children():
            yield from child._named_parameters_with_repeats(prefix + name + ".")

    def parameters(self) -> list[Parameter]:
        """Every Parameter of this module and its children, in a fixed order."""
        return [p for _, p in self.named_parameters()]

    def label_parameters(self) -> None:
        """Give every Parameter without a ``name`` its dotted name here (for error messages). The transforms
        run it before they split, so a split model's parameters (and their shards) keep the names of the model
        as it was built: "blocks.0.ln1.weight", "blocks.0.mlp.layers.2.bias"."""
        for name, p in self.named_parameters():
            if p.name is None:
                p.name = name

    def register_buffer(self, name: str, value: np.ndarray) -> None:
        """A non-trainable array saved with the model (e.g. BatchNorm's running statistics)."""
        if "_buffer_names" not in vars(self):
            self._buffer_names: list[str] = []
        if name not in self._buffer_names:
            self._buffer_names.append(name)
        setattr(self, name, value)

    def named_buffers(self, prefix: str = "") -> Iterator[tuple[str, np.ndarray]]:
        for name in vars(self).get("_buffer_names", []):
            yield prefix + name, getattr(self, name)
        for name, child in self.named_children():
            yield from child.named_buffers(prefix + name + ".")

    # -- modes and gradients ---------------------------------------------------------------------------
    def zero_grad(self) -> None:
        for p in self.parameters():
            p.zero_grad()

    def train(self, mode: bool = True) -> Module:
        for m in self.modules():
            m.training = mode
        return self

    def eval(self) -> Module:
        return self.train(False)

    # -- saving and loading ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of every parameter and buffer, by dotted name."""
        state = {name: p.data.copy() for name, p in self.named_parameters()}
        state.update({name: np.array(b, copy=True) for name, b in self.named_buffers()})
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Copy arrays into the existing parameters and buffers (shapes must match)."""
        targets = {name: p.data for name, p in self.named_parameters()}
        targets.update(dict(self.named_buffers()))
        missing = sorted(set(targets) - set(state))
        unexpected = sorted(set(state) - set(targets))
        if missing or unexpected:
            raise ValueError(f"state_dict mismatch: missing {missing}, unexpected {unexpected}")
        for name, target in targets.items():
            value = np.asarray(state[name])
            if value.shape != target.shape:
                raise ValueError(f"{name}: expected shape {target.shape}, got {value.shape}")
            target[...] = value

    def num_parameters(self) -> int:
        return sum(p.size for p in self.parameters())


class Sequential(Module):
    """Layers applied one after the other; backward runs them in reverse.

    forward:  x -> layers[0] -> layers[1] -> ... -> y
    backward: dy -> layers[-1].backward -> ... -> layers[0].backward -> dx
    """

    def __init__(self, *layers: Module):
        for i, layer in enumerate(layers):
            if not isinstance(layer, Module):
                raise TypeError(f"Sequential expects Modules, argument {i} is {type(layer).__name__}")
        self.layers = list(layers)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """x: input of the first layer; returns y, the last layer's output."""
        for layer in self.layers:
            x = layer.forward(x)
        return x

    def backward(self, dy: np.ndarray) -> np.ndarray:
        """dy: upstream gradient, shape of y; returns dx, shape of x; each layer adds its gradients.

        The last layer checks dy first, so a wrong dy is refused before any layer changes anything.
        The loop is the step runner's (backward.py), the library's one layer-by-layer backward.
        """
        return backward_through(self.layers, dy)

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return Sequential(*self.layers[index])
        return self.layers[index]

    def __iter__(self):
        return iter(self.layers)

    def __repr__(self) -> str:
        inner = ",\n  ".join(repr(layer) for layer in self.layers)
        return f"Sequential(\n  {inner}\n)"


def check_float_array(x, what: str, ndim: int | tuple[int, ...] | None = None) -> None:
    """Raise TypeError/ValueError unless x is a float ndarray with the expected number of dimensions."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{what}: expected a numpy array, got {type(x).__name__}")
    if x.dtype.type not in FLOAT_DTYPES:
        raise TypeError(f"{what}: expected a float16/32/64 array, got dtype {x.dtype}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else ndim
        if x.ndim not in allowed:
            raise ValueError(f"{what}: expected {' or '.join(map(str, allowed))} dimensions, "
                             f"got shape {x.shape}")


def resolve_rng(rng: np.random.Generator | None) -> np.random.Generator:
    """The generator to use for initialisation: the caller's, or a fresh unseeded one.

    Pass ``rng=np.random.default_rng(seed)`` for reproducible runs; NumPy's global state is never read.
    """
    if rng is None:
        return np.random.default_rng()
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    return rng
