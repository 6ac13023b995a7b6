"""Export -> checker -> ONNX Runtime at shapes unlike the export example -> gate."""
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from ortformer import contract
from ortformer.config import LocalAttention, RelativeAttention, preset
from ortformer.core.errors import ExportError, ParityError
from ortformer.exporter import GATES, export, grid
from ortformer.contract.parity import example_shape
from ortformer.models import build_encoder

# a covering set: every attention kind, both norms and norm positions, every
# position kind, token and float-feature input, every pooling
COVERING = [
    dict(attention="softmax", norm="layernorm", norm_position="post", positions="learned"),
    dict(attention="linear", norm="rmsnorm", norm_position="pre", positions="sinusoidal", activation="relu"),
    dict(attention="efficient", norm="layernorm", norm_position="pre", positions="none", pooling="cls"),
    dict(attention="cosine", norm="rmsnorm", norm_position="post", positions="learned", pooling="none"),
    dict(attention="linear", vocab_size=0, type_vocab_size=0, positions="learned", normalize_embeddings=True),
    dict(attention="softmax", vocab_size=0, type_vocab_size=0, norm="rmsnorm", positions="sinusoidal", pooling="none"),
    # rotary positions, SwiGLU / GeGLU feed-forwards, the tanh GELU and bias-free models,
    # for every attention kind
    dict(attention="softmax", positions="rotary", ffn_gated=True, activation="silu", bias=False, qk_norm=True,
         rotary_scale=0.5, num_kv_heads=2),  # Qwen3's per-head q/k norms (fused path), scaled angles, grouped K / V
    dict(attention="linear", positions="rotary", ffn_gated=True, activation="gelu", bias=False, norm_position="pre"),
    dict(attention="efficient", positions="rotary", ffn_gated=True, activation="gelu_tanh", bias=False),
    dict(attention="cosine", positions="rotary", ffn_gated=True, activation="silu", bias=False, norm="rmsnorm"),
    # softmax only: a relative position bias (the grid's 64 tokens pass max_distance)
    dict(attention="softmax", relative_attention=RelativeAttention(buckets=8, max_distance=12), positions="none",
         norm_position="pre"),
    # softmax only: local windows with a global layer every k (rotary with its own local theta, GeGLU,
    # no biases, pre-norm; Gemma-like: sandwich norms, the global layer second), and a window over a relative bias
    dict(attention="softmax", positions="rotary", rotary_theta=160000.0,
         local_attention=LocalAttention(window=6, global_every=2, global_offset=1, rotary_theta=10000.0), num_layers=3,
         ffn_gated=True, bias=False, norm_position="pre", sandwich_norm=True),
    dict(attention="softmax", positions="none", local_attention=LocalAttention(window=5, global_every=2),
         relative_attention=RelativeAttention(buckets=8, max_distance=12)),
    # causal sliding windows in every layer (a decoder's: Mistral, Gemma 2), the grid's lengths past them
    dict(attention="softmax", positions="rotary", causal=True,
         local_attention=LocalAttention(window=7, global_every=3, global_offset=2), num_layers=2, ffn_gated=True,
         activation="silu", bias=False, norm="rmsnorm", norm_position="pre", num_kv_heads=2),
]


def dims(value):
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


@pytest.mark.parametrize("overrides", COVERING, ids=lambda c: "-".join(map(str, c.values())))
def test_export_is_dynamic_checked_and_passes_the_gate(overrides, tmp_path):
    cfg = preset("tiny", **overrides)
    path = tmp_path / "m.onnx"
    result = export(cfg, path, seed=3)
    assert result.files == [path] and path.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]  # no staging leftovers
    model = onnx.load(str(path))
    onnx.checker.check_model(str(path), full_check=True)
    # every input axis is symbolic, named per the contract
    for value in model.graph.input:
        assert dims(value)[:2] == ["batch", "sequence"], value.name
    assert [v.name for v in model.graph.input] == contract.input_names(cfg)
    assert [v.name for v in model.graph.output] == contract.output_names(cfg)
    meta = {p.key: p.value for p in model.metadata_props}
    assert set(contract.REQUIRED_META) <= set(meta)
    assert meta[contract.META_FORMAT] == contract.FORMAT
    assert meta[contract.META_SOURCE] == "random-init:seed=3"
    assert json.loads(meta[contract.META_CONFIG]) == cfg.to_dict()
    report = json.loads(meta[contract.META_PARITY])
    assert report["passed"] and report == result.report
    # the grid covered what the issue asks, none of it at the example shape
    shapes = {(c["batch"], c["sequence"]) for c in report["cases"]}
    assert {1, 2, 5} == {b for b, _ in shapes} and {1, 2, cfg.max_positions} <= {n for _, n in shapes}
    assert example_shape(cfg) not in shapes
    assert {c["padding"] for c in report["cases"]} == {"none", "right", "left", "random+empty"}
    for case in report["cases"]:
        for m in case["outputs"].values():
            assert m["max_abs"] <= 1e-4 and m["min_cosine"] >= 0.99999


