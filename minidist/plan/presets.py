"""The planner's hardware presets: a data sheet per device and the links of its cluster (``hardware``)."""

from __future__ import annotations

from minidist.cluster import LinkModel
from minidist.cluster.topology import Topology
from minidist.hardware.roofline import Machine

from .gpus import GPUS
from .predict import Hardware

# Per device: (peak dense 16-bit FLOP/s, HBM bytes/s, memory bytes, link inside a node, link between nodes).
# Vendors' data sheets: H100 SXM 989 TFLOP/s BF16, 3.35 TB/s, 80 GB, NVLink 450 GB/s per direction, one
# 400 Gb/s InfiniBand NIC per GPU; A100 SXM 312 TFLOP/s, 2.0 TB/s, 80 GB, NVLink 300 GB/s, 200 Gb/s;
# V100 125 TFLOP/s FP16, 0.9 TB/s, 32 GB, NVLink-2 150 GB/s, 100 Gb/s.
# Selene (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
# Megatron-LM", section 5): DGX A100 nodes of 8 A100 80GB on NVSwitch (600 GB/s both ways, 300 per direction),
# 8 x 200 Gb/s HDR InfiniBand per node: 25 GB/s per GPU; the A100 preset's numbers, nodes of 8.
PRESETS = {
    "h100": (989e12, 3.35e12, 80e9, LinkModel(2e-6, 1 / 450e9), LinkModel(5e-6, 1 / 50e9)),
    "a100": (312e12, 2.0e12, 80e9, LinkModel(2e-6, 1 / 300e9), LinkModel(5e-6, 1 / 25e9)),
    "a100-selene": (312e12, 2.0e12, 80e9, LinkModel(2e-6, 1 / 300e9), LinkModel(5e-6, 1 / 25e9)),
    "v100": (125e12, 0.9e12, 32e9, LinkModel(3e-6, 1 / 150e9), LinkModel(5e-6, 1 / 12.5e9)),
}


def hardware(preset: str, devices: int, per_node: int, memory: float | None = None,
             precision: str = "mixed", fused: bool = True, attention: str = "flash",
             weights: str = "bf16") -> Hardware:
    """A Hardware from a preset (PRESETS): devices in nodes of per_node; memory in bytes overrides the
    preset's; its GPU's achieved roofs (gpus.py) price each op, fused or eager; attention and weights as
    Hardware's."""
    if preset not in PRESETS:
        raise ValueError(f"hardware must be one of {tuple(PRESETS)}, got {preset!r}")
    if devices % per_node:
        raise ValueError(f"{devices} devices do not fill nodes of {per_node}")
    peak, bw, mem, intra, inter = PRESETS[preset]
    topology = Topology(nodes=devices // per_node, per_node=per_node, intra=intra, inter=inter)
    machine = Machine(peak=peak, memory_bw=bw, network_bw=1 / inter.beta)
    return Hardware(mem if memory is None else memory, machine, topology, precision,
                    GPUS[preset.split("-")[0]], fused, attention, weights)
