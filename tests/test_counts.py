"""tools/counts.py measures duplication from the source: each check finds exactly the sites planted in a small
tree (and not the look-alikes beside them), and the script fails when a count exceeds its target."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("counts", ROOT / "tools" / "counts.py")
counts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(counts)

FILES = {
    "nn/gpt.py": """
class GPTInput:
    def forward(self, tokens):
        return self.tok_emb.forward(tokens) + self.pos_emb.forward(tokens)
class GPT:
    def __init__(self):
        self.tok_emb = self.pos_emb = None            # building, not running: no chain
    def units(self):
        return [GPTInput(self.tok_emb, self.pos_emb)]
""",
    "precision/fast.py": """
def mixed_forward(model, tokens):
    return model.tok_emb.weight.data[tokens]          # a second chain: indexes the table itself
""",
    "nn/block.py": """
class TransformerBlock:
    def forward(self, x):
        return self.ln2.forward(self.ln1.forward(x))
""",
    "parallel/tensor/block.py": """
from ..context import ring
class TensorBlock:
    def __init__(self, block):
        self.ln1, self.ln2 = block.ln1, block.ln2     # a block wired by hand
    def backward(self, dy, params):
        before = [p.grad.copy() for p in params]       # copy-then-sum
        allreduce_gradients(self.comm, params)         # a hand-rolled sum
        return dy
""",
    "parallel/context/ring.py": """
from ..tensor import block
def neighbours(rank, c):
    return (rank - 1) % c, (rank + 1) % c             # ring arithmetic, not a grid
""",
    "parallel/grid.py": """
class Grid:
    def __init__(self, comm, m):
        self.row, self.col = divmod(comm.rank, m)
        self.data_comm = comm.split(color=self.col, key=self.row)
class Grid2:
    def __init__(self, comm, p, t):
        self.comm = comm.split(color=self.d * p + self.q, key=0)
class Delegates:
    def coords(self, rank):
        return self.shape.coords(rank)
""",
    "parallel/pipeline/pipeline.py": """
class Pipeline:
    def train_step(self, x, y):
        return 0.0
class Table:
    def rows(self):
        return []
""",
    "parallel/pipeline/ledger.py": """
class StageLedger:
    def __init__(self, comm):
        self.memory: list[tuple[float, int]] = [(comm.clock, 0)]   # samples of its own
class Stage:
    def __init__(self, comm):
        self.timeline = []
        self.memory = MemoryLedger(comm.rank)                       # the one ledger: no books of its own
    def memory_of(self):
        return self.memory
""",
    "sim/memory.py": """
class MemoryLedger:
    pass
class MemoryRecorder:                                               # the same module: the same books
    pass
""",
    "sim/rounds.py": """
def _ring(p):
    return [[(r, (r + 1) % p)] for r in range(p)]
def price(plan, link):
    return sum(link.alpha + link.beta for step in plan.steps)   # walks every schedule: a place for each
""",
    "plan/clock.py": """
def rounds(sends, link):
    return len(sends) * link.alpha
def ring_allreduce_seconds(n, p, link):
    return rounds([n] * p, link)                       # the ring priced again, through its file's walker
def train_elastic(x, alpha, algorithm="ring"):
    return alpha * x                                   # a moving rate and a default: no price
""",
    "a.py": "def f():\n    from minidist import b\n",
    "b.py": "from minidist.a import f\n",
    "grading/markers.py": "BEGIN = re.compile(r'^# BEGIN SOLUTION (?P<id>\\w+)$')\n",     # the classroom's
    "collectives/tree.py": "def tree(x):\n    # BEGIN SOLUTION tree\n    return x\n    # END SOLUTION\n",
}


def plant(tmp_path: Path) -> Path:
    for name, text in FILES.items():
        path = tmp_path / "minidist" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_each_count_finds_exactly_the_planted_sites(tmp_path):
    found = counts.counts(plant(tmp_path))
    names = {name: [place.split(":")[0] + " " + place.split()[-1] for place in places]
             for name, places in found.items()}
    assert names["GPT forward/backward chains"] == ["minidist/nn/gpt.py GPTInput",
                                                    "minidist/precision/fast.py mixed_forward"]
    assert names["transformer blocks wired by hand"] == ["minidist/nn/block.py TransformerBlock",
                                                         "minidist/parallel/tensor/block.py TensorBlock"]
    assert names["rank <-> coordinate arithmetic sites"] == ["minidist/parallel/grid.py Grid",
                                                             "minidist/parallel/grid.py Grid2"]
    assert names["pipeline executors"] == ["minidist/parallel/pipeline/pipeline.py Pipeline"]
    assert len(found["copy-then-sum gradient sites"]) == 1
    assert len(found["hand-rolled data-axis allreduces"]) == 1
    assert found["file-level import cycles"] == [                                  # the lazy import counts
        "minidist.a <-> minidist.b", "minidist.parallel.context.ring <-> minidist.parallel.tensor.block"]
    assert found["strategy folders importing each other"] == ["context <-> tensor"]
    assert [place.split(":")[0] for place in found["memory trackers"]] == [
        "minidist/parallel/pipeline/ledger.py", "minidist/sim/memory.py"]
    assert found["places a collective's cost is written"] == ["ring: minidist/plan/clock.py",
                                                           "ring: minidist/sim/rounds.py"]
    assert found["classroom files inside minidist/"] == ["minidist/grading/markers.py"]  # no region file


def test_the_script_fails_only_when_a_count_exceeds_its_target(tmp_path, monkeypatch, capsys):
    root = plant(tmp_path)
    assert counts.main([], root) == 1
    out = capsys.readouterr().out
    assert "GPT forward/backward chains                  2      1  OVER" in out
    high = [(name, measure, None if target is None else 10) for name, measure, target in counts.CHECKS]
    monkeypatch.setattr(counts, "CHECKS", high)
    assert counts.main([], root) == 0


def test_clock_charges_outside_the_cluster_are_counted(tmp_path):
    files = {"cluster/comm.py": "class Comm:\n    def compute(self, f):\n        self._ledger.compute(f)\n",
             "sim/compute.py": "def charge_flops(comm, f, label):\n    comm.compute(f, label=label)\n",
             "parallel/spatial/conv.py": "def forward(self, x):\n    self.comm.elapse(1.0)\n"
                                         "    return x.compute_mean()\n"}
    for name, text in files.items():
        (tmp_path / "minidist" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "minidist" / name).write_text(text)
    found = counts.counts(tmp_path)
    assert found["compute charge APIs"] == ["minidist/parallel/spatial/conv.py", "minidist/sim/compute.py"]
    assert found["direct clock calls in strategies"] == ["minidist/parallel/spatial/conv.py:2"]
