"""parity.passes: the max_abs bound is absolute up to an output scale of max_abs / max_rel and
relative to the scale past it; the cosine floor holds at every scale."""
import numpy as np
import pytest

from ortformer.parity import GATES, compare, passes

MASK = np.ones((2, 5), np.int64)


def outputs(scale: float, error: float) -> tuple[np.ndarray, np.ndarray]:
    """(got, want): want of largest magnitude ``scale``, got = want + ``error`` on one element."""
    want = np.random.default_rng(0).uniform(-1, 1, (2, 5, 16)).astype(np.float32)
    want *= scale / np.abs(want).max()
    got = want.copy()
    got[1, 2, 3] += error
    return got, want


@pytest.mark.parametrize("scale, error, ok", [
    (1.0, 9e-5, True), (1.0, 2e-4, False),  # unit scale: the absolute bound
    (10.0, 9e-5, True), (10.0, 1.1e-4, False),  # where the two bounds meet
    (300.0, 2e-4, True), (300.0, 2.9e-3, True), (300.0, 3.1e-3, False),  # 1e-5 of the scale
])
def test_float32_bound_is_absolute_then_relative(scale, error, ok):
    got, want = outputs(scale, error)
    assert passes(compare("last_hidden_state", got, want, MASK), GATES["float32"]) is ok


def test_cosine_floor_holds_at_any_scale_and_gates_without_a_relative_bound_stay_absolute():
    got, want = outputs(300.0, 0.0)
    got[0, 0] = -want[0, 0]  # one token reversed: max_abs 2 x its norm, far past both bounds
    assert not passes(compare("last_hidden_state", got, want, MASK), GATES["float32"])
    got, want = outputs(300.0, 2e-3)
    assert passes(compare("last_hidden_state", got, want, MASK), GATES["float32"])
    assert not passes(compare("last_hidden_state", got, want, MASK), {"max_abs": 1e-4, "min_cosine": 0.99999})
