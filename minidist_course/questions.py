"""Check-yourself questions at the end of lessons 05, 06, 08, 09, 14, 17 and 19, with their answer key.

Each question is a number to compute or a choice to justify. The key below is what a textbook prints at
the back; each lesson's last cell computes every answer with the library (a schedule's priced messages,
the planner, the lesson's own measured ledger) and ``check_yourself`` asserts it equals the key, so a
key that drifts from the code fails the lesson. The answers stay out of the lesson's printed text: they
are printed by ``python lessons/NN_....py --answers``, by ``python -m minidist exercises questions
--answers`` (the handout without them: no flag) and on the book's answers page (answers.html); the
book shows the questions at the end of each lesson's page.
"""

from __future__ import annotations

import html
import math
import sys
import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class Question:
    """id: unique within its lesson; text: the question; answer: a number, a string or a tuple of them
    (the key); why: how the answer follows, with the formula."""

    id: str
    text: str
    answer: object
    why: str


Q = Question
QUESTIONS: dict[str, tuple[Question, ...]] = {
    "05": (
        Q("ring_bytes",
          "A ring all-reduce sums 12 MB (3,000,000 float32 values) over 6 ranks. How many bytes "
          "does each rank send? Say where each factor of the formula comes from.",
          20000000, "2(P − 1)/P · n = 2 · 5/6 · 12,000,000: P − 1 reduce-scatter steps and P − 1 "
          "all-gather steps, each sending one chunk of n/P bytes. The count hardly grows with P: "
          "the ring is bandwidth-optimal."),
        Q("server_bytes",
          "A parameter-server all-reduce of 4 MB (1,000,000 float32 values) over 8 ranks, rank 0 "
          "the server: how many bytes does the server send, and why does that limit the scheme as "
          "P grows?",
          28000000, "(P − 1) · n: the server returns the whole sum to each of the P − 1 workers, "
          "while a worker sends n once. The server's link carries P − 1 times a worker's traffic, "
          "so the time grows linearly with P."),
        Q("ring_beats_tree",
          "On 8 ranks with α = 10 µs per message and β = 1 ns per byte, what is the smallest "
          "message size (a power of two, in bytes) at which the ring all-reduce is faster than the"
          " binomial tree? Which term decides below it?",
          32768, "tree 2·log₂P·(α + nβ) = 6α + 6nβ; ring 2(P − 1)α + 2(P − 1)/P·nβ = 14α + 1.75nβ."
          " The ring wins once 4.25·nβ > 8α, n > 18,824 bytes: 2¹⁵. Below, the ring's 14 latencies"
          " cost more than the tree's bytes."),
    ),
    "06": (
        Q("gradient_bytes",
          "Data parallelism over 8 ranks trains a model of 25 million float32 parameters, its "
          "gradients summed by a ring all-reduce. How many bytes does each rank send per step, and"
          " does the batch size change it?",
          175000000, "2(P − 1)/P · 4Ψ = 2 · 7/8 · 100 MB, whatever the batch: data parallelism "
          "sends the gradient, which has the model's size."),
        Q("gradient_seconds",
          "On a link with α = 5 µs and β = 0.1 ns per byte (10 GB/s), how many seconds does that "
          "all-reduce take? Which term dominates, and what would make it faster?",
          0.01757, "2(P − 1)α + 2(P − 1)/P·nβ = 14 · 5 µs + 175 MB · 0.1 ns = 0.07 ms + 17.5 ms: "
          "bandwidth. Fewer bytes (lower precision, compression) help; fewer messages (bigger "
          "buckets) barely do."),
        Q("overlap_seconds",
          "A 4-layer network spends 10 ms per layer in forward (backward takes twice that), and "
          "each layer's gradients form one bucket whose all-reduce takes 15 ms. What is the step "
          "time (seconds) when the all-reduces wait for the end of backward, and when each bucket "
          "is sent as soon as its layer's backward ends?",
          (0.18, 0.135), "Waiting: 40 + 80 + 4 · 15 = 180 ms. Overlapped: the buckets leave at 60,"
          " 80, 100 and 120 ms, each done before the next is ready, so only the last bucket's 15 "
          "ms shows: 40 + 80 + 15 = 135 ms."),
    ),
    "08": (
        Q("gpipe_bubble",
          "GPipe runs 6 stages with 12 micro-batches. What fraction of each stage's time is idle?",
          5 / 17, "(P − 1)/(M + P − 1) = 5/17 ≈ 0.294: filling and draining the pipe take P − 1 "
          "ticks each, so the M micro-batches occupy M + P − 1 ticks per direction."),
        Q("held_at_stage_2",
          "With the same 6 stages and 12 micro-batches, how many micro-batches' activations does "
          "stage 2 hold at most under GPipe, and under 1F1B? Why is the bubble the same?",
          (12, 4), "GPipe runs all M forwards before the first backward: 12. 1F1B starts each "
          "backward as soon as it can: P − s = 4 at stage s = 2. Between flushes both do the same "
          "work in the same ticks."),
        Q("micro_batches_for_3_percent",
          "How many micro-batches does an 8-stage GPipe need for a bubble below 3%? What does that"
          " ask of the global batch?",
          227, "(P − 1)/(M + P − 1) < 0.03 ⇔ M > 7/0.03 − 7 = 226.3: at least 227 micro-batches, "
          "so at least 227 sequences per step. Deep pipelines need large batches, or interleaving "
          "(lesson 19)."),
    ),
    "09": (
        Q("megatron_or_data",
          "A Megatron MLP of two square layers of width 1,024 trains on a batch of 256 over 4 "
          "ranks. How many words does each rank send per step under Megatron's tensor split, and "
          "how many under data parallelism?",
          (393216, 3145728), "Megatron: one all-reduce of the B × d output in forward, 2(P − 1)/P "
          "· B·d = 393,216 (the first block's input gradient is not needed). Data: 2(P − 1)/P · "
          "2d² = 3,145,728, 8× more: here d = 4B."),
        Q("crossover_width",
          "Four square layers of width d, batch 512, 4 ranks: what is the smallest power-of-two "
          "width at which Megatron's split sends fewer words than data parallelism?",
          512, "Megatron sends 6(P − 1)·B·d words (two blocks' forward outputs, the second block's"
          " input gradient), data parallelism 8(P − 1)·d²: the split wins for d > 0.75·B = 384. "
          "Activations grow with B·d, gradients with d²."),
        Q("which_fits",
          "Eight square layers of width 16,384 train with Adam in float32 on a batch of 64 on 4 "
          "devices of 16 GiB. Which fits, data parallelism over 4 or the column split over 4? Give"
          " each one's GB per device.",
          ("tensor", 34.369175552, 8.627683328), "Weights, gradients and Adam's two states are 4 ·"
          " 8 · 16,384² words of 4 bytes = 34.4 GB on every data-parallel rank; the split divides "
          "them by T = 4 (activations are small): 8.6 GB < 17.2 GB."),
    ),
    "14": (
        Q("zero2_bytes",
          "Mixed-precision Adam holds 16 bytes per parameter. Under ZeRO-2 over 64 ranks, how many"
          " bytes per parameter does each rank hold, and which part does not shrink?",
          2.21875, "2 + 14/P: the fp16 parameters (2 bytes) stay replicated; the fp16 gradients "
          "(2) and the fp32 master weights, momentum and variance (12) are sharded over the P "
          "ranks."),
        Q("lowest_stage",
          "A 7.5-billion-parameter model trains on 64 devices of 40 GB. Which is the lowest of DP,"
          " ZeRO-1, ZeRO-2, ZeRO-3 whose model states fit, and how many GB does it need per "
          "device?",
          ("ZeRO-1", 31.40625), "DP needs 16 · 7.5 = 120 GB; ZeRO-1 (4 + 12/64) · 7.5 = 31.4 GB "
          "fits. A higher stage would cost more communication (ZeRO-3: 1.5× the bytes) for memory "
          "not needed."),
        Q("zero3_ranks",
          "How many ranks (a power of two) does ZeRO-3 need to hold the model states of a 175B "
          "model in 80 GB per rank?",
          64, "16Ψ/P ≤ 80 GB ⇔ P ≥ 16 · 175/80 = 35: 64. ZeRO-1 and -2 never get there: their "
          "replicated 4Ψ and 2Ψ alone are 700 and 350 GB."),
    ),
    "17": (
        Q("tensor_block_bytes",
          "One transformer block (d = 4096) runs forward and backward on one sequence of 8,192 "
          "tokens in bf16, tensor parallel over 8 ranks. How many bytes does each rank send?",
          469762048, "Four all-reduces (two forward, two backward) of N·d values: 4 · 2(t − 1)/t ·"
          " N·d · 2 bytes = 8 · 7/8 · 8192 · 4096 · 2."),
        Q("sequence_parallel_extra",
          "Sequence parallelism replaces each of those all-reduces by an all-gather and a reduce-"
          "scatter. How many more bytes does each rank send per block, and what does it buy?",
          86016, "The pairs move exactly the all-reduce's bytes; only the LayerNorms' 6d "
          "gradients, now partial over each rank's tokens, need an all-reduce: 2(t − 1)/t · 6d · 2"
          " = 86,016 bytes. In exchange the LayerNorm and dropout activations are divided by t."),
        Q("context_crossover",
          "From what sequence length (a power of two) does context parallelism over 4 ranks send "
          "fewer bytes per block than tensor parallelism over 4 (d = 2048, 16 heads, bf16, each "
          "with the gradient all-reduce it needs)? Why does a crossover exist at all?",
          65536, "Tensor: 8(t − 1)/t · T·d · 2 = 12·T·d bytes. Context: 10·T·d for the ring (K, V "
          "forward; K, V, dK, dV backward, c − 1 hops of T/c tokens) plus 2(c − 1)/c · (12d² + 13d) · "
          "2 ≈ 151 MB of gradients, which the tensor split never sums: 2·T·d > 151 MB from T ≈ "
          "36,900. Both grow with T; only context parallelism pays a fixed cost."),
    ),
    "19": (
        Q("layout_for_13b",
          "A 13B GPT (40 layers, d = 5120, 40 heads, 2,048 tokens, 256 sequences per step) trains "
          "on one node of 8 A100s of 40 GB. How many GB per rank would data parallelism with "
          "ZeRO-1 need, and which layout (with its ZeRO stage and recomputation) does the planner "
          "rank first?",
          ("dp2 pp2 tp2", "ZeRO-1", "none", 86.009728), "ZeRO-1 over 8 still replicates 4 bytes "
          "of bf16 weights and gradients per parameter plus every layer's activations: 86 GB. The "
          "weights must be split (tensor × pipeline = 4); two replicas with ZeRO-1 bring it to 39.5 "
          "GB, the fastest of the layouts that fit. Selective recomputation would save nothing here: "
          "it drops only the attention scores, which flash attention never stores."),
        Q("interleaved_bubble",
          "1F1B on 4 stages with 8 micro-batches idles 3/11 of the time. With three model chunks "
          "per rank (interleaved, v = 3), what is the bubble?",
          1 / 9, "(P − 1)/(v·M + P − 1) = 3/27 ≈ 0.111: each chunk's tick is 1/v as long, so "
          "filling and draining shrink v-fold; the price is v times the point-to-point messages."),
        Q("equivalent_micro_batches",
          "How many micro-batches would plain 1F1B on 4 stages need to match that bubble?",
          24, "(P − 1)/(M′ + P − 1) = 3/27 ⇔ M′ = v·M = 24: interleaving buys the bubble of a "
          "v-times larger batch without changing the batch."),
    ),
}


