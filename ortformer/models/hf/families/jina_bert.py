"""Import JinaBERT v2 folders (jina-embeddings-v2-small-en / -base-en / -base-de / -base-zh /
-base-es): ``model_type: bert`` with ``position_embedding_type: alibi``, written for the remote
code jinaai/jina-bert-implementation that config.json's ``auto_map`` names (transformers has no
JinaBERT); hf.family.family_for routes them here (FAMILY.detect). Folders made for other JinaBERT code are
refused (check_code).

A BERT layer without a position table, attention biased by symmetric ALiBi, and a gated
feed-forward network with its own post-norm:

    e = LN(word + token_type);  per layer:
    x = LN_1(x + O(softmax(Q K^T / sqrt(D) - m_h |i - j| + mask) V))
    x = LN_2(x + W_o (act(G_1 x) * (G_2 x)) + b_o),   [G_1; G_2] = gated_layers (no bias)

act = GELU (erf) for ``feed_forward_type: geglu``, ReLU for ``reglu``; m_h are ALiBi's slopes
(layers.alibi_slopes). This is ortformer's post-norm softmax encoder with ``positions = "alibi"``
and ``ffn_gated`` (rows [activated; gate] as saved, the up bias zero). The classifier of
JinaBertForSequenceClassification (BERT's pooler + classifier) is kept by heads.py as BERT's.
The later qk-post-norm layout (jina-embeddings-v2-base-code: ``layer_norm_q`` / ``layer_norm_k``,
``up_gated_layer``) is refused by name.
"""
from __future__ import annotations

import torch

from ....config import EncoderConfig
from ....core.errors import CheckpointError
from ...loaded import Loaded
from ...weights import Tensors, check_tensors
from ..bert_layout import DROPPED_PREFIXES, REQUIRED, layer_shapes, post_norm_layers, refuse_decoder, split_dropped
from ..config_checks import make_config, refuse, require
from ..folder_import import import_folder
from ..folder_layout import HF_DTYPES
from ..family import Family

WHAT = "JinaBERT "
IMPLEMENTATION = "jina-bert-implementation"  # the remote code (auto_map) whose model this is
FEED_FORWARD = {"geglu": "gelu", "reglu": "relu"}  # feed_forward_type -> the activated half's act
# tensors of the qk-post-norm layout, which computes another layer
QK_POST_NORM_KEYS = ("attention.self.layer_norm_q.", "mlp.up_gated_layer.", "layer_norm_1.")
# (saved name, Encoder name) per layer; q / k / v are fused separately, the gated Linear has no bias
LAYER_NAMES = (("attention.output.dense", "attention.out"), ("attention.output.LayerNorm", "norm1"),
               ("mlp.wo", "ffn.down"), ("mlp.layernorm", "norm2"))


def check_code(hf: dict) -> None:
    """auto_map names the remote code a folder was made for ("owner/repo--module.Class"). ortformer
    reproduces jina-bert-implementation's; the others differ in layout or arithmetic (the flash
    implementation's fused projections, and by one report halved ALiBi slopes for heads past the
    eighth; the qk-post-norm layout), so a folder made for one of them is refused by name."""
    auto_map = hf.get("auto_map") or {}
    repos = {value.split("--")[0] for value in auto_map.values() if isinstance(value, str) and "--" in value} \
        if isinstance(auto_map, dict) else set()
    other = sorted(repo for repo in repos if repo.rsplit("/", 1)[-1] != IMPLEMENTATION)
    if other:
        raise CheckpointError(f"{WHAT}config.json auto_map names {other[0]}'s code, which ortformer does not reproduce; "
                              f"it imports folders made for jinaai/{IMPLEMENTATION} (jina-embeddings-v2)")


