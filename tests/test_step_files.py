"""tools/step_files.py traces one parallelize(...).train_step, and lessons/ONE_GRADIENT.md says what it
measures: the table's counts are the tool's, and every file the step adds to one process's is walked."""

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("step_files", ROOT / "tools" / "step_files.py")
step_files = importlib.util.module_from_spec(spec)
spec.loader.exec_module(step_files)


def test_one_gradient_counts_the_files_the_tool_measures():
    files, one = step_files.files_entered(data=2, tensor=2), step_files.one_process_files()
    parts = {key: sorted(p for p in files if step_files.part(p, one) == key) for key in step_files.PARTS}
    doc = (ROOT / "lessons" / "ONE_GRADIENT.md").read_text()
    table = dict(re.findall(r"^\| (added by|one process's too|the simulated cluster|in all)[^|]*\| (\d+) \|$",
                            doc, re.MULTILINE))
    assert table == {"added by": str(len(parts["path"])), "one process's too": str(len(parts["one"])),
                     "the simulated cluster": str(len(parts["cluster"])), "in all": str(len(files))}
    named = set(re.findall(r"`([\w/]+\.py)`", doc))
    unnamed = [p for p in parts["path"] if not any(p.removeprefix("minidist/").endswith(n) for n in named)]
    assert not unnamed, f"ONE_GRADIENT.md does not walk {unnamed}"
    # the path crosses the strategy's pieces: the trainer, the split block, the runner, the sync, the ring
    for piece in ("parallel/compose/trainer.py", "parallel/tensor/attention.py", "nn/runner.py",
                  "parallel/data/sync.py", "collectives/ring.py"):
        assert f"minidist/{piece}" in parts["path"]
    assert "minidist/nn/linear.py" in parts["one"] and "minidist/nn/linear.py" in files
