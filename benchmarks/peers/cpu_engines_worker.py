"""OpenVINO and CTranslate2 in a process of their own, answering the bench one line at a time.

    python -m benchmarks.peers.cpu_engines_worker --folder MINILM --onnx PLAIN.onnx --onnx-fused FUSED.onnx
        --tokenizer tokenizer.json --max-length 256 [--lowercase] --workdir DIR --threads T --texts TEXTS.json
        --calibration CALIBRATION.json

Both engines come from the peers overlay (overlay.py, cpu_engines_peer.txt). Each engine
gets exactly what ortformer's Runtime.embed_texts does: ortformer's tokenizer (TextEncoder,
same truncation), ortformer's length-sorted batches (length_batches, at most 32 texts and
CPU_TOKENS_PER_THREAD x threads padded tokens a batch), the same thread count. The protocol
is st_onnx_worker's (ready / encode / embeddings / quit), served by its own ``serve``.

Engines (name -> what runs):
    openvino_float32          ortformer's standard-ops ONNX export, OpenVINO CPU, f32 precision forced
    openvino_float32_fused    the fused export (com.microsoft MultiHeadAttention, SkipLayerNormalization)
    openvino_default          the standard-ops export with OpenVINO's default precision (bf16 where
                              the CPU has AVX512_BF16 or AMX: what a user gets without a hint)
    openvino_int8_static      the standard-ops export quantized by NNCF (static int8, activations
                              calibrated on CALIBRATION.json's texts, none of them measured)
    ctranslate2_float32       the sentence-transformers folder's BertModel through CTranslate2's
    ctranslate2_int8          Transformers converter; mean pooling and L2 norm in numpy, as the model's
                              Pooling and Normalize modules do
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from ortformer.runtime.batching import length_batches, pad
from ortformer.runtime.session import CPU_TOKENS_PER_THREAD
from .st_onnx_worker import BATCH_SIZE, run_worker

# OpenVINO's latency hint: one stream on all INFERENCE_NUM_THREADS threads, as ortformer's one
# session runs one batch at a time on its intra-op threads
HINT = "LATENCY"


class Engine:
    """encode(texts, batch_size) -> (n, S) float32, through ortformer's tokenizer and batching;
    a subclass's ``run(ids, mask)`` maps one padded (B, N) batch to (B, S) embeddings."""

    def __init__(self, tokenizer, max_length: int, threads: int):
        self.tokenizer, self.max_length, self.max_tokens = tokenizer, max_length, CPU_TOKENS_PER_THREAD * threads

    def batches(self, texts: list[str], batch_size: int):
        """(indices, ids (B, N) int64, mask (B, N) int64) per length-sorted batch."""
        ids, _, _ = self.tokenizer.encode(texts, self.max_length)
        arrays = [np.asarray(i, dtype=np.int64) for i in ids]
        for batch in length_batches(np.array([len(a) for a in arrays]), batch_size, self.max_tokens):
            padded, mask = pad([arrays[i] for i in batch])
            yield batch, padded, mask

    def encode(self, texts: list[str], batch_size: int = BATCH_SIZE) -> np.ndarray:
        result = None
        for batch, ids, mask in self.batches(texts, batch_size):
            out = self.run(ids, mask)
            if result is None:
                result = np.empty((len(texts), out.shape[-1]), np.float32)
            result[batch] = out
        return result

    def run(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        raise NotImplementedError


def mean_pool_normalized(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """sum_n mask * h / sum_n mask, then divided by its L2 norm: (B, N, F), (B, N) -> (B, F)."""
    weights = mask[..., None].astype(np.float32)
    pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
    return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)


class OpenVinoEngine(Engine):
    """An ortformer ONNX file (or an OpenVINO IR model) compiled for OpenVINO's CPU plugin."""

    def __init__(self, model, threads: int, precision: str | None, **kwargs):
        import openvino as ov

        super().__init__(threads=threads, **kwargs)
        config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": HINT}
        if precision:
            config["INFERENCE_PRECISION_HINT"] = precision
        self.compiled = ov.Core().compile_model(model, "CPU", config)
        self.precision = str(self.compiled.get_property("INFERENCE_PRECISION_HINT"))
        self.request = self.compiled.create_infer_request()
        self.inputs = {port.get_any_name() for port in self.compiled.inputs}
        self.output = self.compiled.output("sentence_embedding")

    def run(self, ids, mask):
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self.inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        return np.array(self.request.infer(feeds)[self.output], dtype=np.float32)


class CTranslate2Engine(Engine):
    """A CTranslate2 encoder model folder: last_hidden_state, then mean pooling and L2 norm."""

    def __init__(self, folder: Path, threads: int, compute_type: str, **kwargs):
        import ctranslate2

        super().__init__(threads=threads, **kwargs)
        self.ctranslate2 = ctranslate2
        self.encoder = ctranslate2.Encoder(str(folder), device="cpu", compute_type=compute_type,
                                           intra_threads=threads, inter_threads=1)

    def run(self, ids, mask):
        view = self.ctranslate2.StorageView.from_array
        lengths = mask.sum(axis=1).astype(np.int32)
        out = self.encoder.forward_batch(view(np.ascontiguousarray(ids, dtype=np.int32)), view(lengths))
        return mean_pool_normalized(np.asarray(out.last_hidden_state, dtype=np.float32), mask)


def calibration_items(engine: Engine, texts: list[str]) -> list[dict]:
    """The calibration texts as the feeds OpenVINO sees them: one dict per length-sorted batch."""
    return [{"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            for _, ids, mask in engine.batches(texts, BATCH_SIZE)]


def static_int8(onnx: Path, workdir: Path, feeds: list[dict]) -> Path:
    """NNCF post-training static int8 of the ONNX file (ModelType.TRANSFORMER: its preset for
    attention models), calibrated on ``feeds``; saved as OpenVINO IR once per workdir."""
    import nncf
    import openvino as ov

    target = workdir / "openvino-int8-static.xml"
    if not target.exists():
        model = ov.Core().read_model(str(onnx))
        quantized = nncf.quantize(model, nncf.Dataset(feeds), model_type=nncf.ModelType.TRANSFORMER,
                                  subset_size=len(feeds))
        ov.save_model(quantized, str(target))
    return target


def ctranslate2_model(folder: Path, workdir: Path) -> Path:
    """CTranslate2's conversion of the folder's BertModel (float32 weights; int8 is chosen at load)."""
    from ctranslate2.converters import TransformersConverter

    target = workdir / "minilm-ctranslate2"
    if not (target / "model.bin").exists():
        TransformersConverter(str(folder)).convert(str(target), force=True)
    return target


def load_engines(args) -> dict:
    from ortformer.config.text import TextEncoder

    common = {"tokenizer": TextEncoder(args.tokenizer, args.lowercase), "max_length": args.max_length, "threads": args.threads}
    engines = {"openvino_float32": OpenVinoEngine(str(args.onnx), precision="f32", **common),
               "openvino_float32_fused": OpenVinoEngine(str(args.onnx_fused), precision="f32", **common),
               "openvino_default": OpenVinoEngine(str(args.onnx), precision=None, **common)}
    calibration = json.loads(args.calibration.read_text(encoding="utf-8"))
    int8 = static_int8(args.onnx, args.workdir, calibration_items(engines["openvino_float32"], calibration))
    engines["openvino_int8_static"] = OpenVinoEngine(str(int8), precision="f32", **common)
    ct2 = ctranslate2_model(args.folder, args.workdir)
    engines["ctranslate2_float32"] = CTranslate2Engine(ct2, compute_type="float32", **common)
    engines["ctranslate2_int8"] = CTranslate2Engine(ct2, compute_type="int8", **common)
    print("openvino precision (default hint): " + engines["openvino_default"].precision, file=sys.stderr)
    return engines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("folder", "onnx", "onnx-fused", "tokenizer", "workdir", "texts", "calibration"):
        parser.add_argument(f"--{name}", type=Path, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--max-length", type=int, required=True)
    parser.add_argument("--lowercase", action="store_true", help="as the Runtime's text_lowercase")
    args = parser.parse_args(argv)
    return run_worker(lambda: load_engines(args), args.texts, args.threads)  # CTranslate2's converter uses torch


if __name__ == "__main__":
    sys.exit(main())
