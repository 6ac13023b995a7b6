"""Batch-invariant int8: a row's embedding is its own; `check` uses the file's dtype gate;
the ortformer.int8 metadata record is validated and printed."""
import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from ortformer import contract
from ortformer.cli import cli
from ortformer.config import preset
from ortformer.core.errors import ModelFileError, ProviderError
from ortformer.exporter import export
from ortformer.exporter.int8 import ROW_QUANTIZE_OPSET, quantize_int8_rows, weight_matmuls, with_row_quantize_opset
from ortformer.exporter.precision import calibration_feeds
from ortformer.modelfile.int8_kernels import signed_int8_exact
from ortformer.contract.parity import row_cosines
from ortformer.runtime import Runtime
from ortformer.modelfile import read_model_file
from support.text_models import set_metadata


def invoke(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exit_code == 0, (result.output, result.exception)
    return result.output


@pytest.fixture(scope="module")
def int8_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("int8") / "tiny8.onnx"
    invoke("export", "--preset", "tiny", "--quantize", "int8", "-o", path)
    return path


def test_int8_graph_has_no_batch_wide_quantization(int8_file):
    ops = {n.op_type for n in onnx.load(str(int8_file)).graph.node}
    assert "MatMulIntegerToFloat" in ops
    assert not ops & {"DynamicQuantizeLinear", "DynamicQuantizeMatMul"}  # one scale for the whole batch


def test_each_row_is_quantized_by_one_blocked_quantize_linear(int8_file):
    """Rows are scaled inside QuantizeLinear (opset 21's blocked form, one block of K per row),
    not by a Div over the whole activation first; the export (default opset 18) traced it at 21."""
    model = onnx.load(str(int8_file))
    assert next(o.version for o in model.opset_import if o.domain == "") >= ROW_QUANTIZE_OPSET
    weights = {t.name: t for t in model.graph.initializer}
    made_by = {o: n for n in model.graph.node for o in n.output}
    readers = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    quantizers = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert len(quantizers) == sum(n.op_type == "MatMulIntegerToFloat" for n in model.graph.node) > 0
    for q in quantizers:
        (gemm,) = readers[q.output[0]]
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in q.attribute}
        assert gemm.op_type == "MatMulIntegerToFloat" and attrs["axis"] == -1
        assert attrs["block_size"] == weights[gemm.input[1]].dims[0]  # K: one block per row
        # the row's own scale (max of the row's two bounds) and the zero point spread over the rows
        assert made_by[q.input[1]].op_type == "Max" and made_by[q.input[2]].op_type == "Expand"


