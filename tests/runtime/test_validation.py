"""Every InputError path, and that the session still answers correctly after each bad call."""
import numpy as np
import pytest

from ortformer import contract
from ortformer.core.errors import InputError
from ortformer.runtime import Runtime

GOOD_IDS = [[5, 6, 7, 8], [9, 10, 11, 12]]
ok_mask = np.ones((2, 4), np.int64)

TOKEN_CASES = {
    "unknown keyword": (dict(input_ids=GOOD_IDS, position_ids=GOOD_IDS), ["unknown input", "position_ids", "input_ids"]),
    "embeds to an id model": (dict(inputs_embeds=np.zeros((1, 2, 32))), ["no inputs_embeds input", "vocab_size=100"]),
    "missing ids": (dict(attention_mask=ok_mask), ["input_ids is required"]),
    "float ids": (dict(input_ids=[[1.0, 2.0]]), ["input_ids has dtype float64", "integer dtype"]),
    "bool ids": (dict(input_ids=np.ones((1, 2), bool)), ["input_ids has dtype bool"]),
    "string ids": (dict(input_ids=[["a", "b"]]), ["input_ids holds text", "embed_texts"]),
    "a text as ids": (dict(input_ids="hello"), ["input_ids holds text", "embed_texts"]),
    "uint64 ids": (dict(input_ids=np.ones((1, 2), np.uint64)), ["input_ids has dtype uint64", "fits int64"]),
    "rank 1": (dict(input_ids=[1, 2, 3]), ["input_ids must be 2-D", "got shape (3,)"]),
    "rank 3": (dict(input_ids=np.ones((1, 2, 3), np.int64)), ["input_ids must be 2-D"]),
    "empty list": (dict(input_ids=[]), ["input_ids is empty"]),
    "zero length": (dict(input_ids=np.zeros((2, 0), np.int64)), ["input_ids is empty", "(2, 0)"]),
    "ragged": (dict(input_ids=[[1, 2, 3], [4]]), ["input_ids is ragged", "attention_mask"]),
    "beyond int64": (dict(input_ids=[[1, 2**70]]), ["input_ids", "non-numbers"]),
    "id = vocab": (dict(input_ids=[[1, 2, 3], [4, 100, 6]]), ["input_ids[1, 1] = 100", "[0, 100)", "vocab_size=100"]),
    "negative id": (dict(input_ids=[[-1, 2]]), ["input_ids[0, 0] = -1", "[0, 100)"]),
    "too long": (dict(input_ids=np.ones((1, 65), np.int64)), ["sequence length 65", "1..64", "max_positions"]),
    "mask batch": (dict(input_ids=GOOD_IDS, attention_mask=np.ones((1, 4))), ["attention_mask has shape (1, 4)", "(2, 4)"]),
    "mask length": (dict(input_ids=GOOD_IDS, attention_mask=np.ones((2, 3), np.int64)), ["attention_mask has shape (2, 3)"]),
    "mask value 2": (dict(input_ids=GOOD_IDS, attention_mask=[[1, 1, 1, 1], [1, 2, 1, 1]]), ["attention_mask[1, 1] = 2", "0 (padding) or 1 (keep)"]),
    "mask value -1": (dict(input_ids=GOOD_IDS, attention_mask=[[1, 1, 1, -1], [1, 1, 1, 1]]), ["attention_mask[0, 3] = -1"]),
    "float mask": (dict(input_ids=GOOD_IDS, attention_mask=ok_mask.astype(np.float32)), ["attention_mask has dtype float32"]),
    "type = type_vocab": (dict(input_ids=GOOD_IDS, token_type_ids=[[0, 0, 0, 2], [0, 0, 0, 0]]), ["token_type_ids[0, 3] = 2", "[0, 2)", "type_vocab_size=2"]),
    "types shape": (dict(input_ids=GOOD_IDS, token_type_ids=[[0, 0]]), ["token_type_ids has shape (1, 2)"]),
    "float types": (dict(input_ids=GOOD_IDS, token_type_ids=ok_mask * 0.0), ["token_type_ids has dtype float64"]),
}

