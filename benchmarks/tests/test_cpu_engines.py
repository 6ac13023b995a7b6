"""OpenVINO and CTranslate2 as bench peers (the cpu-engines scenario): the calibration texts
kept apart from the measured ones, the engines' batching and pooling as ortformer's, the rows'
ratios, the worker protocol driven with a fake engine, and the report when the overlay is
missing. None of it needs OpenVINO or CTranslate2 installed."""
import sys
import textwrap

import numpy as np
import pytest

from benchmarks.peers import overlay
from benchmarks.peers.cpu_engines import engine_rows, measured_and_calibration, start_engines
from benchmarks.peers.cpu_engines_worker import BATCH_SIZE, Engine, mean_pool_normalized
from benchmarks.peers.st_onnx_peer import StOnnxWorker, worker_env
from benchmarks.peers.st_onnx_worker import handle
from ortformer.core.corpus import sentences
from ortformer.core.errors import InputError
from ortformer.runtime.batching import length_batches


class WordTokenizer:
    """TextEncoder's encode(texts, max_length) -> (ids, types, truncated): one id per word, at most max_length."""

    def encode(self, texts, max_length):
        ids = [[len(w) for w in t.split()][:max_length] for t in texts]
        return ids, [[0] * len(i) for i in ids], 0


class SumEngine(Engine):
    """Embeds a batch row as [sum of its ids under the mask, the batch's padded width, batch size]."""

    def __init__(self, **kwargs):
        super().__init__(tokenizer=WordTokenizer(), **kwargs)
        self.shapes = []

    def run(self, ids, mask):
        self.shapes.append(ids.shape)
        return np.stack([(ids * mask).sum(axis=1), np.full(len(ids), ids.shape[1]), np.full(len(ids), len(ids))], axis=1)


def test_calibration_texts_are_never_measured():
    measured, calibration = measured_and_calibration(120, 40)
    assert len(measured) == 120 and len(calibration) == 40
    assert not set(measured) & set(calibration)
    assert measured == sentences(120)  # the same texts the real scenario measures
    with pytest.raises(InputError, match="must be >= 1, got 10 and 0"):
        measured_and_calibration(10, 0)


def test_engines_batch_by_length_and_answer_in_the_callers_order():
    texts = [" ".join(["word"] * n) for n in (30, 2, 17, 2, 9, 40)] + ["a bb ccc"]
    engine = SumEngine(max_length=20, threads=1)
    engine.max_tokens = 64  # CPU_TOKENS_PER_THREAD x threads in the bench; small here so the cap bites
    out = engine.encode(texts, batch_size=3)
    lengths = np.array([min(len(t.split()), 20) for t in texts])
    want = length_batches(lengths, 3, 64)
    assert [s[0] for s in engine.shapes] == [len(b) for b in want]  # ortformer's own batches, in its order
    assert all(rows * width <= 64 or rows == 1 for rows, width in engine.shapes)
    assert out[:, 0].tolist() == [4 * n for n in (20, 2, 17, 2, 9, 20)] + [6]  # truncated at max_length, in order
    assert engine.encode(texts[:1])[0, 0] == 80 and out.dtype == np.float32


def test_mean_pooling_and_norm_match_sentence_transformers_formula():
    rng = np.random.default_rng(0)
    hidden = rng.standard_normal((3, 5, 4)).astype(np.float32)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    got = mean_pool_normalized(hidden, mask)
    for row, n in enumerate(mask.sum(axis=1)):
        mean = hidden[row, :n].mean(axis=0)
        np.testing.assert_allclose(got[row], mean / np.linalg.norm(mean), rtol=1e-6)


