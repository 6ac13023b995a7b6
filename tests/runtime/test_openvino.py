"""Runtime(provider="openvino"): the same file on the OpenVINO runtime gives onnxruntime's
CPU outputs within the float32 gate, over the parity grid, from many threads; what it
cannot run is refused by name."""
from __future__ import annotations

import sys
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from support.cli import fail, invoke

from ortformer import contract
from ortformer.config import preset
from ortformer.core.errors import InputError, MissingExtraError, ProviderError
from ortformer.contract.parity import GATES, compare, grid, make_inputs, passes
from ortformer.runtime import Runtime

pytest.importorskip("openvino")


@pytest.fixture(scope="module")
def linear_model(tmp_path_factory):
    """The linear attention family (its own graph: prefix sums, no softmax), with chunk stages."""
    from ortformer.exporter import export

    path = tmp_path_factory.mktemp("openvino") / "linear.onnx"
    export(preset("tiny", attention="linear"), path, seed=0, parity=False)
    return path


@pytest.mark.parametrize("model", ["tokens_model", "features_model", "linear_model"])
def test_openvino_equals_the_cpu_provider_on_the_parity_grid(model, request):
    """softmax attention with ids and token types, float features (vocab_size = 0), and linear
    attention: every grid case (batch and sequence vary per call, paddings included)."""
    path = request.getfixturevalue(model)
    openvino, cpu = Runtime(path, "openvino", threads=2), Runtime(path, "cpu", threads=2)
    assert openvino.provider == "openvino" and openvino._session.get_providers() == ["OpenVINOExecutionProvider"]
    rng = np.random.default_rng(0)
    for case in grid(openvino.config):
        inputs = make_inputs(openvino.config, case, rng)
        got, want = openvino.run(**inputs), cpu.run(**inputs)
        assert sorted(got) == sorted(want)
        for name in want:
            assert got[name].shape == want[name].shape and got[name].dtype == np.float32
            metrics = compare(name, got[name], want[name], inputs[contract.ATTENTION_MASK])
            assert passes(metrics, GATES["float32"]), (case, name, metrics)


def test_embed_and_embed_texts_match_the_cpu_provider(text_model):
    openvino, cpu = Runtime(text_model, "openvino"), Runtime(text_model, "cpu")
    texts = ["a short one", "a somewhat longer sentence with more words in it", "x"]
    np.testing.assert_allclose(openvino.embed_texts(texts), cpu.embed_texts(texts), atol=GATES["float32"]["max_abs"])
    sequences = [[101, 2023, 102], [101, 7592, 2088, 2003, 2307, 102], [101, 102]]
    got, want = openvino.embed(sequences, output="last_hidden_state"), cpu.embed(sequences, output="last_hidden_state")
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=GATES["float32"]["max_abs"])


def test_threads_sharing_one_runtime_get_what_one_thread_gets(tokens_model):
    """One CompiledModel, an InferRequest per call in flight: concurrent calls of different
    shapes do not see each other's tensors."""
    runtime = Runtime(tokens_model, "openvino", threads=1)
    rng = np.random.default_rng(1)
    batches = [rng.integers(0, runtime.config.vocab_size, size=(1 + i % 3, 3 + i), dtype=np.int64) for i in range(12)]
    alone = [runtime.run(input_ids=ids)[contract.LAST_HIDDEN_STATE] for ids in batches]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda ids: runtime.run(input_ids=ids)[contract.LAST_HIDDEN_STATE], batches * 2))
    for got, want in zip(together, alone * 2):
        np.testing.assert_array_equal(got, want)


def test_refusals_name_the_reason_and_what_is_valid(linear_model, tokens_model):
    import onnxruntime as ort

    runtime = Runtime(linear_model, "openvino", chunk_size=16)
    assert runtime.run(input_ids=np.ones((1, 16), np.int64))[contract.LAST_HIDDEN_STATE].shape == (1, 16, 32)
    with pytest.raises(ProviderError, match=r"longer than chunk_size=16, and stream\(\), run chunk .* use provider='cpu'"):
        runtime.run(input_ids=np.ones((1, 17), np.int64))
    with pytest.raises(ProviderError, match="session_options are onnxruntime's .* use provider='cpu'"):
        Runtime(tokens_model, "openvino", session_options=ort.SessionOptions())
    # input validation is the Runtime's, before OpenVINO sees anything
    with pytest.raises(InputError, match="sequence length 65"):
        runtime.run(input_ids=np.ones((1, 65), np.int64))


def test_without_openvino_the_extra_is_named(tokens_model, monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # `import openvino` now fails, as without the extra
    with pytest.raises(MissingExtraError, match=r"pip install 'ortformer\[openvino\]'"):
        Runtime(tokens_model, "openvino")


def test_check_and_infer_take_provider_openvino(tokens_model):
    output = invoke("check", tokens_model, "--provider", "openvino").output
    assert "PASS" in output and "float32 gate on OpenVINOExecutionProvider" in output
    ran = invoke("infer", tokens_model, "--provider", "openvino", input="[1, 2, 3]\n").output
    want = Runtime(tokens_model, "cpu").run(input_ids=[[1, 2, 3]])[contract.SENTENCE_EMBEDDING][0]
    np.testing.assert_allclose(json.loads(ran.splitlines()[0]), want, atol=GATES["float32"]["max_abs"])
    assert "'cuda' is not one of 'cpu', 'openvino'" in fail("check", tokens_model, "--provider", "cuda", code=2)
