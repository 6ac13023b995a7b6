"""ONNX translations to onnxruntime's fused contrib kernels (torch.onnx custom_translation_table).

- masked_softmax_attention becomes ``com.microsoft.MultiHeadAttention`` with a (B, N)
  int32 key padding mask: one kernel per layer instead of MatMul -> Add -> Softmax ->
  MatMul with (B, H, N, N) intermediates in the graph.
- projected_softmax_attention (nothing between the QKV projection and the attention: no rotary, q / k
  norm, shared K / V heads or position bias) becomes the same kernel with the projection's bias as its
  bias input (3A,), which the kernel adds while splitting the heads (separate 3-D q, k and v, the
  form whose bias onnxruntime accepts: packed K / V refuses one).
- biased_softmax_attention (a relative position bias, a local window) becomes the same
  kernel with its attention_bias input.
- rotary_heads (rotary positions of softmax models) becomes ``com.microsoft.RotaryEmbedding``,
  one kernel instead of Split/Neg/Concat/Mul/Mul/Add per q and k.
- with padding="right", both attentions take key lengths (B,) int32 instead of the (B, N) mask
  (key_lengths): the mask form onnxruntime's fused CUDA kernels accept (docs/gpu.md).
- half_layer_norm (a float16 LayerNorm with float32 statistics) becomes one float16 ONNX
  LayerNormalization with stash_type=1, not Cast -> float32 LayerNormalization -> Cast: onnxruntime
  fuses it with the residual Add into SkipLayerNormalization, in float16 with float32 accumulation.
- half_rms_norm (a float16 RMSNorm computed in float32) becomes one float16
  SimplifiedLayerNormalization, onnxruntime's RMSNorm op: its CPU and CUDA kernels take float16 X and
  scale and accumulate in float32 (U = float). onnxruntime registers it in the ONNX domain (version 1),
  which onnx itself does not define: SIMPLIFIED_LAYER_NORM registers its schema with onnx, so
  onnx.checker in this process accepts the node. ONNX's own RMSNormalization needs opset 23.
- aten.gelu becomes ``com.microsoft.Gelu``: the exporter's erf decomposition
  (x * 0.5 * (1 + erf(x * 0.7071))) is not matched by onnxruntime's GeluFusion, while
  a Gelu node lets onnxruntime fold the preceding bias Add into BiasGelu.
"""
from __future__ import annotations

import onnx
import onnxscript
import torch
from onnx.defs import OpSchema
from onnxscript import opset18 as op

from ..models import attention  # noqa: F401  defines torch.ops.ortformer.masked_softmax_attention
from ..models import layers  # noqa: F401  defines torch.ops.ortformer.half_layer_norm, half_rms_norm

MICROSOFT = onnxscript.values.Opset("com.microsoft", 1)


def _mha_schema() -> OpSchema:
    """The part of the contrib op's signature we use; onnx itself has no schema for it."""
    param, optional = OpSchema.FormalParameter, OpSchema.FormalParameterOption.Optional
    return OpSchema(
        "MultiHeadAttention", "com.microsoft", 1,
        inputs=[param("query", "T"), param("key", "T", param_option=optional),
                param("value", "T", param_option=optional), param("bias", "T", param_option=optional),
                param("key_padding_mask", "M", param_option=optional),
                param("attention_bias", "T", param_option=optional)],
        outputs=[param("output", "T")],
        type_constraints=[("T", ["tensor(float)", "tensor(float16)"], ""), ("M", ["tensor(int32)"], "")],
        attributes=[OpSchema.Attribute("num_heads", OpSchema.AttrType.INT, "", required=True)],
    )


MULTI_HEAD_ATTENTION = onnxscript.values.Op(MICROSOFT, "MultiHeadAttention", _mha_schema())


def _rotary_schema() -> OpSchema:
    param = OpSchema.FormalParameter
    return OpSchema(
        "RotaryEmbedding", "com.microsoft", 1,
        inputs=[param("input", "T"), param("position_ids", "M"), param("cos_cache", "T"), param("sin_cache", "T")],
        outputs=[param("output", "T")],
        type_constraints=[("T", ["tensor(float)", "tensor(float16)"], ""), ("M", ["tensor(int64)"], "")],
        attributes=[OpSchema.Attribute("num_heads", OpSchema.AttrType.INT, "", required=True),
                    OpSchema.Attribute("interleaved", OpSchema.AttrType.INT, "", required=True)],
    )


ROTARY_EMBEDDING = onnxscript.values.Op(MICROSOFT, "RotaryEmbedding", _rotary_schema())


def _unary_schema(name: str) -> OpSchema:
    param = OpSchema.FormalParameter
    return OpSchema(name, "com.microsoft", 1, inputs=[param("X", "T")], outputs=[param("Y", "T")],
                    type_constraints=[("T", ["tensor(float)", "tensor(float16)"], "")])


GELU = onnxscript.values.Op(MICROSOFT, "Gelu", _unary_schema("Gelu"))
FAST_GELU = onnxscript.values.Op(MICROSOFT, "FastGelu", _unary_schema("FastGelu"))


def _simplified_layer_norm_schema() -> OpSchema:
    """onnxruntime's SimplifiedLayerNormalization (contrib_defs.cc): Y = X / sqrt(mean(X^2) + epsilon) * scale
    over the axes from `axis`; U is the type of its statistics (float for float16 X); output 2 (1 / rms)
    is optional and not written here."""
    param, optional = OpSchema.FormalParameter, OpSchema.FormalParameterOption.Optional
    return OpSchema(
        "SimplifiedLayerNormalization", "", 1,
        inputs=[param("X", "T"), param("scale", "V")],
        outputs=[param("Y", "V"), param("inv_std_var", "U", param_option=optional)],
        type_constraints=[("T", ["tensor(float)", "tensor(float16)"], ""), ("U", ["tensor(float)"], ""),
                          ("V", ["tensor(float)", "tensor(float16)"], "")],
        attributes=[OpSchema.Attribute("axis", OpSchema.AttrType.INT, ""),
                    OpSchema.Attribute("epsilon", OpSchema.AttrType.FLOAT, ""),
                    OpSchema.Attribute("stash_type", OpSchema.AttrType.INT, "")],
    )