FEATURE_CASES = {
    "integer features": (dict(inputs_embeds=np.ones((1, 2, 32), np.int64)), ["inputs_embeds has dtype int64", "floating"]),
    "NaN": (dict(inputs_embeds=np.where(np.arange(32) == 5, np.nan, 0.0)[None, None].repeat(2, 1)), ["inputs_embeds[0, 0, 5] = nan", "finite"]),
    "Inf": (dict(inputs_embeds=np.full((1, 2, 32), np.inf, np.float32)), ["inputs_embeds[0, 0, 0] = inf", "64 bad value"]),
    "overflows float32": (dict(inputs_embeds=np.full((1, 1, 32), 1e300)), ["inputs_embeds", "finite"]),
    "feature size": (dict(inputs_embeds=np.zeros((1, 2, 31), np.float32)), ["feature size 31", "32 (hidden_size)"]),
    "rank 2": (dict(inputs_embeds=np.zeros((2, 32), np.float32)), ["inputs_embeds must be 3-D", "[batch, sequence, 32]"]),
    "ids to a feature model": (dict(input_ids=GOOD_IDS), ["no input_ids input", "vocab_size=0"]),
    "types to a feature model": (dict(inputs_embeds=np.zeros((1, 2, 32), np.float32), token_type_ids=[[0, 0]]), ["no token_type_ids input", "type_vocab_size=0"]),
    "too long": (dict(inputs_embeds=np.zeros((1, 65, 32), np.float32)), ["sequence length 65", "max_positions"]),
}


def check_refused_then_healthy(rt, kwargs, fragments, good):
    with pytest.raises(InputError) as info:
        rt.run(**kwargs)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)
    inputs, want = good
    got = rt.run(**inputs)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


@pytest.fixture(scope="module")
def tokens_good(tokens_rt):
    inputs = {"input_ids": GOOD_IDS}
    return inputs, tokens_rt.run(**inputs)


@pytest.fixture(scope="module")
def features_good(features_rt):
    inputs = {"inputs_embeds": np.random.default_rng(0).standard_normal((2, 3, 32)).astype(np.float32)}
    return inputs, features_rt.run(**inputs)


@pytest.mark.parametrize("case", list(TOKEN_CASES))
def test_token_model_refuses(tokens_rt, tokens_good, case):
    kwargs, fragments = TOKEN_CASES[case]
    check_refused_then_healthy(tokens_rt, kwargs, fragments, tokens_good)


@pytest.mark.parametrize("case", list(FEATURE_CASES))
def test_feature_model_refuses(features_rt, features_good, case):
    kwargs, fragments = FEATURE_CASES[case]
    check_refused_then_healthy(features_rt, kwargs, fragments, features_good)


def test_embed_points_text_to_embed_texts(tokens_rt):
    with pytest.raises(InputError, match="sequence 0 holds text.*embed_texts"):
        tokens_rt.embed(["hello"])


def test_model_without_token_types_refuses_them(nopool_rt):
    inputs = {"input_ids": GOOD_IDS}
    good = (inputs, nopool_rt.run(**inputs))
    check_refused_then_healthy(nopool_rt, dict(input_ids=GOOD_IDS, token_type_ids=np.zeros((2, 4), np.int64)),
                               ["no token_type_ids input", "type_vocab_size=0"], good)


def test_the_first_bad_id_and_the_count_are_reported(tokens_rt):
    ids = np.arange(128).reshape(2, 64) + 50  # 50..177: the 78 ids from 100 up are out of range
    with pytest.raises(InputError, match=r"input_ids\[0, 50\] = 100 is not valid \(78 bad value\(s\)\)"):
        tokens_rt.run(input_ids=ids)


def test_a_fully_padded_row_is_allowed(tokens_rt):
    out = tokens_rt.run(input_ids=GOOD_IDS, attention_mask=[[1, 1, 0, 0], [0, 0, 0, 0]])
    assert np.isfinite(out["sentence_embedding"]).all()


def test_an_empty_batch_gets_zero_rows_of_every_output(tokens_model):
    rt = Runtime(tokens_model, "cpu")
    out = rt.run(np.zeros((0, 5), np.int64))
    assert {k: v.shape for k, v in out.items()} == {
        k: (0, *(5 if a == contract.SEQUENCE_AXIS else a for a in shape[1:]))
        for k, shape in contract.output_shapes(rt.config).items()}
    with pytest.raises(InputError, match="at least one token"):
        rt.run(np.zeros((2, 0), np.int64))



def test_session_options_must_be_onnxruntime_s(tokens_model):
    with pytest.raises(InputError, match="must be an onnxruntime.SessionOptions, got dict"):
        Runtime(tokens_model, "cpu", session_options={})
