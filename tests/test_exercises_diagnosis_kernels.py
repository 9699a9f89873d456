"""Wrong interleaved_orders, distributed_sampler, online_softmax_merge, vocab_parallel_cross_entropy and
systolic_tile_schedule solutions fail first with a diagnosing message (issue 55): planted with mutants.py's
machinery (none of these exercises has a mutant in `exercises mutants`), each is named in the algorithm's
own terms — the rank, the place in its order and the tick of a wrong interleaved task; the sample index
duplicated, missing or misplaced on a rank; the block whose max or sum the merge gets wrong; the
vocabulary shard whose max, sum of exponentials or target logit is off; the tile and the weight it
misses or covers twice."""

import numpy as np
import pytest

from minidist_course.mutants import MUTANTS, Mutant
from tests.data.sampler_diagnosis import diagnose_sampler
from tests.hardware.systolic_diagnosis import diagnose_tile_schedule
from tests.parallel.interleaved_diagnosis import diagnose_interleaved
from tests.parallel.merge_diagnosis import diagnose_merge
from tests.parallel.vocab_diagnosis import diagnose_vocab_cross_entropy
from tests.test_exercises_diagnosis_local import planted  # skips this module in a student copy

INTERLEAVED = "minidist/parallel/pipeline/interleaved.py"
WRONG_INTERLEAVED = (
    Mutant("interleaved_orders", "off-by-one: one warm-up forward too few", INTERLEAVED,
           "warmup = min(total, 2 * (P - r - 1) + (v - 1) * P)",
           "warmup = min(total, 2 * (P - r - 1) + (v - 1) * P - 1)"),
    Mutant("interleaved_orders", "wrong direction: the backwards keep the forwards' chunk order",
           INTERLEAVED, "            chunk = v - 1 - chunk\n", "            chunk = chunk\n"),
    Mutant("interleaved_orders", "wrong order: steady state runs the backward before the forward",
           INTERLEAVED, 'order += [task(r, "F", warmup + k), task(r, "B", k)]',
           'order += [task(r, "B", k), task(r, "F", warmup + k)]'),
    Mutant("interleaved_orders", "wrong micro-batch: k mod M, not in groups of P", INTERLEAVED,
           "(k // (P * v)) * P + k % P", "k % M"),
)
SAMPLER = "minidist/data/sampler.py"
STRIDE = "return order[self.rank:self.total_size:p].astype(np.int64)"
WRONG_SAMPLERS = (
    Mutant("distributed_sampler", "wrong order: contiguous blocks, not every P-th index", SAMPLER, STRIDE,
           "start = self.rank * self.num_samples\n"
           "        return order[start:start + self.num_samples].astype(np.int64)"),
    Mutant("distributed_sampler", "wrong padding: repeats the last index, no wrap-around", SAMPLER,
           "order = np.resize(order, self.total_size)",
           "order = np.concatenate([order, np.repeat(order[-1:], self.total_size - n)])"),
    Mutant("distributed_sampler", "off-by-one: drop_last drops the first N mod P, not the last", SAMPLER,
           "order = order[:self.total_size]", "order = order[n - self.total_size:]"),
    Mutant("distributed_sampler", "wrong padding: one copy of the start, too short when P > N", SAMPLER,
           "order = np.resize(order, self.total_size)",
           "order = np.concatenate([order, order[:self.total_size - n]])"),
    Mutant("distributed_sampler", "missing epoch: the same permutation every epoch", SAMPLER,
           "order = np.random.default_rng((self.seed, self.epoch))",
           "order = np.random.default_rng(self.seed)"),
)
MERGE = "minidist/parallel/context/ring.py"
MERGE_OUT = "out = np.exp(lse1 - safe)[..., None] * out1 + np.exp(lse2 - safe)[..., None] * out2"
WRONG_MERGES = (
    Mutant("online_softmax_merge", "missing guard: a row that saw no key becomes NaN", MERGE,
           "safe = np.where(np.isneginf(lse), 0.0, lse)", "safe = lse"),
    Mutant("online_softmax_merge", "missing sum: lse = max(lse₁, lse₂)", MERGE,
           "lse = np.logaddexp(lse1, lse2)", "lse = np.maximum(lse1, lse2)"),
    Mutant("online_softmax_merge", "missing scale: weights relative to the max, not the total", MERGE,
           "safe = np.where(np.isneginf(lse), 0.0, lse)",
           "safe = np.where(np.isneginf(lse), 0.0, np.maximum(lse1, lse2))"),
    Mutant("online_softmax_merge", "wrong order: each block scaled by the other's weight", MERGE, MERGE_OUT,
           "out = np.exp(lse2 - safe)[..., None] * out1 + np.exp(lse1 - safe)[..., None] * out2"),
    Mutant("online_softmax_merge", "overflow: a naive log(e^lse₁ + e^lse₂)", MERGE,
           "lse = np.logaddexp(lse1, lse2)", "lse = np.log(np.exp(lse1) + np.exp(lse2))"),
)
VOCAB = "minidist/parallel/tensor/vocab_parallel.py"
VOCAB_MAX = 'm = group_allreduce(self.comm, z.max(axis=1), "max")'
WRONG_VOCAB_LOSSES = (
    Mutant("vocab_parallel_cross_entropy", "missing all-reduce: each shard's own max", VOCAB, VOCAB_MAX,
           "m = z.max(axis=1)"),
    Mutant("vocab_parallel_cross_entropy", "wrong op: the shards' maxima summed", VOCAB, VOCAB_MAX,
           'm = group_allreduce(self.comm, z.max(axis=1), "sum")'),
    Mutant("vocab_parallel_cross_entropy", "missing all-reduce: each shard's own sum", VOCAB,
           'total = group_allreduce(self.comm, e.sum(axis=1), "sum")', "total = e.sum(axis=1)"),
    Mutant("vocab_parallel_cross_entropy", "off-by-one: a target at its shard's first id is missed", VOCAB,
           "mine = (local_target >= 0) & (local_target < width)",
           "mine = (local_target > 0) & (local_target < width)"),
    Mutant("vocab_parallel_cross_entropy", "missing mask: every shard adds a target logit", VOCAB,
           "picked = np.where(mine, z[np.arange(len(z)), np.where(mine, local_target, 0)], 0.0)",
           "picked = z[np.arange(len(z)), np.clip(local_target, 0, width - 1)]"),
)
SYSTOLIC = "minidist/hardware/systolic.py"
TILES = "for m0 in range(0, M, k) for k0 in range(0, K, k)]"
WRONG_TILES = (
    Mutant("systolic_tile_schedule", "missing clip: the last tiles reach past K and M", SYSTOLIC,
           "return [(slice(k0, min(k0 + k, K)), slice(m0, min(m0 + k, M)))",
           "return [(slice(k0, k0 + k), slice(m0, m0 + k))"),
    Mutant("systolic_tile_schedule", "off-by-one: the columns stop one short of M", SYSTOLIC, TILES,
           "for m0 in range(0, M - 1, k) for k0 in range(0, K, k)]"),
    Mutant("systolic_tile_schedule", "wrong step: a tile at every row, overlapping", SYSTOLIC, TILES,
           "for m0 in range(0, M, k) for k0 in range(0, K)]"),
    Mutant("systolic_tile_schedule", "wrong order: rows and columns swapped", SYSTOLIC,
           "return [(slice(k0, min(k0 + k, K)), slice(m0, min(m0 + k, M)))",
           "return [(slice(m0, min(m0 + k, M)), slice(k0, min(k0 + k, K)))"),
    Mutant("systolic_tile_schedule", "missing scale: tiles of k − 1", SYSTOLIC,
           "return [(slice(k0, min(k0 + k, K)), slice(m0, min(m0 + k, M)))",
           "return [(slice(k0, min(k0 + k - 1, K)), slice(m0, min(m0 + k - 1, M)))"),
    Mutant("systolic_tile_schedule", "wrong range: the last row block replaced by the first again",
           SYSTOLIC, TILES, "for m0 in range(0, M, k) for k0 in [*range(0, K - k, k), 0]]"),
)

