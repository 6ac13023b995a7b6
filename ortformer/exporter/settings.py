"""The grouped arguments of ``export()``: how the graph is built, how the file reads texts, where
the weights came from, and how the file is gated.

``export(model, path, graph=GraphOptions(dtype="float16"), text=TextSettings(tokenizer=...),
provenance=Provenance(source=...), gate=GateOptions(parity=False))``. The flat keywords of older
calls (``dtype=``, ``tokenizer=``, ``text_max_length=``, ``source=``, ``parity=``, ...) still work:
``grouped`` files each into its group (FLAT_KEYWORDS), over the group given, if any.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

# what an import carries to the export lives beside Loaded, the layer below
from ..models.loaded import Provenance, TextSettings

__all__ = ["GraphOptions", "TextSettings", "Provenance", "GateOptions", "FLAT_KEYWORDS", "grouped"]

# opset 18 is the default: the lowest the dynamo exporter emits (export.py says why)
DEFAULT_OPSET = 18


@dataclass(frozen=True)
class GraphOptions:
    """How the ONNX graph is built.

    opset: 18..22. dtype / quantize: "float16" weights and activations, or quantize="int8"
    (exporter/int8.py: per-row scales) of a float32 export; both gated on cosine against the
    float32 eager model. fused_ops: onnxruntime's fused contrib kernels (com.microsoft
    MultiHeadAttention for softmax attention, Gelu); False keeps the graph to standard ONNX ops.
    chunked: for float32 linear-family models, also write the chunk stages that let the runtime
    run sequences of any length chunk by chunk (and stream causal models), gated on cases longer
    than one chunk. padding: "any" gives the fused attention the (B, N) 0/1 mask; "right" gives
    it one key length per row, (B,) int32 = sum of the row's mask, the form onnxruntime's fused
    CUDA kernels accept (docs/gpu.md), true only of right-padded rows: the file records it
    (ortformer.padding) and the Runtime right-aligns other rows before the call
    (runtime/right_padding.py). Needs fused_ops and a fusable softmax attention."""
    opset: int = DEFAULT_OPSET
    dtype: str = "float32"
    quantize: str | None = None
    fused_ops: bool = True
    chunked: bool = True
    padding: str = "any"

    @property
    def precision(self) -> str:
        """"int8", else the dtype: the parity gate's row."""
        return self.quantize or self.dtype


@dataclass(frozen=True)
class GateOptions:
    """The parity gate. parity: False skips it (recorded as skipped); reference: the eager model
    compared against (default: the exported model); keep_failed: where to keep a file that
    failed the gate, for inspection."""
    parity: bool = True
    reference: Any = None
    keep_failed: Path | str | None = None


# the flat keywords export() took before the groups: keyword -> (group, field)
FLAT_KEYWORDS = {
    "opset": ("graph", "opset"), "dtype": ("graph", "dtype"), "quantize": ("graph", "quantize"),
    "fused_ops": ("graph", "fused_ops"), "chunked": ("graph", "chunked"),
    "padding": ("graph", "padding"),
    "tokenizer": ("text", "tokenizer"), "text_max_length": ("text", "max_length"),
    "text_lowercase": ("text", "lowercase"), "prompts": ("text", "prompts"),
    "default_prompt": ("text", "default_prompt"), "late": ("text", "late"),
    "rerank": ("text", "rerank"),
    "source": ("provenance", "source"), "family": ("provenance", "family"), "labels": ("provenance", "labels"),
    "parity": ("gate", "parity"), "reference": ("gate", "reference"), "keep_failed": ("gate", "keep_failed"),
}
GROUPS = {"graph": GraphOptions, "text": TextSettings, "provenance": Provenance, "gate": GateOptions}


def grouped(groups: Mapping[str, Any], flat: Mapping[str, Any]) -> dict[str, Any]:
    """{group name: its object}: each group as given (None: its defaults), with the flat keywords
    of older calls set over it. TypeError for a keyword export() does not take, or a group of the
    wrong type."""
    unknown = sorted(set(flat) - set(FLAT_KEYWORDS))
    if unknown:
        raise TypeError(f"export() got unexpected keyword argument(s) {unknown}")
    result = {}
    for name, kind in GROUPS.items():
        given = groups.get(name)
        if given is not None and not isinstance(given, kind):
            raise TypeError(f"export(): {name}= takes a {kind.__name__}, got {type(given).__name__}")
        changes = {key: flat[keyword] for keyword, (group, key) in FLAT_KEYWORDS.items()
                   if group == name and keyword in flat}
        result[name] = dataclasses.replace(given or kind(), **changes)
    return result
