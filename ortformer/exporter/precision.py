"""Reduced-precision variants of an exported encoder.

- float16: the traced module runs in half precision between float32 inputs and
  outputs (the ONNX contract stays float32); LayerNorm/RMSNorm statistics, softmax
  over positions and the linear-family sequence sums stay in float32 inside the
  kernels. Meant for CUDA; onnxruntime's CPU provider runs it too (slowly), which is
  where the parity gate checks it.
- int8: the weight MatMuls with per-row activation scales (exporter/int8.py), so a
  row's embedding never depends on its batch. Attention's activation-by-activation
  products stay float.
Both are gated on cosine against the float32 eager model (parity.GATES).
"""
from __future__ import annotations

import copy
from pathlib import Path

from torch import nn

from ..core.errors import ExportError

DTYPES = ("float32", "float16")
QUANTIZATIONS = ("int8",)


class Float16Encoder(nn.Module):
    """float32 in, float32 out, float16 inside. Leaves the wrapped model untouched."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.inner = copy.deepcopy(model).half()
        self.config = model.config

    def forward(self, inputs, attention_mask, token_type_ids=None):
        if inputs.is_floating_point():
            inputs = inputs.half()
        args = (inputs, attention_mask) + ((token_type_ids,) if token_type_ids is not None else ())
        return {name: value.float() for name, value in self.inner(*args).items()}


def calibration_feeds(cfg, tokenizer, lowercase: bool = False) -> tuple[list[dict], str]:
    """Inputs the int8 calibration runs the float model on, and a phrase saying what they are.
    tokenizer: a TextEncoder (used as it is), a tokenizer.json path, or None.

    Real sentences through the tokenizer when there is one (distinct from the 48 the text
    parity check reports on), else random ids with right padding, as the parity grid makes.
    """
    import numpy as np

    from .. import contract
    from ..contract.parity import Case, make_inputs

    if tokenizer is not None and cfg.takes_ids:
        from ..core.corpus import sentences
        from ..core.errors import MissingExtraError, ModelFileError
        from ..runtime.batching import pad
        from ..config.text import TruncationWarning, text_encoder
        import warnings

        try:
            encoder = text_encoder(tokenizer, lowercase)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", TruncationWarning)
                ids, _, _ = encoder.encode(sentences(144)[48:], min(cfg.max_positions, 256))
            arrays = [np.asarray(i, np.int64) for i in ids]
            if max(int(a.max()) for a in arrays) < cfg.vocab_size:
                feeds = []
                for start in range(0, len(arrays), 16):
                    padded, mask = pad(arrays[start:start + 16])
                    feed = {contract.INPUT_IDS: padded, contract.ATTENTION_MASK: mask}
                    if cfg.type_vocab_size:
                        feed[contract.TOKEN_TYPE_IDS] = np.zeros_like(mask)
                    feeds.append(feed)
                return feeds, f"{len(arrays)} real sentences"
        except (MissingExtraError, ModelFileError):
            pass  # a tokenizer that cannot run here: calibrate on random ids instead
    rng = np.random.default_rng(0)
    n = min(cfg.max_positions, 64)
    return [make_inputs(cfg, Case(4, n, "right"), rng) for _ in range(4)], f"16 random rows of {n} tokens"


def quantize_int8(source: Path, target: Path, cfg, tokenizer=None, lowercase: bool = False) -> dict:
    """Batch-invariant int8 (exporter/int8.py); returns the record kept in the model's metadata.
    tokenizer: the calibration's (a TextEncoder, a tokenizer.json path, or None: random ids)."""
    from .int8 import quantize_int8_rows

    feeds, calibration = calibration_feeds(cfg, tokenizer, lowercase)
    try:
        return quantize_int8_rows(source, target, feeds, calibration)
    except Exception as exc:
        raise ExportError(f"int8 quantization failed: {type(exc).__name__}: {exc}") from exc
