"""Diagnosing MoE dispatch and combine in their own terms: which expert's slot holds which token, and
which (expert, slot) outputs with which gates reached a token's row.

Token t's input row is t + 1 in every column, so a dispatched row says which token it is. For combine,
expert e's output at slot j is the unit vector of that (e, slot j) pair, so row t of y reads back as the
gate-weighted list of the (expert, slot) outputs it got: y_t = Σ_(kept choices c) g_(t,c) · out_(e(t,c)).
Routings: 6 tokens, 3 experts, top-2 with capacity 4 (two assignments dropped, slot order ≠ token order)
and top-1 with capacity 1 (tokens dropped).
"""

import numpy as np

from minidist.nn.moe_router import route

LOGITS = np.random.default_rng(10).standard_normal((6, 3)).round(1)
ROUTINGS = ((2, 1.0), (1, 0.5))           # (k, capacity factor)


def _terms(weights: np.ndarray, pairs: list[tuple[int, int]]) -> str:
    parts = [f"{w:.3g}·(expert {e}, slot {j})" for w, (e, j) in zip(weights, pairs, strict=True) if w != 0]
    return " + ".join(parts) or "0 (dropped)"


def _token_of(row: np.ndarray) -> str:
    """'token t' when the row is token t's input row, else the row itself."""
    t = row[0] - 1
    return f"token {int(t)}" if np.all(row == row[0]) and t == int(t) and t >= 0 else f"{row.tolist()}"


def _check_dispatch(inputs, r, x, what: str) -> str | None:
    if not isinstance(inputs, list) or len(inputs) != r.num_experts:
        return (f"{what}: dispatch should return a list of one array per expert ({r.num_experts}); it "
                f"returned {type(inputs).__name__}")
    for e, got in enumerate(inputs):
        tokens = r.assignments(e)[0].tolist()
        got = np.asarray(got)
        if got.ndim != 2 or got.shape[1:] != (x.shape[1],) or len(got) != len(tokens):
            held = ", ".join(_token_of(row) for row in got) if got.ndim == 2 else f"of shape {got.shape}"
            return (f"{what}: dispatch: expert {e} keeps tokens {tokens} (slot order; the others that chose "
                    f"it were dropped at capacity {r.capacity}); it got rows {held}")
        for j, (t, row) in enumerate(zip(tokens, got, strict=True)):
            if not np.array_equal(row, x[t]):
                return (f"{what}: dispatch: expert {e}'s slot {j} should hold token {t} (expert {e} keeps "
                        f"tokens {tokens} in slot order); it holds {_token_of(row)}")
    return None


def diagnose_moe_dispatch(dispatch, combine) -> str | None:
    """The first expert slot ``dispatch`` fills wrongly, or the first token row ``combine`` gets wrong."""
    n, d = LOGITS.shape[0], 2
    x = np.repeat(np.arange(1.0, n + 1)[:, None], d, axis=1)
    for k, factor in ROUTINGS:
        r = route(LOGITS, k=k, capacity_factor=factor)
        what = f"top-{k} routing of {n} tokens to {r.num_experts} experts, capacity {r.capacity}"
        try:
            wrong = _check_dispatch(dispatch(x, r), r, x, what)
            if wrong:
                return wrong
            pairs = [(e, j) for e in range(r.num_experts) for j in range(len(r.assignments(e)[0]))]
            outputs = [np.eye(len(pairs))[[pairs.index((e, j)) for j in range(len(r.assignments(e)[0]))]]
                       for e in range(r.num_experts)]
            y = np.asarray(combine(outputs, r, n))
        except Exception as err:  # noqa: BLE001 - the message names what was raised
            return f"{what}: raised {type(err).__name__}: {err}"
        expected = np.zeros((n, len(pairs)))
        for e in range(r.num_experts):
            for j, (t, c) in enumerate(zip(*r.assignments(e), strict=True)):
                expected[t, pairs.index((e, j))] += r.gates[t, c]
        if y.shape != expected.shape:
            return f"{what}: combine should return y of shape {expected.shape}; it returned {y.shape}"
        for t in range(n):
            if not np.allclose(y[t], expected[t], rtol=1e-12, atol=0):
                return (f"{what}: combine: token {t}'s row should be {_terms(expected[t], pairs)}; it is "
                        f"{_terms(y[t], pairs)}")
    return None
