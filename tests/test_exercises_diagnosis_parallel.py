"""Wrong parallel solutions fail first with a diagnosing message (issue 55): planted with mutants.py's
machinery (`exercises mutants` has none for these exercises), wrong stale-synchronous bounds are named by
the worker, how far ahead of the slowest it is and the bound; wrong error feedbacks by the step and the
message or the residual (and what the residual reads as); wrong MoE dispatches by the expert's slot and
the token it holds, wrong combines by the token's row and the (expert, slot) outputs and gates it got;
wrong ZeRO-1 steps by the phase (after the reduce-scatter, after the allgather), the rank, the group and
the element, read as whose gradient it holds; wrong Megatron MLP blocks by the forward z or the backward
dx (as Σ_p of the ranks' partials), or a rank's dW1/db1/dW2/db2 slice and the first index off; wrong halo
exchanges by the rank, the side of its block (above, below, left, right, a corner), the global row and
column and whose element it holds."""

from pathlib import Path

import pytest

import minidist.parallel.data.flat as flat
import minidist.parallel.spatial.comm as halo_comm
import minidist.parallel.tensor.mlp as mlp
from minidist_course.mutants import MUTANTS, Mutant
from tests.nn.moe_dispatch_diagnosis import diagnose_moe_dispatch
from tests.parallel.error_feedback_diagnosis import diagnose_error_feedback
from tests.parallel.halo_diagnosis import CASES as HALO_CASES
from tests.parallel.halo_diagnosis import diagnose_halo
from tests.parallel.megatron_diagnosis import diagnose_megatron
from tests.parallel.staleness_diagnosis import diagnose_may_start
from tests.parallel.zero1_diagnosis import diagnose_zero1
from tests.test_exercises_diagnosis_local import planted

ROOT = Path(__file__).resolve().parent.parent
if "# BEGIN SOLUTION halo_exchange" not in (ROOT / "minidist/parallel/spatial/comm.py").read_text():
    pytest.skip("a student copy: the reference solutions these tests use are cut", allow_module_level=True)
MINE = ("halo_exchange", "megatron_mlp", "error_feedback", "stale_synchronous_bound", "zero1_shard_update",
        "moe_dispatch")

