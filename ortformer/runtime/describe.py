"""What `ortformer info` reports about a model file, as a JSON-able dict (no torch)."""
from __future__ import annotations

import json
import os
import warnings

import onnxruntime

from .. import contract
from ..core.checks import check_int
from ..contract.cost import flops_per_sequence, parameter_breakdown, parameter_count
from .providers import cuda_failure_reason
from .optimize import META_OPTIMIZED
from .session import Runtime, TextUnavailableWarning

DEFAULT_FLOPS_SEQUENCE = 128


def _int8(runtime: Runtime) -> dict | None:
    """The file's int8 record (validated on read) and "kernel": the GEMM this CPU runs for it."""
    if contract.META_INT8 not in runtime.metadata:
        return None
    import onnx

    from ..modelfile.int8_kernels import kernel_here

    model = onnx.load(str(runtime.path), load_external_data=False)  # the graph and inline weights' types
    return {**json.loads(runtime.metadata[contract.META_INT8]), "kernel": kernel_here(model)}


def describe(path: str | os.PathLike, sequence_length: int | None = None) -> dict:
    """Config, files, inputs/outputs, parameters, FLOPs at ``sequence_length`` tokens
    (default min(128, max_positions)), the parity report and the providers usable here.

    The model is opened with provider "auto" (every file check applies, and whether CUDA
    really loads is seen, not guessed). Keys: path, files {path: bytes}, format, version,
    source, config, inputs, outputs, parameters {total, per part}, flops {sequence_length,
    total, per part}, max_sequence, parity, providers {available, usable, cuda_unusable_reason},
    family, prompts, labels, rerank_template, text {tokenizer, max_length, lowercase, unavailable, truncation_side},
    int8 and optimized.
    """
    with warnings.catch_warnings():  # an unusable tokenizer is reported under "text" instead
        warnings.simplefilter("ignore", TextUnavailableWarning)
        runtime = Runtime(path, "auto")
    cfg, file = runtime.config, runtime.model_file
    n = min(DEFAULT_FLOPS_SEQUENCE, cfg.max_positions) if sequence_length is None else check_int("sequence_length", sequence_length)
    flops = flops_per_sequence(cfg, n)
    usable = ["cuda", "cpu"] if runtime.provider == "cuda" else ["cpu"]
    return {
        "path": str(runtime.path),
        # every file the model consists of, as export counts them: weights side files and tokenizer
        "files": {str(p): p.stat().st_size for p in (runtime.path.resolve(), *file.external_files,
                                                      *filter(None, [runtime.tokenizer_path()]))},
        "format": runtime.metadata[contract.META_FORMAT],
        "version": file.version,
        "source": runtime.source,
        "family": runtime.family,  # the Hugging Face model_type imported, or None
        "prompts": {"prompts": runtime.prompts, "default": runtime.default_prompt},
        # a classifier's label names by id, for the logits output ([] without a classifier)
        "labels": runtime.labels,
        # late interaction: markers, query expansion, skiplist and special ids (late.LateInteraction), or None
        "late_interaction": json.loads(runtime.late.to_json()) if runtime.late is not None else None,
        # an LLM yes/no reranker's prompt template (rerank_template.RerankTemplate), or None
        "rerank_template": json.loads(runtime.rerank_template.to_json()) if runtime.rerank_template else None,
        # how texts become ids: None when the file names no tokenizer; "unavailable" says why
        # a named one cannot be used (the model still takes token ids)
        "text": {"tokenizer": runtime.metadata[contract.META_TOKENIZER], "max_length": runtime.text_max_length,
                 "lowercase": runtime.text_lowercase, "unavailable": runtime.text_problem,
                 # which end a long text loses (the tokenizer file's truncation direction)
                 "truncation_side": runtime.truncation_side}
        if runtime.metadata.get(contract.META_TOKENIZER) else None,
        "config": cfg.to_dict(),
        "inputs": [s.to_dict() for s in file.inputs],
        "outputs": [s.to_dict() for s in file.outputs],
        "parameters": {"total": parameter_count(cfg), **parameter_breakdown(cfg)},
        "flops": {"sequence_length": n, "total": sum(flops.values()), **flops},
        "max_sequence": cfg.max_sequence,  # the longest sequence the model takes
        "parity": runtime.parity,
        # int8 files: the scheme and the weight MatMuls kept in float, with why (validated on read)
        "int8": _int8(runtime),
        # files from `ortformer optimize`: the onnxruntime and provider they were optimized for
        "optimized": _optimized(runtime.metadata),
        "providers": {
            "available": onnxruntime.get_available_providers(),
            "usable": usable,
            "cuda_unusable_reason": None if "cuda" in usable else cuda_failure_reason(0),
        },
    }


def _optimized(metadata: dict[str, str]) -> dict | None:
    try:
        record = json.loads(metadata[META_OPTIMIZED]) if META_OPTIMIZED in metadata else None
    except ValueError:
        return None
    return record if isinstance(record, dict) else None
