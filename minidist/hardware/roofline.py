"""The roofline model: is a layer (or a training step) bound by compute, memory or the network?

Williams, Waterman and Patterson, "Roofline: An Insightful Visual Performance Model for Floating-Point
Programs and Multicore Architectures" (CACM 2008), as in the "Hardware Accelerators for Training DNNs"
tutorial (roofline model for distributed training) and the "Scaling Deep Learning" slides:

    arithmetic intensity  I = FLOPs / bytes moved to and from memory
    attainable FLOP/s       = min(peak FLOP/s, memory bandwidth · I)     ridge point I* = peak / bandwidth

Below the ridge a kernel is memory-bound, above it compute-bound. The distributed roofline adds the
interconnect: communication intensity I_net = FLOPs / bytes sent, attainable = min(peak, network bw · I_net).
A step is bound by the largest of flops/peak, bytes/memory bw and bytes sent/network bw.

Traffic counts each tensor once (an ideal cache): forward reads x and the parameters and writes y;
backward reads dy, x and the parameters and writes dx and the parameter gradients. FLOPs: the layers'
own ``flops(input_shape)`` (multiply-add = 2); backward = 2 × forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from minidist.nn import Linear, Sequential
from minidist.nn.checks import check_count, check_real, is_count

BOUNDS = ("compute", "memory", "network")


@dataclass(frozen=True)
class Machine:
    """A device: ``peak`` FLOP/s, ``memory_bw`` and ``network_bw`` bytes/s (default: a V100 in FP32,
    900 GB/s HBM2, one NVLink-2 link of 25 GB/s)."""

    peak: float = 15.7e12
    memory_bw: float = 900e9
    network_bw: float = 25e9

    def __post_init__(self):
        for name in ("peak", "memory_bw", "network_bw"):  # frozen: set through object's setattr
            object.__setattr__(
                self, name, check_real(getattr(self, name), f"Machine: {name}", 0.0, strict=True)
            )

    @property
    def ridge(self) -> float:
        """The ridge point peak / memory_bw (FLOPs per byte): above it a kernel is compute-bound."""
        return self.peak / self.memory_bw

    def attainable(self, intensity: float, bandwidth: float | None = None) -> float:
        """min(peak, bandwidth · intensity) FLOP/s (bandwidth: memory_bw unless given); intensity >= 0."""
        intensity = check_real(intensity, "intensity (FLOPs per byte)", 0.0)
        bandwidth = (
            self.memory_bw if bandwidth is None else check_real(bandwidth, "bandwidth", 0.0, strict=True)
        )
        return min(self.peak, bandwidth * intensity)

    def bound(self, flops: float, nbytes: float, sent: float = 0.0) -> str:
        """"compute", "memory" or "network": whichever of flops/peak, nbytes/memory_bw, sent/network_bw
        takes longest. flops, nbytes, sent: finite and >= 0."""
        times = self._times(flops, nbytes, sent)
        return BOUNDS[max(range(3), key=lambda i: times[i])]

    def time(self, flops: float, nbytes: float, sent: float = 0.0) -> float:
        """The roofline's time: max(flops/peak, nbytes/memory_bw, sent/network_bw) seconds."""
        return max(self._times(flops, nbytes, sent))

    def _times(self, flops: float, nbytes: float, sent: float) -> tuple[float, float, float]:
        """(flops/peak, nbytes/memory_bw, sent/network_bw), each amount checked finite and >= 0."""
        amounts = [
            check_real(v, name, 0.0) for v, name in ((flops, "flops"), (nbytes, "nbytes"), (sent, "sent"))
        ]
        return amounts[0] / self.peak, amounts[1] / self.memory_bw, amounts[2] / self.network_bw


@dataclass(frozen=True)
class LayerCost:
    """FLOPs and memory bytes of one layer's forward and backward for one input shape."""

    name: str
    input_shape: tuple
    output_shape: tuple
    forward_flops: int
    forward_bytes: int
    backward_flops: int
    backward_bytes: int

    @property
    def forward_intensity(self) -> float:
        return self.forward_flops / self.forward_bytes

    @property
    def backward_intensity(self) -> float:
        return self.backward_flops / self.backward_bytes


