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
post-FFN norms), ``qk_norm``, ``ffn_gated`` and a local_attention group (``window = sliding_window``,
``global_every`` / ``global_offset`` from the pattern). Folded into the weights: every norm weight
stored as 1 + w and the token table multiplied by sqrt(F), the same float32 products transformers
computes; the query norm's weight multiplied by sqrt(D / query_pre_attn_scalar) when the scalar is
not the head size D (ortformer scales scores by 1/sqrt(D); equal in exact arithmetic to
transformers' scaling of the scores, up to rounding). Grouped-query attention is
kept (``num_kv_heads``) as in llama.py. Causal Gemma 3 models (use_bidirectional_attention false: Gemma 3
classifiers) have the causal window i - w < j <= i in their sliding layers, a causal local_attention
``window`` of 2w - 1 (windows.causal_pattern); attention logit soft-capping is
refused (transformers' Gemma 3 never applies it, whatever config.json says). The LM
head is set aside; a classifier's "score" Linear is kept (heads.py).

Gemma 2 (``gemma2``: Gemma 2 classifiers and reward models, bge-multilingual-gemma2) is the same
layer without q / k norms, causal, with attention logit soft-capping: scores c tanh(s / c) with
c = attn_logit_softcapping (``attention_softcap``) before the mask. Its query_pre_attn_scalar is
folded into the query Linear's rows (sqrt(D / s)). Its sliding layers (every other one by
default) have the causal window i - w < j <= i, as causal Gemma 3's. The final
logit soft-capping belongs to the LM head, which is dropped.

Gemma (``gemma``: Gemma 1 classifiers and embedders) is Llama's layer with Gemma's (1 + w) RMSNorms,
the token table times sqrt(F), GeGLU (``hidden_act`` "gelu" is read as the tanh approximation, as
transformers reads it) and its own head size: no sandwich norms, q / k norms, cap or query scalar.
It runs causally; use_bidirectional_attention true is refused, as for Gemma 2 (refuse_bidirectional).
"""
from __future__ import annotations

import math

import torch

from ....config import EncoderConfig
from ....core.errors import CheckpointError
from ...loaded import Loaded
from ...weights import Tensors, check_tensors
from ..activations import ACTIVATIONS
from ..config_checks import make_config, refuse, require, rope_theta
from ..folder_import import import_folder
from ..folder_files import FolderFiles
from ..folder_layout import HF_DTYPES
from ..family import Family
from .llama import base_tensors, biases, kv_heads, map_linears, names
from ..windows import FULL, SLIDING, causal_pattern, check_layer_types, global_period, pattern_fields, rope_thetas

WHAT = "Gemma 3 "
WHAT_2 = "Gemma 2 "
WHAT_1 = "Gemma "
BIAS_KEYS = ("attention_bias",)  # Gemma 2 / 3 read this flag only: their MLP never has biases
REQUIRED = ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size")
DROPPED_PREFIXES = ("lm_head.", "score.")
# transformers' Gemma3TextConfig defaults, for keys a config.json leaves out
DEFAULTS = {"head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 4096, "sliding_window_pattern": 6,
            "rms_norm_eps": 1e-6, "max_position_embeddings": 131072, "hidden_activation": "gelu_pytorch_tanh",
            "num_key_value_heads": 4}
# Gemma2Config's, where they differ (its layer pattern, even layers sliding, is fixed: gemma2_config)
DEFAULTS_2 = {**DEFAULTS, "max_position_embeddings": 8192}
SOFTCAP_2 = 50.0  # Gemma2Config's attn_logit_softcapping
DEFAULT_THETA = {FULL: ("rope_theta", 1_000_000.0), SLIDING: ("rope_local_base_freq", 10_000.0)}
NORMS = {"input_layernorm": "norm1", "post_attention_layernorm": "post_attention_norm",
         "pre_feedforward_layernorm": "norm2", "post_feedforward_layernorm": "post_ffn_norm"}
NORMS_1 = {"input_layernorm": "norm1", "post_attention_layernorm": "norm2"}  # Gemma 1: Llama's two
# GemmaConfig's, for the keys Gemma 1 reads (hidden_act where Gemma 2 / 3 read hidden_activation; no
# query_pre_attn_scalar: scores are scaled by 1 / sqrt(head_dim))
DEFAULTS_1 = {"head_dim": 256, "rms_norm_eps": 1e-6, "max_position_embeddings": 8192, "num_key_value_heads": 16,
              "hidden_act": "gelu_pytorch_tanh"}
DEFAULTS_BY_TYPE = {"gemma2": DEFAULTS_2, "gemma": DEFAULTS_1}


def defaults(hf: dict) -> dict:
    """The defaults of config.json's model_type's config class."""
    return DEFAULTS_BY_TYPE.get(hf.get("model_type"), DEFAULTS)


def setting(hf: dict, key: str):
    """config.json's ``key``, else its config class's default."""
    value = hf.get(key)
    return defaults(hf)[key] if value is None else value


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


def shared_fields(hf: dict, what: str, activation_key: str = "hidden_activation", activation: str | None = None) -> dict:
    """The EncoderConfig fields Gemma 1, 2 and 3 read alike, defaults from setting(); Gemma 2 / 3 add
    sandwich norms and check their query_pre_attn_scalar. ``activation`` (default: config.json's
    ``activation_key``) is a transformers name."""
    require(hf, what.strip(), REQUIRED)
    scalars = tuple(key for key in ("head_dim", "query_pre_attn_scalar") if key in defaults(hf))
    require({key: setting(hf, key) for key in scalars}, what.strip(), scalars)
    activation = setting(hf, activation_key) if activation is None else activation
    if activation not in ACTIVATIONS:
        raise CheckpointError(f"{what}config.json {activation_key}={activation!r} is not supported; ortformer "
                              f"implements {', '.join(map(repr, ACTIVATIONS))}")
    heads, head_dim = hf["num_attention_heads"], setting(hf, "head_dim")
    return dict(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_heads=heads,
        attention_head_size=0 if head_dim * heads == hf["hidden_size"] else head_dim,
        num_kv_heads=kv_heads(hf, what, defaults(hf)["num_key_value_heads"]), num_layers=hf["num_hidden_layers"],
        ffn_size=hf["intermediate_size"], ffn_gated=True, bias=bool(biases(hf, what, keys=BIAS_KEYS)),
        attention="softmax", norm="rmsnorm", norm_position="pre", activation=ACTIVATIONS[activation],
        positions="rotary", type_vocab_size=0, norm_eps=setting(hf, "rms_norm_eps"))


def softcap(hf: dict, what: str, default: float | None) -> float:
    """attention_softcap from attn_logit_softcapping (``default`` when absent; null: 0, none)."""
    cap = hf.get("attn_logit_softcapping", default)
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 0 < cap < math.inf):
        raise CheckpointError(f"{what}config.json attn_logit_softcapping={cap!r} is not supported; it must be "
                              "a number > 0, or null for none")
    return float(cap or 0.0)


def gemma_config(hf: dict, common: dict) -> EncoderConfig:
    fields = shared_fields(hf, WHAT)
    # transformers' Gemma 3 attention passes no soft-cap to its kernels: a value here is one it never applies
    refuse(hf, "attn_logit_softcapping", (None,), None, WHAT)
    bidirectional = hf.get("use_bidirectional_attention") or False
    if not isinstance(bidirectional, bool):
        raise CheckpointError(f"{WHAT}config.json use_bidirectional_attention={bidirectional!r} must be true or false")
    kinds, source = layer_kinds(hf, hf["num_hidden_layers"])
    every, offset = global_period(kinds, WHAT, source)
    # a null window is no window at all (transformers cannot load such a config): refused below
    window = hf.get("sliding_window", DEFAULTS["sliding_window"]) if every > 1 else 0
    if every > 1 and (isinstance(window, bool) or not isinstance(window, int) or window < 2):
        raise CheckpointError(f"{WHAT}config.json sliding_window={window!r} is not supported; ortformer implements "
                              "windows of an int >= 2 tokens")
    thetas, longest = rope_thetas(hf, DEFAULT_THETA, WHAT), setting(hf, "max_position_embeddings")
    if bidirectional:  # transformers halves a bidirectional window: |i - j| <= w // 2, local_attention.window w
        pattern = pattern_fields(window, every, offset, thetas, WHAT)
    else:  # the causal i - w < j <= i
        pattern, longest = causal_pattern(kinds, window or None, longest, thetas, WHAT)
    return make_config(WHAT.strip(), **fields, sandwich_norm=True, causal=not bidirectional, qk_norm=True, **pattern,
                       max_positions=longest, **common)


def refuse_bidirectional(hf: dict, what: str) -> None:
    """Gemma 1 / 2 with use_bidirectional_attention true: transformers builds a causal mask whatever it
    says, and only its SDPA path without padding (no mask passed) then runs bidirectionally, so the
    flag names no one model; refused."""
    if hf.get("use_bidirectional_attention"):
        raise CheckpointError(f"{what}config.json use_bidirectional_attention={hf['use_bidirectional_attention']!r} "
                              f"is not supported: transformers' {what.strip()} model masks causally with eager "
                              "attention or padding and runs bidirectionally only under SDPA without padding; "
                              "ortformer imports the causal model (set it to false)")


def gemma2_config(hf: dict, common: dict) -> EncoderConfig:
    fields = shared_fields(hf, WHAT_2)
    refuse_bidirectional(hf, WHAT_2)
    layers = hf["num_hidden_layers"]
    if hf.get("layer_types") is not None:
        kinds = check_layer_types(hf["layer_types"], layers, WHAT_2)
    else:  # Gemma2Config's: even layers slide
        kinds = [SLIDING if (l + 1) % 2 else FULL for l in range(layers)]
    window = hf.get("sliding_window", DEFAULTS["sliding_window"]) if SLIDING in kinds else None
    if SLIDING in kinds and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise CheckpointError(f"{WHAT_2}config.json sliding_window={window!r} is not supported with sliding "
                              "layers; it must be an int >= 1")
    refuse(hf, "rope_scaling", (None,), None, WHAT_2)
    theta = rope_theta(hf, 10000.0, WHAT_2)
    # the causal window i - w < j <= i of the sliding layers (windows.causal_pattern)
    pattern, longest = causal_pattern(kinds, window, setting(hf, "max_position_embeddings"),
                                      {FULL: theta, SLIDING: theta}, WHAT_2)
    return make_config(WHAT_2.strip(), **fields, sandwich_norm=True, causal=True, qk_norm=False,
                       attention_softcap=softcap(hf, WHAT_2, SOFTCAP_2),
                       **pattern, max_positions=longest, **common)


def gemma1_config(hf: dict, common: dict) -> EncoderConfig:
    refuse_bidirectional(hf, WHAT_1)
    refuse(hf, "rope_scaling", (None,), None, WHAT_1)
    activation = setting(hf, "hidden_act")
    activation = "gelu_pytorch_tanh" if activation == "gelu" else activation  # GemmaConfig's legacy reading
    return make_config(WHAT_1.strip(), **shared_fields(hf, WHAT_1, "hidden_act", activation), causal=True,
                       rotary_theta=rope_theta(hf, 10000.0, WHAT_1),
                       max_positions=setting(hf, "max_position_embeddings"), **common)


def map_weights(raw: Tensors, cfg: EncoderConfig, what: str, duplicates, biased: frozenset[str],
                query_scalar: float) -> tuple[Tensors, list[str]]:
    """Check a Gemma 1 / 2 / 3 state dict and map it, folding (1 + w), sqrt(F) and the query scale
    (into the query norm's weight, or without q / k norms (Gemma 2) into the query Linear's rows)."""
    norms = NORMS if cfg.sandwich_norm else NORMS_1
    kept, dropped = base_tensors(raw, DROPPED_PREFIXES)
    check_tensors(kept, names(cfg, biased, tuple(norms)), dtypes=HF_DTYPES, what=what, duplicates=duplicates)

    def unit_offset(name: str) -> torch.Tensor:  # Gemma's norms multiply by 1 + w, in float32
        return 1.0 + kept[name].float()

    # the same float32 product transformers' scaled embedding computes per looked-up row
    scale = torch.tensor(cfg.hidden_size ** 0.5, dtype=torch.float32)
    out = {"tokens.weight": kept["embed_tokens.weight"].float() * scale, "norm.weight": unit_offset("norm.weight"),
           **map_linears(kept, cfg, query_scale=1.0 if cfg.qk_norm else math.sqrt(cfg.head_size / query_scalar))}
    query = math.sqrt(cfg.head_size / query_scalar)
    for i in range(cfg.num_layers):
        p, q = f"layers.{i}.", f"blocks.{i}."
        for theirs, ours in norms.items():
            out[f"{q}{ours}.weight"] = unit_offset(f"{p}{theirs}.weight")
        if not cfg.qk_norm:  # Gemma 1 / 2: the query scale, if any, is in the q rows (map_linears)
            continue
        q_norm = unit_offset(p + "self_attn.q_norm.weight")
        out[q + "attention.q_norm.weight"] = q_norm if query == 1.0 else q_norm * query
        out[q + "attention.k_norm.weight"] = unit_offset(p + "self_attn.k_norm.weight")
    return out, sorted(dropped)


def load(folder, *, pooling: str | None = None, normalize: bool | None = None, name: str | None = None) -> Loaded:
    """Import a Gemma 3 text, Gemma 2 or Gemma folder as an ortformer Encoder."""
    files = FolderFiles.of(folder)  # parsed once: load_any hands over the files it read
    hf = files.config
    model_type = hf.get("model_type")
    what, build = {"gemma2": (WHAT_2, gemma2_config), "gemma": (WHAT_1, gemma1_config)}.get(model_type,
                                                                                          (WHAT, gemma_config))

    def weights(raw, cfg, where, duplicates):
        # Gemma 1 scales scores by 1 / sqrt(head size), as ortformer does: a scalar of D folds to 1
        scalar = cfg.head_size if model_type == "gemma" else setting(hf, "query_pre_attn_scalar")
        return map_weights(raw, cfg, where, duplicates, biases(hf, what, keys=BIAS_KEYS), scalar)

    return import_folder(files, family=model_type if model_type in ("gemma2", "gemma") else "gemma3_text",
                         build=build, map_weights=weights, pooling=pooling, normalize=normalize, name=name)


FAMILY = Family("Gemma", ("gemma3_text", "gemma2", "gemma"), load,
                elsewhere={"gemma3": "a Gemma 3 text encoder is imported from a text-only folder (model_type "
                                     "gemma3_text, Gemma3TextModel: EmbeddingGemma's)"})
