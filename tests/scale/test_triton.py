"""write_triton_repo: config.pbtxt parsed with Triton's own ModelConfig schema and checked
field by field against the ONNX graph; names, overwrites and foreign files refused."""
from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from ortformer import contract
from ortformer.config import EncoderConfig, preset
from ortformer.core.errors import ModelFileError, OutputError
from ortformer.scale import write_triton_repo

REPO = Path(__file__).resolve().parents[2]
ONNX_TO_TRITON = {onnx.TensorProto.INT64: "TYPE_INT64", onnx.TensorProto.FLOAT: "TYPE_FP32"}


def parse_config(entry: Path):
    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    text_format = pytest.importorskip("google.protobuf.text_format")
    return text_format.Parse((entry / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())


def graph_io(path: Path):
    model = onnx.load(str(path), load_external_data=False)
    weights = {t.name for t in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in weights]
    cfg = EncoderConfig.from_json({p.key: p.value for p in model.metadata_props}[contract.META_CONFIG])
    return inputs, list(model.graph.output), cfg


def assert_matches_graph(config, onnx_path: Path, *, name, max_batch_size, kind):
    """Every field of the parsed config against the ONNX file it was written from."""
    pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    inputs, outputs, cfg = graph_io(onnx_path)
    assert config.name == name
    assert config.platform == "onnxruntime_onnx"
    assert config.max_batch_size == max_batch_size
    assert config.HasField("dynamic_batching")
    assert config.dynamic_batching.max_queue_delay_microseconds > 0
    assert [g.kind for g in config.instance_group] == [getattr(pb2.ModelInstanceGroup, kind)]
    assert [g.count for g in config.instance_group] == [1]
    for declared, graph, names in ((config.input, inputs, contract.input_names(cfg)),
                                   (config.output, outputs, contract.output_names(cfg))):
        assert [t.name for t in declared] == names
        by_name = {v.name: v for v in graph}
        for tensor in declared:
            value = by_name[tensor.name].type.tensor_type
            assert pb2.DataType.Name(tensor.data_type) == ONNX_TO_TRITON[value.elem_type], tensor.name
            graph_dims = [d.dim_param or d.dim_value for d in value.shape.dim]
            assert graph_dims[0] == contract.BATCH_AXIS  # the axis Triton adds itself
            expected = [-1 if d == contract.SEQUENCE_AXIS else d for d in graph_dims[1:]]
            assert list(tensor.dims) == expected, tensor.name


def test_token_model_config_matches_graph(text_model, tmp_path):
    entry = write_triton_repo(text_model, tmp_path / "repo")
    assert entry == tmp_path / "repo" / "tiny"  # default name: the file's stem
    config = parse_config(entry)
    assert_matches_graph(config, text_model, name="tiny", max_batch_size=64, kind="KIND_CPU")
    dims = {t.name: list(t.dims) for t in [*config.input, *config.output]}
    assert dims == {"input_ids": [-1], "attention_mask": [-1], "token_type_ids": [-1],
                    "last_hidden_state": [-1, 32], "sentence_embedding": [32]}
    assert (entry / "1" / "model.onnx").read_bytes() == text_model.read_bytes()
    # the tokenizer named in the metadata: beside the version folder for clients, and in
    # it, where the model's metadata points
    tokenizer = (text_model.parent / "tokenizer.json").read_bytes()
    assert (entry / "tokenizer.json").read_bytes() == tokenizer == (entry / "1" / "tokenizer.json").read_bytes()
    assert sorted(str(p.relative_to(entry)) for p in entry.rglob("*")) == [
        "1", "1/model.onnx", "1/tokenizer.json", "config.pbtxt", "tokenizer.json"]


def test_feature_model_config_matches_graph(features_model, tmp_path):
    entry = write_triton_repo(features_model, tmp_path, name="feat.v1", max_batch_size=8, device="gpu")
    config = parse_config(entry)
    assert_matches_graph(config, features_model, name="feat.v1", max_batch_size=8, kind="KIND_GPU")
    pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    assert [(t.name, pb2.DataType.Name(t.data_type), list(t.dims)) for t in config.input] == [
        ("inputs_embeds", "TYPE_FP32", [-1, 32]), ("attention_mask", "TYPE_INT64", [-1])]
    assert not (entry / "tokenizer.json").exists()


@pytest.mark.parametrize("name", ["../x", "a/b", "", "a\\b", ".hidden", "..", "a..b", "x y", "/abs", "é"])
def test_bad_names_are_refused(text_model, tmp_path, name):
    with pytest.raises(OutputError, match="letters, digits"):
        write_triton_repo(text_model, tmp_path / "repo", name=name)
    assert not (tmp_path / "repo").exists()  # refused before anything is written


def test_bad_default_name_asks_for_a_valid_one(text_model, tmp_path):
    odd = tmp_path / "my model.onnx"
    shutil.copy(text_model, odd)
    with pytest.raises(OutputError, match="'my model' is not valid"):
        write_triton_repo(odd, tmp_path / "repo")


@pytest.mark.parametrize("kwargs, match", [({"max_batch_size": 0}, "max_batch_size"),
                                           ({"max_batch_size": True}, "max_batch_size"),
                                           ({"device": "tpu"}, "choose one of cpu, gpu")])
def test_bad_settings_are_refused(text_model, tmp_path, kwargs, match):
    with pytest.raises(OutputError, match=match):
        write_triton_repo(text_model, tmp_path, **kwargs)


def test_existing_entry_needs_force(text_model, tmp_path):
    entry = write_triton_repo(text_model, tmp_path, name="m")
    before = (entry / "config.pbtxt").read_text()
    with pytest.raises(OutputError, match="already exists.*force"):
        write_triton_repo(text_model, tmp_path, name="m", max_batch_size=4)
    assert (entry / "config.pbtxt").read_text() == before
    write_triton_repo(text_model, tmp_path, name="m", max_batch_size=4, force=True)
    assert parse_config(entry).max_batch_size == 4
    assert not [p for p in entry.rglob(".*")]  # no temporary files left


def test_external_data_is_copied_and_loads(text_model, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    folder = tmp_path / "src"
    folder.mkdir()
    source = folder / "ext.onnx"
    shutil.copy(text_model.parent / "tokenizer.json", folder)  # the metadata names it: a missing one is an error
    onnx.save_model(onnx.load(str(text_model)), str(source), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="ext.weights", size_threshold=1024)
    shutil.copy(text_model.parent / "tokenizer.json", folder)  # the model names it: it must be there
    entry = write_triton_repo(source, tmp_path / "repo")
    assert (entry / "1" / "ext.weights").read_bytes() == (folder / "ext.weights").read_bytes()
    session = ort.InferenceSession(str(entry / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    ids = np.array([[101, 2023, 102]], np.int64)
    out = session.run(["sentence_embedding"], {"input_ids": ids, "attention_mask": np.ones_like(ids),
                                               "token_type_ids": np.zeros_like(ids)})[0]
    assert out.shape == (1, 32) and np.isfinite(out).all()
    # replacing it with an inline model removes the data file the old model used
    shutil.copy(text_model, source)
    write_triton_repo(source, tmp_path / "repo", force=True)
    assert not (entry / "1" / "ext.weights").exists()


def test_foreign_and_unsafe_files_are_refused(text_model, tmp_path):
    model = onnx.load(str(text_model))
    del model.metadata_props[:]
    foreign = tmp_path / "foreign.onnx"
    onnx.save(model, str(foreign))
    with pytest.raises(ModelFileError, match="not an ortformer model"):
        write_triton_repo(foreign, tmp_path / "repo")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00not onnx at all" * 10)
    with pytest.raises(ModelFileError, match="junk.onnx"):
        write_triton_repo(junk, tmp_path / "repo")
    sneaky = tmp_path / "sneaky.onnx"
    model = onnx.load(str(text_model))
    next(p for p in model.metadata_props if p.key == contract.META_TOKENIZER).value = "../../etc/passwd"
    onnx.save(model, str(sneaky))
    with pytest.raises(ModelFileError, match="contains '..'"):
        write_triton_repo(sneaky, tmp_path / "repo")


def test_the_model_file_reader_guards_the_writer(text_model, tmp_path):
    """The writer reads models with ortformer.modelfile, like the runtime: another format
    version, a graph that breaks the contract, and a hard-linked data file are refused."""
    model = onnx.load(str(text_model))
    next(p for p in model.metadata_props if p.key == contract.META_FORMAT).value = "2"
    future = tmp_path / "future.onnx"
    onnx.save(model, str(future))
    with pytest.raises(ModelFileError, match="format '2' is not supported"):
        write_triton_repo(future, tmp_path / "repo")
    model = onnx.load(str(text_model))
    model.graph.output[0].name = "hidden"
    renamed = tmp_path / "renamed.onnx"
    onnx.save(model, str(renamed))
    with pytest.raises(ModelFileError, match="do not match the ortformer contract"):
        write_triton_repo(renamed, tmp_path / "repo")
    folder = tmp_path / "linked"
    folder.mkdir()
    source = folder / "ext.onnx"
    onnx.save_model(onnx.load(str(text_model)), str(source), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="ext.weights", size_threshold=1024)
    shutil.copy(text_model.parent / "tokenizer.json", folder)  # the model names it: it must be there
    (tmp_path / "elsewhere.weights").hardlink_to(folder / "ext.weights")
    with pytest.raises(ModelFileError, match="hard links"):
        write_triton_repo(source, tmp_path / "repo")
    assert not (tmp_path / "repo").exists()


def test_cli_writes_entry_and_errors_in_one_line(cli_group, text_model, tmp_path):
    runner = CliRunner()
    result = runner.invoke(cli_group, ["triton-repo", str(text_model), "--repo", str(tmp_path), "--name", "enc",
                                       "--device", "gpu", "--max-batch-size", "16"])
    assert result.exit_code == 0, result.output
    assert "enc/config.pbtxt" in result.output and "tokenizer.json" in result.output
    config = parse_config(tmp_path / "enc")
    pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    assert config.max_batch_size == 16 and config.instance_group[0].kind == pb2.ModelInstanceGroup.KIND_GPU
    result = runner.invoke(cli_group, ["triton-repo", str(text_model), "--repo", str(tmp_path), "--name", "a/b"])
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and result.output.startswith("error: Triton model name 'a/b'")


def test_example_client_builds_inputs_the_config_declares(text_model, features_model, tmp_path):
    """examples/triton_client.py is not run against a server here; its inputs are checked
    against the written config and run through onnxruntime, and its requests are built."""
    spec = importlib.util.spec_from_file_location("triton_client", REPO / "examples" / "triton_client.py")
    client = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(client)
    pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    numpy_of = {"TYPE_INT64": np.int64, "TYPE_FP32": np.float32}
    from ortformer.runtime import Runtime

    for model in (text_model, features_model):
        entry = write_triton_repo(model, tmp_path / "repo")
        config = parse_config(entry)
        names = [t.name for t in config.input]
        if "input_ids" in names:
            inputs = client.token_inputs(["a short text", "and a somewhat longer second text"],
                                         str(entry / "tokenizer.json"), names, max_length=64)
        else:
            inputs = client.feature_inputs(np.zeros((2, 5, 32)))
        assert list(inputs) == names
        for tensor in config.input:
            array = inputs[tensor.name]
            assert array.dtype == numpy_of[pb2.DataType.Name(tensor.data_type)]
            assert array.ndim == 1 + len(tensor.dims)
        out = Runtime(entry / "1" / "model.onnx", "cpu").run(**inputs)["sentence_embedding"]
        assert out.shape == (2, 32)
    httpclient = pytest.importorskip("tritonclient.http")
    from tritonclient.utils import np_to_triton_dtype

    for name, array in inputs.items():  # what infer() sends, minus the server
        item = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        item.set_data_from_numpy(array)
        assert item.datatype() in ("INT64", "FP32")


def test_triton_writer_and_scale_cli_work_without_torch(text_model, tmp_path):
    """The repository writer needs neither torch nor onnxruntime (a serving box can run
    it), and the scale commands import without torch or ray."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "BLOCKED = {'torch', 'onnxruntime', 'ray'}\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in BLOCKED or name.startswith(('ortformer.models', 'ortformer.exporter')):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from ortformer.scale import write_triton_repo\n"
        f"print(write_triton_repo({str(text_model)!r}, {str(tmp_path)!r}).name)\n"
        "BLOCKED.discard('onnxruntime')  # the CLI group imports the runtime commands\n"
        "import ortformer.cli.scale_cmd\n"
        "assert 'torch' not in sys.modules and 'ray' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "tiny"


@pytest.fixture(scope="module")
def int8_model(tmp_path_factory) -> Path:
    from ortformer.exporter import export

    path = tmp_path_factory.mktemp("int8") / "tiny8.onnx"
    export(preset("tiny"), path, quantize="int8")
    return path


def _weight_types(path: Path) -> set[int]:
    return {t.data_type for t in onnx.load(str(path)).graph.initializer if t.name.endswith(".i8.w")}


def test_int8_entries_are_portable_unless_asked_for_vnni(int8_model, tmp_path):
    """A Triton server runs the file as written: by default its int8 weights become uint8 + 128
    (exact on CPUs without VNNI), with the same outputs and a weights digest that still checks."""
    from ortformer.modelfile import check_weights, read_model_file
    from ortformer.runtime import Runtime

    portable = write_triton_repo(int8_model, tmp_path / "a") / "1" / "model.onnx"
    kept = write_triton_repo(int8_model, tmp_path / "b", int8_kernel="vnni") / "1" / "model.onnx"
    assert _weight_types(int8_model) == _weight_types(kept) == {onnx.TensorProto.INT8}
    assert _weight_types(portable) == {onnx.TensorProto.UINT8}
    assert kept.read_bytes() == int8_model.read_bytes()
    assert check_weights(read_model_file(portable)) == "ok"
    assert "portable" in json.loads(read_model_file(portable).metadata[contract.META_INT8])["weights"]
    ids = np.random.default_rng(0).integers(0, 100, size=(3, 17))
    want = Runtime(int8_model, "cpu").run(input_ids=ids)
    for name, value in Runtime(portable, "cpu").run(input_ids=ids).items():
        np.testing.assert_array_equal(value, want[name])


def test_a_bad_int8_kernel_is_refused(int8_model, tmp_path):
    with pytest.raises(OutputError, match="'portable', 'vnni'"):
        write_triton_repo(int8_model, tmp_path, int8_kernel="avx2")


def test_a_portable_copy_of_an_int8_file_with_a_side_file_is_refused(int8_model, tmp_path):
    """The portable copy rewrites inline weights only; the error names both ways out."""
    path = tmp_path / "side8.onnx"
    onnx.save(onnx.load(str(int8_model)), str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="side8.data", size_threshold=0)
    with pytest.raises(OutputError, match="side file.*export it again.*--int8-kernel vnni"):
        write_triton_repo(path, tmp_path / "repo")
    assert not (tmp_path / "repo").exists() or not any((tmp_path / "repo").rglob("model.onnx"))
    assert write_triton_repo(path, tmp_path / "repo", int8_kernel="vnni").is_dir()


def test_an_int8_file_is_refused_for_gpu_instances(int8_model, tmp_path):
    """onnxruntime has no CUDA kernel for its MatMulIntegerToFloat or per-row QuantizeLinear, so
    the server would fail at the first request; the writer says so before writing anything."""
    from ortformer.scale.triton import triton_config

    with pytest.raises(OutputError, match="int8 file, which runs on CPU instances only.*--device cpu"):
        write_triton_repo(int8_model, tmp_path / "repo", device="gpu")
    assert not (tmp_path / "repo").exists()
    with pytest.raises(OutputError, match="int8 file"):
        triton_config(int8_model, "tiny8", device="gpu")
    assert "KIND_CPU" in triton_config(int8_model, "tiny8", device="cpu")
