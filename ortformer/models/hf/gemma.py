"""Import Gemma 3 text encoders (``gemma3_text``): EmbeddingGemma and other Gemma 3 models run
bidirectionally (``use_bidirectional_attention``).

transformers' Gemma3TextModel, with Gemma's RMSNorm n(x) = (1 + w) * x / sqrt(mean(x^2) + eps):

    x = sqrt(F) * embed_tokens(ids);  per layer:
    x = x + n_post_attn(o(attn(n_in(x))));  x = x + n_post_ffn(down(act(gate(n_pre_ffn x)) * up(n_pre_ffn x)))
    out = n_final(x)

attention over each head's RMS-normalised q and k (q_norm, k_norm), rotated rotate-half at the
sequence index, scores scaled by query_pre_attn_scalar^-1/2; a sliding layer attends to
|i - j| <= sliding_window // 2 (transformers halves the window of a bidirectional model, with
exclusive bounds), a full layer to every key. Layer l is full when (l + 1) % 6 == 0 unless
``layer_types`` lists another pattern; full and sliding layers rotate with their own theta.

This is ortformer's pre-norm ``rmsnorm`` encoder with ``sandwich_norm`` (the post-attention and
post-FFN norms), ``qk_norm``, ``ffn_gated`` and ``local_window = sliding_window`` with
``global_every`` / ``global_offset`` from the pattern. Folded into the weights: every norm weight
stored as 1 + w and the token table multiplied by sqrt(F), the same float32 products transformers
computes; the query norm's weight multiplied by sqrt(D / query_pre_attn_scalar) when the scalar is
not the head size D (ortformer scales scores by 1/sqrt(D); equal in exact arithmetic to
transformers' scaling of the scores, up to rounding). Grouped-query attention is
kept (``num_kv_heads``) as in llama.py. Causal Gemma 3 models (use_bidirectional_attention false) import when every
layer is full (causal attention with a window is not implemented); attention logit soft-capping is refused. The LM
head is set aside; a classifier's "score" Linear is kept (heads.py).
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

from ...config import EncoderConfig
from ...errors import CheckpointError
from ..loaded import Loaded
from ..weights import Tensors, check_tensors
from .activations import ACTIVATIONS
from .folder import HF_DTYPES, import_folder, make_config, read_json, refuse, require, transformer_dir
from .llama import base_tensors, biases, kv_heads, map_linears, names
from .windows import FULL, SLIDING, check_layer_types, global_period, pattern_fields, rope_thetas

WHAT = "Gemma 3 "
BIAS_KEYS = ("attention_bias",)  # Gemma 3 reads this flag only: its MLP never has biases
REQUIRED = ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size")
DROPPED_PREFIXES = ("lm_head.", "score.")
# transformers' Gemma3TextConfig defaults, for keys a config.json leaves out
DEFAULTS = {"head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 4096, "sliding_window_pattern": 6,
            "rms_norm_eps": 1e-6, "max_position_embeddings": 131072, "hidden_activation": "gelu_pytorch_tanh",
            "num_key_value_heads": 4}
DEFAULT_THETA = {FULL: ("rope_theta", 1_000_000.0), SLIDING: ("rope_local_base_freq", 10_000.0)}
NORMS = {"input_layernorm": "norm1", "post_attention_layernorm": "post_attention_norm",
         "pre_feedforward_layernorm": "norm2", "post_feedforward_layernorm": "post_ffn_norm"}


def setting(hf: dict, key: str):
    value = hf.get(key)
    return DEFAULTS[key] if value is None else value


def layer_kinds(hf: dict, layers: int) -> tuple[list[str], str]:
    """(each layer's kind, the config.json key it comes from): layer_types, or the
    sliding_window_pattern's (layer l full when (l + 1) % pattern == 0)."""
    if hf.get("layer_types") is not None:
        return check_layer_types(hf["layer_types"], layers, WHAT), "layer_types"
    pattern = setting(hf, "sliding_window_pattern")
    if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
        raise CheckpointError(f"{WHAT}config.json sliding_window_pattern={pattern!r} is not supported; "
                              "it must be an int >= 1")
    return [SLIDING if (l + 1) % pattern else FULL for l in range(layers)], "sliding_window_pattern"


def gemma_config(hf: dict, common: dict) -> EncoderConfig:
    require(hf, WHAT.strip(), REQUIRED)
    require({key: setting(hf, key) for key in ("head_dim", "query_pre_attn_scalar")}, WHAT.strip(),
            ("head_dim", "query_pre_attn_scalar"))
    activation = setting(hf, "hidden_activation")  # Gemma3TextConfig reads no hidden_act
    if activation not in ACTIVATIONS:
        raise CheckpointError(f"{WHAT}config.json hidden_activation={activation!r} is not supported; ortformer "
                              f"implements {', '.join(map(repr, ACTIVATIONS))}")
    refuse(hf, "attn_logit_softcapping", (None,), None, WHAT)
    bidirectional = hf.get("use_bidirectional_attention") or False
    if not isinstance(bidirectional, bool):
        raise CheckpointError(f"{WHAT}config.json use_bidirectional_attention={bidirectional!r} must be true or false")
    kv = kv_heads(hf, WHAT, DEFAULTS["num_key_value_heads"])
    layers, heads = hf["num_hidden_layers"], hf["num_attention_heads"]
    kinds, source = layer_kinds(hf, layers)
    every, offset = global_period(kinds, WHAT, source)
    if every > 1 and not bidirectional:
        raise CheckpointError(f"{WHAT}config.json use_bidirectional_attention={bidirectional} with sliding-window "
                              "layers is not supported: ortformer imports causal Gemma 3 models with full attention "
                              "in every layer, and bidirectional ones (EmbeddingGemma) with sliding windows")
    # a null window is no window at all (transformers cannot load such a config): refused below
    window = hf.get("sliding_window", DEFAULTS["sliding_window"]) if every > 1 else 0
    if every > 1 and (isinstance(window, bool) or not isinstance(window, int) or window < 2):
        raise CheckpointError(f"{WHAT}config.json sliding_window={window!r} is not supported; ortformer implements "
                              "windows of an int >= 2 tokens")
    pattern = pattern_fields(window, every, offset, rope_thetas(hf, DEFAULT_THETA, WHAT))
    head_dim = setting(hf, "head_dim")
    return make_config(
        WHAT.strip(), vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_heads=heads,
        attention_head_size=0 if head_dim * heads == hf["hidden_size"] else head_dim, num_kv_heads=kv,
        num_layers=layers, ffn_size=hf["intermediate_size"], ffn_gated=True, bias=bool(biases(hf, WHAT, keys=BIAS_KEYS)),
        attention="softmax", causal=not bidirectional, qk_norm=True, norm="rmsnorm", norm_position="pre",
        sandwich_norm=True, activation=ACTIVATIONS[activation], positions="rotary", **pattern,
        max_positions=setting(hf, "max_position_embeddings"),
        type_vocab_size=0, norm_eps=setting(hf, "rms_norm_eps"), **common)


def map_weights(raw: Tensors, cfg: EncoderConfig, what: str, duplicates, biased: frozenset[str],
                query_scalar: float) -> tuple[Tensors, list[str]]:
    """Check a Gemma 3 state dict and map it, folding (1 + w), sqrt(F) and the query scale."""
    kept, dropped = base_tensors(raw, DROPPED_PREFIXES)
    check_tensors(kept, names(cfg, biased, tuple(NORMS)), dtypes=HF_DTYPES, what=what, duplicates=duplicates)

    def unit_offset(name: str) -> torch.Tensor:  # Gemma's norms multiply by 1 + w, in float32
        return 1.0 + kept[name].float()

    # the same float32 product transformers' scaled embedding computes per looked-up row
    scale = torch.tensor(cfg.hidden_size ** 0.5, dtype=torch.float32)
    out = {"tokens.weight": kept["embed_tokens.weight"].float() * scale, "norm.weight": unit_offset("norm.weight"),
           **map_linears(kept, cfg)}
    query = math.sqrt(cfg.head_size / query_scalar)
    for i in range(cfg.num_layers):
        p, q = f"layers.{i}.", f"blocks.{i}."
        for theirs, ours in NORMS.items():
            out[f"{q}{ours}.weight"] = unit_offset(f"{p}{theirs}.weight")
        q_norm = unit_offset(p + "self_attn.q_norm.weight")
        out[q + "attention.q_norm.weight"] = q_norm if query == 1.0 else q_norm * query
        out[q + "attention.k_norm.weight"] = unit_offset(p + "self_attn.k_norm.weight")
    return out, sorted(dropped)


def load(folder, *, pooling: str | None = None, normalize: bool | None = None, name: str | None = None) -> Loaded:
    """Import a Gemma 3 text folder as an ortformer Encoder."""
    hf = read_json(transformer_dir(Path(folder)) / "config.json")

    def weights(raw, cfg, where, duplicates):
        scalar = setting(hf, "query_pre_attn_scalar")
        return map_weights(raw, cfg, where, duplicates, biases(hf, WHAT, keys=BIAS_KEYS), scalar)

    return import_folder(folder, family="gemma3_text", build=gemma_config, map_weights=weights,
                         pooling=pooling, normalize=normalize, name=name)