def test_a_model_at_the_row_quantize_opset_is_not_converted():
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "g",
                                   [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
                                   [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
    at = {v: onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", v)], ir_version=10) for v in (18, 22)}
    assert with_row_quantize_opset(at[22]) is at[22]
    converted = with_row_quantize_opset(at[18])
    assert [o.version for o in converted.opset_import] == [ROW_QUANTIZE_OPSET] and at[18].opset_import[0].version == 18


def test_int8_files_run_on_the_cpu_provider_only(int8_file, monkeypatch):
    """onnxruntime has no CUDA kernel for MatMulIntegerToFloat or the blocked QuantizeLinear,
    so a CUDA session would fail at its first run: "auto" asks for the CPU alone, "cuda" is
    refused by name (or falls back with a warning when allowed)."""
    from ortformer.runtime import ProviderFallbackWarning, providers

    asked = []
    real = providers.provider_list
    monkeypatch.setattr(providers, "provider_list", lambda provider, device_id, **more: asked.append(provider) or real(provider, device_id, **more))
    assert Runtime(int8_file, "auto").provider == "cpu" and asked == ["cpu"]
    with pytest.raises(ProviderError, match="int8 file, which runs on the CPU provider only"):
        Runtime(int8_file, "cuda")
    with pytest.warns(ProviderFallbackWarning, match="int8 file"):
        assert Runtime(int8_file, "cuda", allow_fallback=True).provider == "cpu"


def test_provider_openvino_refuses_an_int8_file(int8_file):
    """Its MatMulIntegerToFloat and per-row QuantizeLinear are onnxruntime's CPU kernels:
    refused before the OpenVINO runtime is imported, by Runtime and by `check`."""
    with pytest.raises(ProviderError, match="int8 file, whose .* onnxruntime's CPU kernels; use provider='cpu'"):
        Runtime(int8_file, "openvino")
    result = CliRunner().invoke(cli, ["check", str(int8_file), "--provider", "openvino"])
    assert result.exit_code == 1 and "int8 file" in result.stderr.strip().splitlines()[-1], result.output


def test_a_row_embeds_the_same_alone_and_in_a_large_mixed_batch(int8_file):
    runtime = Runtime(int8_file, "cpu")
    vocab = runtime.config.vocab_size
    rng = np.random.default_rng(1)
    # rows of very different scale: long and short, ids from the whole vocabulary, and repeats of one id
    rows = [rng.integers(0, vocab, size=int(n)).tolist() for n in rng.integers(1, 40, size=60)]
    rows += [[3] * 37, [vocab - 1], list(range(min(vocab, 39)))]
    together = runtime.embed(rows, batch_size=64)
    alone = np.concatenate([runtime.embed([r]) for r in rows])
    assert row_cosines(alone, together).min() >= 0.99999
    # and the float-gate's own metric on the raw token states of one padded batch against one row
    longest = max(len(r) for r in rows)
    ids = np.zeros((len(rows), longest), np.int64)
    mask = np.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)] = r, 1
    full = runtime.run(input_ids=ids, attention_mask=mask)["last_hidden_state"]
    single = runtime.run(input_ids=ids[:1, :len(rows[0])], attention_mask=mask[:1, :len(rows[0])])["last_hidden_state"]
    assert row_cosines(single[0], full[0, :len(rows[0])]).min() >= 0.99999


def test_check_uses_the_int8_gate(int8_file):
    out = invoke("check", int8_file)
    assert "PASS" in out and "(int8 gate on" in out


def test_check_uses_the_float16_gate(tmp_path):
    path = tmp_path / "tiny16.onnx"
    invoke("export", "--preset", "tiny", "--dtype", "float16", "-o", path)
    out = invoke("check", path)
    assert "PASS" in out and "(float16 gate on" in out


def test_info_prints_the_int8_record(int8_file, tmp_path):
    out = invoke("info", int8_file)
    assert "int8        per-row dynamic uint8 activations" in out and "MatMulIntegerToFloat" in out
    record = json.loads(invoke("info", int8_file, "--json"))["int8"]
    assert record["float_matmuls"] == [] and record["int8_matmuls"] == 2 * preset("tiny").num_layers * 2
    # the GEMM this CPU runs: int8 weights as stored (VNNI), or rewritten as uint8 + 128
    assert ("uint8 x int8" if signed_int8_exact() else "uint8 + 128") in record.pop("kernel")
    assert "kernel on this CPU: uint8 x " in out
    model = onnx.load(str(int8_file))  # a file that kept one MatMul float: info names its module
    kept = {"node": "node_MatMul_47", "module": "blocks.0.ffn.down", "reason": "its error was the largest"}
    for prop in model.metadata_props:
        if prop.key == contract.META_INT8:
            prop.value = json.dumps({**record, "float_matmuls": [kept]})
    onnx.save(model, str(tmp_path / "kept.onnx"))
    assert "blocks.0.ffn.down (node_MatMul_47): its error was the largest" in invoke("info", tmp_path / "kept.onnx")


def test_unreachable_floor_keeps_the_worst_matmuls_float_with_reasons(tmp_path):
    cfg = preset("tiny")
    source = tmp_path / "f32.onnx"
    export(cfg, source, parity=False)
    feeds, what = calibration_feeds(cfg, None)
    record = quantize_int8_rows(source, tmp_path / "q.onnx", feeds, what, floor=1.01, max_float_share=0.5)
    names = [n.name for n in weight_matmuls(onnx.load(str(source)))]
    kept = record["float_matmuls"]
    assert len(kept) == len(names) // 2 and record["int8_matmuls"] == len(names) - len(kept)
    assert all(k["node"] in names and "< 1.01" in k["reason"] for k in kept)
    # each names the model's module it computes, e.g. blocks.1.ffn.down
    modules = {f"blocks.{i}.{m}" for i in range(cfg.num_layers) for m in ("attention.qkv", "attention.out", "ffn.up", "ffn.down")}
    assert {k["module"] for k in kept} <= modules and len({k["module"] for k in kept}) == len(kept)
    errors = [k["simulated_error"] for k in kept]
    assert errors == sorted(errors, reverse=True)
    still_float = {n.name for n in weight_matmuls(onnx.load(str(tmp_path / "q.onnx")))}
    assert still_float == {k["node"] for k in kept}


@pytest.mark.parametrize("value, words", [
    ("not json", "not valid JSON"),
    ('{"float_matmuls": []}', "'scheme' string"),
    ('{"scheme": "x", "float_matmuls": [{"node": "a"}]}', "'float_matmuls' must be a list"),
    ('{"scheme": "x", "float_matmuls": {}}', "'float_matmuls' must be a list"),
    ('{"scheme": "x", "float_matmuls": [{"node": "a", "reason": "r", "module": 3}]}', "optional .module.: str"),
])
def test_the_int8_record_is_validated(int8_file, tmp_path, value, words):
    bad = set_metadata(int8_file, contract.META_INT8, value, tmp_path / "bad.onnx")
    with pytest.raises(ModelFileError, match=words):
        read_model_file(bad)
