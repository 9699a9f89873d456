"""Diagnosing magnitude_mask in its own terms: how many weights it should prune (round(sparsity·n)) and
the first weight it keeps or prunes wrongly, with its value and its place in magnitude order.

The reference, written out here: the weights ordered by (|w|, flat index) — ties in index order — and
the first round(sparsity·n) of them pruned.
"""

import numpy as np

CASES = ((np.array([[0.5, -0.1, 2.0], [-3.0, 0.05, -0.4]]), 0.5),     # negatives prune by magnitude
         (np.array([1.0, -1.0, 1.0, 0.5, -1.0]), 0.6),                # ties: the earlier index goes first
         (np.arange(12.0).reshape(2, 2, 3) - 5.5, 0.3),               # round(3.6) = 4 of 12
         (np.array([[4.0, -2.0]]), 0.0))


def diagnose_magnitude_mask(magnitude_mask) -> str | None:
    """The first case where magnitude_mask(weight, sparsity) prunes the wrong number or the wrong weight."""
    for weight, sparsity in CASES:
        k = round(sparsity * weight.size)
        what = f"magnitude_mask(weight of shape {weight.shape}, sparsity {sparsity})"
        order = sorted(range(weight.size), key=lambda i: (abs(weight.flat[i]), i))
        place = {i: rank for rank, i in enumerate(order)}
        keep = np.asarray(magnitude_mask(weight.copy(), sparsity))
        if keep.shape != weight.shape or keep.dtype != bool:
            return f"{what}: a bool mask of shape {weight.shape} expected, got {keep.dtype} {keep.shape}"
        if int((~keep).sum()) != k:
            return (f"{what}: should prune round({sparsity}·{weight.size}) = {k} weights; it prunes "
                    f"{int((~keep).sum())}")
        for i in order:
            index = tuple(int(j) for j in np.unravel_index(i, weight.shape))
            pruned = place[i] < k
            if bool(keep.flat[i]) == pruned:
                verb, should = ("keeps", "prune") if pruned else ("prunes", "keep")
                return (f"{what}: it {verb} w{list(index)} = {weight.flat[i]:g}, number {place[i] + 1} in "
                        f"magnitude order (ties by index); it should {should} the {k} smallest |w|")
    return None
