"""The torch-free runtime: validate an ortformer ONNX file and serve it with onnxruntime.

Imports numpy, onnx and onnxruntime, and of ortformer only the torch-free modules below it
(checks, chunkfile, config, contract, cost, errors, fsutil, int8_kernels, late, modelfile,
parity, text; tests/test_layers.py holds the layers): never torch, ortformer.models or ortformer.exporter, so an
app can serve models without the export extra installed.
"""
from ..modelfile import ModelFile, TensorSpec, read_model_file, resolve_inside, tokenizer_path
from .batching import PreparedBatch
from .providers import PROVIDERS
from .session import ProviderFallbackWarning, Runtime, TextUnavailableWarning
from .validate import check_inputs

__all__ = [
    "Runtime", "PreparedBatch", "ProviderFallbackWarning", "TextUnavailableWarning", "PROVIDERS",
    "ModelFile", "TensorSpec", "read_model_file", "resolve_inside", "tokenizer_path", "check_inputs",
]