def _same(got, want) -> bool:
    if isinstance(want, tuple):
        return isinstance(got, tuple) and len(got) == len(want) and all(map(_same, got, want))
    if isinstance(want, str) or isinstance(got, str):
        return got == want
    return math.isclose(float(got), float(want), rel_tol=1e-9, abs_tol=1e-12)


def format_answer(value) -> str:
    """The key as a reader writes it: 20,000,000; 0.2727; (8, 4)."""
    if isinstance(value, tuple):
        return ", ".join(map(format_answer, value))
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def check_yourself(lesson: str, **computed) -> None:
    """Assert that the lesson's computed answers equal the key, one keyword per question id; print the
    answers with ``--answers`` on the command line, otherwise one line saying where the questions are.

    Raises ValueError for an unknown lesson or ids that do not match its questions; AssertionError naming
    the question whose computed answer differs from the key."""
    if lesson not in QUESTIONS:
        raise ValueError(f"lesson: no questions for {lesson!r}; lessons with questions: {sorted(QUESTIONS)}")
    ids = [q.id for q in QUESTIONS[lesson]]
    if sorted(computed) != sorted(ids):
        raise ValueError(f"lesson {lesson}: expected an answer for each of {ids}, got {sorted(computed)}")
    for q in QUESTIONS[lesson]:
        assert _same(computed[q.id], q.answer), (
            f"check yourself {lesson}.{q.id}: the lesson computes {computed[q.id]!r}, "
            f"the key says {q.answer!r}")
    if "--answers" in sys.argv[1:]:
        print(handout([lesson], answers=True), end="")
    else:
        print(f"check yourself: {len(ids)} questions (`python -m minidist exercises questions --lesson "
              f"{lesson}`); answers checked against the key (`--answers` prints them)")


