"""Options the course's commands share: lists of exercise ids (``--only a,b --only c``)."""

from __future__ import annotations


class OptionError(ValueError):
    """An option given with a value it cannot take (the command ends with one line and exit status 2)."""


def exercise_ids(values: list[str] | None, option: str = "--only") -> list[str] | None:
    """Repeatable options that also take comma-separated lists: ["a,b", "c"] -> ["a", "b", "c"]; None when
    the option was not given. A given but empty or blank list ('', ',', ' ') is an OptionError: it would
    otherwise read as "no selection" and select everything (or nothing)."""
    if values is None:
        return None
    ids = [part.strip() for value in values for part in value.split(",") if part.strip()]
    if not ids:
        raise OptionError(f"{option} {','.join(values)!r}: expected one or more exercise ids (a,b or the "
                          f"option repeated); `exercises list` names them")
    return ids
