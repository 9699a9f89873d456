"""Diagnosing DynamicLossScaler.update in its own terms: the step, the flag it saw, and which of the scale
and the clean-step count diverged from GradScaler's rule, with why the scale should be what it is.

The rule, written out here step by step: on found_inf, s ← s·backoff and the count restarts at 0; on a clean
step the count grows, and when it reaches growth_interval, s ← s·growth (unless that is Inf) and the count
restarts; then s ← max(s, min_scale) when there is a min_scale.
"""

import math

FLAGS = (False, False, True, False, False, False, True, True, False, False, False, False)
CASES = ({"init_scale": 8.0, "growth_interval": 3},
         {"init_scale": 4.0, "growth_interval": 2, "backoff_factor": 0.25, "min_scale": 1.0},
         {"init_scale": 2.0**1023, "growth_interval": 1})      # growing would overflow: it must stay


def reference_update(scale: float, clean: int, found_inf: bool, growth_interval: int, growth: float,
                     backoff: float, min_scale: float | None) -> tuple[float, int, str]:
    """(scale, clean steps, why) after one update of GradScaler's rule."""
    if found_inf:
        scale, clean, why = scale * backoff, 0, f"an overflow backs off by {backoff:g}, the count restarts"
    elif clean + 1 == growth_interval:
        grown = scale * growth
        why = (f"{growth_interval} clean steps grow it by {growth:g}" if math.isfinite(grown) else
               f"{growth_interval} clean steps, but growing by {growth:g} would give Inf: it stays")
        scale, clean = (grown if math.isfinite(grown) else scale), 0
    else:
        clean, why = clean + 1, f"clean step {clean + 1} of {growth_interval}: no change"
    if min_scale is not None and scale < min_scale:
        scale, why = min_scale, why + f", then min_scale {min_scale:g} holds it"
    return scale, clean, why


def diagnose_loss_scaler(scaler_class) -> str | None:
    """The first step, flag and quantity (scale or clean_steps) where scaler_class's update goes wrong."""
    for case in CASES:
        scaler = scaler_class(**case)
        scale, clean = scaler.scale, 0
        for t, flag in enumerate(FLAGS, start=1):
            scale, clean, why = reference_update(scale, clean, flag, case["growth_interval"],
                                                 case.get("growth_factor", 2.0),
                                                 case.get("backoff_factor", 0.5), case.get("min_scale"))
            scaler.update(flag)
            what = f"DynamicLossScaler({case}), step {t} (found_inf={flag})"
            if scaler.scale != scale:
                return f"{what}: the scale should be {scale:g} ({why}); it is {scaler.scale:g}"
            if scaler.clean_steps != clean:
                return f"{what}: clean_steps should be {clean} ({why}); it is {scaler.clean_steps}"
    return None
