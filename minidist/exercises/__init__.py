"""Exercises for a course: solution regions, student copies, the test-to-exercise map, grading.

See lessons/TEACHING.md for the instructor's workflow and lessons/EXERCISES.md for the list.
"""

from .exercise_map import build_map, load_map
from .grade import ExerciseResult, grade, grade_exercise, splice_functions
from .markers import MarkerError, Region, all_regions, find_regions, read_registry
from .student_copy import instrumented_copy, make_student_copy

__all__ = ["MarkerError", "Region", "find_regions", "all_regions", "read_registry", "make_student_copy",
           "instrumented_copy", "build_map", "load_map", "grade", "grade_exercise", "splice_functions",
           "ExerciseResult"]