#: exercise -> (what the diagnosis says of a planted module, phrases its message must all hold, one of which:
#: the quantity named)
DIAGNOSES = {
    "interleaved_orders": (lambda module: diagnose_interleaved(module.interleaved_orders),
                           ("interleaved_orders(P=", ": rank ", ", task ", " of the interleaved schedule) "
                            "should be ", "micro-batch "),
                           ("warm-up forward k = ", "steady-state forward k = ", "steady-state backward k = ",
                            "drain backward k = ")),
    "distributed_sampler": (lambda module: diagnose_sampler(module.DistributedSampler),
                            ("DistributedSampler(N=", "), epoch ", "rank "),
                            ("is duplicated on ", "is missing from ", ") should be sample ",
                             " indices; every rank should have ")),
    "online_softmax_merge": (lambda module: diagnose_merge(module.merge),
                             ("merge(O₁ = e₀ rows, lse₁; O₂ = e₁ rows, lse₂)", ": row ", "block "),
                             ("the merged lse should be m + log S", "'s O is scaled by ",
                              ": NaN in (O, lse)")),
    "vocab_parallel_cross_entropy": (
        lambda module: diagnose_vocab_cross_entropy(module.VocabParallelCrossEntropy),
        ("VocabParallelCrossEntropy, logits (", " shards: token ", "shard ", " (ids "),
        ("computes e = exp(z − m) with m = ", " has S = ", " uses the target logit z_t = ")),
    "systolic_tile_schedule": (lambda module: diagnose_tile_schedule(module.tile_schedule),
                               ("tile_schedule(K=", ", k="), ("(run at tick ", ": weight W[")),
}
CASES = WRONG_INTERLEAVED + WRONG_SAMPLERS + WRONG_MERGES + WRONG_VOCAB_LOSSES + WRONG_TILES


