"""Offline graph optimization: do onnxruntime's graph rewrites once, not at every start.

onnxruntime rewrites the graph (constant folding, LayerNorm/GELU/bias fusions,
layout choices) each time a session is created. `optimize_offline` runs those
rewrites once for the CPU provider, checks the result against the original on
the parity grid, and writes a file whose metadata says so. A Runtime opening such
a file on CPU with the same onnxruntime version skips the rewrites.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort

from .. import contract
from ..errors import ModelFileError
from ..fsutil import copy_atomic, staged
from ..modelfile import ModelFile, read_model_file, tokenizer_path
from ..parity import GATES, compare, fold_worst, grid, make_inputs, passes

META_OPTIMIZED = "ortformer.optimized"


def optimized_for_cpu(model_file: ModelFile) -> bool:
    """True when the file was optimized offline for the CPU provider by this onnxruntime."""
    try:
        record = json.loads(model_file.metadata.get(META_OPTIMIZED, "{}"))
    except ValueError:
        return False
    return record.get("provider") == "cpu" and record.get("onnxruntime") == ort.__version__


def optimize_offline(path, out, *, force: bool = False) -> dict:
    """Write an onnxruntime-optimized copy of ``path`` to ``out`` (atomically); return the check."""
    import onnx  # here, not at the top: Runtime imports this module and should not pay for onnx

    source = read_model_file(path)
    if source.external_files:
        raise ModelFileError(f"{path} keeps its weights in a side file; offline optimization handles inline models (< 2 GB)")
    out = Path(out)
    if out.exists() and os.path.samefile(out, source.path):
        raise ModelFileError(f"{out} is the model being optimized; write the optimized copy to another file")
    if out.exists() and not force:
        raise ModelFileError(f"{out} already exists; pass force=True (--force) to replace it")
    if not out.absolute().parent.is_dir():
        raise ModelFileError(f"cannot write {out}: folder {out.parent} does not exist; create it first")
    metadata = {**source.metadata, META_OPTIMIZED: json.dumps(
        {"onnxruntime": ort.__version__, "provider": "cpu", "level": "extended"})}
    # the tokenizer travels with the copy, as export writes it: <stem>.tokenizer.json beside the model
    tokenizer = tokenizer_path(source)
    tokenizer_dest = None
    if tokenizer is not None:
        metadata[contract.META_TOKENIZER] = f"{out.stem}.tokenizer.json"
        tokenizer_dest = out.absolute().parent / metadata[contract.META_TOKENIZER]
        if tokenizer_dest.exists() and not force and tokenizer_dest.read_bytes() != tokenizer.read_bytes():
            raise ModelFileError(f"{tokenizer_dest} already exists (the copy's tokenizer goes there); "
                                 "pass force=True (--force) to replace it")
    with staged(out, suffix=".tmp.onnx") as tmp:  # written, checked, then fsynced (mode per umask) and renamed over out
        options = ort.SessionOptions()
        # EXTENDED, not ALL: ALL adds layout changes tied to this machine's instruction set
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(tmp)
        ort.InferenceSession(str(source.path), options, providers=["CPUExecutionProvider"])
        model = onnx.load(str(tmp))
        del model.metadata_props[:]
        for key, value in metadata.items():
            model.metadata_props.add(key=key, value=value)
        onnx.save(model, str(tmp))
        check = _compare(source.path, tmp, source.config)
        if not check["passed"]:
            raise ModelFileError(f"the optimized graph differs from the original beyond its gate "
                                 f"(parity.GATES['optimized'] = {GATES['optimized']}): {check}")
        if tokenizer_dest is not None:  # last, so a failed check leaves nothing behind
            copy_atomic(tokenizer, tokenizer_dest)
    return check


def _compare(original: Path, optimized: Path, cfg) -> dict:
    """The saved graph (run as Runtime runs it: no rewrites at session start) against the
    original with the same rewrites done at session start, on the parity grid's inputs;
    max_abs and min_cosine over every case and output. So the check asks whether the file
    holds the rewritten graph faithfully. Against the original with no rewrites at all, an
    int8 graph differs by its quantization rounding (max_abs 0.1 on all-MiniLM-L6-v2: the
    fused kernels round otherwise), which no Runtime user ever sees."""
    rewritten = ort.SessionOptions()
    rewritten.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    plain = ort.SessionOptions()
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    a = ort.InferenceSession(str(original), rewritten, providers=["CPUExecutionProvider"])
    b = ort.InferenceSession(str(optimized), plain, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    worst: dict[str, dict] = {}
    for case in grid(cfg):
        feeds = make_inputs(cfg, case, rng)
        for name, x, y in zip(contract.output_names(cfg), a.run(None, feeds), b.run(None, feeds)):
            fold_worst(worst, "all outputs", compare(name, y, x, feeds[contract.ATTENTION_MASK]))
    overall = worst["all outputs"]
    return {"max_abs": overall["max_abs"], "min_cosine": overall["min_cosine"],
            "passed": passes(overall, GATES["optimized"]), "cases": len(grid(cfg))}
