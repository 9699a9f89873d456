"""The planner: for a model, a cluster and a memory budget, which parallel layout, and what will it cost?

model.py (the GPT/MoE counted: parameters, FLOPs, activations), layouts.py (data × expert × pipeline ×
tensor × context, placed on the cluster; what does not divide), predict.py (memory per rank with ZeRO and
recomputation; step time from the roofline, the α-β model per link level and the schedule's bubble),
report.py (the ranked table and ``python -m minidist plan``), minidist_mode.py (the same questions priced
as minidist's cluster prices them — float64, its layers' activations, the table walked on the α-β clock —
so a prediction can be checked against a run; its collectives priced by minidist.sim.collective_cost,
minidist_clock.py: ring attention and Chimera's pair exchange on the α-β clock; minidist_switch.py: a
Switch model's blocks over an expert axis, and ZeRO-1 in minidist_mode.py), check.py (every layout of a
tiny GPT or Switch model that runs on ≤ 8 ranks, predicted and measured), minidist_plan.py (that mode's
ranked table: ``plan --mode minidist``).
"""

from .layouts import Layout, check_layout, enumerate_layouts
from .memory import predict_memory
from .model import ModelSpec
from .predict import Hardware, Prediction, predict_time
from .presets import hardware
from .report import format_plan, plan

__all__ = ["Hardware", "Layout", "ModelSpec", "Prediction", "check_layout", "enumerate_layouts",
           "format_plan", "hardware", "plan", "predict_memory", "predict_time"]
