"""Torch encoders built from an EncoderConfig, and the Hugging Face folder imports.

Importing this package is torch-free, so its torch-free parts (the family registry in
hf/family.py: Family, VocabTokenizer, FAMILY_MODULES, and ``model_types()``, the config.json
model_types it imports) import and run without torch. The torch gate sits
where torch is needed: each name below loads its module on first use, after require_torch (a
MissingExtraError naming the extra when torch is missing), and hf.family.families() checks it
before it imports the family modules.
"""
from __future__ import annotations

import importlib

# name -> the submodule that defines it; every one of them needs torch
_TORCH_NAMES = {
    "KERNELS": "attention", "MultiHeadAttention": "attention", "get_kernel": "attention",
    "load_checkpoint": "checkpoint", "save_checkpoint": "checkpoint",
    "Block": "encoder", "Encoder": "encoder", "build_encoder": "encoder", "pool": "encoder",
    "load_bert": "hf.families.bert",
    "RMSNorm": "layers", "sinusoid_table": "layers",
    "Loaded": "loaded", "load_any": "loading", "checkpoint_digest": "weights",
}

# name -> the submodule that defines it; none of them needs torch
_TORCH_FREE_NAMES = {"model_types": "hf.family"}

__all__ = ["model_types", "KERNELS", "MultiHeadAttention", "get_kernel", "Block", "Encoder", "build_encoder", "pool",
           "RMSNorm", "sinusoid_table", "load_bert", "Loaded", "checkpoint_digest", "load_any",
           "load_checkpoint", "save_checkpoint"]


def __getattr__(name: str):
    if name in _TORCH_FREE_NAMES:
        return getattr(importlib.import_module(f".{_TORCH_FREE_NAMES[name]}", __name__), name)
    module = _TORCH_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'ortformer.models' has no attribute {name!r}")
    from ..core.errors import require_torch

    require_torch("ortformer.models")
    return getattr(importlib.import_module(f".{module}", __name__), name)


def __dir__():
    return sorted(set(globals()) | set(__all__))