def jina_config(hf: dict, common: dict) -> EncoderConfig:
    check_code(hf)
    require(hf, WHAT.strip(), tuple(key for key in REQUIRED if key != "max_position_embeddings"))
    refuse(hf, "feed_forward_type", tuple(FEED_FORWARD), None, WHAT)
    refuse_decoder(hf, WHAT)
    # ALiBi has no table to bound the length (the remote code rebuilds its bias past
    # max_position_embeddings); without the key, the 8192 tokens every released model sets
    longest = hf.get("max_position_embeddings", 8192)
    return make_config(
        WHAT.strip(), vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_heads=hf["num_attention_heads"],
        num_layers=hf["num_hidden_layers"], ffn_size=hf["intermediate_size"], ffn_gated=True, attention="softmax",
        norm="layernorm", norm_position="post", activation=FEED_FORWARD[hf["feed_forward_type"]], positions="alibi",
        max_positions=longest, type_vocab_size=hf.get("type_vocab_size", 2), norm_eps=hf.get("layer_norm_eps", 1e-12),
        **common)


def saved_shapes(cfg: EncoderConfig) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape as JinaBertModel saves them (without task heads)."""
    f, ffn = cfg.hidden_size, cfg.ffn_size
    shapes = {"embeddings.word_embeddings.weight": (cfg.vocab_size, f),
              "embeddings.LayerNorm.weight": (f,), "embeddings.LayerNorm.bias": (f,)}
    if cfg.type_vocab_size:
        shapes["embeddings.token_type_embeddings.weight"] = (cfg.type_vocab_size, f)
    linears = {"attention.self.query": (f, f), "attention.self.key": (f, f), "attention.self.value": (f, f),
               "attention.output.dense": (f, f), "mlp.wo": (f, ffn)}
    for i in range(cfg.num_layers):
        p = f"encoder.layer.{i}."
        shapes.update(layer_shapes(p, linears, ("attention.output.LayerNorm", "mlp.layernorm"), f))
        shapes[p + "mlp.gated_layers.weight"] = (2 * ffn, f)
    return shapes


def map_weights(raw: Tensors, cfg: EncoderConfig, what: str, duplicates) -> tuple[Tensors, list[str]]:
    """Check a JinaBERT v2 state dict and map it to Encoder names."""
    # a position table saved beside ALiBi (an absolute-position save's leftover) is never read by it
    kept, dropped = split_dropped(raw, "bert.", (*DROPPED_PREFIXES, "embeddings.position_embeddings."))
    later = sorted(name for name in kept if any(key in name for key in QK_POST_NORM_KEYS))
    if later:
        raise CheckpointError(f"{what}: {later[0]} belongs to JinaBERT's qk-post-norm layout (jina-embeddings-v2-base-code: "
                              "q / k LayerNorms and another layer order), which ortformer does not import; it imports "
                              "the jina-bert-implementation layout (mlp.gated_layers, mlp.wo, mlp.layernorm)")
    check_tensors(kept, saved_shapes(cfg), dtypes=HF_DTYPES, what=what, duplicates=duplicates)
    out = {"tokens.weight": kept["embeddings.word_embeddings.weight"],
           "norm.weight": kept["embeddings.LayerNorm.weight"], "norm.bias": kept["embeddings.LayerNorm.bias"]}
    if cfg.type_vocab_size:
        out["types.weight"] = kept["embeddings.token_type_embeddings.weight"]
    out.update(post_norm_layers(kept, cfg.num_layers, ("attention.self.query", "attention.self.key",
                                                       "attention.self.value"), LAYER_NAMES))
    for i in range(cfg.num_layers):
        gated = kept[f"encoder.layer.{i}.mlp.gated_layers.weight"]  # rows [activated; gate], as ffn.up reads them
        out[f"blocks.{i}.ffn.up.weight"] = gated
        out[f"blocks.{i}.ffn.up.bias"] = torch.zeros(gated.shape[0], dtype=gated.dtype)
    return out, dropped


def load(folder, *, pooling: str | None = None, normalize: bool | None = None, name: str | None = None) -> Loaded:
    """Import a JinaBERT v2 folder as an ortformer Encoder."""
    return import_folder(folder, family="jina_bert", build=jina_config, map_weights=map_weights,
                         pooling=pooling, normalize=normalize, name=name)


# BERT's model_type with ALiBi positions (position_embedding_type "alibi") is JinaBERT v2
FAMILY = Family("JinaBERT v2", ("bert",), load,
                detect=lambda config: config.get("position_embedding_type") == "alibi")
