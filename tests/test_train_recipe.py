"""``python -m minidist train`` (minidist/recipes/train.py) run small, as a reader runs it: a subprocess.

data × pipeline × tensor = 2 × 2 × 2 (a GPT) and data × expert = 2 × 4 (a Switch Transformer) in float64
with --check: the printed differences from one process are at most 1e-9, the figure and the checkpoint
exist, and the checkpoint loads into an unsplit model equal to one process's after the same steps (run
here, by the test's own loop) whose validation loss is the one printed. --resume goes on from it in another
layout (AdamW's moments kept: equal to one process from step 1). --restarts 1 with a rank killed
(MINIDIST_TRAIN_KILL) ends bitwise equal to an uninterrupted run. Bad flags end with one line on stderr
and exit status 2, no traceback, nothing written.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minidist.__main__ import main
from minidist.checkpoint import latest
from minidist.data import load_text
from minidist.nn import CrossEntropyLoss
from minidist.optim import AdamW
from minidist.recipes.train_files import CHECKPOINTS, load_unsplit, saved_run
from minidist.recipes.train_loop import build_model, train_batch, validation_batches, validation_loss

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--layers", "2", "--d-model", "16", "--heads", "2", "--block", "8", "--batch", "8", "--steps", "3",
        "--eval-every", "2", "--sample", "20", "--dtype", "float64"]
NUMBER = r"([0-9.]+(?:e[-+][0-9]+)?)"


def train(out: Path, *flags: str, **env: str) -> str:
    """Run the command; return its stdout (the test fails with its stderr if the exit status is not 0)."""
    command = [sys.executable, "-m", "minidist", "train", *TINY, "--out", str(out), *flags]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), **env))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done.stdout


def one_process(config: dict, corpus, steps: range, state: dict | None = None) -> dict:
    """The unsplit model after ``steps`` AdamW steps on the recipe's batches, in this process."""
    model = build_model(config, corpus.vocab_size)
    if state is not None:
        model.load_state_dict(state)
    optimizer, loss_fn = AdamW(model.parameters(), lr=config["lr"]), CrossEntropyLoss()
    for step in steps:
        x, y = train_batch(corpus, config, step)
        model.zero_grad()
        loss_fn.forward(model.forward(x), y)
        model.backward(loss_fn.backward())
        optimizer.step()
    return model.state_dict()


def final_state(out: Path, corpus) -> tuple[int, dict, dict, dict]:
    """(step, config, history, the unsplit model's state dict) of the newest checkpoint in ``out``."""
    step, config, history = saved_run(out)
    model = build_model(config, corpus.vocab_size)
    load_unsplit(model, AdamW(model.parameters(), lr=config["lr"]), latest(out / CHECKPOINTS))
    return step, config, history, model.state_dict()


def checked(stdout: str, out: Path, corpus, steps: range) -> dict:
    """Assert what a --check run printed and wrote (the checkpoint equals one process trained from step 1,
    AdamW's moments kept across a resume); return the checkpoint's state."""
    params, losses = map(float, re.search(rf"largest parameter difference {NUMBER}, largest loss "
                                          rf"difference {NUMBER}", stdout).groups())
    assert params <= 1e-9 and losses <= 1e-9, stdout
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    step, config, history, state = final_state(out, corpus)
    assert step == steps[-1] and [s for s, _ in history["train"]] == list(range(1, step + 1))
    model = build_model(config, corpus.vocab_size)
    model.load_state_dict(state)                       # every name and shape of the unsplit model
    expected = one_process(config, corpus, range(1, step + 1))
    assert set(state) == set(expected)
    for name, value in expected.items():
        assert state[name].dtype == value.dtype == np.float64
        np.testing.assert_allclose(model.state_dict()[name], value, rtol=0, atol=1e-9, err_msg=name)
    printed = float(re.search(rf"validation {NUMBER} \(unigram", stdout).group(1))
    evaluator = build_model(config, corpus.vocab_size, evaluation=True)
    val = validation_loss(evaluator, state, validation_batches(corpus, config))
    assert abs(val - printed) < 1e-4
    line = rf"^step +{steps[-1]}  loss [0-9.]+  simulated +[0-9.]+ ms  wall +[0-9]+ ms$"
    assert re.search(line, stdout, re.M)
    assert "sample (temperature 0.8, top-k 10):\nThe " in stdout
    return state