def _lessons(lessons: list[str] | None) -> list[str]:
    wanted = [str(n).zfill(2) for n in lessons] if lessons else sorted(QUESTIONS)
    unknown = [n for n in wanted if n not in QUESTIONS]
    if unknown:
        raise ValueError(f"--lesson: no questions for lesson {unknown[0]!r}; lessons with questions: "
                         f"{', '.join(sorted(QUESTIONS))}")
    return wanted


def handout(lessons: list[str] | None = None, answers: bool = False) -> str:
    """The questions of ``lessons`` (all by default) as plain text, each with its answer and why when
    ``answers``. Raises ValueError naming a lesson without questions."""
    lines = []
    for lesson in _lessons(lessons):
        lines.append(f"Lesson {lesson}: check yourself")
        for i, q in enumerate(QUESTIONS[lesson], 1):
            lines.append(textwrap.fill(q.text, 100, initial_indent=f"  {i}. ", subsequent_indent="     "))
            if answers:
                lines.append(textwrap.fill(f"Answer: {format_answer(q.answer)}. {q.why}", 100,
                                           initial_indent="     ", subsequent_indent="     "))
        lines.append("")
    return "\n".join(lines) + "\n"


def questions_markdown(lesson: str) -> str:
    """The questions of one lesson as the Markdown cell the book puts at the end of its page ('' if the
    lesson has none); the answers are on answers.html."""
    if lesson not in QUESTIONS:
        return ""
    items = [f"{i}. {q.text}" for i, q in enumerate(QUESTIONS[lesson], 1)]
    return ("## Check yourself\n\n" + "\n".join(items)
            + f"\n\nThe answers, computed and asserted by the cell above: "
              f"[answers](answers.html#lesson-{lesson}).")


