"""Argument checks shared by every layer (a leaf: imports only ortformer.errors)."""
from __future__ import annotations

import numbers

from .errors import InputError, OrtformerError


def check_int(name: str, value, *, low: int = 1, high: int | None = None,
              error: type[OrtformerError] = InputError, why: str = "") -> int:
    """``value`` as an int when it is an integer in [low, high] (high None: no bound).

    Strict: a bool, a float (even 3.0) or a string is refused, as is anything out of
    range; ``error`` (the caller's typed error) says what was given and what is valid.
    numpy integers are accepted (e.g. a length read from an array) and returned as int.
    ``why`` is appended to the message, e.g. " (or None for the default)".
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) \
            or value < low or (high is not None and value > high):
        valid = f"an int in [{low}, {high}]" if high is not None else f"an int >= {low}"
        raise error(f"{name}={value!r} must be {valid}{why}")
    return int(value)


def brief(value, limit: int = 120) -> str:
    """repr(value) for an error message, cut to ``limit`` characters with "..." when longer."""
    text = repr(value)
    return text if len(text) <= limit else text[:max(limit - 3, 1)] + "..."
