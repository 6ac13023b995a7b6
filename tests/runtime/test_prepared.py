"""The one batch entry: Runtime.prepare validates sequences once into a PreparedBatch, and
embed_prepared / run_prepared run it without checking or sorting it again."""
import numpy as np
import pytest

from ortformer.core.errors import InputError
from ortformer.runtime import PreparedBatch, Runtime
from ortformer.runtime import batching


@pytest.fixture
def checks(monkeypatch):
    """Each call of the input validator, as the number of rows it checked."""
    calls = []
    real = batching.check_inputs

    def spy(spec, given):
        calls.append(len(next(iter(given.values()))))
        return real(spec, given)

    monkeypatch.setattr(batching, "check_inputs", spy)
    return calls


def test_embed_validates_each_sequence_once(tokens_rt, rng, checks):
    sequences = [rng.integers(0, 100, size=n) for n in (5, 1, 9, 3)]
    tokens_rt.embed(sequences, batch_size=2)
    assert checks == [1, 1, 1, 1]


def test_a_prepared_batch_is_not_validated_again(tokens_rt, rng, checks):
    sequences = [rng.integers(0, 100, size=n) for n in (5, 1, 9, 3)]
    batch = tokens_rt.prepare(sequences, ["sentence_embedding", "last_hidden_state"])
    assert len(checks) == 4
    embedded = tokens_rt.embed_prepared(batch, batch_size=2)
    ran = tokens_rt.run_prepared(batch)
    part = tokens_rt.run_prepared(batch.take([2, 0]))
    assert len(checks) == 4  # none of the three runs checked anything again
    want = tokens_rt.embed(sequences, batch_size=2)
    np.testing.assert_array_equal(embedded["sentence_embedding"], want)
    for i, sequence in enumerate(sequences):  # each equals its own unbatched run
        alone = tokens_rt.run(input_ids=sequence[None])
        np.testing.assert_allclose(ran["sentence_embedding"][i], alone["sentence_embedding"][0], atol=1e-5, rtol=0)
        np.testing.assert_allclose(ran["last_hidden_state"][i], alone["last_hidden_state"][0], atol=1e-5, rtol=0)
        np.testing.assert_array_equal(embedded["last_hidden_state"][i].shape, (len(sequence), tokens_rt.config.hidden_size))
    np.testing.assert_allclose(part["sentence_embedding"], ran["sentence_embedding"][[2, 0]], atol=1e-5, rtol=0)


def test_run_prepared_keeps_the_order_given(tokens_rt, rng, monkeypatch):
    """One model call, rows as handed over: the caller cut the batch, the Runtime does not sort it."""
    sequences = [rng.integers(0, 100, size=n) for n in (7, 2, 4)]
    fed = []
    real = tokens_rt._execute
    monkeypatch.setattr(tokens_rt, "_execute", lambda feeds, **kw: fed.append(feeds) or real(feeds, **kw))
    tokens_rt.run_prepared(tokens_rt.prepare(sequences))
    assert len(fed) == 1
    assert fed[0]["attention_mask"].sum(axis=1).tolist() == [7, 2, 4]
    np.testing.assert_array_equal(fed[0]["input_ids"][0], sequences[0])


@pytest.mark.parametrize("bad, kwargs, message", [
    ([[1, 2], [1, 10**6]], {}, r"sequence 1: input_ids\[1\] = 1000000 is not valid"),
    ([[1], []], {}, "sequence 1"),
    ("abc", {}, "sequences must be a list of sequences"),
    ([[1, 2]], {"attention": [[1, 2]]}, "sequence 0: attention_mask"),
    ([[1, 2]], {"attention": []}, "one 0/1 mask per sequence"),
])
def test_prepare_refuses_what_embed_refuses_with_the_same_error(tokens_rt, bad, kwargs, message):
    with pytest.raises(InputError, match=message) as prepared:
        tokens_rt.prepare(bad, **kwargs)
    with pytest.raises(InputError) as embedded:
        tokens_rt.embed(bad, **kwargs)
    assert str(prepared.value) == str(embedded.value)


