"""The demo's line of where the distributed time went (minidist.recipes.demo.wall_breakdown)."""

import re

from minidist.cluster import run_traced
from minidist.data import load_digits
from minidist.recipes.demo import DEVICE, LINK, train_digits_data_parallel, wall_breakdown


def test_the_breakdown_adds_up_to_the_steps_and_names_every_part():
    data = load_digits()
    results, trace = run_traced(train_digits_data_parallel, 2, 1, 0, 32, 0.1, 0.9, 16, data, link=LINK,
                                device=DEVICE)
    for r in results:
        wall = r["wall"]
        assert 0.0 <= wall["waiting"] <= wall["in_calls"] <= wall["step"] and wall["sleeps"] >= 0
        assert wall["other"] >= 0.0 and r["steps"] == 45           # 1,437 images, global batch 32
    last_step_start = results[0]["last_step"][0]                   # only the last step's spans came back
    assert trace.spans and min(s.start for s in trace.spans) >= last_step_start
    line = wall_breakdown(results, trace, 9.5)
    parts = r"steps of ([\d.]+) ms = compute ([\d.]+) ms, messages ([\d.]+) ms, waiting ([\d.]+) ms"
    step, compute, messages, waiting = (float(x) for x in re.search(parts, line).groups())
    assert abs(compute + messages + waiting - step) < 0.02           # the three parts make the step
    assert line.startswith("where the 9.5 s went") and "start-up" in line and "spans back" in line
