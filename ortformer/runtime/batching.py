"""Length-bucketed batching for Runtime.embed.

Sorting sequences by length and cutting the sorted list into batches of
`batch_size` keeps the padding per batch small: a batch pads to its own longest
member, so the wasted work is sum_b (B_b * max_len_b - sum_i len_i) tokens instead
of N * max_len for one big padded batch.
"""
from __future__ import annotations

import numpy as np


def length_batches(lengths: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Indices into `lengths`, grouped into batches of at most batch_size of similar length.

    A stable sort keeps equal-length sequences in input order, so results are deterministic.
    """
    order = np.argsort(lengths, kind="stable")
    return [order[start:start + batch_size] for start in range(0, len(order), batch_size)]


def pad(sequences: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad sequences of shape (len_i, *rest) with zeros to (B, max_len, *rest).

    Returns (padded, attention_mask) with mask[i, j] = 1 for j < len_i, else 0 (int64).
    Pad values are 0, a valid id: they only have to be in range, the mask removes them.
    """
    lengths = np.array([len(s) for s in sequences])
    first = sequences[0]
    padded = np.zeros((len(sequences), lengths.max(), *first.shape[1:]), dtype=first.dtype)
    for row, sequence in enumerate(sequences):  # one copy per sequence, not per token
        padded[row, : len(sequence)] = sequence
    mask = (np.arange(lengths.max())[None, :] < lengths[:, None]).astype(np.int64)  # (B, max_len)
    return padded, mask
