"""Exercises for a course: solution regions, student copies, the test-to-exercise map, grading.

See lessons/TEACHING.md for the instructor's workflow and lessons/EXERCISES.md for the list.
"""

from .exercise_map import build_map, load_map
from .grade import ExerciseResult, grade, grade_exercise, splice_functions
from .markers import MarkerError, Region, all_regions, find_regions, read_registry
from .student_copy import instrumented_copy, make_student_copy

__all__ = [
           "ExerciseResult",
           "MarkerError",
           "Region",
           "all_regions",
           "build_map",
           "find_regions",
           "grade",
           "grade_exercise",
           "instrumented_copy",
           "load_map",
           "make_student_copy",
           "read_registry",
           "splice_functions",
]
