"""Import an LFM2 folder (``model_type: lfm2``: Liquid AI's LFM2 models and LFM2-ColBERT, whose
PyLate layout adds the per-token Dense head: late_folders.py).

transformers' Lfm2Model, with RMSNorm n(x) = w * x / sqrt(mean(x^2) + eps) (eps = norm_eps):

    x = embed(ids);  per layer:  x = x + mixer(n_op(x));  x = x + W_2 (silu(W_1 h) * W_3 h), h = n_ffn(x)
    out = n_final(x)                       (transformers names n_final "embedding_norm")

the mixer of a ``full_attention`` layer is causal grouped-query attention over each head's
RMS-normalised q and k (q_layernorm, k_layernorm), rotated rotate-half at the sequence index
(theta from rope_parameters / rope_theta); that of a ``conv`` layer is the gated short convolution
[b; c; h] = W_in (m x), out = W_out (c * conv(b * h)), conv depthwise and causal over conv_L_cache
taps, m the attention mask. This is ortformer's causal pre-norm ``rmsnorm`` encoder with ``qk_norm``,
``ffn_gated`` SwiGLU, ``num_kv_heads`` and the ``short_conv`` group (kernel_size = conv_L_cache,
layers = the conv layers). The SwiGLU width is transformers' (block_auto_adjust_ff_dim: 2/3 of
intermediate_size, times block_ffn_dim_multiplier, rounded up to block_multiple_of).

``conv_bias: true`` is refused: in_proj's bias makes a padded position's b * h non-zero, so in
transformers a left-padded text's first tokens read their padding. The LM head is set aside.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ....core.checks import brief
from ....config import EncoderConfig, ShortConv
from ....core.errors import CheckpointError
from ...loaded import Loaded
from ...weights import Tensors, check_tensors
from ..config_checks import make_config, make_group, refuse, require, rope_theta
from ..family import Family
from ..folder_import import import_folder
from ..folder_layout import HF_DTYPES
from .llama import base_tensors, kv_heads

WHAT = "LFM2 "
REQUIRED = ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers")
# transformers' Lfm2Config defaults, for keys a config.json leaves out
DEFAULTS = {"norm_eps": 1e-5, "max_position_embeddings": 128_000, "num_key_value_heads": 8, "conv_L_cache": 3,
            "block_multiple_of": 256, "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": True,
            "intermediate_size": 12288, "rope_theta": 1_000_000.0}
CONV, FULL = "conv", "full_attention"


def setting(hf: dict, key: str):
    """config.json's ``key`` (null included: a null block_ffn_dim_multiplier turns the rounding off), else
    transformers' default."""
    return hf[key] if key in hf else DEFAULTS[key]


