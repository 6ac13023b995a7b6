"""Prepare all-MiniLM-L6-v2 for Infinity's optimum engine, as Infinity itself would.

Run by the Infinity peer's own interpreter as a script (``python infinity_prepare.py FOLDER
OUT CACHE``), never imported by ortformer. Two steps, both with the peer's optimum:
1. optimum's ONNX export of the sentence-transformers FOLDER into OUT, as the transformers
   model (output ``last_hidden_state``, which Infinity pools; exported as a
   sentence-transformers model it would name its outputs otherwise and Infinity fails).
2. the graph optimization Infinity runs on a CPU model before serving it (onnxruntime's
   transformers optimizer, level 99, no fp16), saved where Infinity looks for it
   (CACHE = $HF_HOME/hub/infinity_onnx/CPUExecutionProvider/<model id>). Infinity 0.0.78
   calls it with a keyword optimum 2 no longer has (optimize_with_onnxruntime_only), then
   serves the unoptimized graph; running it here gives Infinity its intended graph.
"""
import sys
from pathlib import Path


def main(folder: str, out: str, cache: str) -> None:
    from optimum.exporters.onnx import main_export
    from optimum.onnxruntime import ORTModelForFeatureExtraction, ORTOptimizer
    from optimum.onnxruntime.configuration import OptimizationConfig

    main_export(folder, output=out, task="feature-extraction", library_name="transformers")
    model = ORTModelForFeatureExtraction.from_pretrained(out, file_name="model.onnx", provider="CPUExecutionProvider")
    config = OptimizationConfig(optimization_level=99, optimize_for_gpu=False, fp16=False)
    ORTOptimizer.from_pretrained(model).optimize(optimization_config=config, save_dir=cache, one_external_file=True)
    if not list(Path(cache).glob("*_optimized.onnx")):
        sys.exit(f"no optimized model was written to {cache}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
