"""GPT: logits, every parameter gradient and five AdamW steps against torch (float64); finite differences;
tied weights; T = 1; sampling; bad input refused before anything changes."""

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from minidist import nn
from minidist.nn.gradcheck import numerical_gradient, relative_error
from minidist.nn.runner import StepRunner
from minidist.optim import AdamW

seeds = st.integers(0, 2**32 - 1)


def tiny(rng, tie=False, **kw):
    return nn.GPT(7, 5, 2, 8, 2, tie_weights=tie, rng=rng, dtype=np.float64, **kw)


@pytest.mark.parametrize("tie", [False, True])
@given(b=st.integers(1, 3), t=st.integers(1, 5), heads=st.integers(1, 3), d_head=st.integers(2, 3),
       seed=seeds)
def test_gpt_matches_torch(tie, b, t, heads, d_head, seed):
    pytest.importorskip("torch")
    from tests.nn import torch_transformer as tt

    rng = np.random.default_rng(seed)
    d = heads * d_head
    # LayerNorm over d = 2 features outputs ±γ + β whatever its input: its input gradient is 0 up to eps and
    # rounding, so a relative comparison below it (the position table's) compares noise (seed 2266 fails)
    assume(d > 2)
    model = nn.GPT(6, 5, 2, d, heads, tie_weights=tie, rng=rng, dtype=np.float64)
    tokens = rng.integers(0, 6, (b, t))
    tt.compare(model, tt.GPT(6, 5, 2, d, heads, tie=tie), tokens, rng.standard_normal((b, t, 6)))


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("t", [1, 4])
def test_gpt_finite_differences(tie, t):
    rng = np.random.default_rng(t)
    model = nn.GPT(5, 4, 1, 4, 2, tie_weights=tie, rng=rng, dtype=np.float64)
    tokens = rng.integers(0, 5, (2, t))
    tokens[0, 0] = tokens[1, 0]  # a repeated token: the scatter-add must sum both rows
    dy = rng.standard_normal((2, t, 5))
    model.zero_grad()
    model.forward(tokens)
    model.backward(dy)
    for name, p in model.named_parameters():
        numeric = numerical_gradient(lambda: float(np.sum(dy * model.forward(tokens))), p.data)
        assert relative_error(p.grad, numeric) < 1e-6, name


def test_gpt_five_adamw_steps_match_torch():
    torch = pytest.importorskip("torch")
    from tests.nn import torch_transformer as tt

    rng = np.random.default_rng(0)
    model = tiny(rng)
    ref = tt.twin(model, tt.GPT(7, 5, 2, 8, 2))
    opt = AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(5):
        tokens = rng.integers(0, 7, (3, 5))
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        opt.zero_grad()
        loss = loss_fn(model.forward(inputs), targets)
        model.backward(loss_fn.backward())
        opt.step()
        ref_opt.zero_grad()
        ref_loss = torch.nn.functional.cross_entropy(ref(torch.from_numpy(inputs)).reshape(-1, 7),
                                                     torch.from_numpy(targets).reshape(-1))
        ref_loss.backward()
        ref_opt.step()
        assert loss == pytest.approx(ref_loss.item(), rel=1e-12)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        tt.assert_close(p.data, q.detach().numpy(), name)


def test_gpt_tied_head_is_one_parameter_listed_once():
    model = tiny(np.random.default_rng(0), tie=True)
    assert model.head.weight is model.tok_emb.weight
    names = [n for n, _ in model.named_parameters()]
    assert "head.weight" not in names and len(names) == len(set(map(id, model.parameters())))
    assert model.num_parameters() == tiny(np.random.default_rng(0)).num_parameters() - 7 * 8


def test_gpt_sub_layers_and_parameter_order():
    model = tiny(np.random.default_rng(0))
    assert isinstance(model.blocks, list) and len(model.blocks) == 2
    expected = [*model.tok_emb.parameters(), *model.pos_emb.parameters(),
                *[p for block in model.blocks for p in block.parameters()],
                *model.ln_f.parameters(), *model.head.parameters()]
    assert [id(p) for p in model.parameters()] == [id(p) for p in expected]


