"""Input validation before onnxruntime sees anything (numpy only, vectorised).

Why our own checks: onnxruntime's CUDA Gather silently returns zeros for an
out-of-range id, a learned position table past max_positions reads garbage or
fails deep inside a kernel, and a mask value of 2 or a NaN feature flows through
as a plausible-looking embedding. Every check here raises InputError naming the
input, what was given and what is valid.

Shapes (B = batch, N = sequence, F = hidden_size):
  input_ids      int64   (B, N), values in [0, vocab_size)
  inputs_embeds  float   (B, N, F), finite           (models with vocab_size = 0)
  attention_mask int64   (B, N), values in {0, 1}    (default: all ones)
  token_type_ids int64   (B, N), values in [0, type_vocab_size) (default: zeros)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .. import contract
from ..config import EncoderConfig
from ..core.errors import InputError

ALL_INPUTS = (contract.INPUT_IDS, contract.INPUTS_EMBEDS, contract.ATTENTION_MASK, contract.TOKEN_TYPE_IDS,
              contract.TASK_ID)


@dataclass(frozen=True)
class InputSpec:
    """What one model accepts: its config, graph input names and the float dtype of inputs_embeds."""

    config: EncoderConfig
    names: tuple[str, ...]
    embeds_dtype: np.dtype = np.dtype(np.float32)

    @property
    def main(self) -> str:
        return contract.INPUT_IDS if self.config.takes_ids else contract.INPUTS_EMBEDS


def as_array(name: str, value: Any) -> np.ndarray:
    """numpy arrays pass through; nested lists become arrays, ragged ones are refused."""
    if isinstance(value, np.ndarray):
        return value
    try:
        array = np.asarray(value)
    except (ValueError, TypeError):  # numpy >= 1.24 refuses ragged nesting with ValueError
        raise InputError(
            f"{name} is ragged (rows of different lengths or depths) or not numeric; "
            "give a rectangular array: pad rows to one length and pass attention_mask"
        ) from None
    if array.dtype.kind in "US":  # embed(["hello"]), run(input_ids="hello")
        raise InputError(f"{name} holds text, not numbers; token ids come from a tokenizer: use embed_texts(...) "
                         "(infer --text) with a model exported with its tokenizer, or tokenize first")
    if array.dtype == object:
        raise InputError(f"{name} is ragged or holds non-numbers (or integers beyond int64); give a rectangular numeric array")
    return array


def _ints(name: str, array: np.ndarray, allow_bool: bool = False) -> np.ndarray:
    kind = array.dtype.kind
    ok = (kind in "iu" and np.can_cast(array.dtype, np.int64, "safe")) or (allow_bool and kind == "b")
    if not ok:
        valid = "an integer dtype that fits int64 (int8-int64, uint8-uint32)" + (" or bool" if allow_bool else "")
        raise InputError(f"{name} has dtype {array.dtype}; valid: {valid}, which is cast to int64")
    return array.astype(np.int64, copy=False)


def _check_values(name: str, array: np.ndarray, bad: np.ndarray, valid: str) -> None:
    """Raise if any element is flagged in `bad`, naming the first one and the count."""
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        raise InputError(
            f"{name}{list(index)} = {array[index].item()!r} is not valid ({int(bad.sum())} bad value(s)); valid: {valid}"
        )


def _check_ids(name: str, array: np.ndarray, size: int, what: str) -> None:
    _check_values(name, array, (array < 0) | (array >= size), f"integers in [0, {size}) ({what}={size})")


def check_inputs(spec: InputSpec, given: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Validate named inputs (None = not given) and return the graph feeds, defaults filled in."""
    cfg = spec.config
    given = {name: value for name, value in given.items() if value is not None}
    for name in given:
        if name not in ALL_INPUTS:
            raise InputError(f"unknown input {name!r}; this model takes {list(spec.names)}")
        if name not in spec.names:
            raise InputError(f"this model has no {name} input ({_why_absent(cfg, name)}); it takes {list(spec.names)}")
    if spec.main not in given:
        raise InputError(f"{spec.main} is required; this model takes {list(spec.names)}")

    main = as_array(spec.main, given[spec.main])
    rank = 2 if cfg.takes_ids else 3
    # zero rows of a real length is an empty batch (a service's empty queue): answered with zero rows
    if main.size == 0 and not (main.ndim == rank and main.shape[0] == 0 and all(main.shape[1:])):
        raise InputError(f"{spec.main} is empty (shape {main.shape}); give at least one token per sequence")
    if main.ndim != rank:
        layout = "[batch, sequence]" if cfg.takes_ids else f"[batch, sequence, {cfg.hidden_size}]"
        raise InputError(f"{spec.main} must be {rank}-D {layout}, got shape {main.shape} (wrap a single sequence in a list)")
    batch, length = main.shape[:2]
    if length > cfg.max_sequence:
        raise InputError(f"{spec.main} has sequence length {length}; valid lengths are 1..{cfg.max_sequence} "
                         f"(max_positions={cfg.max_positions} less position_offset={cfg.position_offset})")

    feeds = {}
    if cfg.takes_ids:
        ids = _ints(spec.main, main)
        _check_ids(spec.main, ids, cfg.vocab_size, "vocab_size")
        feeds[spec.main] = ids
    else:
        if main.dtype.kind != "f":
            raise InputError(f"{spec.main} has dtype {main.dtype}; valid: a floating dtype, cast to {spec.embeds_dtype}")
        if main.shape[2] != cfg.hidden_size:
            raise InputError(f"{spec.main} has feature size {main.shape[2]}; valid: {cfg.hidden_size} (hidden_size)")
        with np.errstate(over="ignore"):  # an overflow becomes inf, refused just below
            embeds = main.astype(spec.embeds_dtype, copy=False)
        # checked after the cast: a float64 1e300 becomes inf in float32
        _check_values(spec.main, embeds, ~np.isfinite(embeds), "finite numbers (no NaN or Inf)")
        feeds[spec.main] = embeds

    def companion(name: str, default) -> np.ndarray:
        if name not in given:
            return np.full((batch, length), default, dtype=np.int64)
        array = as_array(name, given[name])
        if array.shape != (batch, length):
            raise InputError(f"{name} has shape {array.shape}; valid: {(batch, length)}, the [batch, sequence] of {spec.main}")
        return _ints(name, array, allow_bool=name == contract.ATTENTION_MASK)

    mask = companion(contract.ATTENTION_MASK, 1)
    _check_values(contract.ATTENTION_MASK, mask, (mask != 0) & (mask != 1), "0 (padding) or 1 (keep)")
    feeds[contract.ATTENTION_MASK] = mask
    if contract.TOKEN_TYPE_IDS in spec.names:
        types = companion(contract.TOKEN_TYPE_IDS, 0)
        _check_ids(contract.TOKEN_TYPE_IDS, types, cfg.type_vocab_size, "type_vocab_size")
        feeds[contract.TOKEN_TYPE_IDS] = types
    if contract.TASK_ID in spec.names:
        feeds[contract.TASK_ID] = task_ids(cfg, given.get(contract.TASK_ID), batch)
    # onnxruntime copies non-contiguous arrays anyway; doing it here keeps IO binding simple
    return {name: np.ascontiguousarray(array) for name, array in feeds.items()}