def test_these_exercises_have_no_mutants_of_their_own():
    """If `exercises mutants` gains some for these exercises, they belong in CASES too."""
    assert not {m.exercise for m in MUTANTS} & set(DIAGNOSES)


@pytest.mark.parametrize("mutant", CASES, ids=lambda m: f"{m.exercise}-{m.kind.split(':')[0]}")
def test_a_wrong_solution_is_named_in_the_algorithms_terms(mutant):
    diagnose, every, one_of = DIAGNOSES[mutant.exercise]
    message = diagnose(planted(mutant))
    print(f"{mutant.kind}: {message}")
    assert message is not None and all(part in message for part in every), f"{mutant.kind}: {message}"
    assert any(part in message for part in one_of), f"{mutant.kind}: {message}"


def row_blocks_first(K, M, k):
    """A correct tile_schedule in another order, with NumPy integers: the statement allows any order."""
    return [(slice(a, min(a + k, K)), slice(b, min(b + k, M)))
            for a in np.arange(0, K, k) for b in np.arange(0, M, k)]


def merge_by_max_and_sum(out1, lse1, out2, lse2):
    """A correct merge written as m = max, S = Σ e^(lseᵢ − m), lse = m + log S, with its own −∞ guard."""
    m = np.maximum(lse1, lse2)
    m_safe = np.where(np.isneginf(m), 0.0, m)
    w1, w2 = np.exp(lse1 - m_safe), np.exp(lse2 - m_safe)
    total = w1 + w2
    with np.errstate(divide="ignore"):
        lse = np.where(total > 0, m_safe + np.log(total), -np.inf)
    total = np.where(total > 0, total, 1.0)
    return (w1 / total)[..., None] * out1 + (w2 / total)[..., None] * out2, lse


def test_correct_solutions_written_otherwise_pass_the_diagnoses():
    assert diagnose_tile_schedule(row_blocks_first) is None
    assert diagnose_merge(merge_by_max_and_sum) is None