def test_generate_is_reproducible_in_range_and_top_1_is_greedy():
    model = tiny(np.random.default_rng(1))
    prompt = np.array([[1, 2], [3, 3]])
    a = model.generate(prompt, 8, temperature=0.8, top_k=3, rng=np.random.default_rng(5))
    b = model.generate(prompt, 8, temperature=0.8, top_k=3, rng=np.random.default_rng(5))
    assert a.shape == (2, 10) and np.array_equal(a, b) and np.array_equal(a[:, :2], prompt)
    assert a.min() >= 0 and a.max() < 7
    greedy = model.generate(prompt, 6, top_k=1, rng=np.random.default_rng(0))  # longer than block_size
    for i in range(2, 8):
        expected = model.forward(greedy[:, max(0, i - 5):i])[:, -1].argmax(-1)
        np.testing.assert_array_equal(greedy[:, i], expected)
    assert model.training


def test_generate_samples_from_the_softmax():
    """With a fixed last-position distribution, sample frequencies follow softmax(logits / temperature)."""
    model = nn.GPT(3, 2, 1, 4, 1, rng=np.random.default_rng(0), dtype=np.float64)
    model.head.weight.data[:] = 0
    model.head.weight.data[:, 0] = [1.0, 0.0, -1.0]  # logits depend on ln_f's first output only
    prompt = np.zeros((4000, 1), np.int64)
    out = model.generate(prompt, 1, temperature=2.0, rng=np.random.default_rng(0))[:, 1]
    model.eval()
    expected = nn.softmax(model.forward(prompt)[0, -1] / 2.0)
    counts = np.bincount(out, minlength=3) / len(out)
    assert np.abs(counts - expected).max() < 0.03  # ~4 standard errors at n = 4000


def test_gpt_bad_input_changes_nothing():
    with pytest.raises(ValueError, match="divisible by n_heads"):
        nn.GPT(7, 5, 1, 6, 4)
    model = tiny(np.random.default_rng(0))
    model.forward(np.array([[1, 2]]))
    saved = [(m, dict(vars(m))) for m in model.modules()]
    with pytest.raises(ValueError, match=r"\[0, 7\)"):
        model.forward(np.array([[1, 7]]))
    with pytest.raises(ValueError, match=r"\[0, 7\)"):
        model.forward(np.array([[-1, 2]]))
    with pytest.raises(TypeError, match="integer token ids"):
        model.forward(np.array([[1.0, 2.0]]))
    with pytest.raises(ValueError, match="block_size = 5"):
        model.forward(np.zeros((1, 6), np.int64))
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        model.forward(np.zeros(3, np.int64))
    with pytest.raises(TypeError, match="rng"):
        model.generate(np.array([[1]]), 2)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(np.array([[1]]), 2, temperature=0.0, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="top_k"):
        model.generate(np.array([[1]]), 2, top_k=8, rng=np.random.default_rng(0))
    assert all(vars(m) == before for m, before in saved)


@pytest.mark.parametrize("tie", [False, True])
def test_gpt_is_its_units_and_the_runner_steps_through_them(tie):
    """GPT.forward/backward run exactly units(): the step runner stepping unit by unit gives the same
    logits and bitwise the same gradients, and a Sequential of the units (a pipeline's) the same logits."""
    rng = np.random.default_rng(3)
    model = nn.GPT(7, 6, 2, 8, 2, tie_weights=tie, rng=rng, dtype=np.float64)
    tokens, targets = rng.integers(0, 7, (3, 5)), rng.integers(0, 7, (3, 5))
    units = model.units()
    assert [type(u).__name__ for u in units] == ["GPTInput", "TransformerBlock", "TransformerBlock",
                                                 "LayerNorm", "Linear"]
    assert sum(len(u.parameters()) for u in units) == len(model.parameters()) + tie   # tied: listed twice
    loss_fn = nn.CrossEntropyLoss()
    loss = loss_fn.forward(model.forward(tokens), targets)
    model.backward(loss_fn.backward())
    by_hand = [p.grad.copy() for p in model.parameters()]
    model.zero_grad()
    runner = StepRunner(model, nn.CrossEntropyLoss())
    assert len(runner.layers) == 5
    assert runner.forward_backward(tokens, targets) == loss
    for got, want in zip((p.grad for p in model.parameters()), by_hand, strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(nn.Sequential(*model.units()).forward(tokens), model.forward(tokens))