def test_features_model_prepares_float_rows(features_rt, rng):
    rows = [rng.standard_normal((n, features_rt.config.hidden_size)).astype(np.float32) for n in (3, 6)]
    batch = features_rt.prepare(rows, ["last_hidden_state"])
    got = features_rt.run_prepared(batch)["last_hidden_state"]
    for row, out in zip(rows, got):
        np.testing.assert_allclose(out, features_rt.run(inputs_embeds=row[None])["last_hidden_state"][0],
                                   atol=1e-5, rtol=0)
    with pytest.raises(InputError, match=r"sequence 0: inputs_embeds\[1, 0\]"):
        features_rt.prepare([np.array(rows[0]) * np.where(np.arange(3) == 1, np.nan, 1)[:, None]])


def test_a_prepared_batch_is_made_only_by_prepare_and_cannot_change(tokens_rt, features_rt):
    with pytest.raises(TypeError, match="Runtime.prepare"):
        PreparedBatch((np.array([1]),), None, None, ("sentence_embedding",), tokens_rt._spec)
    ids = np.array([1, 2, 3])
    batch = tokens_rt.prepare([ids])
    ids[0] = 10**6  # the caller's array changes after the checks; the batch's copy does not
    assert batch.ids[0].tolist() == [1, 2, 3]
    with pytest.raises(ValueError):
        batch.ids[0][0] = 10**6
    with pytest.raises(InputError, match="prepared for another model"):
        features_rt.run_prepared(batch)
    with pytest.raises(InputError, match="expected a PreparedBatch"):
        tokens_rt.run_prepared([[1, 2]])


def test_an_empty_batch_and_one_output_name(tokens_rt):
    empty = tokens_rt.run_prepared(tokens_rt.prepare([], "sentence_embedding"))
    assert empty["sentence_embedding"].shape == (0, tokens_rt.config.sentence_size)
    assert tokens_rt.embed_prepared(tokens_rt.prepare([]))["sentence_embedding"].shape[0] == 0


def test_a_second_runtime_of_the_same_file_takes_the_batch(tokens_model, tokens_rt):
    batch = tokens_rt.prepare([[1, 2, 3]])
    other = Runtime(tokens_model, "cpu")
    np.testing.assert_array_equal(other.run_prepared(batch)["sentence_embedding"],
                                  tokens_rt.run_prepared(batch)["sentence_embedding"])


def _same_batch(got, want):
    """Two PreparedBatches hold the same rows: ids, type ids, masks, task ids, outputs, in order."""
    assert got.outputs == want.outputs and len(got) == len(want)
    for field in ("ids", "types", "attention"):
        mine, theirs = getattr(got, field), getattr(want, field)
        assert (mine is None) == (theirs is None), field
        for a, b in zip(mine or (), theirs or ()):
            np.testing.assert_array_equal(a, b)
            assert a.dtype == b.dtype and not a.flags.writeable
    assert (got.tasks is None) == (want.tasks is None)
    if got.tasks is not None:
        np.testing.assert_array_equal(got.tasks, want.tasks)
    np.testing.assert_array_equal(got.lengths, want.lengths)


def test_concat_of_prepared_parts_equals_prepare_of_the_whole(tokens_rt, rng, checks):
    parts = [([rng.integers(0, 100, size=n) for n in lengths], [rng.integers(0, 2, size=n) for n in lengths],
              [np.r_[1, rng.integers(0, 2, size=n - 1)] for n in lengths])
             for lengths in ((5, 1), (9,), (3, 7, 2))]
    prepared = [tokens_rt.prepare(ids, "last_hidden_state", token_types=types, attention=mask)
                for ids, types, mask in parts]
    assert len(checks) == 6
    joined = PreparedBatch.concat(prepared)
    assert len(checks) == 6  # joining checks nothing again
    whole = tokens_rt.prepare([s for p in parts for s in p[0]], "last_hidden_state",
                              token_types=[t for p in parts for t in p[1]], attention=[m for p in parts for m in p[2]])
    _same_batch(joined, whole)
    fed, want = joined.feeds(), whole.feeds()
    assert set(fed) == set(want) == {"input_ids", "attention_mask", "token_type_ids"}
    for name in fed:
        np.testing.assert_array_equal(fed[name], want[name])


