"""The classroom beside the textbook: solution regions, student copies, the test-to-exercise map, grading,
and the book (the lessons executed into a static site).

minidist/ is the textbook and never imports this package (an import-linter contract in pyproject.toml);
the one bridge is the command line, minidist/__main__.py, which imports it inside the ``exercises`` and
``book`` commands only. This package reads the textbook's files as text (their solution markers) and runs
its tests on copies of it. See lessons/TEACHING.md for the instructor's workflow and lessons/EXERCISES.md
for the list.
"""

from .catalog import render_markdown
from .classroom import grade, grade_class, grade_exercise, grade_submission
from .exercise_map import build_map, instrumented_copy, load_map, own_exercise
from .grade import SubmissionReport, splice_functions
from .markers import MarkerError, Region, all_regions, find_regions, read_registry
from .registry import Exercise
from .results import ExerciseResult, IntegrationResult
from .student_copy import make_student_copy

__all__ = [
           "Exercise",
           "ExerciseResult",
           "IntegrationResult",
           "MarkerError",
           "Region",
           "SubmissionReport",
           "all_regions",
           "build_map",
           "find_regions",
           "grade",
           "grade_class",
           "grade_exercise",
           "grade_submission",
           "instrumented_copy",
           "load_map",
           "make_student_copy",
           "own_exercise",
           "read_registry",
           "render_markdown",
           "splice_functions",
]
