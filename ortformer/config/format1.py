"""Config format 1: one flat object, each group's fields spelled at the top level with a prefix
(classifier_labels, conv_kernel_size, ...), as every model file written before format 2 holds it
in its metadata. Read here into format 2's nested groups; also the namespace of export's flags.
Works on plain dicts, so that config.py can call it. Torch-free."""
from __future__ import annotations

from typing import Any

from .groups import CLASSIFIER_POOLINGS, DENSE_ACTIVATIONS, checked_type
from ..core.errors import ConfigError

# flat name -> (group, field). The first name of each group is its switch: 0 = the group is off.
FLAT: dict[str, tuple[str, str]] = {
    "classifier_labels": ("classifier", "labels"),
    "classifier_per_token": ("classifier", "per_token"),
    "classifier_pooling": ("classifier", "pooling"),
    "classifier_dense": ("classifier", "dense"),
    "classifier_norm": ("classifier", "norm"),
    "classifier_pad_id": ("classifier", "pad_id"),
    "conv_kernel_size": ("convolution", "kernel_size"),
    "conv_groups": ("convolution", "groups"),
    "conv_activation": ("convolution", "activation"),
    "relative_attention_buckets": ("relative_attention", "buckets"),
    "relative_attention_max_distance": ("relative_attention", "max_distance"),
    "disentangled_buckets": ("disentangled", "buckets"),
    "disentangled_max_distance": ("disentangled", "max_distance"),
    "disentangled_projections": ("disentangled", "projections"),
    "disentangled_norm": ("disentangled", "norm"),
    "local_window": ("local_attention", "window"),
    "global_every": ("local_attention", "global_every"),
    "global_offset": ("local_attention", "global_offset"),
    "rotary_theta_local": ("local_attention", "rotary_theta"),
    "sentence_dense_size": ("sentence_dense", "size"),
    "sentence_dense_activation": ("sentence_dense", "activation"),
    "sentence_dense_bias": ("sentence_dense", "bias"),
    "token_dense_size": ("token_dense", "size"),
    "token_dense_bias": ("token_dense", "bias"),
}
# the value format 1 wrote for each flat name while its group was off
OFF: dict[str, Any] = {
    "classifier_labels": 0, "classifier_per_token": False, "classifier_pooling": "cls", "classifier_dense": "none",
    "classifier_norm": False, "classifier_pad_id": -1,
    "conv_kernel_size": 0, "conv_groups": 1, "conv_activation": "tanh",
    "relative_attention_buckets": 0, "relative_attention_max_distance": 128,
    "disentangled_buckets": 0, "disentangled_max_distance": 512, "disentangled_projections": "shared",
    "disentangled_norm": True,
    "local_window": 0, "global_every": 1, "global_offset": 0, "rotary_theta_local": 0.0,
    "sentence_dense_size": 0, "sentence_dense_activation": "identity", "sentence_dense_bias": True,
    "token_dense_size": 0, "token_dense_bias": False,
}
# fields the format-1 reader accepted, without effect, while their group was off: files holding them
# still load (the value is dropped); export's flags refuse them (strict)
HARMLESS_WHEN_OFF = frozenset({"relative_attention_max_distance", "disentangled_max_distance", "global_every",
                               "sentence_dense_activation", "sentence_dense_bias", "classifier_pooling"})
SWITCHES = {group: flat for flat, (group, field) in reversed(FLAT.items())}  # each group's first name
# the values format 1 took for those while they had no effect: a file of it holds nothing else
_VALID_WHEN_OFF = {
    "relative_attention_max_distance": (lambda v: v >= 1, ">= 1"),
    "disentangled_max_distance": (lambda v: v >= 0, ">= 0"),
    "global_every": (lambda v: v >= 1, ">= 1"),
    "sentence_dense_activation": (lambda v: v in DENSE_ACTIVATIONS, f"one of {', '.join(DENSE_ACTIVATIONS)}"),
    "classifier_pooling": (lambda v: v in CLASSIFIER_POOLINGS, f"one of {', '.join(CLASSIFIER_POOLINGS)}"),
}


