"""normalize: false is the pooled vector before normalization, as TEI answers it, also for a
model whose graph normalizes: the file's sentence_embedding_unnormalized, or for a file written
before that output, pooled from the same token states by the encoder's own formula."""
from __future__ import annotations

import os

import numpy as np
import pytest

from ortformer import contract
from ortformer.config import POOLINGS
from ortformer.serve.outputs import pool_rows
from support.exported_models import without_output
from support.serve import serving

httpx = pytest.importorskip("httpx")
TEXTS = ["A short text.", "a much longer text, with many more words in it than the first one has", "why?"]


@pytest.mark.parametrize("kind", POOLINGS[1:])
def test_pool_rows_is_the_encoders_pool(kind):
    torch = pytest.importorskip("torch")
    from ortformer.models.encoder import pool

    rng = np.random.default_rng(0)
    states = [rng.standard_normal((n, 8)).astype(np.float32) for n in (1, 5, 9)]
    for x in states:
        want = pool(torch.from_numpy(x)[None], torch.ones(1, len(x), dtype=torch.bool), kind)[0].numpy()
        np.testing.assert_allclose(pool_rows([x], kind)[0], want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("older", [False, True], ids=["file", "older-file"])
def test_normalize_false_undoes_no_normalization_the_graph_did(runtimes, older):
    """From the file's sentence_embedding_unnormalized, or (a file written before it) re-pooled
    from its token states: the same vectors."""
    from ortformer.serve import ServeOptions, load_runtime

    runtime = runtimes["normalizing"]
    assert contract.SENTENCE_EMBEDDING_UNNORMALIZED in runtime.output_names
    if older:
        path = runtimes.files["normalizing"]
        old = without_output(path, path.parent / f"older-{os.getpid()}.onnx", contract.SENTENCE_EMBEDDING_UNNORMALIZED)
        runtime = load_runtime(old, ServeOptions(threads=2))
        assert contract.SENTENCE_EMBEDDING_UNNORMALIZED not in runtime.output_names
    served = {"normalizing": runtime}
    with serving(served, ["normalizing"]) as running, httpx.Client(base_url=running.url, timeout=30) as client:
        raw = np.array(client.post("/embed", json={"inputs": TEXTS, "normalize": False}).json())
        unit = np.array(client.post("/embed", json={"inputs": TEXTS}).json())
        cut = np.array(client.post("/embed", json={"inputs": TEXTS, "normalize": False, "dimensions": 4}).json())
    graph = runtime.embed_texts(TEXTS)  # the file's own output: unit vectors
    np.testing.assert_allclose(np.linalg.norm(graph, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(unit, graph, atol=1e-5, rtol=0)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0, atol=1e-2)  # not unit vectors
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), graph, atol=1e-5, rtol=0)
    states = runtime.embed_texts(TEXTS, output="last_hidden_state")
    weights = [np.arange(1, len(s) + 1) for s in states]  # weighted_mean, computed here apart
    want = np.stack([w @ s.astype(np.float64) / w.sum() for w, s in zip(weights, states)])
    np.testing.assert_allclose(raw, want, atol=1e-5, rtol=0)
    np.testing.assert_allclose(cut, raw[:, :4], atol=1e-6, rtol=0)
