"""minidist: a NumPy reference implementation of distributed deep-learning training.

Layers with hand-written backward passes (``minidist.nn``), optimizers (``minidist.optim``), emulated
low-precision arithmetic (``minidist.precision``), a cluster of processes joined by shared memory
(``minidist.cluster``), collectives on it (``minidist.collectives``) and parallel training strategies
(``minidist.parallel``). See README.md and the lessons.
"""

__version__ = "0.1.0"


def _lessons_exit_cleanly_on_unsolved_exercises() -> None:
    """In a student copy, a lesson that reaches an unsolved exercise says which, how to check it, and exits
    with status 1 (minidist.exercises.unsolved.stop_message)."""
    import os
    import sys

    script = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if os.path.basename(os.path.dirname(script)) != "lessons":
        return
    previous = sys.excepthook

    def hook(kind, error, tb):
        from minidist.exercises.unsolved import stop_message, unsolved_exercise  # only when it failed

        exercise = unsolved_exercise(error)   # raised here, or inside a cluster rank (in ClusterError)
        if exercise is not None:
            print(stop_message("This lesson", "the lesson", exercise), flush=True)
            os._exit(1)
        previous(kind, error, tb)

    sys.excepthook = hook


_lessons_exit_cleanly_on_unsolved_exercises()


def _mpi_process_setup() -> None:
    """Under mpiexec: only rank 0 prints; a job started by `python -m minidist run --mpi` is watched
    (minidist/mpi_rank.py). Reads the environment only; imports nothing outside one."""
    import os

    if "PMI_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ:
        from minidist.mpi_rank import setup

        setup()


_mpi_process_setup()
