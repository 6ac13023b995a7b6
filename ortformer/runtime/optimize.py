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
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort

from .. import contract
from ..core.errors import ModelFileError
from ..core.fsutil import copy_atomic, staged
from ..modelfile import int8_kernels
from ..modelfile.int8_kernels import open_session
from ..modelfile import ModelFile, check_weights, read_model_file, tensors_digest, tokenizer_path
from ..contract.parity import GATES, compare, fold_worst, grid, make_inputs, passes

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
    check_weights(source)  # the copy records a digest of its own: it must start from the weights exported
    if source.external_files:
        raise ModelFileError(f"{path} keeps its weights in a side file; offline optimization handles inline models (< 2 GB)")
    out = Path(out)
    if out.exists() and os.path.samefile(out, source.path):
        raise ModelFileError(f"{out} is the model being optimized; write the optimized copy to another file")
    tokenizer = tokenizer_path(source, missing_ok=True)  # a model copied alone still optimizes, for ids
    if out.exists() and tokenizer is not None and os.path.samefile(out, tokenizer):
        raise ModelFileError(f"{out} is the tokenizer of the model being optimized; write the copy to another file")
    if out.exists() and not force:
        raise ModelFileError(f"{out} already exists; pass force=True (--force) to replace it")
    if not out.absolute().parent.is_dir():
        raise ModelFileError(f"cannot write {out}: folder {out.parent} does not exist; create it first")
    metadata = {**source.metadata, META_OPTIMIZED: json.dumps(
        {"onnxruntime": ort.__version__, "provider": "cpu", "level": "extended"})}
    # the tokenizer travels with the copy, as export writes it: <stem>.tokenizer.json beside the model
    tokenizer_dest = None
    if tokenizer is None:
        if metadata.pop(contract.META_TOKENIZER, None):  # copied alone: the copy serves token ids, as the model does
            warnings.warn(f"{path}: its tokenizer {source.metadata[contract.META_TOKENIZER]!r} is missing; the "
                          "optimized copy takes token ids only", stacklevel=2)
    else:
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
        # the rewrites a CPU Runtime would do at start, and not the ones it leaves out
        ort.InferenceSession(str(source.path), options, providers=["CPUExecutionProvider"],
                             disabled_optimizers=list(int8_kernels.CPU_DISABLED_FUSIONS))
        model = onnx.load(str(tmp))
        if contract.META_WEIGHTS in metadata:  # the rewrites fold and fuse weights: the copy records its own
            metadata[contract.META_WEIGHTS] = tensors_digest(model)
        del model.metadata_props[:]
        # the required keys last, as the exporter writes them: a file cut between two entries then
        # always loses a required one and is refused (exporter/atomic.set_metadata)
        for key in sorted(metadata, key=lambda k: k in contract.REQUIRED_META):
            model.metadata_props.add(key=key, value=metadata[key])
        onnx.save(model, str(tmp))
        dtype = source.parity.get("dtype", "float32")
        check = _compare(source.path, tmp, source.config, dtype if dtype in GATES else "float32",
                         int8=contract.META_INT8 in source.metadata)
        if not check["passed"]:
            raise ModelFileError(f"the optimized graph differs from the original beyond its gate "
                                 f"(parity.GATES['optimized'] = {GATES['optimized']}, and the file's dtype gate "
                                 f"against the graph without rewrites): {check}")
        if tokenizer_dest is not None:  # last, so a failed check leaves nothing behind
            copy_atomic(tokenizer, tokenizer_dest)
    return check


def _compare(original: Path, optimized: Path, cfg, dtype: str, int8: bool = False) -> dict:
    """The saved graph, run as Runtime runs it on CPU (no rewrites at session start), on the
    parity grid's inputs against two references; max_abs and min_cosine over every case and
    output against each:
    - the original with the same rewrites done at session start, at GATES["optimized"]: does
      the file hold the rewritten graph faithfully;
    - the original with no rewrites at all, at the gate of the file's dtype: did a rewrite
      change the math. Not the tight gate: an int8 graph's fused kernels round otherwise than
      its unfused ops (max_abs 0.1 on all-MiniLM-L6-v2), as every session of it does anyway.
    """
    def session(path: Path, level) -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        return open_session(path, options, ["CPUExecutionProvider"], int8=int8)

    saved = session(optimized, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    references = {"rewritten": session(original, ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED),
                  "unoptimized": session(original, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)}
    gates = {"rewritten": GATES["optimized"], "unoptimized": GATES[dtype]}
    rng = np.random.default_rng(0)
    worst: dict[str, dict] = {}
    passed = True
    names = [o.name for o in saved.get_outputs()]  # the file's own: an older one lacks the optional outputs
    for case in grid(cfg):
        feeds = make_inputs(cfg, case, rng)
        got = saved.run(names, feeds)
        for label, reference in references.items():
            for name, x, y in zip(names, reference.run(names, feeds), got):
                metrics = compare(name, y, x, feeds[contract.ATTENTION_MASK])
                passed = passed and passes(metrics, gates[label])  # per comparison, not on the folded worst case
                fold_worst(worst, label, metrics)
    faithful, unoptimized = worst["rewritten"], worst["unoptimized"]
    return {"max_abs": faithful["max_abs"], "max_rel": faithful["max_rel"], "min_cosine": faithful["min_cosine"],
            "cases": len(grid(cfg)),
            "unoptimized": {"max_abs": unoptimized["max_abs"], "max_rel": unoptimized["max_rel"],
                            "min_cosine": unoptimized["min_cosine"], "gate": dtype},
            "passed": passed}
