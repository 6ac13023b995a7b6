"""benchmarks/gpu_check.py's CPU-side logic: the JSON it writes without a GPU, and a CPU rehearsal
of its strictness and IO-binding sections (the real run needs a GPU; docs/performance.md has it)."""
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from ortformer.runtime import Runtime

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def check(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    module = load("gpu_check")
    yield module
    module.gpu_bench.DEVICE = "cuda"
    for name in ("cuda_parity", "gpu_bench", "gpu_fast_path"):  # imported by gpu_check through sys.path
        sys.modules.pop(name, None)


@pytest.fixture
def workdir(tmp_path, tokens_model):
    for name in ("parity_softmax.onnx", "soak.onnx"):
        shutil.copy(tokens_model, tmp_path / name)
    return tmp_path


def test_without_cuda_every_section_is_skipped_in_the_json(check, workdir, tmp_path):
    if Runtime(workdir / "soak.onnx", "auto").provider == "cuda":
        pytest.skip("CUDA really loads here")
    out = tmp_path / "gpu.json"
    assert check.main([str(workdir), str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["sections"]) == {"strictness", "parity", "io_binding", "float16", "throughput", "long_linear",
                                       "soak", "profile", "kernels"}
    assert all("CUDA is not usable" in s["skipped"] for s in report["sections"].values())
    assert report["environment"]["onnxruntime"]


def test_cpu_rehearsal_of_strictness_and_io_binding(check, workdir, tmp_path, monkeypatch):
    monkeypatch.setattr(check.gpu_bench, "TIMING_S", 0.0)  # five timed calls per figure
    monkeypatch.setattr(check, "IO_SHAPES", ((1, 128), (3, 128)))
    out = tmp_path / "gpu.json"
    check.main([str(workdir), str(out), "--device", "cpu", "--sections", "strictness,io_binding"])
    sections = json.loads(out.read_text())["sections"]
    strict = sections["strictness"]
    assert strict["session_providers"][0] == "CPUExecutionProvider"
    assert len(strict["out_of_range_ids"]) == 3
    assert all(v.startswith("InputError") and "vocab_size" in v for v in strict["out_of_range_ids"].values())
    assert strict["raw_session_out_of_range"]["raised"]  # the CPU Gather refuses; validation came first anyway
    binding = sections["io_binding"]
    assert binding["passed"] and binding["1x64"]["equal"] and binding["3x64"]["max_abs_difference"] == 0.0
    assert binding["1x64"]["ms_io_binding"] > 0  # the model's 64 positions cap the 128-token shapes


def test_a_failing_section_keeps_the_others(check, workdir, tmp_path, monkeypatch):
    def broken(work):
        raise RuntimeError("boom")

    monkeypatch.setattr(check, "io_binding", broken)
    out = tmp_path / "gpu.json"
    assert check.main([str(workdir), str(out), "--device", "cpu", "--sections", "io_binding,strictness"]) == 1
    sections = json.loads(out.read_text())["sections"]
    assert sections["io_binding"]["error"] == "RuntimeError: boom"
    assert sections["strictness"]["out_of_range_ids"]


def test_summary_keeps_only_failed_cases(check):
    ok = {"outputs": {"last_hidden_state": {"passed": True}}}
    bad = {"batch": 2, "outputs": {"last_hidden_state": {"passed": True}, "sentence_embedding": {"passed": False}}}
    summary = check.summary({"passed": False, "cases": [ok, bad, ok]})
    assert summary == {"passed": False, "cases": 3, "failed_cases": [bad]}


def test_tiled_weights_repeat_their_block_and_leave_small_tensors():
    models = load("gpu_models")
    linear = torch.nn.Linear(200, 300)
    bias = linear.bias.detach().clone()
    models.tile_(linear)
    w = linear.weight.detach()
    rows, cols = models.BLOCK
    assert torch.equal(w[rows:2 * rows, cols:2 * cols], w[:rows, :cols])
    assert torch.equal(w[:, cols:2 * cols], w[:, :cols]) and not torch.equal(w[:rows, 1:cols + 1], w[:rows, :cols])
    assert torch.equal(linear.bias, bias)  # 300 values: left as drawn


def test_cpu_rehearsal_of_the_fast_path(check, workdir, tmp_path, monkeypatch):
    """gpu_fast_path at tiny sizes on the CPU: both float16 graphs exported from one folder, every
    shape timed in the three engines, the padded rows of the key-length graph within the float16
    gate, and the JSON saying what a CPU run cannot show."""
    pytest.importorskip("transformers")
    fast = check.gpu_fast_path
    monkeypatch.setattr(fast, "CPU_SHAPES", ((1, 16), (3, 32)))
    monkeypatch.setattr(fast, "CPU_MIX_TEXTS", 12)
    monkeypatch.setattr(fast, "MODELS", ("bert-base",))  # minilm's exports take minutes on 2 cores
    monkeypatch.setattr(check.gpu_bench, "TIMING_S", 0.0)
    out = tmp_path / "gpu.json"
    assert check.main([str(workdir), str(out), "--device", "cpu", "--sections", "fast_path"]) == 0
    result = json.loads(out.read_text())["sections"]["fast_path"]
    assert result["passed"] and result["torch_dtype"] == "float32" and result["peak_fp16_tflops"] is None
    assert any("float32 between inserted Casts" in note for note in result["notes"])
    assert {r["engine"] + "/" + r["graph"] for r in result["rows"]} == {"ortformer/key_lengths", "ortformer/mask",
                                                                        "transformers/sdpa"}
    assert {(r["model"], r["batch"], r["sequence"]) for r in result["rows"]} >= {("bert-base", 1, 16), ("bert-base", 3, 32)}
    bert = result["models"]["bert-base"]
    assert {"right", "left", "scattered"} <= set(bert["padded_parity"])
    assert bert["length_mix"]["key_lengths"]["real_tokens"] > 12
    assert bert["kernels"]["key_lengths"]["skipped"]


def test_peak_table_prefers_the_specific_name():
    fast = load("gpu_fast_path")
    assert fast.peak_for("NVIDIA H100 PCIe") == ("H100 PCIe", 756.5)
    assert fast.peak_for("NVIDIA H200") == ("H200", 989.4)
    assert fast.peak_for("NVIDIA GeForce GTX 1080") == (None, None)
