"""What a mixed-precision run adds to its checkpoint (parallelize(..., mixed={...}), MixedPrecisionTrainer).

Outside a step the model's Parameters hold the fp32 master weights (the low-precision copy lives only
inside forward-backward), so each rank's file already has the masters and the optimizer's state
(shards.py). The manifest's "mixed" entry adds what the recipe keeps beside them:

    config          mixed's keywords as text (fmt, grad_fmt, master_fmt, update_rounding, the scaler's class)
    scale           the loss scale s                clean_steps   steps since the last overflow (dynamic)
    steps_taken, steps_skipped                      rng           the stochastic rounding generator's state

Without the scale a resumed run scales its first gradients by another s: other roundings, other bits.
"""

from __future__ import annotations

from pathlib import Path

from minidist.precision.formats import FloatFormat

from .manifest import MANIFEST


def describe(value) -> str:
    """A keyword's value as text that is equal for equal formats (FloatFormat(5, 10) == FP16)."""
    if isinstance(value, FloatFormat):
        return f"FloatFormat({value.exp_bits}, {value.man_bits}, finite_only={value.finite_only})"
    if isinstance(value, (str, int, float)) or value is None:
        return repr(value)
    return type(value).__name__                    # a scaler, a Generator: their state is saved below


def config_of(trainer) -> dict | None:
    return None if trainer.mixed is None else {k: describe(v) for k, v in sorted(trainer.mixed.items())}


def mixed_state(trainer) -> dict | None:
    """The manifest's "mixed" entry of a built trainer (None for a plain-precision one)."""
    recipe = trainer.recipe
    if recipe is None:
        return None
    return {"config": config_of(trainer), "scale": float(recipe.scaler.scale),
            "clean_steps": int(getattr(recipe.scaler, "clean_steps", 0)), "steps_taken": recipe.steps_taken,
            "steps_skipped": recipe.steps_skipped,
            "rng": None if recipe.rng is None else recipe.rng.bit_generator.state}


def check_mixed(directory: Path, manifest: dict, trainer) -> None:
    """ValueError naming the manifest when the checkpoint's precision is not this trainer's (plain against
    mixed, or other formats / rounding / scaler)."""
    saved, mine = manifest.get("mixed"), config_of(trainer)
    if (saved is None) != (mine is None):
        raise ValueError(f"{Path(directory) / MANIFEST}: saved " + ("without" if saved is None else "with")
                         + " mixed precision, this trainer runs " + ("with" if saved is None else "without"))
    if saved is not None and saved["config"] != mine:
        raise ValueError(f"{Path(directory) / MANIFEST}: saved with mixed = {saved['config']}, this trainer "
                         f"has mixed = {mine}")


def restore_mixed(trainer, saved: dict | None) -> None:
    """Give the built trainer's recipe the saved loss scale, counters and rounding generator state."""
    if saved is None:
        return
    recipe = trainer.recipe
    recipe.scaler.scale = saved["scale"]
    if hasattr(recipe.scaler, "clean_steps"):
        recipe.scaler.clean_steps = saved["clean_steps"]
    recipe.steps_taken, recipe.steps_skipped = saved["steps_taken"], saved["steps_skipped"]
    if recipe.rng is not None and saved["rng"] is not None:
        recipe.rng.bit_generator.state = saved["rng"]
