"""The task-table executor, by its old name: pipeline.py's one executor runs every table (one stage per
rank or several, with or without W tasks), so ``TaskPipeline`` is ``Pipeline``."""

from .pipeline import Pipeline as TaskPipeline

__all__ = ["TaskPipeline"]