def test_ort_matches_eager_on_fresh_shapes_independently(tmp_path):
    """Not trusting the report: run ORT ourselves at shapes outside the grid too."""
    cfg = preset("tiny", attention="cosine")
    path = tmp_path / "m.onnx"
    export(cfg, path, seed=1, parity=False)
    model = build_encoder(cfg, seed=1)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(9)
    for b, n in [(4, 3), (7, 64), (1, 33)]:
        ids = rng.integers(0, cfg.vocab_size, (b, n))
        mask = (rng.random((b, n)) < 0.8).astype(np.int64)
        mask[:, 0] = 1
        types = rng.integers(0, 2, (b, n))
        got = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})
        with torch.no_grad():
            want = model(torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(types))
        np.testing.assert_allclose(got[0], want["last_hidden_state"].numpy(), rtol=0, atol=1e-4)
        np.testing.assert_allclose(got[1], want["sentence_embedding"].numpy(), rtol=0, atol=1e-4)


@pytest.mark.usefixtures("cached_tracing")  # plumbing, not tracing: one trace per session
def test_perturbed_reference_fails_the_gate_and_leaves_no_file(tmp_path):
    cfg = preset("tiny")
    model = build_encoder(cfg, seed=0)
    perturbed = build_encoder(cfg, seed=0)
    with torch.no_grad():
        perturbed.blocks[0].ffn.down.bias[0] += 0.05  # one feature: a uniform shift would vanish in LayerNorm
    path = tmp_path / "m.onnx"
    with pytest.raises(ParityError) as err:
        export(model, path, reference=perturbed)
    assert not path.exists() and list(tmp_path.iterdir()) == []
    assert err.value.report["passed"] is False
    assert "max_abs" in str(err.value)


def test_float32_bound_follows_the_outputs_scale(tmp_path):
    """The same model with every output x 1000 (its final norm scaled): float32 rounding grows with the
    outputs, past 1e-4, and the gate holds it to 1e-5 of their scale instead."""
    model = build_encoder(preset("tiny", norm_position="pre", num_layers=1), seed=0)
    with torch.no_grad():
        model.norm.weight.mul_(1000.0)
        model.norm.bias.mul_(1000.0)
    report = export(model, tmp_path / "m.onnx").report
    worst = report["worst"]["last_hidden_state"]
    assert worst["max_abs"] > GATES["float32"]["max_abs"]  # past the absolute bound, which measured rounding here
    assert worst["max_rel"] <= GATES["float32"]["max_rel"] and report["passed"]


@pytest.mark.usefixtures("cached_tracing")  # plumbing, not tracing: one trace per session
def test_failed_model_is_kept_only_under_keep_failed(tmp_path):
    cfg = preset("tiny")
    perturbed = build_encoder(cfg, seed=0)
    with torch.no_grad():
        perturbed.norm.bias[:4] += 1.0
    kept = tmp_path / "failed.onnx"
    with pytest.raises(ParityError, match="kept at"):
        export(build_encoder(cfg, seed=0), tmp_path / "m.onnx", reference=perturbed, keep_failed=kept)
    assert not (tmp_path / "m.onnx").exists()
    onnx.checker.check_model(str(kept))
    recorded = json.loads({p.key: p.value for p in onnx.load(str(kept)).metadata_props}[contract.META_PARITY])
    assert recorded["passed"] is False and recorded["cases"]  # it says it failed, not "skipped"