SCHEDULE = "minidist/parallel/asynchronous/schedule.py"
BOUND = "return pushes[worker] - min(pushes) <= bound"
WRONG_BOUNDS = (
    Mutant("stale_synchronous_bound", "off-by-one: strictly less than s", SCHEDULE, BOUND,
           "return pushes[worker] - min(pushes) < bound"),
    Mutant("stale_synchronous_bound", "wrong direction: how far behind the fastest", SCHEDULE, BOUND,
           "return max(pushes) - pushes[worker] <= bound"),
    Mutant("stale_synchronous_bound", "missing case: no bound stops everyone", SCHEDULE,
           "if bound is None:\n        return True", "if bound is None:\n        return False"),
    Mutant("stale_synchronous_bound", "wrong reference: ahead of the mean, not the slowest", SCHEDULE, BOUND,
           "return pushes[worker] - sum(pushes) / len(pushes) <= bound"),
)
ERROR_FEEDBACK = "minidist/parallel/compression/error_feedback.py"
RESIDUAL = "self.residual = corrected - self.codec.decode(message)"
WRONG_FEEDBACKS = (
    Mutant("error_feedback", "missing correction: encodes g, not g + r", ERROR_FEEDBACK,
           "message = self.codec.encode(corrected)", "message = self.codec.encode(grad)"),
    Mutant("error_feedback", "wrong residual: g − decode, not c − decode", ERROR_FEEDBACK, RESIDUAL,
           "self.residual = grad - self.codec.decode(message)"),
    Mutant("error_feedback", "wrong direction: decode − c", ERROR_FEEDBACK, RESIDUAL,
           "self.residual = self.codec.decode(message) - corrected"),
    Mutant("error_feedback", "in-place aliasing: adds to the residual it replaced", ERROR_FEEDBACK, RESIDUAL,
           "self.residual += corrected - self.codec.decode(message)"),
)
MOE = "minidist/nn/moe.py"
DISPATCH = "return [x[r.assignments(e)[0]] for e in range(r.num_experts)]"
COMBINE = "y[tokens] += r.gates[tokens, choices][:, None] * out"
WRONG_MOES = (
    Mutant("moe_dispatch", "wrong order: tokens in token order, not slot order", MOE, DISPATCH,
           "return [x[np.sort(r.assignments(e)[0])] for e in range(r.num_experts)]"),
    Mutant("moe_dispatch", "missing drop: every token that chose the expert", MOE, DISPATCH,
           "return [x[np.flatnonzero((r.experts == e).any(axis=1))] for e in range(r.num_experts)]"),
    Mutant("moe_dispatch", "missing scale: combine without the gate", MOE, COMBINE, "y[tokens] += out"),
    Mutant("moe_dispatch", "in-place aliasing: assigns, so a top-2 token keeps one expert", MOE, COMBINE,
           "y[tokens] = r.gates[tokens, choices][:, None] * out"),
    Mutant("moe_dispatch", "off-by-one choice: always the first choice's gate", MOE, COMBINE,
           "y[tokens] += r.gates[tokens, 0][:, None] * out"),
)
FLAT = "minidist/parallel/data/flat.py"
SCATTER = "g.shard.grad[...] = reduce_scatter(comm, g.grad)"
GATHER = "g.data[...] = np.concatenate(allgather(comm, g.shard.data))"
STEP = "    optimizer.step()" + " " * 42 + "# only this rank's piece: state is K·n_r\n"
WRONG_ZEROS = (
    Mutant("zero1_shard_update", "missing reduction: the shard steps on its own gradient", FLAT, SCATTER,
           "g.shard.grad[...] = g.grad[g.lo:g.hi]"),
    Mutant("zero1_shard_update", "in-place aliasing: rebinds the shard's grad", FLAT, SCATTER,
           "g.shard.grad = reduce_scatter(comm, g.grad)"),
    Mutant("zero1_shard_update", "wrong order: gathers before the step", FLAT, STEP + "    for g in groups:\n"
           f"        {GATHER}\n", f"    for g in groups:\n        {GATHER}\n" + STEP),
    Mutant("zero1_shard_update", "in-place aliasing: rebinds data, the parameters never see it", FLAT,
           GATHER, "g.data = np.concatenate(allgather(comm, g.shard.data))"),
    Mutant("zero1_shard_update", "wrong order: the pieces concatenated last rank first", FLAT, GATHER,
           "g.data[...] = np.concatenate(allgather(comm, g.shard.data)[::-1])"),
)
MLP = "minidist/parallel/tensor/mlp.py"
Z_AND_BIAS = ("z = self.g.forward(self._a @ w2.T)  # all-reduce of the P partial products\n"
              "        if b2 is not None:\n            z += b2.data")
WRONG_MLPS = (
    Mutant("megatron_mlp", "missing all-reduce: g skipped forward", MLP,
           "z = self.g.forward(self._a @ w2.T)", "z = self._a @ w2.T"),
    Mutant("megatron_mlp", "wrong order: b2 added before the all-reduce", MLP, Z_AND_BIAS,
           "z = self.g.forward(self._a @ w2.T + (b2.data if b2 is not None else 0))"),
    Mutant("megatron_mlp", "missing all-reduce: f's backward skipped", MLP,
           "dx = self.f.backward(dh_part @ w1.data)", "dx = (dh_part @ w1.data)"),
    Mutant("megatron_mlp", "in-place aliasing: assigns dW1 instead of adding", MLP,
           "w1.grad += _rows(dh_part).T @ _rows(self._x)",
           "w1.grad[...] = _rows(dh_part).T @ _rows(self._x)"),
    Mutant("megatron_mlp", "missing derivative: dh without the activation's backward", MLP,
           "dh_part = self.activation.backward(dz @ w2.data)", "dh_part = dz @ w2.data"),
)
HALO = "minidist/parallel/spatial/comm.py"
PHASE_0, PHASE_1 = ("for send, recv in plan.steps(comm.rank, phase=0):",
                    "for send, recv in plan.steps(comm.rank, phase=1):")