def ffn_size(hf: dict) -> int:
    """Lfm2MLP's width: intermediate_size (or block_ff_dim), with block_auto_adjust_ff_dim 2/3 of it,
    then times block_ffn_dim_multiplier rounded up to block_multiple_of (when the multiplier is set)."""
    size = hf.get("block_ff_dim", setting(hf, "intermediate_size"))
    if setting(hf, "block_auto_adjust_ff_dim"):
        size = int(2 * size / 3)
        multiplier, multiple = setting(hf, "block_ffn_dim_multiplier"), setting(hf, "block_multiple_of")
        if multiplier is not None:
            size = int(multiplier * size)
            size = multiple * ((size + multiple - 1) // multiple)
    return size


def conv_layers(hf: dict, layers: int) -> tuple[int, ...]:
    """The conv layers, from layer_types or (older saves) full_attn_idxs, as transformers reads them."""
    kinds = hf.get("layer_types")
    if kinds is None:
        full = hf.get("full_attn_idxs")
        full = list(range(layers)) if full is None else full
        kinds = [FULL if l in full else CONV for l in range(layers)]
    if not (isinstance(kinds, list) and len(kinds) == layers and set(kinds) <= {CONV, FULL}):
        raise CheckpointError(f"{WHAT}config.json layer_types={brief(kinds, 120)} is not supported; it must list "
                              f"'{CONV}' or '{FULL}' for each of the {layers} layers")
    return tuple(l for l, kind in enumerate(kinds) if kind == CONV)


def lfm2_config(hf: dict, common: dict) -> EncoderConfig:
    require(hf, WHAT.strip(), REQUIRED)
    refuse(hf, "conv_bias", (False,), False, WHAT)
    hf = {**hf, "rope_theta": setting(hf, "rope_theta")}
    layers = hf["num_hidden_layers"]
    convs = conv_layers(hf, layers)
    heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    short_conv = make_group(WHAT.strip(), ShortConv, kernel_size=setting(hf, "conv_L_cache"), layers=convs) if convs else None
    return make_config(
        WHAT.strip(), vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_heads=heads,
        attention_head_size=0 if head_dim * heads == hf["hidden_size"] else head_dim,
        num_kv_heads=kv_heads(hf, WHAT, DEFAULTS["num_key_value_heads"]), num_layers=layers, ffn_size=ffn_size(hf),
        ffn_gated=True, bias=False, attention="softmax", causal=True, qk_norm=True, norm="rmsnorm",
        norm_position="pre", activation="silu", positions="rotary", rotary_theta=rope_theta(hf, DEFAULTS["rope_theta"], WHAT),
        max_positions=setting(hf, "max_position_embeddings"), type_vocab_size=0, norm_eps=setting(hf, "norm_eps"),
        short_conv=short_conv, **common)


def names(cfg: EncoderConfig) -> dict[str, tuple[int, ...]]:
    """Saved tensor name (without "model.") -> shape."""
    f, ffn, a, kv, d = cfg.hidden_size, cfg.ffn_size, cfg.attention_size, cfg.kv_size, cfg.head_size
    convs = cfg.short_conv.layers if cfg.short_conv else ()
    shapes = {"embed_tokens.weight": (cfg.vocab_size, f), "embedding_norm.weight": (f,)}
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        shapes.update({p + "operator_norm.weight": (f,), p + "ffn_norm.weight": (f,),
                       p + "feed_forward.w1.weight": (ffn, f), p + "feed_forward.w3.weight": (ffn, f),
                       p + "feed_forward.w2.weight": (f, ffn)})
        if i in convs:
            shapes.update({p + "conv.in_proj.weight": (3 * f, f), p + "conv.out_proj.weight": (f, f),
                           p + "conv.conv.weight": (f, 1, cfg.short_conv.kernel_size)})
        else:
            shapes.update({p + "self_attn.q_proj.weight": (a, f), p + "self_attn.k_proj.weight": (kv, f),
                           p + "self_attn.v_proj.weight": (kv, f), p + "self_attn.out_proj.weight": (f, a),
                           p + "self_attn.q_layernorm.weight": (d,), p + "self_attn.k_layernorm.weight": (d,)})
    return shapes


def map_weights(raw: Tensors, cfg: EncoderConfig, what: str, duplicates) -> tuple[Tensors, list[str]]:
    kept, dropped = base_tensors(raw, ("lm_head.",))
    check_tensors(kept, names(cfg), dtypes=HF_DTYPES, what=what, duplicates=duplicates)
    convs = cfg.short_conv.layers if cfg.short_conv else ()
    out = {"tokens.weight": kept["embed_tokens.weight"], "norm.weight": kept["embedding_norm.weight"]}
    for i in range(cfg.num_layers):
        p, q = f"layers.{i}.", f"blocks.{i}."
        out[q + "norm1.weight"], out[q + "norm2.weight"] = kept[p + "operator_norm.weight"], kept[p + "ffn_norm.weight"]
        out[q + "ffn.up.weight"] = torch.cat([kept[p + "feed_forward.w1.weight"], kept[p + "feed_forward.w3.weight"]])
        out[q + "ffn.down.weight"] = kept[p + "feed_forward.w2.weight"]
        if i in convs:
            for name in ("in_proj", "out_proj", "conv"):
                out[q + f"attention.{name}.weight"] = kept[p + f"conv.{name}.weight"]
            continue
        attn = p + "self_attn."
        out[q + "attention.qkv.weight"] = torch.cat([kept[attn + f"{n}_proj.weight"] for n in "qkv"])
        out[q + "attention.out.weight"] = kept[attn + "out_proj.weight"]
        out[q + "attention.q_norm.weight"] = kept[attn + "q_layernorm.weight"]
        out[q + "attention.k_norm.weight"] = kept[attn + "k_layernorm.weight"]
    return out, sorted(dropped)


def load(folder, *, pooling: str | None = None, normalize: bool | None = None, name: str | None = None) -> Loaded:
    """Import an LFM2 folder (an LFM2-ColBERT PyLate folder too) as an ortformer Encoder."""
    return import_folder(Path(folder), family="lfm2", build=lfm2_config, map_weights=map_weights,
                         pooling=pooling, normalize=normalize, name=name)


FAMILY = Family("LFM2", ("lfm2",), load)
