"""Diagnosing VocabParallelCrossEntropy.forward in its own terms: for which token and which vocabulary
shard the max m, the sum of exponentials S or the target logit z_t is off (and so log S + m − z_t).

The loss, written out here: shard p holds the logits z[:, V_p] (feature_slice(V, t, p)); per token
m = max over all shards, S = Σ over all shards of exp(z − m) (the e = exp(z − m) and S that forward keeps
for backward), z_t = the target's logit from the one shard holding it, loss = mean(log S + m − z_t). m and
S are read from what forward keeps (m from e at the shard's largest logit); z_t from one token's loss.
"""

import numpy as np

from minidist.cluster import ClusterError, run
from minidist.parallel.tensor import feature_slice

#: (logits (N, V), targets (N,), t): each token's max on another shard than most; targets at shard edges
CASES = ((np.array([[1.0, 2.0, 0.5, -1.0, 3.0], [0.0, 4.0, 0.0, 0.0, 1.0], [5.0, -2.0, 1.0, 1.0, 0.0]]),
          np.array([3, 2, 0]), 2),
         (np.array([[0.5, -1.0, 2.5, 0.0, 1.0, -0.5, 1.5], [3.0, 0.0, -1.0, 2.0, 0.5, 1.0, 6.0]]),
          np.array([3, 6]), 3))


def shard_loss_worker(comm, loss_class, logits, target):
    """This rank's (mean loss, e, S, each token's loss alone) with loss_class on its shard of logits."""
    cols = feature_slice(logits.shape[-1], comm.world_size, comm.rank)
    loss_fn = loss_class(comm, logits.shape[-1])
    loss = loss_fn.forward(logits[:, cols].copy(), target.copy())
    e, total = (np.array(a, dtype=np.float64) for a in loss_fn._saved[:2])
    alone = [loss_class(comm, logits.shape[-1]).forward(logits[n:n + 1, cols].copy(), target[n:n + 1].copy())
             for n in range(len(target))]
    return loss, e, total, alone


def shard_of(token_id: int, V: int, t: int) -> tuple[int, str]:
    """(p, "shard p (ids a:b)") of the shard holding token_id."""
    p = next(q for q in range(t) if token_id in range(V)[feature_slice(V, t, q)])
    cols = feature_slice(V, t, p)
    return p, f"shard {p} (ids {cols.start}:{cols.stop})"


def max_and_sum_off(what: str, p: int, e: np.ndarray, total: np.ndarray, logits: np.ndarray,
                    t: int) -> str | None:
    """Where shard p's kept e = exp(z − m) and S differ from the global max and sum, token by token."""
    n_tok, V = logits.shape
    cols = [feature_slice(V, t, q) for q in range(t)]
    z, shard = logits[:, cols[p]], f"shard {p} (ids {cols[p].start}:{cols[p].stop})"
    if e.shape != z.shape or total.shape != (n_tok,):
        return (f"{what}: {shard} keeps e of shape {e.shape} and S of shape {total.shape}; "
                f"expected {z.shape} and ({n_tok},)")
    m = logits.max(axis=1)
    e_want = np.exp(logits - m[:, None])
    for n in range(n_tok):
        j = int(z[n].argmax())
        with np.errstate(divide="ignore"):
            m_used = z[n, j] - np.log(e[n, j])
        if not np.isclose(m_used, m[n], rtol=1e-9, atol=1e-9):
            own = " (its own shard's max: the max is not all-reduced)" if np.isclose(m_used, z[n, j]) else ""
            top = shard_of(int(logits[n].argmax()), V, t)[1]
            return (f"{what}: token {n}: {shard} computes e = exp(z − m) with m = {m_used:.6g}{own}; "
                    f"m should be the max over all {t} shards = {m[n]:g}, on {top}")
        parts = [float(e_want[n, c].sum()) for c in cols]
        if not np.isclose(total[n], sum(parts), rtol=1e-9):
            own = " (its own shard's sum: the sum is not all-reduced)" \
                if np.isclose(total[n], parts[p]) else ""
            return (f"{what}: token {n}: {shard} has S = {total[n]:.6g}{own}; S should be Σ over all {t} "
                    f"shards of exp(z − m) = {' + '.join(f'{x:.6g}' for x in parts)} = {sum(parts):.6g}")
    return None


def diagnose_vocab_cross_entropy(loss_class) -> str | None:
    """The first token and shard where loss_class's forward gets m, S or z_t wrong, for a few cases."""
    for logits, target, t in CASES:
        n_tok, V = logits.shape
        what = f"VocabParallelCrossEntropy, logits ({n_tok}, {V}) over t = {t} shards"
        try:
            results = run(shard_loss_worker, t, loss_class, logits, target, timeout=30)
        except ClusterError as err:
            return f"{what}: the run failed: {err}"
        for p, (_, e, total, _) in enumerate(results):
            wrong = max_and_sum_off(what, p, e, total, logits, t)
            if wrong:
                return wrong
        m, z_t = logits.max(axis=1), logits[np.arange(n_tok), target]
        S = np.exp(logits - m[:, None]).sum(axis=1)
        for p, (loss, _, _, alone) in enumerate(results):
            for n in range(n_tok):
                z_used = np.log(S[n]) + m[n] - alone[n]
                if not np.isclose(z_used, z_t[n], rtol=1e-9, atol=1e-9):
                    home = shard_of(target[n], V, t)[1]
                    return (f"{what}: token {n} (target id {target[n]}, on {home}): on rank {p} the loss "
                            f"log S + m − z_t = {alone[n]:.6g} uses the target logit z_t = {z_used:.6g}; "
                            f"it should be z[{n}, {target[n]}] = {z_t[n]:g}, from that shard alone "
                            f"(the others add 0)")
            want = float(np.mean(np.log(S) + m - z_t))
            if not np.isclose(loss, want, rtol=1e-12):
                return (f"{what}: on rank {p} the loss of the {n_tok} tokens is {loss:.12g}; it should be "
                        f"the mean of log S + m − z_t over them = {want:.12g}")
    return None
