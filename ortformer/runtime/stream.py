"""Runtime.stream: a causal linear-family model as an RNN over chunks of any size.

State per layer: T = sum_{j seen} fk_j^T [v_j, 1] of shape (B, H, Dk, D + 1) (models/
linear_forms.py); token i of a chunk reads [num, den] = fq_i (T + the chunk's keys up to i)
and outputs num / (den + eps). Memory holds the state and one chunk, however long the
stream; the outputs, concatenated, equal one causal run over the whole sequence.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator

import numpy as np

from .. import contract
from ..core.errors import InputError
from .validate import InputSpec, as_array, check_inputs


def stream(runtime, chunks: Iterable[Any]) -> Iterator[np.ndarray]:
    """Yield last_hidden_state for each chunk: (C, F) for one sequence's chunk (token ids
    (C,) or features (C, F)), (B, C, F) for a batch of rows streamed together."""
    cfg = runtime.config
    runner = runtime.chunk_runner()
    if runner is None or runner.payload.mode != "step":
        raise InputError(f"{runtime.path} cannot stream: streaming needs a causal linear or cosine model "
                         f"exported with its step stage (this one: attention={cfg.attention!r}, causal={cfg.causal})")
    if isinstance(chunks, (str, bytes)) or not hasattr(chunks, "__iter__"):
        raise InputError(f"chunks must be an iterable of token-id or feature chunks, got {type(chunks).__name__}")
    # each chunk is checked like a run() input, except that only the learned position
    # table bounds the stream's total length
    # token_type_ids, where the model has them, default to 0 as in run()
    spec = InputSpec(cfg.replace(max_positions=2**62), runtime._spec.names,
                     runtime._spec.embeds_dtype)
    single_rank = 1 if cfg.takes_ids else 2
    states, start, batch = None, 0, None
    for index, chunk in enumerate(chunks):
        array = as_array(f"chunk {index}", chunk)
        single = array.ndim == single_rank
        rows = array[None] if single else array
        if rows.ndim >= 2 and rows.shape[1] == 0:
            yield np.empty((*rows.shape[:1], 0, cfg.hidden_size), np.float32)[0 if single else slice(None)]
            continue
        try:
            feeds = check_inputs(spec, {runtime.main_input: rows})
        except InputError as exc:
            raise InputError(f"chunk {index}: {exc}") from None
        b, n = feeds[contract.ATTENTION_MASK].shape
        if batch is not None and b != batch:
            raise InputError(f"chunk {index} has {b} rows; every chunk of a stream has the first chunk's {batch}")
        if cfg.positions == "learned" and start + n > cfg.max_positions:
            raise InputError(f"chunk {index} reaches position {start + n}; the learned position table has "
                             f"{cfg.max_positions} rows (max_positions)")
        if states is None:
            batch, states = b, runner.initial_states(b)
        feeds["start"] = np.array(start, np.int64)
        hidden, states = runner.step(feeds, states)
        if not np.isfinite(hidden).all():
            raise InputError(f"chunk {index}: the model produced non-finite values; nothing was returned")
        start += n
        yield hidden[0] if single else hidden