@pytest.mark.usefixtures("cached_tracing")  # plumbing, not tracing: one trace per session
def test_existing_file_needs_force(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(b"old model")
    with pytest.raises(ExportError, match="already exists.*force"):
        export(preset("tiny"), path, parity=False)
    assert path.read_bytes() == b"old model"
    export(preset("tiny"), path, parity=False, force=True)
    assert onnx.load(str(path)).graph.input[0].name == "input_ids"


@pytest.mark.parametrize("kwargs, message", [
    (dict(opset=12), "opset 12 is not supported"),
    (dict(dtype="bfloat16"), "dtype 'bfloat16' is not supported"),
])
def test_bad_options_are_export_errors(kwargs, message, tmp_path):
    with pytest.raises(ExportError, match=message):
        export(preset("tiny"), tmp_path / "m.onnx", **kwargs)


def test_bad_destinations(tmp_path):
    with pytest.raises(ExportError, match="must end in .onnx"):
        export(preset("tiny"), tmp_path / "m.bin")
    with pytest.raises(ExportError, match="does not exist"):
        export(preset("tiny"), tmp_path / "missing" / "m.onnx")
    with pytest.raises(ExportError, match="EncoderConfig or an ortformer Encoder"):
        export(torch.nn.Linear(2, 2), tmp_path / "m.onnx")
    with pytest.raises(ExportError, match="max_positions - position_offset must be >= 2"):
        export(preset("tiny", max_positions=1), tmp_path / "m.onnx")


def test_grid_is_capped_for_huge_position_tables():
    cases = grid(preset("bert-base").replace(max_positions=4096))
    assert max(c.sequence for c in cases) == 512
    assert all(c.batch * c.sequence <= 1024 for c in cases)


def test_export_records_a_weights_digest_for_modules(tmp_path):
    cfg = preset("tiny")
    a = export(build_encoder(cfg, seed=1), tmp_path / "a.onnx", parity=False)
    b = export(build_encoder(cfg, seed=2), tmp_path / "b.onnx", parity=False)
    assert a.source.startswith("weights-sha256:") and a.source != b.source


@pytest.mark.parametrize("kwargs, gate", [(dict(dtype="float16"), 0.999), (dict(quantize="int8"), 0.99)])
@pytest.mark.parametrize("attention", ["softmax", "linear"])
def test_reduced_precision_passes_its_cosine_gate_and_keeps_the_contract(kwargs, gate, attention, tmp_path):
    cfg = preset("tiny", attention=attention)
    path = tmp_path / "m.onnx"
    result = export(cfg, path, **kwargs)
    dtype = kwargs.get("quantize") or kwargs["dtype"]
    assert result.report["dtype"] == dtype and result.report["gate"]["min_cosine"] == gate
    assert result.report["passed"] and all(m["min_cosine"] >= gate for m in result.report["worst"].values())
    model = onnx.load(str(path))
    ops = {n.op_type for n in model.graph.node}
    if "quantize" in kwargs:
        assert "MatMulIntegerToFloat" in ops and "DynamicQuantizeLinear" not in ops
    else:
        assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in model.graph.initializer)
    # float32 in and out either way: the ONNX contract does not change with precision
    assert all(o.type.tensor_type.elem_type == onnx.TensorProto.FLOAT for o in model.graph.output)
    assert [d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim] == ["batch", "sequence"]


def test_float16_normalized_embeddings_of_an_all_padded_row_are_zero_not_nan(tmp_path):
    # F.normalize's eps is 0 in float16: the normalization runs in float32
    cfg = preset("tiny", normalize_embeddings=True)
    result = export(cfg, tmp_path / "m.onnx", dtype="float16")
    assert result.report["passed"]
    from ortformer.runtime import Runtime

    ids = np.array([[1, 42, 2], [0, 0, 0]], np.int64)
    out = Runtime(tmp_path / "m.onnx").run(input_ids=ids, attention_mask=np.array([[1, 1, 1], [0, 0, 0]], np.int64))
    embedding = out["sentence_embedding"]
    assert np.isfinite(embedding).all() and np.allclose(embedding[1], 0)
    assert abs(np.linalg.norm(embedding[0]) - 1) < 1e-3


def test_quantize_needs_a_float32_export(tmp_path):
    with pytest.raises(ExportError, match="quantize='int8' quantizes a float32 export; got dtype='float16'"):
        export(preset("tiny"), tmp_path / "m.onnx", dtype="float16", quantize="int8")
    with pytest.raises(ExportError, match="quantize='int4'"):
        export(preset("tiny"), tmp_path / "m.onnx", quantize="int4")


@pytest.mark.parametrize("overrides", [dict(ffn_gated=True, activation="gelu_tanh", bias=False, positions="rotary",
                                            local_attention=LocalAttention(window=4, global_every=2)),
                                       dict(activation="silu", ffn_gated=True,
                                            relative_attention=RelativeAttention(buckets=8, max_distance=12))])
def test_new_feed_forwards_export_with_standard_ops_too(overrides, tmp_path):
    path = tmp_path / "plain.onnx"
    export(preset("tiny", **overrides), path, fused_ops=False)  # passes the gate
    assert all(n.domain in ("", "ai.onnx") for n in onnx.load(str(path)).graph.node)