def test_rows_give_ratios_to_ortformer_float32_and_int8():
    stats = {"ortformer_float32": {"median_s": 2.0}, "ortformer_int8": {"median_s": 1.0}, "openvino_float32": {"median_s": 4.0}}
    cosines = {"ortformer_float32": np.ones(3), "ortformer_int8": np.array([0.99, 1.0, 0.98]),
               "openvino_float32": np.array([1.0, 0.5, 0.9])}
    rows = {r["contender"]: r for r in engine_rows(stats, cosines, 100)}
    assert rows["openvino_float32"]["sentences_per_s"] == 25.0
    assert rows["openvino_float32"]["vs_ortformer_float32"] == 0.5 and rows["openvino_float32"]["vs_ortformer_int8"] == 0.25
    assert rows["ortformer_int8"]["vs_ortformer_float32"] == 2.0
    assert rows["openvino_float32"]["min_cosine_vs_float32"] == 0.5 and rows["openvino_float32"]["median_cosine_vs_float32"] == 0.9


def test_the_worker_protocol_serves_engines(tmp_path):
    """The worker answers with st_onnx_worker's handle/serve; an Engine fits them as a model."""
    engines = {"sum": SumEngine(max_length=8, threads=1)}
    assert float(handle("encode sum", engines, ["a bb", "ccc"]).removeprefix("ok ")) >= 0
    path = tmp_path / "sum.npy"
    assert handle(f"embeddings sum {path}", engines, ["a bb", "ccc"]) == f"ok {path}"
    assert np.load(path)[:, 0].tolist() == [3.0, 3.0]
    assert handle("encode openvino_int8_static", engines, ["x"]) == "error InputError: no model 'openvino_int8_static' here; loaded: sum"
    assert BATCH_SIZE == 32  # the batch size ortformer's embed_texts runs with in the bench


FAKE_ENGINE_WORKER = textwrap.dedent("""
    import sys
    import numpy as np
    from benchmarks.peers.cpu_engines_worker import Engine
    from benchmarks.peers.st_onnx_worker import serve

    class Words:
        def encode(self, texts, max_length):
            ids = [[len(w) for w in t.split()] for t in texts]
            return ids, ids, 0

    class Sum(Engine):
        def run(self, ids, mask):
            return (ids * mask).sum(axis=1, keepdims=True).astype(np.float32)

    serve({"openvino_float32": Sum(tokenizer=Words(), max_length=8, threads=1)}, ["a bb", "ccc dddd e"], sys.stdin, sys.stdout)
""")


def test_an_engine_worker_round_trip_over_pipes(tmp_path):
    with StOnnxWorker([sys.executable, "-c", FAKE_ENGINE_WORKER], worker_env(None), tmp_path / "log", 120) as worker:
        assert worker.names == ["openvino_float32"] and worker.encode("openvino_float32") >= 0
        assert worker.embeddings("openvino_float32", tmp_path / "e.npy").tolist() == [[3.0], [8.0]]
    assert worker.process.returncode == 0


def test_missing_engines_name_the_setup_command(monkeypatch, tmp_path):
    from ortformer.bench.run import format_table

    monkeypatch.setenv(overlay.ENV_VAR, str(tmp_path / "absent"))
    worker, why = start_engines(tmp_path, tmp_path, tmp_path / "a.onnx", tmp_path / "b.onnx", None, ["t"], ["c"], 1)
    assert worker is None
    assert why.startswith(f"no peers overlay at {tmp_path / 'absent'}: run `python -m benchmarks --setup-peers`")
    assert "openvino==2026.4.1" in why and "nncf==3.4.0" in why and "ctranslate2==4.8.5" in why
    table = format_table({"quick": False, "scenarios": {"cpu-engines": {
        "seconds": 1.0, "rows": [], "targets": [], "unavailable": {"OpenVINO and CTranslate2": why}}}})
    assert f"OpenVINO and CTranslate2: not available here ({why})" in table


