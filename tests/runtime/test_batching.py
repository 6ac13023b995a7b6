"""Length-sorted batching: every index once, similar lengths together, budgets kept."""
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ortformer.runtime.batching import length_batches, pad


@given(st.lists(st.integers(1, 300), min_size=0, max_size=60), st.integers(1, 40),
       st.one_of(st.none(), st.integers(1, 2000)))
def test_batches_cover_every_index_once_within_budget(lengths, batch_size, max_tokens):
    lengths = np.array(lengths, dtype=np.int64)
    batches = length_batches(lengths, batch_size, max_tokens)
    flat = np.concatenate(batches) if batches else np.array([], np.int64)
    assert sorted(flat.tolist()) == list(range(len(lengths)))
    assert all(1 <= len(b) <= batch_size for b in batches)
    if max_tokens is not None:
        # over budget only when one sequence is longer than the budget by itself
        assert all(len(b) * lengths[b].max() <= max_tokens or len(b) == 1 for b in batches)
        # greedy: the next sequence would not have fitted (or the batch was full)
        for b, following in pairwise(batches):
            grown = len(b) + 1
            assert grown > batch_size or grown * lengths[following[0]] > max_tokens
    # sorted: batch b's longest is no longer than batch b+1's shortest
    for b, following in pairwise(batches):
        assert lengths[b].max() <= lengths[following].min()


def test_budget_splits_long_from_short():
    lengths = np.array([100, 3, 3, 3, 3, 50])
    batches = length_batches(lengths, batch_size=32, max_tokens=250)
    assert [b.tolist() for b in batches] == [[1, 2, 3, 4, 5], [0]]  # 6 x 100 > 250
    assert [b.tolist() for b in length_batches(lengths, batch_size=32)] == [[1, 2, 3, 4, 5, 0]]


def test_stable_order_for_equal_lengths():
    assert [b.tolist() for b in length_batches(np.array([2, 2, 2, 2]), 3, max_tokens=100)] == [[0, 1, 2], [3]]


@pytest.mark.parametrize("rest", [(), (3,)])
def test_pad_right_pads_with_mask(rest):
    sequences = [np.ones((n, *rest), np.float32) * n for n in (2, 4, 1)]
    padded, mask = pad(sequences)
    assert padded.shape == (3, 4, *rest) and mask.dtype == np.int64
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert (padded[mask == 0] == 0).all() and (padded[0, :2] == 2).all()


def test_a_huge_batch_size_does_not_widen_the_search(monkeypatch):
    """Each batch considers at most max_tokens // (its shortest length) candidates, not
    batch_size of them: otherwise a huge batch_size makes the grouping quadratic."""
    from ortformer.runtime import batching

    widths = []

    class CountingNumpy:  # numpy for the batching module alone: numpy itself stays untouched
        def __getattr__(self, name):
            return getattr(np, name)

        @staticmethod
        def arange(start, stop, *rest):
            widths.append(stop - start)
            return np.arange(start, stop, *rest)

    monkeypatch.setattr(batching, "np", CountingNumpy())
    batches = length_batches(np.full(2_000, 50), batch_size=1_000_000, max_tokens=500)
    assert len(batches) == 200 and all(len(b) == 10 for b in batches)
    assert max(widths) <= 10
