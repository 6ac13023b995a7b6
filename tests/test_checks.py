"""check_int: the one strict integer check behind every count, size and index argument."""
import numpy as np
import pytest

from ortformer.core.checks import check_int
from ortformer.core.errors import InputError, ProviderError


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


def test_is_int_takes_integers_never_bools():
    import numpy as np

    from ortformer.core.checks import is_int

    assert is_int(3) and is_int(np.int64(3)) and is_int(-1)
    assert not any(is_int(v) for v in (True, False, 3.0, "3", None, [3]))


def test_json_object_names_what_and_raises_the_callers_error():
    from ortformer.core.checks import json_object
    from ortformer.core.errors import ConfigError

    assert json_object('{"a": 1}', "x") == {"a": 1} and json_object(b'{"a": 1}', "x") == {"a": 1}
    for text, message in (("{not json", "body is not valid JSON"), ("[1, 2]", "body must be a JSON object, got list"),
                          ("[" * 100_000, "body is not valid JSON"), (None, "body is not valid JSON")):
        with pytest.raises(ConfigError, match=message):
            json_object(text, "body", ConfigError)
    with pytest.raises(ValueError, match="x must be a JSON object, got int"):
        json_object("3", "x")


def test_one_guard_names_the_extra_and_the_missing_module(monkeypatch):
    import json as present

    from ortformer.core.errors import MissingExtraError, require

    assert require("a feature", "text", "json") is present
    monkeypatch.setitem(__import__("sys").modules, "absent_module", None)
    with pytest.raises(MissingExtraError, match=r"a feature needs the 'serve' extra \(absent_module is not installed\)"):
        require("a feature", "serve", "json", "absent_module")


def test_no_module_guards_an_optional_import_by_hand():
    import ast
    from pathlib import Path

    import ortformer

    root = Path(ortformer.__file__).parent
    raising = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ExceptHandler) and getattr(node.type, "id", None) == "ImportError":
                if any(isinstance(n, ast.Raise) and "MissingExtraError" in ast.unparse(n) for n in ast.walk(node)):
                    raising.append(f"{path.relative_to(root)}:{node.lineno}")
    assert [r.split(":")[0] for r in raising] == ["core/errors.py"], raising
