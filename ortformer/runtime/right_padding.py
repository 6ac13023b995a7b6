"""Right-aligning rows for files whose attention takes key lengths (export padding="right").

Such a file's MultiHeadAttention receives one key length per row, (B,) int32, the mask form
onnxruntime's fused CUDA kernels accept (docs/gpu.md); a length says "keys 0..len-1 are kept",
so it is only true of a row whose kept tokens come first. Any other row (left padding, holes)
is right-aligned here before the call and put back after it:

  perm[b] = kept columns of row b in order, then its padded columns in order    (B, N)
  inputs:   x'[b, j] = x[b, perm[b, j]]             (every (B, N, ...) input)
  outputs:  y[b, perm[b, j]] = y'[b, j]             (every output with a sequence axis)

so a kept token keeps its column in the caller's arrays. What it computes is the row with its
kept tokens side by side from position 0: the same as the 2-D-mask graph for models whose
positions count kept tokens (position_ids="kept") or have none; for absolute positions
counted from column 0 ("index", sinusoidal) or relative ones over columns (rotary, alibi,
relative bias, windows), it is the row run alone, i.e. its kept tokens no longer depend on the
padding around them. numpy only (the runtime never imports torch).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .. import contract


def right_padded(mask: np.ndarray) -> bool:
    """Whether every row of a (B, N) 0/1 mask keeps a prefix: no kept token after a padded one."""
    return mask.shape[1] < 2 or bool((mask[:, 1:] <= mask[:, :-1]).all())


def alignment(mask: np.ndarray) -> np.ndarray | None:
    """perm (B, N) int64 as in the module docstring, or None when the mask is already right-padded."""
    if right_padded(mask):
        return None
    # a stable sort on "padded?" keeps both groups in column order
    return np.argsort(mask == 0, axis=1, kind="stable")


def _gather(array: np.ndarray, index: np.ndarray) -> np.ndarray:
    """array (B, N, ...) gathered along axis 1 by index (B, N)."""
    return np.take_along_axis(array, index.reshape(index.shape + (1,) * (array.ndim - 2)), axis=1)


def align_feeds(feeds: dict[str, np.ndarray], perm: np.ndarray) -> dict[str, np.ndarray]:
    """Every input with a sequence axis, (B, N) or (B, N, F), gathered along it by perm; others as given."""
    rows = feeds[contract.ATTENTION_MASK].shape
    return {name: _gather(array, perm) if array.ndim >= 2 and array.shape[:2] == rows else array  # task_id (B,)
            for name, array in feeds.items()}


def restore_outputs(outputs: dict[str, np.ndarray], perm: np.ndarray, sequence_outputs: set[str]) -> dict[str, np.ndarray]:
    """Outputs of an aligned call put back in the caller's columns: each name in sequence_outputs
    (B, N, ...) gathered by the inverse permutation (y[b, c] = y'[b, inverse[b, c]]); pooled
    outputs (B, S) as they are."""
    inverse = np.argsort(perm, axis=1)
    return {name: _gather(array, inverse) if name in sequence_outputs else array for name, array in outputs.items()}


def sequence_outputs(cfg) -> set[str]:
    """The outputs of a model with a sequence axis (per token), which restore_outputs puts back."""
    return {name for name, shape in contract.output_shapes(cfg).items()
            if len(shape) > 1 and shape[1] == contract.SEQUENCE_AXIS}


def run_aligned(run: Callable[[dict], dict], feeds: dict[str, np.ndarray], sequence_outputs: set[str]) -> dict:
    """run(feeds) (named arrays in, named arrays out) for a key-length file: rows that are not
    right-padded right-aligned first and the outputs in sequence_outputs put back after."""
    perm = alignment(feeds[contract.ATTENTION_MASK])
    if perm is None:
        return run(feeds)
    return restore_outputs(run(align_feeds(feeds, perm)), perm, sequence_outputs)