def answers_page(lessons: list[str], head: str = "") -> str:
    """answers.html: every question of ``lessons`` (those with questions) with its answer and why."""
    lines = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', head,
             "<title>minidist: check-yourself answers</title>",
             "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}</style></head><body>",
             '<p><a href="index.html">index</a></p><h1>Check yourself: the answers</h1>']
    for lesson in [n for n in lessons if n in QUESTIONS]:
        lines.append(f'<h2 id="lesson-{lesson}">Lesson {lesson}</h2><ol>')
        for q in QUESTIONS[lesson]:
            lines.append(f"<li><p>{html.escape(q.text)}</p><p><b>{html.escape(format_answer(q.answer))}</b>. "
                         f"{html.escape(q.why)}</p></li>")
        lines.append("</ol>")
    return "\n".join(lines + ["</body></html>", ""])


def cmd_questions(args) -> int:
    try:
        sys.stdout.write(handout(args.lesson, answers=args.answers))
    except ValueError as err:
        print(f"exercises questions: {err}", file=sys.stderr)
        return 2
    return 0


def add_parser(verbs) -> None:
    """``exercises questions [--lesson NN] [--answers]``: the check-yourself questions as a handout."""
    qs = verbs.add_parser("questions", help="the lessons' check-yourself questions, as a handout")
    qs.add_argument("--lesson", action="append", metavar="NN", help="only these lessons (repeatable)")
    qs.add_argument("--answers", action="store_true", help="with the answers and how they follow")
    qs.set_defaults(func=cmd_questions)