COLUMN_SLAB = "np.ascontiguousarray(tall[..., _slice(send.cols, own_c[0])])"
WRONG_HALOS = (
    Mutant("halo_exchange", "missing phase: no column exchange", HALO, PHASE_1,
           PHASE_1.replace("phase=1)", "phase=1)[:0]")),
    Mutant("halo_exchange", "missing shift: phase 0 stops after its first step", HALO,
           PHASE_0, PHASE_0.replace("phase=0)", "phase=0)[:1]")),
    Mutant("halo_exchange", "missing copy: the window's own columns not taken from the buffer", HALO,
           "    window[..., _slice(kept, win_c[0])] = tall[..., _slice(kept, own_c[0])]\n", ""),
    Mutant("halo_exchange", "missing corners: the column slabs carry only the sender's own rows", HALO,
           COLUMN_SLAB,
           COLUMN_SLAB.replace("])])", "])] * np.isin(np.arange(*win_r), np.arange(*own_r))[:, None])")),
)

#: exercise -> (what the diagnosis says of a planted module, phrases its message must all hold, one of which)
DIAGNOSES = {
    "stale_synchronous_bound": (lambda module: diagnose_may_start(module.may_start),
                                ("may_start(worker ", ", pushes=[", "; may_start returned "),
                                ("ahead, within the bound", "ahead, more than the bound",
                                 "with no bound every worker may start")),
    "error_feedback": (lambda module: diagnose_error_feedback(module.ErrorFeedback),
                       ("ErrorFeedback(TopK(", ": step "),
                       ("the message should be the top-", "the residual r_")),
    "moe_dispatch": (lambda module: diagnose_moe_dispatch(module.dispatch, module.combine),
                     (" routing of 6 tokens to 3 experts, capacity ",),
                     ("should hold token ", " keeps tokens ", "'s row should be ")),
    "zero1_shard_update": (lambda module: diagnose_zero1(2) or diagnose_zero1(3),
                           ("zero1_shard_update over ", "rank ", "group "),
                           ("after the reduce-scatter, rank ", "after the allgather, rank ",
                            "INTO shard.grad")),
    "megatron_mlp": (lambda module: diagnose_megatron(2) or diagnose_megatron(3),
                     ("MegatronMLP Linear(3, 5)", "rank "),
                     ("forward: rank ", "backward: rank ")),
    "halo_exchange": (lambda module: next(filter(None, map(diagnose_halo, HALO_CASES)), None),
                      ("exchange_halo, input ", ": rank ", "window element (", "it should hold x["),
                      ("in the halo above", "in the halo below", "in the halo left", "in the halo right",
                       "in its own block")),
}
CASES = WRONG_BOUNDS + WRONG_FEEDBACKS + WRONG_MOES + WRONG_ZEROS + WRONG_MLPS + WRONG_HALOS
#: where a planted solution must be set for the forked ranks to run it
PLANT_IN = {"zero1_shard_update": (flat, "zero1_shard_update"), "megatron_mlp": (mlp, "MegatronMLP"),
            "halo_exchange": (halo_comm, "exchange_halo")}


def test_these_exercises_have_no_mutants_of_their_own_yet():
    """If `exercises mutants` gains some for these exercises, they belong in CASES."""
    assert not [m for m in MUTANTS if m.exercise in MINE and m not in CASES]


@pytest.mark.parametrize("mutant", CASES, ids=lambda m: f"{m.exercise}-{m.kind.split(':')[0]}")
def test_a_wrong_parallel_solution_is_named_in_its_algorithms_terms(monkeypatch, mutant):
    diagnose, every, one_of = DIAGNOSES[mutant.exercise]
    module = planted(mutant)
    if mutant.exercise in PLANT_IN:
        where, name = PLANT_IN[mutant.exercise]
        monkeypatch.setattr(where, name, getattr(module, name))
    message = diagnose(module)
    print(f"{mutant.kind}: {message}")
    assert message is not None and all(part in message for part in every), f"{mutant.kind}: {message}"
    assert any(part in message for part in one_of), f"{mutant.kind}: {message}"