def is_flat(data: dict) -> bool:
    """True when data spells a group's field the format-1 way."""
    return any(name in FLAT for name in data)


def from_flat(data: dict, strict: bool = False) -> dict:
    """data (format 1, without its "format" key) as a format-2 dict: each group an object of its
    fields, or None where its switch is 0. A field set while its group is off is refused (strict),
    or, for the fields format 1 itself let pass, dropped."""
    nested = sorted(set(data) & set(SWITCHES))
    if nested:  # one layout per object: a group both ways would leave one of them unread
        flat = sorted(name for name in data if name in FLAT)
        raise ConfigError(f"the config mixes format 1's flat {flat or 'layout'} with format 2's group(s) {nested}: "
                          f"write it in one format (format 2: {hint(flat) or 'each group an object'})")
    out = {k: v for k, v in data.items() if k not in FLAT}
    for group, switch in SWITCHES.items():
        names = [flat for flat, (g, _) in FLAT.items() if g == group]
        if switch in data and data[switch]:
            out[group] = {FLAT[flat][1]: data[flat] for flat in names if flat in data}  # the group checks them
            if group == "local_attention" and data.get("global_every", OFF["global_every"]) == 1:
                raise ConfigError(f"local_window={data[switch]} with global_every=1 makes every layer global: set "
                                  "global_every >= 2 (layer l is global when l % global_every == global_offset)")
            continue
        for flat in names:  # an off group's fields still hold their type: False is not 0, nor 1 True
            if flat in data:
                checked_type(flat, data[flat], type(OFF[flat]))
        stray = [flat for flat in names[1:] if flat in data and data[flat] != OFF[flat]
                 and (strict or flat not in HARMLESS_WHEN_OFF)]
        if stray:
            raise ConfigError(f"{', '.join(stray)} shape{'s' if len(stray) == 1 else ''} {group}; with {switch}=0 "
                              f"there is none: set {switch}, or leave {'it' if len(stray) == 1 else 'them'} at "
                              "the default")
        for flat in names:
            valid, what = _VALID_WHEN_OFF.get(flat, (None, ""))
            if flat in data and valid and not valid(data[flat]):
                raise ConfigError(f"{flat}={data[flat]!r} is not valid; it must be {what}")
        out[group] = None
    return out



def to_flat(data: dict) -> dict:
    """A format-2 dict (groups as dicts or None, no "format" key) in format 1's flat names."""
    out = {k: v for k, v in data.items() if k not in SWITCHES}
    for flat, (group, field) in FLAT.items():
        values = data.get(group)
        out[flat] = values[field] if values else OFF[flat]
    return out


def merge_flat(base: dict, data: dict, strict: bool = False) -> dict:
    """data's flat fields over base (format 2, no "format" key), as a format-2 dict, read as
    from_flat reads them. A switch that data sets to 0 turns its group off with every field base
    had in it; data's own fields of a group it turns off are still refused as from_flat refuses them."""
    flat = to_flat(base)
    for group, switch in SWITCHES.items():
        if switch in data and not data[switch]:
            flat.update({name: OFF[name] for name, (g, _) in FLAT.items() if g == group})
    return from_flat({**flat, **data}, strict)


def hint(names) -> str:
    """Where format 2 keeps each flat name of ``names`` ("local_window is local_attention.window"), for messages."""
    return "; ".join(f"{name} is {'.'.join(FLAT[name])}" for name in names if name in FLAT)


def dropped_when_off(data: dict) -> list[str]:
    """The flat fields from_flat drops from data: those format 1 let pass while their group is off."""
    return [name for name in data if name in HARMLESS_WHEN_OFF and data[name] != OFF[name]
            and not data.get(SWITCHES[FLAT[name][0]], 0)]
