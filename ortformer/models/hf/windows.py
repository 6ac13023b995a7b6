"""Layer patterns of sliding-window models (ModernBERT, Gemma 2 / 3, UltraBERT, Mistral, Qwen2 / 3): which
layers attend globally, and the rotary theta of each layer kind.

ortformer expresses a pattern as "layer l is global when l % global_every == global_offset,
sliding otherwise"; config.json lists it as ``layer_types`` (or a period the family defines).
"""
from __future__ import annotations

from ...core.checks import brief
from ...config import LocalAttention
from ...core.errors import CheckpointError
from .config_checks import default_rope_theta, make_group, refuse

FULL, SLIDING = "full_attention", "sliding_attention"


def check_layer_types(kinds, layers: int, what: str) -> list[str]:
    """config.json's layer_types, checked to name a known kind for each of ``layers`` layers."""
    if not isinstance(kinds, list) or len(kinds) != layers or not set(kinds) <= {FULL, SLIDING}:
        raise CheckpointError(f"{what}config.json layer_types={brief(kinds, 120)} is not supported; it must list "
                              f"{FULL!r} or {SLIDING!r} for each of the {layers} layers")
    return kinds


def global_period(kinds: list[str], what: str, source: str | None = "layer_types") -> tuple[int, int]:
    """(global_every, global_offset) that give ``kinds`` (layer l global when
    l % global_every == global_offset); (1, 0) when every layer is global. A pattern that no
    period gives is refused, naming config.json's ``source`` key."""
    layers = len(kinds)
    full = [l for l, kind in enumerate(kinds) if kind == FULL]
    if len(full) == layers:
        return 1, 0
    if not full:  # no global layer: an offset past the last layer
        every, offset = layers + 1, layers
    elif len(full) == 1:  # any period that puts the next global layer past the end
        every, offset = max(full[0] + 1, layers - full[0], 2), full[0]
    else:
        every, offset = full[1] - full[0], full[0]
    if offset >= every or kinds != [FULL if l % every == offset else SLIDING for l in range(layers)]:
        raise CheckpointError(f"{what}config.json {source or 'layer pattern'} gives layers {brief(kinds, 160)}, which is not "
                              "supported; ortformer implements a global layer every k layers (l % k == offset) and "
                              "sliding layers between them")
    return every, offset


def pattern_fields(window: int, every: int, offset: int, thetas: dict[str, float], what: str) -> dict:
    """The EncoderConfig fields of a layer pattern: rotary_theta, the full layers' theta, and the
    local_attention group of the window ``window`` with the sliding layers' theta; None when every layer
    is global (``window`` 0, which global_period gives as every = 1, offset = 0)."""
    local = None
    if window:
        local = make_group(what.strip(), LocalAttention, window=window, global_every=every, global_offset=offset,
                           rotary_theta=thetas[SLIDING])
    return {"rotary_theta": thetas[FULL], "local_attention": local}


def causal_pattern(kinds: list[str], window: int | None, longest: int, thetas: dict[str, float],
                   what: str) -> tuple[dict, int]:
    """(EncoderConfig fields, the longest sequence) of a decoder whose ``kinds`` layers slide with the causal
    window w = ``window`` (token i sees i - w < j <= i: a local_attention window of 2w - 1 under causal attention).

    No sliding layer, or a window that cannot act within ``longest`` tokens where both kinds rotate
    alike, gives full layers (kinds that rotate otherwise keep the pattern, the window idle). A
    pattern no period gives (e.g. Qwen2's full layers below max_window_layers, sliding ones above) keeps
    every layer full and caps the longest sequence at w, where the window never acts: exact, when both
    kinds rotate alike (CheckpointError otherwise)."""
    idle = window is not None and window >= longest  # the window never acts: only the thetas can tell kinds apart
    if window is None or SLIDING not in kinds or (idle and thetas[FULL] == thetas[SLIDING]):
        return pattern_fields(0, 1, 0, thetas, what), longest
    try:
        every, offset = global_period(kinds, what)
    except CheckpointError:
        if thetas[FULL] != thetas[SLIDING]:
            raise
        return pattern_fields(0, 1, 0, thetas, what), window
    return pattern_fields(2 * window - 1, every, offset, thetas, what), longest


def rope_thetas(hf: dict, defaults: dict[str, tuple[str | None, float]], what: str) -> dict[str, float]:
    """The rotary theta of each layer kind, from rope_parameters ({kind: {...}}) or, in older
    configs, the key ``defaults[kind][0]`` (``defaults[kind][1]`` when that key is None or absent
    from config.json)."""
    refuse(hf, "rope_scaling", (None,), None, what)
    params = hf.get("rope_parameters") or {}
    if not isinstance(params, dict) or not set(params) <= {FULL, SLIDING}:
        raise CheckpointError(f"{what}config.json rope_parameters={brief(params, 120)} is not supported; "
                              f"ortformer reads one entry per layer kind ({FULL!r}, {SLIDING!r})")
    thetas = {}
    for kind, (old_key, default) in defaults.items():
        rope = params.get(kind) or {}
        if not isinstance(rope, dict):
            raise CheckpointError(f"{what}config.json rope_parameters[{kind!r}]={brief(rope, 80)} is not supported")
        fallback = hf.get(old_key, default) if old_key else default
        thetas[kind] = default_rope_theta(rope, fallback, what, f"rope_parameters[{kind!r}]")
    return thetas