@pytest.fixture(scope="module")
def corpus():
    return load_text()


def test_train_recipe_gpt_on_data_pipeline_tensor_trains_like_one_process_and_resumes(tmp_path, corpus):
    stdout = train(tmp_path, "--data", "2", "--pipeline", "2", "--tensor", "2", "--micro-batches", "2",
                   "--check")
    assert "layout data 2 × pipeline 2 × tensor 2 = 8 ranks" in stdout
    checked(stdout, tmp_path, corpus, range(1, 4))
    resumed = train(tmp_path, "--resume", "--tensor", "2", "--steps", "2", "--check")   # another layout
    assert "from step 3" in resumed
    checked(resumed, tmp_path, corpus, range(4, 6))


def test_train_recipe_restarts_after_a_killed_rank_and_ends_bitwise_equal(tmp_path, corpus):
    """--restarts 1, --save-every 2: rank 1 killed before step 4 (after step 3, not saved); the run
    restarts from step 2 and its final checkpoint is bitwise an uninterrupted run's."""
    flags = ("--data", "2", "--steps", "4", "--save-every", "2", "--sample", "0")
    stdout = train(tmp_path / "killed", *flags, "--restarts", "1", MINIDIST_TRAIN_KILL="1:4")
    assert re.search(r"attempt 0 failed: .*rank 1.*; resumed from step 2", stdout), stdout
    assert "finished after 1 restart(s)" in stdout
    train(tmp_path / "whole", *flags)
    (step, _, history, state), (_, _, whole_history, whole) = (final_state(tmp_path / name, corpus)
                                                              for name in ("killed", "whole"))
    assert step == 4 and [s for s, _ in history["train"]] == [1, 2, 3, 4] and history == whole_history
    for name, value in whole.items():
        assert np.array_equal(state[name], value), name


def test_train_recipe_switch_on_data_expert_trains_like_one_process(tmp_path, corpus):
    stdout = train(tmp_path, "--data", "2", "--expert", "4", "--d-ff", "16", "--check")   # 4 experts a layer
    assert stdout.startswith("SwitchTransformer(") and "layout data 2 × expert 4 = 8 ranks" in stdout
    checked(stdout, tmp_path, corpus, range(1, 4))


BAD_FLAGS = {
    "lr": (["--lr", "-1"], "argument --lr: expected a positive number"),
    "data": (["--data", "0"], "argument --data: expected an integer >= 1"),
    "dtype": (["--dtype", "float16"], "argument --dtype: invalid choice"),
    "ranks": (["--ranks", "6", "--data", "2", "--tensor", "2"], "has 4 ranks, --ranks says 6"),
    "heads": (["--heads", "3"], "divisible"),
    "prompt": (["--prompt", "§"], "not in the vocabulary"),
    "resume": (["--resume"], "no checkpoint to resume from"),
    "out": (["--out", __file__], "is a file, not a folder"),
    "tensor": (["--tensor", "4"], "heads"),                        # parallelize's: 4 does not divide 2 heads
    "dense-expert": (["--expert", "2", "--experts", "0"], "expert"),  # parallelize's: a GPT has no experts
    "schedule": (["--schedule", "nope", "--pipeline", "2"], "nope"),
    "batch": (["--batch", "6", "--data", "4"], "6"),                # refused at the first step
}


@pytest.mark.parametrize("flags, says", BAD_FLAGS.values(), ids=BAD_FLAGS.keys())
def test_train_recipe_refuses_bad_flags_in_one_line(flags, says, tmp_path, capsys):
    args = ["train", *TINY, "--out", str(tmp_path / "run"), *flags]
    try:
        status = main(args)
    except SystemExit as stop:                             # argparse's errors
        status = stop.code
    err = capsys.readouterr().err
    assert status == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith("python -m minidist train: error: ") and says in last, err
    assert "Traceback" not in err and not (tmp_path / "run").exists()


def test_train_recipe_a_lost_rank_without_restarts_ends_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MINIDIST_TRAIN_KILL", "1:2")
    status = main(["train", *TINY, "--data", "2", "--out", str(tmp_path), "--sample", "0"])
    err = capsys.readouterr().err
    assert status == 1 and "Traceback" not in err and (tmp_path / "killed-1-2").exists()
    assert err.strip().splitlines()[-1].startswith("python -m minidist train: error: ") and "rank 1" in err
