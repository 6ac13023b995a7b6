"""ONNX translations for ortformer's own torch ops (torch.onnx custom_translation_table).

masked_softmax_attention becomes onnxruntime's contrib ``com.microsoft.MultiHeadAttention``
with a (B, N) int32 key padding mask: one fused kernel per layer instead of
MatMul -> Add -> Softmax -> MatMul with (B, H, N, N) intermediates in the graph.
"""
from __future__ import annotations

import onnx
import onnxscript
import torch
from onnx.defs import OpSchema
from onnxscript import opset18 as op

from ..models.attention import masked_softmax_attention

MICROSOFT = onnxscript.values.Opset("com.microsoft", 1)


def _mha_schema() -> OpSchema:
    """The part of the contrib op's signature we use; onnx itself has no schema for it."""
    param, optional = OpSchema.FormalParameter, OpSchema.FormalParameterOption.Optional
    return OpSchema(
        "MultiHeadAttention", "com.microsoft", 1,
        inputs=[param("query", "T"), param("key", "T", param_option=optional),
                param("value", "T", param_option=optional), param("bias", "T", param_option=optional),
                param("key_padding_mask", "M", param_option=optional)],
        outputs=[param("output", "T")],
        type_constraints=[("T", ["tensor(float)", "tensor(float16)"], ""), ("M", ["tensor(int32)"], "")],
        attributes=[OpSchema.Attribute("num_heads", OpSchema.AttrType.INT, "", required=True)],
    )


MULTI_HEAD_ATTENTION = onnxscript.values.Op(MICROSOFT, "MultiHeadAttention", _mha_schema())


def multi_head_attention(q, k, v, key_mask, num_heads: int):
    """(B, N, F) q, k, v and a (B, N) mask -> (B, N, F)."""
    return MULTI_HEAD_ATTENTION(q, k, v, None, op.Cast(key_mask, to=onnx.TensorProto.INT32), num_heads=num_heads)


TRANSLATIONS = {torch.ops.ortformer.masked_softmax_attention.default: multi_head_attention}
assert masked_softmax_attention is not None  # the op must be defined before the table is used
