"""The course's exercises: id, lesson, statement and hint (where each one lives comes from its markers).

lessons/EXERCISES.md is generated from this list and the markers in the code
(``python -m minidist exercises list --markdown > lessons/EXERCISES.md``); a test checks it is current.
The tooling reads the registry of the tree it works on (``load_registry(root)`` loads
``root/minidist_course/registry.py``), so a reference tree and its registry always travel together.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Exercise:
    id: str
    lesson: str       # the lesson that introduces it, e.g. "lessons/05_collectives.py"
    statement: str    # what to implement, in one or two sentences
    hint: str = ""    # the API or idea a solution needs
    # What the statement promises, with each promise's share of the score ((name, weight), ...; tests mark
    # theirs with @pytest.mark.promise(name), unmarked ones check "values"). Empty: one promise, its values.
    promises: tuple[tuple[str, float], ...] = ()


EXERCISES = (
    Exercise("linear", "lessons/01_backprop.py",
             "Forward and backward of a fully connected layer: y = x·Wᵀ + b, dx = dy·W, dW = dyᵀ·x, "
             "db = Σ dy.",
             "Keep the 2-D input in forward; backward *adds* into weight.grad and bias.grad."),
    Exercise("conv2d_backward", "lessons/01_backprop.py",
             "The backward pass of a 2-D convolution: input, weight and bias gradients from the im2col form.",
             "dW = dyᵀ·cols, dcols = dy·W, then fold the columns back (col2im) into dx."),
    Exercise("batchnorm_backward", "lessons/01_backprop.py",
             "The backward pass of batch normalisation through the batch mean and variance.",
             "dx = (1/σ)·(g − mean(g) − x̂·mean(g·x̂)) with g = dy·γ; running statistics are constants."),
    Exercise("cross_entropy_backward", "lessons/01_backprop.py",
             "The gradient of softmax cross-entropy: (softmax(z) − onehot(t)) / N.",
             "Reuse the probabilities kept by forward."),
    Exercise("sgd_momentum", "lessons/02_optimizers.py",
             "SGD with momentum, dampening and Nesterov, exactly as torch.optim.SGD.",
             "The first step sets the buffer to g; later b = μb + (1 − τ)g, in place."),
    Exercise("adam", "lessons/02_optimizers.py",
             "Adam's update with bias correction (and AMSGrad's running maximum).",
             "Update exp_avg and exp_avg_sq in place; bias-correct with 1 − βᵗ."),
    Exercise("stochastic_rounding", "lessons/03_mixed_precision.py",
             "Round to one of the two neighbouring representable values with probability proportional to "
             "closeness: exactly unbiased.",
             "Find the neighbours lo ≤ x ≤ hi from the spacing of x (np.frexp); round up with probability "
             "(x − lo)/(hi − lo), drawn with bernoulli(p, rng)."),
    Exercise("dynamic_loss_scaling", "lessons/03_mixed_precision.py",
             "Back off on Inf/NaN and skip the step; grow after a run of clean steps.",
             "Count clean steps; never grow into Inf; respect min_scale."),
    Exercise("ring_allreduce", "lessons/05_collectives.py",
             "Reduce-scatter (ring_reduce_scatter) then allgather (ring_allgather) around the ring (rank r "
             "sends only to r + 1, receives only from r − 1): 2(P−1) steps of one sendrecv each, "
             "every message one of the P chunks of "
             "split_offsets(n, P) (np.array_split's rule), so each rank sends exactly 2(P−1)/P·n elements' "
             "bytes in 2(P−1) messages when P divides n (all ranks together 2(P−1)·n for any n). At "
             "reduce-scatter step s rank r sends chunk (r−s−1) mod P, so chunk r is complete on rank r; the "
             "result must be bitwise the same on every rank. Reducing on receipt is allowed, so is a "
             "temporary buffer.",
             "comm.sendrecv(send, dst=right, src=left, out=chunk, op=op) receives and reduces in one call; "
             "minidist.collectives.pieces.split_offsets(n, P) gives the chunks.",
             promises=(("values", 0.5), ("traffic", 0.5))),
    Exercise("parameter_server_allreduce", "lessons/05_collectives.py",
             "Rank 0 gathers, sums and sends back.",
             "comm.send / comm.recv(src, out=, op=) on rank 0; every other rank sends, then receives.",
             promises=(("values", 0.5), ("traffic", 0.5))),
    Exercise("tree_allreduce", "lessons/05_collectives.py",
             "Binomial-tree reduce to rank 0, then binomial-tree broadcast.",
             "At step k a rank whose bit k is set sends to rank − 2ᵏ and leaves the reduce.",
             promises=(("values", 0.5), ("traffic", 0.5))),
    Exercise("dp_bucketed_allreduce", "lessons/06_data_parallel.py",
             "Flatten one bucket of gradients, allreduce it in one call, copy the sums back: with shard "
             "weights n_r/B, the full-batch average.",
             "np.concatenate(..., out=buffer), one allreduce, then write each slice back into its gradient."),
    Exercise("halo_exchange", "lessons/10_spatial.py",
             "Exchange the boundary rows/columns a convolution needs with the neighbouring ranks.",
             "Rows first (phase 0), then full-height columns (phase 1), one shift step per plan step."),
    Exercise("gpipe_schedule", "lessons/08_pipeline.py",
             "The GPipe schedule: all forwards of M micro-batches, then all backwards, tick by tick.",
             "Stage s runs forward m at tick s + m; the backwards mirror the forwards."),
    Exercise("megatron_mlp", "lessons/09_model_parallel.py",
             "Column- then row-parallel linear layers with one all-reduce forward and one backward.",
             "f is the identity forward and an all-reduce backward; g the other way round."),
    Exercise("error_feedback", "lessons/11_asynchronous.py",
             "Error feedback: correct the gradient by the residual, send its compressed form, keep what the "
             "message misses (c − decode(message)) as the next residual.",
             "c = g + residual; message = codec.encode(c); residual = c − codec.decode(message)."),
    Exercise("stale_synchronous_bound", "lessons/11_asynchronous.py",
             "The stale-synchronous bound: a worker may start its next step only if it is at most s pushes "
             "ahead of the slowest worker (no bound: always).",
             "Compare this worker's pushes with the minimum over all workers; s = None means no bound."),
    Exercise("hierarchical_allreduce", "lessons/15_topology.py",
             "Reduce-scatter inside each node, allreduce the piece across nodes (ranks with the same local "
             "index, recursive doubling), allgather inside the node: 2(G−1)(α_i + n/G·β_i) + "
             "log2 N·(α_e + n/G·β_e).",
             "reduce_scatter on the node's communicator, recursive_doubling_allreduce across nodes, "
             "allgather on the node's communicator."),
    Exercise("magnitude_prune", "lessons/13_sparsity.py",
             "The keep-mask of unstructured magnitude pruning: False at the round(s·n) smallest |w|, ties in "
             "index order (stable sort).",
             "np.argsort(np.abs(w).ravel(), kind=\"stable\") gives the order; prune the first round(s·n)."),
    Exercise("sync_batchnorm_backward", "lessons/12_normalization.py",
             "SyncBatchNorm's backward: sum dy and dy·x̂ per channel on this rank, allreduce the 2C sums, "
             "then dx = γ/√(σ²+ε)·(dy − Σdy/M − x̂·Σdy·x̂/M) with the global count M; dγ, dβ get the local "
             "sums (or the global ones when global_parameter_gradients).",
             "Sum over every axis but the channels, one allreduce of the 2C sums (self._allreduce); an empty "
             "shard still joins the allreduce."),
    Exercise("zero1_shard_update", "lessons/14_memory.py",
             "ZeRO-1's step: reduce-scatter each group's flat gradient so rank r holds piece r of the sum "
             "(in its shard's grad), step the optimizer on the shards only, then allgather the updated "
             "shards into every rank's full parameters.",
             "reduce_scatter(comm, g.grad) returns piece r of the sum: write it into g.shard.grad; one "
             "optimizer.step() updates the shards in place; allgather(comm, g.shard.data) returns the P "
             "pieces in rank order: write their concatenation into g.data."),
    Exercise("softmax_backward", "lessons/16_transformers.py",
             "The backward pass of softmax along an axis (attention's probabilities): "
             "dx = y ⊙ (dy − Σ dy ⊙ y), the Jacobian diag(y) − y·yᵀ applied to dy without forming it.",
             "One product, one sum along the axis with keepdims=True, one subtraction, one product.",
             promises=(("values", 0.5), ("every axis", 0.5))),
    Exercise("moe_dispatch", "lessons/18_mixture_of_experts.py",
             "Mixture-of-experts dispatch and combine: gather each expert's kept tokens in slot order, then "
             "add gate · expert output back into the token's row (dropped tokens stay 0).",
             "Routing.assignments(e) gives the tokens and choices of expert e; gates[tokens, choices]."),
    Exercise("systolic_tile_schedule", "lessons/21_inside_the_accelerator.py",
             "The order in which a k × k systolic array runs the weight tiles of a K × M matrix: one (rows, "
             "columns) pair of slices per tile, each at most k × k, covering every weight exactly once.",
             "Two ranges with step k, the last slice clipped at K or M: ⌈K/k⌉·⌈M/k⌉ tiles."),
    Exercise("lstm_cell_backward", "lessons/21_inside_the_accelerator.py",
             "The LSTM cell's backward: from dh and dc at step t, the gradients of the four gate "
             "pre-activations (i, f, g, o) and of c_(t−1).",
             "h = o·tanh(c) adds dh·o·(1 − tanh²c) to dc; c = f·c_prev + i·g; "
             "σ' = σ(1 − σ), tanh' = 1 − tanh²."),
    Exercise("online_softmax_merge", "lessons/17_splitting_transformers.py",
             "Merge two partial attention results over disjoint key sets, (O₁, lse₁) and (O₂, lse₂), into "
             "the result over their union: lse = log(e^lse₁ + e^lse₂), "
             "O = e^(lse₁−lse)·O₁ + e^(lse₂−lse)·O₂. "
             "A row that saw no key on either side (lse = −∞) must stay (0, −∞), never NaN.",
             "np.logaddexp handles −∞; replace a −∞ total by 0 before subtracting it, so the weights are "
             "exp(−∞) = 0."),
    Exercise("vocab_parallel_cross_entropy", "lessons/17_splitting_transformers.py",
             "The forward of the vocabulary-parallel cross-entropy: "
             "each rank holds the logits of its ids only; "
             "compute every token's loss log S + m − z_target without gathering the logits, with three "
             "all-reduces of one number per token (max, sum of exponentials, target logit).",
             "group_allreduce(self.comm, x, op) from tensor/comm.py; "
             "keep e = exp(z − m) and the total S for backward; "
             "the target's logit is on the one rank whose slice holds it, 0 elsewhere."),
    Exercise("distributed_sampler", "lessons/20_input_pipeline.py",
             "Rank r's indices for one epoch, as torch's DistributedSampler: a permutation of range(N) from "
             "(seed, epoch), cut to P·floor(N/P) with drop_last or padded by wrapping around to P·ceil(N/P), "
             "then every P-th index from r.",
             "np.random.default_rng((seed, epoch)).permutation(n); np.resize pads by repeating; "
             "order[rank:total:P]."),
    Exercise("lamb_trust_ratio", "lessons/22_large_batch_theory.py",
             "LAMB's trust ratio: |w| / |u| for a layer w and its Adam-plus-weight-decay update u (1 when "
             "either norm is zero), so that every layer moves by lr·|w| per step.",
             "Euclidean norms of the whole arrays (minidist.optim.lars.norm).",
             promises=(("values", 0.5), ("layer step", 0.5))),
    Exercise("interleaved_orders", "lessons/19_putting_it_together.py",
             "Each rank's task order under Megatron's interleaved 1F1B with v chunks: "
             "min(v·M, 2(P − r − 1) + (v − 1)·P) warm-up forwards, then one forward and one backward, "
             "then the remaining backwards. "
             "The k-th forward runs chunk (k mod P·v) // P (stage chunk·P + r) "
             "on micro-batch (k // P·v)·P + k mod P; the k-th backward the same with the chunks reversed.",
             "Write a helper task(r, kind, k) -> Task; "
             "the total per rank is v·M forwards and v·M backwards."),
)


_LOADING = threading.Lock()


def load_registry(root: Path) -> dict[str, Exercise]:
    """{id: Exercise} from ``root/minidist_course/registry.py`` (this file, in the tree at root).

    Raises FileNotFoundError if it is missing, ValueError if it registers an id twice."""
    path = Path(root) / "minidist_course" / "registry.py"
    if not path.exists():
        raise FileNotFoundError(f"missing exercise registry {path}")
    spec = importlib.util.spec_from_file_location("_minidist_exercise_registry", path)
    module = importlib.util.module_from_spec(spec)
    with _LOADING:                        # the isolation check loads registries from several threads
        sys.modules[spec.name] = module   # dataclasses look their module up while the class is built
        try:
            spec.loader.exec_module(module)
        finally:
            del sys.modules[spec.name]
    registry: dict[str, Exercise] = {}
    for ex in module.EXERCISES:
        if registry.setdefault(ex.id, ex) is not ex:
            raise ValueError(f"{path}: exercise {ex.id!r} is registered twice")
    return registry
