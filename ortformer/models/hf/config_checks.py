"""Checks of config.json values shared by the family modules: required sizes, refused
settings, the rope theta, and the EncoderConfig (and its optional groups) they build."""
from __future__ import annotations

from typing import TypeVar

from ...core.checks import brief
from ...config import EncoderConfig
from ...core.errors import CheckpointError, ConfigError

Group = TypeVar("Group")


def make_config(what: str, **fields) -> EncoderConfig:
    """EncoderConfig(**fields), a CheckpointError when the folder describes one ortformer cannot build."""
    try:
        return EncoderConfig(**fields)
    except ConfigError as exc:
        raise _cannot_build(what, exc) from None


def make_group(what: str, group: type[Group], **fields) -> Group:
    """An EncoderConfig group (config_groups: Convolution, LocalAttention, ...) from config.json's values,
    a CheckpointError as make_config's when the group refuses them: a group checks its own fields when it
    is built, which is before make_config sees it."""
    try:
        return group(**fields)
    except ConfigError as exc:
        raise _cannot_build(what, exc) from None


def _cannot_build(what: str, exc: ConfigError) -> CheckpointError:
    return CheckpointError(f"{what} config.json describes an encoder ortformer cannot build: {exc}")


def require(hf: dict, what: str, keys: tuple[str, ...]) -> None:
    """CheckpointError unless config.json holds every key of ``keys`` as an int >= 1 (sizes, counts)."""
    missing = [key for key in keys if key not in hf]
    if missing:
        raise CheckpointError(f"{what} config.json lacks {', '.join(missing)}")
    bad = [f"{key}={hf[key]!r}" for key in keys if isinstance(hf[key], bool) or not isinstance(hf[key], int) or hf[key] < 1]
    if bad:
        raise CheckpointError(f"{what} config.json {', '.join(bad)}: sizes and counts must be ints >= 1")


def refuse(hf: dict, key: str, supported: tuple, default=None, what: str = "") -> None:
    """CheckpointError unless hf[key] (default when absent) is one of ``supported``."""
    value = hf.get(key, default)
    if value not in supported:
        names = ", ".join("null (or no such key)" if v is None else repr(v) for v in supported)
        raise CheckpointError(f"{what}config.json {key}={value!r} is not supported; ortformer implements {names}")


def rope_theta(hf: dict, default: float, what: str) -> float:
    """The theta of config.json's rope_parameters (one entry for every layer), else of its older
    rope_theta key, else ``default``: default_rope_theta's checks."""
    params = hf.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise CheckpointError(f"{what}config.json rope_parameters={brief(params, 80)} is not supported")
    return default_rope_theta(params, hf.get("rope_theta", default), what)


def default_rope_theta(rope: dict, fallback: float, what: str, where: str = "rope_parameters") -> float:
    """The theta of config.json's ``where`` (a rope_parameters entry; ``fallback`` when it has
    none), CheckpointError unless it describes the default rope over the whole head."""
    refuse(rope, "rope_type", ("default",), "default", f"{what}{where} in ")
    extra = sorted(set(rope) - {"rope_type", "rope_theta", "partial_rotary_factor"})
    if extra or rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise CheckpointError(f"{what}config.json {where} sets {', '.join(extra) or 'partial_rotary_factor'}; "
                              "ortformer implements the default rope over the whole head (rope_type and rope_theta)")
    theta = rope.get("rope_theta", fallback)
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
        raise CheckpointError(f"{what}config.json rope_theta={theta!r} is not supported; it must be a number > 0")
    return float(theta)