def task_ids(cfg: EncoderConfig, value: Any, batch: int) -> np.ndarray:
    """task_id (batch,) int64 from None (the default task), a task name or index for every row, or
    one name or index per row; InputError naming the valid tasks otherwise."""
    tasks = cfg.adapters.tasks
    valid = f"a task of {list(tasks)} or its index 0..{len(tasks) - 1}, for every row or one per row"
    if value is None:
        value = cfg.adapters.default
    if isinstance(value, (str, int, np.integer)) and not isinstance(value, bool):
        value = [value] * batch
    rows = list(value) if isinstance(value, (list, tuple, np.ndarray)) else None
    if rows is None or len(rows) != batch:
        raise InputError(f"task {value!r} is not valid for a batch of {batch}; valid: {valid}")
    ids = []
    for row in rows:
        if isinstance(row, str) and row in tasks:
            ids.append(tasks.index(row))
        elif isinstance(row, (int, np.integer)) and not isinstance(row, bool) and 0 <= row < len(tasks):
            ids.append(int(row))
        else:
            raise InputError(f"task {row!r} is not valid; valid: {valid}")
    return np.asarray(ids, dtype=np.int64)


def _why_absent(cfg: EncoderConfig, name: str) -> str:
    if name == contract.TASK_ID:
        return "it has no task adapters"
    if name == contract.TOKEN_TYPE_IDS:
        return "type_vocab_size=0"
    if name == contract.INPUT_IDS:
        return "vocab_size=0: it takes float features as inputs_embeds"
    return f"vocab_size={cfg.vocab_size}: it takes token ids as input_ids"