def _registered(schema: OpSchema) -> OpSchema:
    """schema, registered with onnx once per process so that onnx.checker knows the node."""
    if not onnx.defs.has(schema.name, schema.domain):
        onnx.defs.register_schema(schema)
    return schema


SIMPLIFIED_LAYER_NORM = onnxscript.values.Op(op, "SimplifiedLayerNormalization",
                                             _registered(_simplified_layer_norm_schema()))


def gelu(x, approximate: str = "none"):
    """erf GELU (and the tanh approximation) as one contrib node."""
    return FAST_GELU(x) if approximate == "tanh" else GELU(x)


def padding_mask(key_mask):
    """(B, N) mask -> MultiHeadAttention's (B, N) int32 key_padding_mask."""
    return op.Cast(key_mask, to=onnx.TensorProto.INT32)


def key_lengths(key_mask):
    """(B, N) mask -> (B,) int32 max(sum of the row, 1): onnxruntime's MASK_1D_KEY_SEQ_LEN, keys
    0..len-1 kept. True of right-padded rows only (the Runtime right-aligns the others). A fully
    padded row gets length 1, not 0: every kernel then has a key to average (finite), and the
    model zeroes that row after attention anyway."""
    lengths = op.ReduceSum(op.Cast(key_mask, to=onnx.TensorProto.INT32), op.Constant(value_ints=[1]), keepdims=0)
    return op.Max(lengths, op.CastLike(op.Constant(value_int=1), lengths))


def attention_translations(mask_input) -> dict:
    """The softmax attention ops as MultiHeadAttention nodes whose mask input is mask_input(key_mask):
    padding_mask, or key_lengths for padding="right"."""

    def multi_head_attention(q, k, v, key_mask, num_heads: int):
        """(B, N, F) q, k, v and a (B, N) mask -> (B, N, F)."""
        return MULTI_HEAD_ATTENTION(q, k, v, None, mask_input(key_mask), num_heads=num_heads)

    def projected_multi_head_attention(q, k, v, bias, key_mask, num_heads: int):
        """multi_head_attention of q + b_q, k + b_k, v + b_v, bias = [b_q | b_k | b_v] (3F,)."""
        return MULTI_HEAD_ATTENTION(q, k, v, bias, mask_input(key_mask), num_heads=num_heads)

    def biased_multi_head_attention(q, k, v, key_mask, scores_bias, num_heads: int):
        """As multi_head_attention, plus an additive (1|B, 1|H, N, N) attention_bias (input 5),
        which onnxruntime broadcasts over batch and heads."""
        return MULTI_HEAD_ATTENTION(q, k, v, None, mask_input(key_mask), scores_bias, num_heads=num_heads)

    return {torch.ops.ortformer.masked_softmax_attention.default: multi_head_attention,
            torch.ops.ortformer.biased_softmax_attention.default: biased_multi_head_attention,
            torch.ops.ortformer.projected_softmax_attention.default: projected_multi_head_attention}


def rotary_heads(x, cos, sin, num_heads: int):
    """(B, N, F) x and (N, D) tables -> (B, N, F). RotaryEmbedding takes the first D/2
    columns (the angles; the second half repeats them) as caches, and a (1,) position_ids
    meaning positions 0..N-1; interleaved=0 is the rotate-half convention."""
    start, half, axis = op.Constant(value_ints=[0]), op.Div(op.Shape(cos, start=1), op.Constant(value_ints=[2])), \
        op.Constant(value_ints=[1])
    return ROTARY_EMBEDDING(x, op.Constant(value_ints=[0]), op.Slice(cos, start, half, axis),
                            op.Slice(sin, start, half, axis), num_heads=num_heads, interleaved=0)


def half_layer_norm(x, weight, bias, eps: float):
    """ONNX LayerNormalization over the last axis on float16 x, weight and bias; stash_type=1:
    mean and variance in float32 (ONNX's definition), the output float16."""
    normed, _, _ = op.LayerNormalization(x, weight, bias, axis=-1, epsilon=eps, stash_type=1)  # (Y, Mean, InvStdDev)
    return normed


def half_rms_norm(x, weight, eps: float):
    """SimplifiedLayerNormalization over the last axis on float16 x and weight: mean(x^2) and the
    normalisation in float32 (stash_type=1), the output float16."""
    normed, _ = SIMPLIFIED_LAYER_NORM(x, weight, axis=-1, epsilon=eps, stash_type=1)  # (Y, inv_std_var)
    return normed


TRANSLATIONS = {
    **attention_translations(padding_mask),
    torch.ops.ortformer.rotary_heads.default: rotary_heads,
    torch.ops.aten.gelu.default: gelu,
    torch.ops.ortformer.half_layer_norm.default: half_layer_norm,
    torch.ops.ortformer.half_rms_norm.default: half_rms_norm,
}

# padding="right": the attention takes key lengths instead of the (B, N) mask
RIGHT_PADDING_TRANSLATIONS = {**TRANSLATIONS, **attention_translations(key_lengths)}


def translations(padding: str = "any") -> dict:
    """The custom translation table for an export with this padding ("any" or "right")."""
    return RIGHT_PADDING_TRANSLATIONS if padding == "right" else TRANSLATIONS
