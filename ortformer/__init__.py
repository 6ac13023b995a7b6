"""ortformer: PyTorch Transformer encoders to ONNX, served with onnxruntime.

Importing the package is cheap and torch-free; ``build_encoder`` and ``export``
load torch on first use.
"""
from __future__ import annotations

from .config import PRESETS, EncoderConfig, preset
from .config.groups import (Classifier, Convolution, Disentangled, LocalAttention, RelativeAttention, SentenceDense,
                            TokenDense)
from .core.errors import (CheckpointError, ConfigError, ExportError, InputError, ListenError, MissingExtraError,
                          ModelFileError, OrtformerError, OutputError, ParityError, ProviderError)

from ._version import __version__

__all__ = [
    "__version__", "EncoderConfig", "PRESETS", "preset", "build_encoder", "export", "Runtime",
    # EncoderConfig's optional groups (config/groups.py)
    "Classifier", "Convolution", "Disentangled", "LocalAttention", "RelativeAttention", "SentenceDense", "TokenDense",
    "OrtformerError", "ConfigError", "CheckpointError", "ExportError", "ParityError",
    "ModelFileError", "OutputError", "InputError", "ProviderError", "MissingExtraError", "ListenError",
]


def __getattr__(name: str):
    # lazy: `import ortformer` must not pull in torch or onnxruntime
    if name == "build_encoder":
        from .models import build_encoder

        return build_encoder
    if name == "export":
        from .exporter import export

        return export
    if name == "Runtime":
        from .runtime import Runtime

        return Runtime
    raise AttributeError(f"module 'ortformer' has no attribute {name!r}")
