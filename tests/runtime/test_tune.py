"""The precision ladder and `tune`: bfloat16 on OpenVINO only where the CPU computes it (faked
flags refuse it by name), every tier's gate verdict on real text against onnxruntime float32,
and the tuned choice recorded beside the model, reused by provider="tuned", refused on another
CPU, thread count or file."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from support.text_models import minilm_tokenizer

from ortformer import contract
from ortformer.config import preset
from ortformer.core.errors import InputError, ModelFileError, OutputError, ProviderError
from ortformer.contract.parity import GATES, compare, passes
from ortformer.runtime import Runtime, machine, tuned
from ortformer.runtime.providers import check_precision
from ortformer.runtime.tune import choice_entry, tune

openvino = pytest.importorskip("openvino")

TEXTS = ["a short one", "a somewhat longer sentence with more words in it", "x",
         "The quick brown fox jumps over the lazy dog.", "Return the sum of the two numbers."]
SPR = "model name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu sse avx avx2 fma avx512f avx512bw avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8\n"
ZEN3 = "model name\t: AMD EPYC 7763\nflags\t\t: fpu sse avx avx2 fma avx512_fake\n"
HERE = machine.this_cpu()


def fake_cpu(monkeypatch, text: str) -> None:
    """Every reader of the CPU (machine.this_cpu) sees ``text`` as /proc/cpuinfo."""
    monkeypatch.setattr(machine, "cpuinfo", lambda: text)


@pytest.fixture(scope="module")
def text_folder(tmp_path_factory):
    """tiny with BERT's vocabulary and the MiniLM tokenizer (model.onnx), its int8 sibling
    (model.int8.onnx), and an int8 export of other weights (other.int8.onnx)."""
    from ortformer.exporter import export

    folder = tmp_path_factory.mktemp("tune")
    cfg = preset("tiny", vocab_size=30522)
    export(cfg, folder / "model.onnx", parity=False, tokenizer=minilm_tokenizer())
    export(cfg, folder / "model.int8.onnx", parity=False, tokenizer=minilm_tokenizer(), quantize="int8")
    export(cfg, folder / "other.int8.onnx", parity=False, tokenizer=minilm_tokenizer(), quantize="int8", seed=7)
    return folder


@pytest.fixture
def model(text_folder, tmp_path):
    """A fresh copy of the folder per test: tune writes its record beside the model."""
    for path in text_folder.iterdir():
        shutil.copy(path, tmp_path / path.name)
    return tmp_path / "model.onnx"


def test_cpu_identity_reads_the_name_and_the_relevant_flags(monkeypatch):
    fake_cpu(monkeypatch, SPR)
    cpu = machine.this_cpu()
    assert cpu.model == "Intel(R) Xeon(R) Platinum 8480+" and cpu.bfloat16_missing() is None
    assert cpu.identity(2) == {"cpu": "Intel(R) Xeon(R) Platinum 8480+", "threads": 2,
                               "flags": ["amx_bf16", "amx_int8", "amx_tile", "avx", "avx2", "avx512_bf16",
                                         "avx512_vnni", "avx512bw", "avx512f", "fma"]}
    fake_cpu(monkeypatch, ZEN3)
    assert "neither avx512_bf16 nor amx_bf16" in machine.this_cpu().bfloat16_missing()
    fake_cpu(monkeypatch, "")  # no /proc/cpuinfo: no name, no flags, so no bfloat16
    assert machine.this_cpu().identity(1) == {"cpu": "", "flags": [], "threads": 1}


def test_bfloat16_is_refused_by_name_where_the_cpu_lacks_it(monkeypatch, tokens_model):
    fake_cpu(monkeypatch, ZEN3)
    with pytest.raises(ProviderError, match=r"needs bfloat16 dot products in hardware \(the flag avx512_bf16 or "
                                            r"amx_bf16\): this CPU \(AMD EPYC 7763\) lists neither"):
        Runtime(tokens_model, "openvino", precision="bfloat16")
    with pytest.raises(ProviderError, match="runs on provider='openvino' only"):
        check_precision("cpu", "bfloat16", machine.CPU("x", frozenset({"amx_bf16"})))
    with pytest.raises(ProviderError, match="unknown precision 'float16'; choose one of float32, bfloat16"):
        Runtime(tokens_model, "openvino", precision="float16")
    with pytest.raises(ProviderError, match="takes its precision from the tuned record"):
        Runtime(tokens_model, "tuned", precision="float32")


@pytest.mark.skipif(HERE.bfloat16_missing() is not None, reason="this CPU has no bfloat16 instructions")
def test_bfloat16_computes_in_bfloat16_within_its_gate(text_model):
    """Within GATES["bfloat16"] of float32 on real text, and measurably not float32 (the hint took)."""
    low, full = Runtime(text_model, "openvino", precision="bfloat16"), Runtime(text_model, "cpu")
    texts = TEXTS * 4
    got, want = low.embed_texts(texts), full.embed_texts(texts)
    metrics = compare(contract.SENTENCE_EMBEDDING, got, want, np.ones((len(texts), 1)))
    assert passes(metrics, GATES["bfloat16"]), metrics
    assert metrics["max_abs"] > GATES["float32"]["max_abs"], metrics


def rows(result) -> dict:
    return {(row["engine"], row["precision"]): row for row in result["candidates"]}


def test_every_tier_gets_its_gate_verdict_and_the_floor_admits_the_stricter_tiers(model):
    result = tune(model, TEXTS, "int8", threads=1, rounds=1)
    found = rows(result)
    assert found["onnxruntime", "float32"]["min_cosine"] == 1.0 and found["onnxruntime", "float32"]["passes"]
    assert found["openvino", "float32"]["gate"] == "float32" and found["openvino", "float32"]["passes"]
    assert found["onnxruntime", "int8"]["file"] == "model.int8.onnx" and found["onnxruntime", "int8"]["passes"]
    assert found["onnxruntime", "int8"]["min_cosine"] < 1.0
    if HERE.bfloat16_missing() is None:
        assert found["openvino", "bfloat16"]["passes"] and found["openvino", "bfloat16"]["gate"] == "bfloat16"
    eligible = [row for row in result["candidates"] if row.get("eligible")]
    assert result["choice"] == max(eligible, key=lambda row: row["sentences_per_s"]) and result["choice"]["chosen"]
    # a float32 floor admits the float32 tier only, whatever the others measured
    strict = tune(model, TEXTS, "float32", threads=1, rounds=1)
    assert {row["precision"] for row in strict["candidates"] if row.get("eligible")} == {"float32"}
    assert strict["choice"]["precision"] == "float32"


def test_a_tier_that_fails_its_gate_is_never_chosen(model, monkeypatch):
    """An int8 file of other weights (same config) fails the int8 gate on the texts; a CPU without
    bfloat16 lists that tier as unavailable, naming the flags."""
    fake_cpu(monkeypatch, ZEN3)
    result = tune(model, TEXTS, "int8", threads=1, rounds=1, int8=model.with_name("other.int8.onnx"))
    found = rows(result)
    assert found["onnxruntime", "int8"]["min_cosine"] < GATES["int8"]["min_cosine"]
    assert not found["onnxruntime", "int8"]["passes"] and not found["onnxruntime", "int8"]["eligible"]
    assert result["choice"]["precision"] == "float32"
    assert not found["openvino", "bfloat16"]["available"]
    assert "neither avx512_bf16 nor amx_bf16" in found["openvino", "bfloat16"]["unavailable"]


def test_what_tune_cannot_use_is_named(model, tokens_model):
    model.with_name("model.int8.onnx").unlink()
    found = rows(tune(model, TEXTS, threads=1, rounds=1))
    assert "no int8 sibling beside model.onnx (model.int8.onnx" in found["onnxruntime", "int8"]["unavailable"]
    found = rows(tune(model, TEXTS, threads=1, rounds=1, int8=model))
    assert "is not an int8 file" in found["onnxruntime", "int8"]["unavailable"]
    with pytest.raises(InputError, match="is an int8 file; tune takes the float32 file"):
        tune(model.with_name("other.int8.onnx"), TEXTS)
    with pytest.raises(InputError, match="quality='fp8'; choose one of float32, near-lossless, int8"):
        tune(model, TEXTS, "fp8")
    with pytest.raises(InputError, match="names no tokenizer"):
        tune(tokens_model, TEXTS, threads=1, rounds=1)


def test_the_choice_is_recorded_and_reused_by_provider_tuned(model):
    result = tune(model, TEXTS, "int8", threads=1, rounds=1)
    record = tuned.write_choice(model, choice_entry(result))
    assert record == model.with_name("model.tuned.json") and not list(model.parent.glob(".model.tuned.json*"))
    saved = json.loads(record.read_text())
    assert saved["model"] == "model.onnx" and saved["choices"][0]["threads"] == 1
    runtime = Runtime(model, "tuned", threads=1)
    chosen = result["choice"]
    assert runtime.tuned == saved["choices"][0]
    assert runtime.provider == {"onnxruntime": "cpu", "openvino": "openvino"}[chosen["engine"]]
    assert runtime.path.name == chosen["file"] and runtime.threads == 1
    want = Runtime(runtime.path, runtime.provider, threads=1,
                   precision="bfloat16" if chosen["precision"] == "bfloat16" else None).embed_texts(TEXTS)
    np.testing.assert_array_equal(runtime.embed_texts(TEXTS), want)
    with pytest.raises(OutputError, match=r"already records a choice for this CPU at 1 thread\(s\).*--force"):
        tuned.write_choice(model, choice_entry(result))
    # another thread count is another key: both stay
    tuned.write_choice(model, {**choice_entry(result), "threads": 2})
    assert [c["threads"] for c in json.loads(record.read_text())["choices"]] == [1, 2]
    tuned.write_choice(model, {**choice_entry(result), "engine": "onnxruntime", "precision": "float32",
                               "file": "model.onnx", "file_bytes": model.stat().st_size,
                               "file_weights": Runtime(model, "cpu").metadata[contract.META_WEIGHTS]}, force=True)
    assert Runtime(model, "tuned", threads=1).provider == "cpu"


def recorded(model, cpu_text: str, monkeypatch, force: bool = False, **changes) -> None:
    """A record of onnxruntime float32 at 1 thread, made on the CPU ``cpu_text`` describes."""
    fake_cpu(monkeypatch, cpu_text)
    entry = {**machine.this_cpu().identity(1), "quality": "float32", "engine": "onnxruntime",
             "precision": "float32", "file": "model.onnx", "file_bytes": model.stat().st_size,
             "file_weights": Runtime(model, "cpu").metadata[contract.META_WEIGHTS], "sentences_per_s": 100.0, "vs_float32": 1.0, "min_cosine": 1.0, "measured": "2026-12-05T00:00:00Z"}
    tuned.write_choice(model, {**entry, **changes}, force)


def test_a_record_moved_to_another_cpu_or_thread_count_is_refused(model, monkeypatch):
    with pytest.raises(ProviderError, match=r"has no tuned choice \(model.tuned.json is not beside it\); run "
                                            r"`ortformer tune .*model.onnx --threads 1 --write` on this machine"):
        Runtime(model, "tuned", threads=1)
    recorded(model, SPR, monkeypatch)
    assert Runtime(model, "tuned", threads=1).provider == "cpu"  # the same (faked) CPU: used
    fake_cpu(monkeypatch, ZEN3)
    with pytest.raises(ProviderError, match=r"no choice for this CPU \(AMD EPYC 7763, flags avx avx2 fma, 1 threads\); "
                                            r"it was measured on another CPU \(Intel\(R\) Xeon\(R\) Platinum 8480\+; "
                                            r"flags there only: amx_bf16 .*`ortformer tune"):
        Runtime(model, "tuned", threads=1)
    # same model name, one flag fewer (a VM that hides AMX): another CPU too
    fake_cpu(monkeypatch, SPR.replace(" amx_bf16", ""))
    with pytest.raises(ProviderError, match=r"flags there only: amx_bf16\): run `ortformer tune"):
        Runtime(model, "tuned", threads=1)
    fake_cpu(monkeypatch, SPR)
    with pytest.raises(ProviderError, match=r"tuned here for 1 thread\(s\) only: pass that thread count, or run "
                                            r"`ortformer tune .* --threads 2 --write`"):
        Runtime(model, "tuned", threads=2)


def test_a_changed_model_or_a_hostile_record_is_refused(model, monkeypatch):
    recorded(model, SPR, monkeypatch)
    record = tuned.record_path(model)
    data = json.loads(record.read_text())
    record.write_text(json.dumps({**data, "model_bytes": data["model_bytes"] - 1}))  # the model was rewritten since
    with pytest.raises(ProviderError, match=r"was measured on a \d+-byte model.onnx, and .* is \d+ bytes now"):
        Runtime(model, "tuned", threads=1)
    for bad, message in [({"file": "../model.onnx"}, "must be a file name in the model's folder"),
                         ({"engine": "tensorrt"}, "engine 'tensorrt'"),
                         ({"threads": "1"}, "threads must be of type int")]:
        data["choices"] = [{**data["choices"][0], **bad}]
        record.write_text(json.dumps(data))
        with pytest.raises(ModelFileError, match=message):
            Runtime(model, "tuned", threads=1)
    record.write_text("[1, 2]")
    with pytest.raises(ModelFileError, match="must be a JSON object"):
        Runtime(model, "tuned", threads=1)
    with pytest.raises(OutputError, match="exists and is not a tuned record; --force replaces it"):
        recorded(model, SPR, monkeypatch)
    recorded(model, SPR, monkeypatch, force=True, file="model.int8.onnx", file_bytes=1)
    with pytest.raises(ProviderError, match="runs model.int8.onnx, which is another file than the one measured"):
        Runtime(model, "tuned", threads=1)
    # a file of the same size with other weights (a re-export of other.int8.onnx's weights)
    other = model.with_name("other.int8.onnx")
    shutil.copy(other, model.with_name("model.int8.onnx"))
    recorded(model, SPR, monkeypatch, force=True, file="model.int8.onnx", file_bytes=other.stat().st_size,
             file_weights=Runtime(model.with_name("model.int8.onnx"), "cpu").metadata[contract.META_WEIGHTS])
    assert Runtime(model, "tuned", threads=1).path.name == "model.int8.onnx"
    recorded(model, SPR, monkeypatch, force=True, file="model.int8.onnx", file_bytes=other.stat().st_size,
             file_weights="sha256:" + "0" * 64)
    with pytest.raises(ProviderError, match=r"holds other weights than the file tuned \(ortformer.weights sha256:"):
        Runtime(model, "tuned", threads=1)


def test_serve_loads_the_tuned_choice(model, monkeypatch):
    from ortformer.serve.options import ServeOptions, load_runtime

    recorded(model, SPR, monkeypatch)
    runtime = load_runtime(model, ServeOptions(provider="tuned", threads=1))
    assert runtime.tuned["engine"] == "onnxruntime" and runtime.provider == "cpu"


def test_fastest_within_a_floor_takes_only_passing_rows_of_that_tier_or_a_stricter_one():
    from ortformer.runtime.tune import fastest_within, within

    rows = [{"precision": "float32", "passes": True, "sentences_per_s": 10.0},
            {"precision": "float32", "passes": False, "sentences_per_s": 99.0},  # fails its gate: never chosen
            {"precision": "bfloat16", "passes": True, "sentences_per_s": 30.0},
            {"precision": "int8", "passes": True, "sentences_per_s": 40.0}]
    assert fastest_within(rows, "float32") is rows[0]
    assert fastest_within(rows, "near-lossless") is rows[2]
    assert fastest_within(rows, "int8") is rows[3]
    assert not within(rows[1], "int8") and within(rows[0], "int8") and not within(rows[3], "near-lossless")
    assert fastest_within(rows[1:2], "int8") is None