def output_shape(layer, input_shape: tuple) -> tuple:
    """The output shape of ``layer`` for an input of ``input_shape`` (no computation)."""
    input_shape = tuple(input_shape)
    if isinstance(layer, Linear):
        return input_shape[:-1] + (layer.out_features,)
    if hasattr(layer, "output_shape"):          # Conv2d, MaxPool2d, AvgPool2d
        return tuple(layer.output_shape(input_shape))
    if type(layer).__name__ == "Flatten":
        return (input_shape[0], math.prod(input_shape[1:]))
    return input_shape                           # activations, norms, dropout keep the shape


def layer_cost(layer, input_shape: tuple, itemsize: int = 4) -> LayerCost:
    """Forward/backward FLOPs and bytes of ``layer`` on an input of ``input_shape`` (elements of
    ``itemsize`` bytes). x, y: input and output elements; W: parameter elements.

        forward bytes  = (x + W + y) · itemsize      backward bytes = (dy + x + W + dx + dW) · itemsize
    """
    itemsize = check_count(itemsize, "itemsize")
    input_shape = tuple(check_count(d, "an input_shape entry") for d in input_shape)
    out = output_shape(layer, input_shape)
    x, y = math.prod(input_shape), math.prod(out)
    w = sum(p.size for p in layer.parameters())
    flops = int(layer.flops(input_shape))
    return LayerCost(type(layer).__name__, input_shape, out, flops, (x + w + y) * itemsize,
                     2 * flops, (y + x + w + x + w) * itemsize)


def model_costs(model: Sequential, input_shape: tuple, itemsize: int = 4) -> list[LayerCost]:
    """``layer_cost`` of every layer of a Sequential, each on the output shape of the one before."""
    costs, shape = [], tuple(input_shape)
    for layer in model:
        costs.append(layer_cost(layer, shape, itemsize))
        shape = costs[-1].output_shape
    return costs


def step_bound(costs: list[LayerCost], machine: Machine, sent: float = 0.0) -> tuple[str, float, float]:
    """(bound, FLOPs, bytes) of a whole training step (forward + backward of every layer, ``sent``
    bytes over the network)."""
    flops = sum(c.forward_flops + c.backward_flops for c in costs)
    nbytes = sum(c.forward_bytes + c.backward_bytes for c in costs)
    return machine.bound(flops, nbytes, sent), flops, nbytes


def communication_intensity(widths: list[int], batch: int, strategy: str, parts: int,
                            itemsize: int = 4) -> tuple[float, float]:
    """(FLOPs, bytes sent) per rank for one training step of an MLP Linear(w0, w1), ..., split ``parts``
    ways; their ratio is the communication intensity. F = Σ 2·B·w_i·w_(i+1) (forward), step = 3F.

        data      3F / D flops; ring allreduce of all parameters (weights and biases): 2(D − 1)/D · |W|
        tensor    3F / T flops; Megatron pairs: per pair one allreduce of (B, w_out) forward and one of
                  (B, w_in) backward, 2(T − 1)/T · B · (w_in + w_out) each pair
        pipeline  3F / P flops; a middle stage sends its activations forward and its input gradient
                  backward: 2 · B · w at a boundary of width w (the widest boundary: the slowest stage)
    (bytes are times ``itemsize``.)
    """
    if strategy not in ("data", "tensor", "pipeline"):
        raise ValueError(f"strategy must be 'data', 'tensor' or 'pipeline', got {strategy!r}")
    if len(widths) < 2 or not all(is_count(v) for v in [*widths, batch, parts, itemsize]):
        raise ValueError(
            f"need >= 2 widths, and widths, batch, parts and itemsize integers >= 1, got {widths}, "
            f"batch={batch}, parts={parts}, itemsize={itemsize}"
        )
    pairs = list(zip(widths[:-1], widths[1:]))
    step = 3 * sum(2 * batch * a * b for a, b in pairs) / parts
    if strategy == "data":
        weights = sum(a * b + b for a, b in pairs)
        return step, 2 * (parts - 1) / parts * weights * itemsize
    if strategy == "tensor":
        if len(pairs) % 2:
            raise ValueError(f"tensor parallelism pairs the layers (column, row): need an even number of "
                             f"Linear layers, got {len(pairs)}")
        blocks = [(pairs[i][0], pairs[i + 1][1]) for i in range(0, len(pairs), 2)]
        return step, sum(2 * (parts - 1) / parts * batch * (a + b) for a, b in blocks) * itemsize
    inner = widths[1:-1] or [0]
    return step, (2 * batch * max(inner) * itemsize if parts > 1 else 0.0)
