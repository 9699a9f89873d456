"""Time the grader: one full grade of a submission, and a class of six (issue 32's "done when").

The class: untouched (every exercise cut), one solved (ring_allreduce), all solved, a wrong ring (the
reduce-scatter only, no allgather), a hang (ErrorFeedback.compress loops forever without sleeping) and an
exit (DynamicLossScaler.update calls os._exit(0)); the last three have every other exercise solved.
Checked here: every correct exercise at full marks, the wrong ring at most 10%, the hang and the exit
named in the reports. Targets: one submission <= 60 s on an idle 2-core machine; the class <= 6 minutes.

    python benchmarks/grade.py              # from the repository root; record the figures in grade.md
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from minidist.exercises import all_regions, grade_class, grade_submission, make_student_copy

RING, FEEDBACK = "minidist/collectives/ring.py", "minidist/parallel/compression/error_feedback.py"
SCALING = "minidist/precision/scaling.py"
REDUCE_SCATTER_ONLY = """\
    p, r, tag = comm.world_size, comm.rank, TAGS["ring"]
    for s in range(p - 1):
        comm.sendrecv(ring_chunk(flat, p, r - s - 1), dst=(r + 1) % p, src=(r - 1) % p, sendtag=tag,
                      recvtag=tag, out=ring_chunk(flat, p, r - s - 2), op=op)
    return flat"""


def replace_cut(copy: Path, path: str, exercise: str, bodies: list[str]) -> None:
    """Put ``bodies`` (one per cut region, in file order) where the copy raises for ``exercise``."""
    text = (copy / path).read_text()
    for body in bodies:
        line = next(li for li in text.splitlines() if f"NotImplementedError('exercise {exercise}:" in li)
        indent = line[:len(line) - len(line.lstrip())]
        text = text.replace(line, "\n".join(indent + b.strip("\n").lstrip() if i == 0 else b
                                             for i, b in enumerate(body.split("\n"))), 1)
    (copy / path).write_text(text)


def make_class(folder: Path) -> dict[str, Path]:
    copies = {name: folder / name for name in ("untouched", "one-solved", "all-solved", "wrong-ring",
                                                "hang", "exit")}
    make_student_copy(ROOT, copies["untouched"])
    make_student_copy(ROOT, copies["one-solved"], keep=["ring_allreduce"])
    make_student_copy(ROOT, copies["all-solved"], only=[])
    make_student_copy(ROOT, copies["wrong-ring"], only=["ring_allreduce"])
    replace_cut(copies["wrong-ring"], RING, "ring_allreduce", [REDUCE_SCATTER_ONLY, "    return flat"])
    make_student_copy(ROOT, copies["hang"], only=["error_feedback"])
    replace_cut(copies["hang"], FEEDBACK, "error_feedback", ["        while True:\n            pass"])
    make_student_copy(ROOT, copies["exit"], only=["dynamic_loss_scaling"])
    replace_cut(copies["exit"], SCALING, "dynamic_loss_scaling", ["        import os\n        os._exit(0)"])
    return copies


def check(reports: dict) -> list[str]:
    """What the class must show; returns the failures (empty when all hold)."""
    bad = []
    wrong_by_design = {"wrong-ring": "ring_allreduce", "hang": "error_feedback",
                       "exit": "dynamic_loss_scaling"}
    for name, report in reports.items():
        for r in report.exercises:
            cut = name == "untouched" or (name == "one-solved" and r.exercise != "ring_allreduce")
            if not cut and r.exercise != wrong_by_design.get(name) and r.score != 1.0:
                bad.append(f"{name}: {r.exercise} scored {r.score:.2f}, expected full marks")
    ring = next(r for r in reports["wrong-ring"].exercises if r.exercise == "ring_allreduce")
    if ring.score > 0.10:
        bad.append(f"wrong-ring: ring_allreduce scored {ring.score:.2f} > 0.10")
    for name, exercise, outcome in (("hang", "error_feedback", "hung"),
                                    ("exit", "dynamic_loss_scaling", "crashed")):
        if not any(i["exercise"] == exercise and i["outcome"] == outcome for i in reports[name].incidents):
            bad.append(f"{name}: {exercise} not reported {outcome}")
    return bad


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)
    ids = sorted({r.exercise for r in all_regions(ROOT)})
    print(f"grader benchmark: {len(ids)} exercises, 2 sessions at a time, {os.cpu_count()} cpu(s), "
          f"load average {os.getloadavg()[0]:.1f} at the start")
    with tempfile.TemporaryDirectory(prefix="minidist-bench-grade-") as tmp:
        copies = make_class(Path(tmp))
        start, cpu = time.perf_counter(), _children_cpu()
        one = grade_submission(copies["all-solved"], ROOT)
        print(f"one submission (all solved): {time.perf_counter() - start:6.1f} s, score "
              f"{one.total_score:.2f}, load average {os.getloadavg()[0]:.1f}; {_children_cpu() - cpu:.0f} "
              f"CPU-seconds in its sessions (on 2 idle cores about half that in wall-clock time)")
        start = time.perf_counter()
        reports = dict(zip(copies, grade_class(list(copies.values()), ROOT, echo=print)))
        total = time.perf_counter() - start
        print(f"class of {len(copies)}: {total:6.1f} s ({total / 60:.1f} min), load average "
              f"{os.getloadavg()[0]:.1f} at the end")
        for name, report in reports.items():
            trouble = "; ".join(f"{i['exercise']} {i['outcome']}: {i['test'].split('::')[-1]}"
                                for i in report.incidents)
            ring = next(r for r in report.exercises if r.exercise == "ring_allreduce")
            print(f"  {name:11s} score {report.total_score:.2f}  ring {ring.passed}/{ring.total}  "
                  f"{report.status}" + (f"  ({trouble})" if trouble else ""))
        failures = check(reports)
        print("checks: " + ("all hold" if not failures else "FAILED\n  " + "\n  ".join(failures)))


if __name__ == "__main__":
    main()
