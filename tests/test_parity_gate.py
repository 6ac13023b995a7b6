"""parity.passes: past the absolute max_abs bound, every vector must be within max_rel of its own
scale; the cosine floor holds at every scale."""
import numpy as np
import pytest

from ortformer.contract.parity import GATES, compare, passes

MASK = np.ones((2, 5), np.int64)


def outputs(scale: float, error: float) -> tuple[np.ndarray, np.ndarray]:
    """(got, want): every token vector of want of largest magnitude ``scale``, got = want + ``error``
    on one element."""
    want = np.random.default_rng(0).uniform(-1, 1, (2, 5, 16)) * scale
    want[..., 0] = scale
    want = want.astype(np.float32)
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


def test_one_large_vector_does_not_loosen_the_bound_on_the_others():
    got, want = outputs(1.0, 5e-4)  # the error sits on token (1, 2), of scale 1
    want[0, 0] *= 500.0  # another token 500 times larger
    got[0, 0] = want[0, 0]
    metrics = compare("last_hidden_state", got, want, MASK)
    assert metrics["max_rel"] == pytest.approx(5e-4, rel=1e-3)  # token (1, 2)'s own, not 5e-4 / 500
    assert not passes(metrics, GATES["float32"])
