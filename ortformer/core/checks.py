"""Argument checks shared by every layer (a leaf: imports only ortformer.core.errors)."""
from __future__ import annotations

import json
import numbers
from typing import Any, Callable

from .errors import InputError, OrtformerError


def check_int(name: str, value, *, low: int = 1, high: int | None = None,
              error: type[OrtformerError] = InputError, why: str = "") -> int:
    """``value`` as an int when it is an integer in [low, high] (high None: no bound).

    Strict: a bool, a float (even 3.0) or a string is refused, as is anything out of
    range; ``error`` (the caller's typed error) says what was given and what is valid.
    numpy integers are accepted (e.g. a length read from an array) and returned as int.
    ``why`` is appended to the message, e.g. " (or None for the default)".
    """
    if not is_int(value) or value < low or (high is not None and value > high):
        valid = f"an int in [{low}, {high}]" if high is not None else f"an int >= {low}"
        raise error(f"{name}={value!r} must be {valid}{why}")
    return int(value)


def is_int(value: Any) -> bool:
    """An integer (numpy's too), never a bool: True must not pass as a count."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def json_value(text: str | bytes, what: str, error: Callable[[str], Exception] = ValueError):
    """``text`` parsed as JSON; else ``error`` "{what} is not valid JSON: ..." (input nested
    deeper than the parser goes is invalid JSON that says so, not a crash)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise error(f"{what} is not valid JSON: nested too deeply to parse") from None
    except (TypeError, ValueError) as exc:
        raise error(f"{what} is not valid JSON: {exc}") from None


def json_object(text: str | bytes, what: str, error: Callable[[str], Exception] = ValueError) -> dict:
    """``text`` parsed as a JSON object; else ``error`` "{what} is not valid JSON: ..." or
    "{what} must be a JSON object, got <type>"."""
    data = json_value(text, what, error)
    if not isinstance(data, dict):
        raise error(f"{what} must be a JSON object, got {type(data).__name__}")
    return data


def brief(value, limit: int = 120) -> str:
    """repr(value) for an error message, cut to ``limit`` characters with "..." when longer."""
    text = repr(value)
    return text if len(text) <= limit else text[:max(limit - 3, 1)] + "..."