def test_an_engine_running_ortformers_graph_gives_embed_texts_exactly(text_model):
    """What each engine is fed is what Runtime.embed_texts runs: the same tokenizer, truncation and
    padding, so with ortformer's own graph as the engine the two are equal (the batches themselves
    are checked above: ortformer's results do not depend on them)."""
    from ortformer.runtime import Runtime
    from ortformer.config.text import TextEncoder

    runtime = Runtime(text_model, "cpu", threads=1)

    class OrtformerGraph(Engine):
        def run(self, ids, mask):
            return runtime.run(input_ids=ids, attention_mask=mask)["sentence_embedding"]

    texts = sentences(40) + ["x " * 300]  # one past max_length: truncated the same way
    engine = OrtformerGraph(TextEncoder(runtime.tokenizer_path(), runtime.text_lowercase), 64, threads=1)
    with pytest.warns(Warning, match="truncated"):
        got = engine.encode(texts)
    with pytest.warns(Warning, match="truncated"):
        want = runtime.embed_texts(texts, max_length=64)
    np.testing.assert_array_equal(got, want)


def test_each_tier_pits_tunes_choice_against_the_fastest_peer_that_passes_its_gate():
    from benchmarks.peers.cpu_engines import ours_name, tier_rows

    def row(name, rate, gates):
        return {"contender": name, "sentences_per_s": rate, "passes_gates": gates}

    rows = [row("ortformer_float32", 100.0, ["float32", "bfloat16", "int8"]), row("ortformer_int8", 180.0, ["int8"]),
            row("ortformer_openvino_bfloat16", 240.0, ["bfloat16", "int8"]),
            row("ctranslate2_float32", 120.0, ["float32", "bfloat16", "int8"]),
            row("openvino_default", 200.0, ["bfloat16", "int8"]),
            row("openvino_int8_static", 400.0, []),  # fast, but below the int8 gate: no tier's peer
            row("ctranslate2_int8", 230.0, ["int8"])]
    candidates = [{"engine": "onnxruntime", "precision": "float32", "passes": True, "sentences_per_s": 90.0},
                  {"engine": "onnxruntime", "precision": "int8", "passes": True, "sentences_per_s": 170.0},
                  {"engine": "openvino", "precision": "bfloat16", "passes": True, "sentences_per_s": 160.0}]
    tiers, targets = tier_rows(rows, {"candidates": candidates}, threads=2)
    by_tier = {t["tier"]: t for t in tiers}
    assert [t["tier"] for t in tiers] == ["float32", "near-lossless", "int8"] and all(t["threads"] == 2 for t in tiers)
    # the choice is tune's (its own timing: onnxruntime int8 at 170 beat OpenVINO bf16 at 160 there),
    # its figure the interleaved run's
    assert by_tier["int8"]["tuned"] == "ortformer_int8" and by_tier["int8"]["tuned_sentences_per_s"] == 180.0
    assert by_tier["int8"]["best_peer"] == "ctranslate2_int8"
    assert by_tier["near-lossless"]["tuned"] == "ortformer_openvino_bfloat16"
    assert by_tier["near-lossless"]["best_peer"] == "openvino_default"  # bf16 and float32 peers both qualify
    assert by_tier["float32"] == {**by_tier["float32"], "tuned": "ortformer_float32", "best_peer": "ctranslate2_float32"}
    assert by_tier["float32"]["tuned_vs_best_peer"] == 100.0 / 120.0
    assert [(t["measured"], t["met"]) for t in targets] == [(round(100 / 120, 4), False), (1.2, True), (round(180 / 230, 4), False)]
    assert targets[0]["name"] == "2t float32: ortformer_float32 / ctranslate2_float32"
    assert ours_name("openvino", "float32") == "ortformer_openvino_float32" and ours_name("onnxruntime", "int8") == "ortformer_int8"


def test_a_tier_without_a_qualifying_peer_has_no_target():
    from benchmarks.peers.cpu_engines import tier_rows

    rows = [{"contender": "ortformer_float32", "sentences_per_s": 50.0, "passes_gates": ["float32", "bfloat16", "int8"]}]
    tiers, targets = tier_rows(rows, {"candidates": [{"engine": "onnxruntime", "precision": "float32", "passes": True,
                                                      "sentences_per_s": 50.0}]}, threads=1)
    assert targets == [] and all(t["best_peer"] is None and "tuned_vs_best_peer" not in t for t in tiers)
