"""check_int: the one strict integer check behind every count, size and index argument."""
import numpy as np
import pytest

from ortformer.checks import check_int
from ortformer.errors import InputError, ProviderError


@pytest.mark.parametrize("value", [1, 7, np.int64(3), 2**40])
def test_integers_in_range_pass_as_int(value):
    result = check_int("n", value)
    assert result == value and type(result) is int


@pytest.mark.parametrize("value", [0, -1, True, False, 1.0, "3", None, [1], np.float32(2)])
def test_everything_else_is_refused_with_the_valid_range(value):
    with pytest.raises(InputError, match=r"^n=.* must be an int >= 1$"):
        check_int("n", value)


def test_bounds_error_class_and_reason():
    assert check_int("device_id", 0, low=0, error=ProviderError) == 0
    with pytest.raises(ProviderError, match=r"device_id=-1 must be an int >= 0"):
        check_int("device_id", -1, low=0, error=ProviderError)
    assert check_int("length", 64, high=64) == 64
    with pytest.raises(InputError, match=r"^length=65 must be an int in \[1, 64\] \(the model's max_positions\)$"):
        check_int("length", 65, high=64, why=" (the model's max_positions)")