@pytest.mark.usefixtures("cached_tracing")  # plumbing, not tracing: one trace per session
def test_fused_ops_are_contrib_kernels_and_can_be_turned_off(tmp_path):
    fused, plain = tmp_path / "fused.onnx", tmp_path / "plain.onnx"
    export(preset("tiny"), fused, parity=False)
    export(preset("tiny"), plain, fused_ops=False)  # the standard-ops graph passes the gate too
    contrib = {(n.domain, n.op_type) for n in onnx.load(str(fused)).graph.node if n.domain}
    assert contrib == {("com.microsoft", "MultiHeadAttention"), ("com.microsoft", "Gelu")}
    assert all(n.domain in ("", "ai.onnx") for n in onnx.load(str(plain)).graph.node)


def test_relative_bias_is_the_fused_kernels_attention_bias_input(tmp_path):
    cfg = preset("tiny", relative_attention=RelativeAttention(buckets=8, max_distance=12))
    path = tmp_path / "m.onnx"
    export(cfg, path, parity=False)
    model = onnx.load(str(path))
    attention = [n for n in model.graph.node if n.op_type == "MultiHeadAttention"]
    assert len(attention) == cfg.num_layers
    assert len({n.input[5] for n in attention}) == 1  # one (1, H, N, N) bias, computed once for all layers
    # nothing stored grows with the sequence: the bucket lookup is max_distance + 1 entries
    assert max(int(np.prod(t.dims)) for t in model.graph.initializer) <= cfg.vocab_size * cfg.hidden_size


def test_local_layers_get_the_window_as_attention_bias_and_global_layers_none(tmp_path):
    cfg = preset("tiny", local_attention=LocalAttention(window=4, global_every=2), num_layers=4, positions="rotary")
    path = tmp_path / "m.onnx"
    export(cfg, path, parity=False)
    nodes = onnx.load(str(path)).graph.node
    # rotary q and k of softmax models run in onnxruntime's RotaryEmbedding kernel
    assert [n.domain for n in nodes if n.op_type == "RotaryEmbedding"] == ["com.microsoft"] * 2 * cfg.num_layers
    attention = [n for n in nodes if n.op_type == "MultiHeadAttention"]
    biased = [len(n.input) > 5 and n.input[5] != "" for n in attention]
    assert biased == [False, True, False, True]
    assert len({n.input[5] for n in attention if len(n.input) > 5}) == 1  # one (1, 1, N, N) window for all


def test_bad_text_options_are_refused_before_tracing(tmp_path, monkeypatch):
    import sys

    export_module = sys.modules["ortformer.exporter.export"]  # the package's `export` name is the function

    def no_trace(*args, **kwargs):
        raise AssertionError("traced before validating the options")

    monkeypatch.setattr(export_module, "_trace_to_onnx", no_trace)
    with pytest.raises(ExportError, match="tokenizer .* is not a file"):
        export(preset("tiny"), tmp_path / "m.onnx", tokenizer=tmp_path / "missing.json")
    with pytest.raises(ExportError, match=r"text_max_length=65 must be an int in \[1, 64\]"):
        export(preset("tiny"), tmp_path / "m.onnx", text_max_length=65)
    assert list(tmp_path.iterdir()) == []


def test_check_file_holds_the_graph_to_the_contract(tokens_model, tmp_path):
    """check_file uses the model-file reader's contract check: an output axis renamed
    from 'sequence' (a shape the contract does not declare) is an ExportError."""
    import onnx

    from ortformer.exporter import check_file
    from ortformer.runtime import read_model_file

    cfg = read_model_file(tokens_model).config
    check_file(tokens_model, cfg)
    model = onnx.load(str(tokens_model))
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_param = "tokens"
    broken = tmp_path / "broken.onnx"
    onnx.save(model, str(broken))
    with pytest.raises(ExportError, match="breaks the contract.*last_hidden_state has shape"):
        check_file(broken, cfg)


def test_rotary_and_relative_tables_come_from_the_position_index(tmp_path):
    """A million-position model stores nothing per position (a sinusoid table would be 128 MB here)."""
    cfg = preset("tiny", positions="rotary", relative_attention=RelativeAttention(buckets=8, max_distance=12),
                 max_positions=1 << 20)
    path, short = tmp_path / "m.onnx", tmp_path / "short.onnx"
    export(cfg, path, parity=False)
    export(cfg.replace(max_positions=64), short, parity=False)
    assert path.stat().st_size - short.stat().st_size < 1000
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (1, 600))
    mask, types = np.ones_like(ids), np.zeros_like(ids)
    got = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})[0]
    with torch.no_grad():
        want = build_encoder(cfg)(*(torch.from_numpy(a) for a in (ids, mask, types)))["last_hidden_state"]
    np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=1e-4)