def test_concat_gives_parts_without_types_or_masks_the_defaults(tokens_rt, rng):
    plain = [rng.integers(0, 100, size=n) for n in (4, 2)]
    paired, types = [rng.integers(0, 100, size=3)], [np.array([0, 1, 1])]
    joined = PreparedBatch.concat([tokens_rt.prepare(plain), tokens_rt.prepare(paired, token_types=types),
                                   tokens_rt.prepare(plain[:1], attention=[np.array([1, 1, 0, 0])])])
    whole = tokens_rt.prepare(plain + paired + plain[:1], token_types=[np.zeros(4, int), np.zeros(2, int), types[0],
                                                                       np.zeros(4, int)],
                              attention=[np.ones(4, int), np.ones(2, int), np.ones(3, int), np.array([1, 1, 0, 0])])
    _same_batch(joined, whole)
    # each part's own batch: a part without type ids or masks is still one without
    assert tokens_rt.prepare(plain).types is None and PreparedBatch.concat([tokens_rt.prepare(plain)]).attention is None


def test_concat_joins_task_ids_in_order():
    from ortformer import contract
    from ortformer.config import Adapters, preset
    from ortformer.runtime.validate import InputSpec

    cfg = preset("tiny", adapters=Adapters(tasks=("query", "passage", "match"), rank=2, default="passage"))
    spec = InputSpec(cfg, (contract.INPUT_IDS, contract.ATTENTION_MASK, contract.TOKEN_TYPE_IDS, contract.TASK_ID))
    parts = [([[1, 2], [3]], "query"), ([[4, 5, 6]], None), ([[7], [8, 9]], [2, "query"])]
    joined = PreparedBatch.concat([batching.prepare(spec, ["last_hidden_state"], ids, task=task) for ids, task in parts])
    whole = batching.prepare(spec, ["last_hidden_state"], [s for ids, _ in parts for s in ids],
                             task=["query", "query", "passage", "match", "query"])
    _same_batch(joined, whole)
    assert joined.tasks.tolist() == [0, 0, 1, 2, 0]


def test_concat_refuses_what_cannot_be_mixed(tokens_rt, nopool_rt):
    ids = [[1, 2, 3]]
    with pytest.raises(InputError, match="part 1 computes outputs"):
        PreparedBatch.concat([tokens_rt.prepare(ids, "sentence_embedding"), tokens_rt.prepare(ids, "last_hidden_state")])
    with pytest.raises(InputError, match="part 1 was prepared for another model"):
        PreparedBatch.concat([tokens_rt.prepare(ids, "last_hidden_state"), nopool_rt.prepare(ids, "last_hidden_state")])
    with pytest.raises(InputError, match="at least one"):
        PreparedBatch.concat([])


def test_concat_and_take_cannot_forge_a_batch(tokens_rt):
    """Only prepare (and concat / take of what it made) gives a PreparedBatch: concat refuses
    anything else, so an unchecked sequence cannot join a checked one."""
    with pytest.raises(InputError, match="part 1 is a list"):
        PreparedBatch.concat([tokens_rt.prepare([[1, 2]]), [[1, 10**6]]])
    with pytest.raises(TypeError, match="Runtime.prepare"):
        PreparedBatch((np.array([10**6]),), None, None, ("sentence_embedding",), tokens_rt._spec, object())
    joined = PreparedBatch.concat([tokens_rt.prepare([[1, 2]]), tokens_rt.prepare([[3]])])
    assert isinstance(joined.take([1]), PreparedBatch) and joined.take([1]).ids[0].tolist() == [3]
