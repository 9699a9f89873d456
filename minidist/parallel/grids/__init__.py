"""The grids that ``parallelize`` cannot build, each with its reason in its docstring:

data_tensor.py   data × tensor of any model built of tensor-parallel layers (parallelize splits GPTs)
data_spatial.py  data × spatial of a CNN (spatial is not a parallelize axis), with its placements
"""

from .data_spatial import GridSpatial
from .data_tensor import hybrid_train_step, mesh_bytes_sent

__all__ = ["GridSpatial", "hybrid_train_step", "mesh_bytes_sent"]
