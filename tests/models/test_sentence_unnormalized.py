"""sentence_embedding_unnormalized: a model whose graph normalizes (Pooling -> Dense -> Normalize)
also gives the vector right before Normalize, equal to sentence-transformers' pipeline without
its Normalize module, under the parity gate; `/embed` with normalize=false answers it; a file
written before the output existed still loads (and says how to get it)."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from support.exported_models import without_output
from support.hf import assert_same_embeddings, load_and_export

from ortformer import contract
from ortformer.core.errors import ModelFileError
from ortformer.runtime import Runtime, read_model_file

st = pytest.importorskip("sentence_transformers")
httpx = pytest.importorskip("httpx")
from models.test_sentence_dense import TEXTS, st_folder  # noqa: E402  (the LaBSE-like folder builder)

UNNORMALIZED = contract.SENTENCE_EMBEDDING_UNNORMALIZED


@pytest.fixture(scope="module")
def dense_file(tmp_path_factory):
    """(sentence-transformers folder, exported file): Pooling(mean) -> Dense(32 -> 16, tanh) -> Normalize."""
    root = tmp_path_factory.mktemp("unnormalized")
    folder = st_folder(root)
    _, path = load_and_export(folder, root / "m.onnx", text=True)
    return folder, path


def before_normalize(folder, texts) -> np.ndarray:
    """sentence-transformers' own vectors from its pipeline less the last module (Normalize)."""
    model = st.SentenceTransformer(str(folder), device="cpu")
    assert type(list(model)[-1]).__name__ == "Normalize"
    cut = st.SentenceTransformer(modules=list(model)[:-1], device="cpu")
    return cut.encode(texts, convert_to_numpy=True, batch_size=8)


def test_the_file_gives_the_vector_before_normalize(dense_file):
    folder, path = dense_file
    runtime = Runtime(path, "cpu")
    assert runtime.output_names[-1] == UNNORMALIZED
    assert [o.shape for o in runtime.model_file.outputs if o.name == UNNORMALIZED] == [("batch", 16)]
    raw = runtime.embed_texts(TEXTS, output=UNNORMALIZED)
    want = before_normalize(folder, TEXTS)
    assert not np.allclose(np.linalg.norm(want, axis=1), 1.0, atol=1e-2)  # the oracle is not unit vectors
    assert_same_embeddings(raw, want)
    unit = runtime.embed_texts(TEXTS)
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), unit, atol=1e-5, rtol=0)
    # covered by the export's parity gate, as sentence_embedding is
    report = json.loads(read_model_file(path).metadata[contract.META_PARITY])
    worst = report["worst"][UNNORMALIZED]
    assert worst["passed"] and worst["max_rel"] <= report["gate"]["max_rel"]
    assert all(UNNORMALIZED in case["outputs"] for case in report["cases"])
    from support.cli import invoke

    printed = json.loads(invoke("infer", path, "--text", TEXTS[0], "--text", TEXTS[1], "--tensor", UNNORMALIZED).stdout)
    np.testing.assert_allclose(np.array(printed), raw[:2], atol=1e-6, rtol=0)


def test_no_output_where_the_graph_does_not_normalize(tmp_path):
    folder = st_folder(tmp_path, normalize=False, seed=2)
    loaded, path = load_and_export(folder, tmp_path / "m.onnx", text=True)
    assert not loaded.config.normalize_embeddings
    assert UNNORMALIZED not in Runtime(path, "cpu").output_names


def test_embed_normalize_false_serves_it(dense_file, tmp_path):
    from support.serve import serving

    folder, path = dense_file
    runtimes = {"dense": Runtime(path, "cpu"), "old": Runtime(without_output(path, path.parent / "old.onnx", UNNORMALIZED), "cpu")}
    with serving(runtimes, ["dense", "old"]) as running, httpx.Client(base_url=running.url, timeout=30) as client:
        raw = np.array(client.post("/embed", json={"inputs": TEXTS, "normalize": False}).json())
        unit = np.array(client.post("/embed", json={"inputs": TEXTS, "normalize": True}).json())
        cut = np.array(client.post("/embed", json={"inputs": TEXTS, "normalize": False, "dimensions": 4}).json())
        old_unit = client.post("/embed", json={"inputs": TEXTS, "model": "old"})
        old_raw = client.post("/embed", json={"inputs": TEXTS, "normalize": False, "model": "old"})
    assert_same_embeddings(raw, before_normalize(folder, TEXTS))
    from support.hf import st_embeddings

    assert_same_embeddings(unit, st_embeddings(folder, TEXTS))
    np.testing.assert_allclose(cut, raw[:, :4], atol=1e-6, rtol=0)
    # an older file with a Dense head: still served normalized; normalize=false says how to get it
    assert old_unit.status_code == 200
    np.testing.assert_allclose(np.array(old_unit.json()), unit, atol=1e-6, rtol=0)
    assert old_raw.status_code == 424, old_raw.text
    assert "re-export" in old_raw.json()["error"] and UNNORMALIZED in old_raw.json()["error"]


def test_an_older_file_without_it_loads_unchanged(dense_file, tmp_path):
    _, path = dense_file
    old = without_output(path, path.parent / "older.onnx", UNNORMALIZED)
    model = read_model_file(old)
    assert UNNORMALIZED not in [o.name for o in model.outputs]
    runtime = Runtime(old, "cpu")
    np.testing.assert_allclose(runtime.embed_texts(TEXTS), Runtime(path, "cpu").embed_texts(TEXTS), atol=0, rtol=0)
    with pytest.raises(Exception, match=UNNORMALIZED):
        runtime.embed_texts(TEXTS, output=UNNORMALIZED)
    # the exporter's own check wants every output: an export that lost it fails
    from ortformer.modelfile import check_graph_io

    with pytest.raises(ModelFileError, match="do not match"):
        check_graph_io(old, onnx.load(str(old), load_external_data=False).graph, runtime.config, optional=False)


def _retyped(path, dest, change):
    proto = onnx.load(str(path))
    (output,) = [o for o in proto.graph.output if o.name == UNNORMALIZED]
    change(output)
    onnx.save(proto, str(dest))
    return dest


@pytest.mark.parametrize("change, fragment", [
    (lambda o: setattr(o.type.tensor_type, "elem_type", onnx.TensorProto.INT64), "has type int64"),
    (lambda o: o.type.tensor_type.shape.dim[1].__setattr__("dim_value", 5), "declares ['batch', 16]"),
    (lambda o: o.type.tensor_type.shape.dim[0].__setattr__("dim_param", "rows"), "declares ['batch', 16]"),
    (lambda o: setattr(o, "name", "sentence_embedding_raw"), "do not match the ortformer contract"),
])
def test_a_malformed_extra_output_is_refused(dense_file, tmp_path, change, fragment):
    _, path = dense_file
    bad = _retyped(path, tmp_path / "bad.onnx", change)
    with pytest.raises(ModelFileError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        read_model_file(bad)


def test_the_output_is_refused_on_a_model_that_does_not_normalize(dense_file, tmp_path):
    """The file's config says it does not normalize: an unnormalized output does not belong."""
    _, path = dense_file
    proto = onnx.load(str(path))
    meta = {p.key: p for p in proto.metadata_props}
    config = json.loads(meta[contract.META_CONFIG].value)
    config["normalize_embeddings"] = False
    meta[contract.META_CONFIG].value = json.dumps(config)
    onnx.save(proto, str(tmp_path / "m.onnx"))
    with pytest.raises(ModelFileError, match="do not match the ortformer contract"):
        read_model_file(tmp_path / "m.onnx")
