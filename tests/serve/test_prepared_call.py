"""The queue's model call hands the Runtime a prepared batch: each sequence is validated once
and the batch runs in the order the queue cut it."""
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("starlette")

from ortformer.runtime import batching  # noqa: E402
from ortformer.serve.batcher import Batcher  # noqa: E402


def test_a_queue_call_validates_each_sequence_once_and_keeps_its_order(runtimes, monkeypatch):
    runtime = runtimes["embedder"]
    checked, fed = [], []
    real_check, real_execute = batching.check_inputs, runtime._execute
    monkeypatch.setattr(batching, "check_inputs", lambda spec, given: checked.append(1) or real_check(spec, given))
    monkeypatch.setattr(runtime, "_execute", lambda feeds, **kw: fed.append(feeds) or real_execute(feeds, **kw))
    sequences = [np.array([101, 7592, 2088, 102]), np.array([101, 102]), np.array([101, 7592, 102])]
    queue = SimpleNamespace(model=SimpleNamespace(runtime=runtime))
    got = Batcher._call(queue, "sentence_embedding", sequences, None, None)
    assert len(checked) == len(sequences) and len(fed) == 1
    assert fed[0]["attention_mask"].sum(axis=1).tolist() == [4, 2, 3]
    for sequence, row in zip(sequences, got):
        np.testing.assert_allclose(row, runtime.run(input_ids=sequence[None])["sentence_embedding"][0],
                                   atol=1e-5, rtol=0)
