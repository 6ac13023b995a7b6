"""Import a DeBERTa-v2 / v3 folder (deberta-v3-base, mdeberta-v3 and their kin).

transformers' DebertaV2Model is BERT's post-norm layer with disentangled attention:

    scores_ij = (q_i k_j + q_i pk[I_ij] + k_j pq[I_ij]) / sqrt(3 D),   pk = W_K R + b_K, pq = W_Q R + b_Q

with R = LN(rel_embeddings) (2S, F) shared by every layer, projected by each layer's own
query and key Linears (share_att_key), and I_ij = clamp(bucket(i - j) + S, 0, 2S - 1), the
log buckets of position_buckets = S up to max_relative_positions. That is EncoderConfig's
disentangled group (Disentangled's buckets / max_distance), whose scores divide by sqrt(D): storing
W_Q and b_Q divided by sqrt(3) scales every term by the same 1/sqrt(3) (q and pq each
appear once per term), which is exact up to rounding. (Without relative attention
transformers still divides by sqrt(D (1 + #pos_att_type terms)); the fold follows it.) Absolute positions are added only
with position_biased_input (v2); v3 has none.

Without position_buckets the distances are plain (disentangled.max_distance = 0); with
share_att_key=false each layer projects R by a pos_query_proj / pos_key_proj pair of its own
(disentangled.projections = "separate"), and norm_rel_ebd sets disentangled.norm: the parts
DeBERTa v1 (deberta.py) always has.

The ConvLayer after the first layer (conv_kernel_size, xlarge and xxlarge) is EncoderConfig's
convolution group (Convolution's kernel_size / groups / activation). Refused: other pos_att_type sets,
embedding_size != hidden_size (a bias-free projection) and attention_head_size != hidden / heads.
"""
from __future__ import annotations

import math

import torch

from ....config import Convolution, Disentangled, EncoderConfig
from ....core.errors import CheckpointError
from ...loaded import Loaded
from ...weights import Tensors, check_tensors
from ..activations import ACTIVATIONS, head_activation
from ..bert_layout import BERT_LAYER_NAMES, layer_shapes, post_norm_layers, split_dropped
from ..config_checks import make_config, make_group, refuse, require
from ..folder_import import import_folder
from ..folder_files import FolderFiles
from ..folder_layout import HF_DTYPES
from ..family import Family, VocabTokenizer
from ..spm_tokenizers import deberta_tokenizer

WHAT = "DeBERTa-v2 "
REQUIRED = ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size",
            "max_position_embeddings")
DROPPED_PREFIXES = ("pooler.", "lm_predictions.", "mask_predictions.", "cls.", "classifier.", "qa_outputs.")
TERMS = {"c2p", "p2c"}


def _terms(hf: dict) -> set[str]:
    """pos_att_type as a set: a "p2c|c2p" string or a list; CheckpointError for anything else."""
    kind = hf.get("pos_att_type") or []
    kind = kind.lower().split("|") if isinstance(kind, str) else kind
    if not isinstance(kind, list):
        raise CheckpointError(f"{WHAT}config.json pos_att_type={hf.get('pos_att_type')!r} must be a list or a "
                              "\"p2c|c2p\" string")
    return {str(t).strip() for t in kind}


def query_scale(hf: dict) -> float:
    """1 / sqrt(1 + the position terms): DeBERTa divides q . k by sqrt(D (1 + #terms)) whether or not
    relative attention is on, ortformer by sqrt(D)."""
    return 1 / math.sqrt(1 + len(_terms(hf) & TERMS))


def deberta_config(hf: dict, common: dict) -> EncoderConfig:
    require(hf, "DeBERTa-v2", REQUIRED)
    refuse(hf, "hidden_act", tuple(ACTIVATIONS), "gelu", WHAT)
    f, heads = hf["hidden_size"], hf["num_attention_heads"]
    head_size = hf.get("attention_head_size", f // heads)
    if head_size * heads != f:
        raise CheckpointError(f"{WHAT}config.json attention_head_size={head_size} x {heads} heads "
                              f"!= hidden_size={f} is not supported; ortformer's heads split the width")
    if hf.get("embedding_size", f) != f:
        raise CheckpointError(f"{WHAT}config.json embedding_size={hf['embedding_size']} != hidden_size={f} is not "
                              "supported (a bias-free embedding projection)")
    learned = hf.get("position_biased_input", True)
    return make_config(
        "DeBERTa-v2", vocab_size=hf["vocab_size"], hidden_size=f, num_heads=heads,
        num_layers=hf["num_hidden_layers"], ffn_size=hf["intermediate_size"], attention="softmax", norm="layernorm",
        norm_position="post", activation=ACTIVATIONS[hf.get("hidden_act", "gelu")],
        positions="learned" if learned else "none", max_positions=hf["max_position_embeddings"],
        type_vocab_size=hf.get("type_vocab_size", 0), norm_eps=hf.get("layer_norm_eps", 1e-7),
        disentangled=disentangled_group(hf, v1=False), convolution=_convolution(hf), **common)


def disentangled_group(hf: dict, v1: bool) -> Disentangled | None:
    """The EncoderConfig group of relative attention (None without it): S = position_buckets log buckets up to
    max_relative_positions, or (v1, or position_buckets <= 0) S = max_relative_positions plain
    distances; the table projected by each layer's own query and key Linears (share_att_key) or by
    a position pair of its own (v1 always), normalised with norm_rel_ebd (never in v1)."""
    what = "DeBERTa " if v1 else WHAT
    if not hf.get("relative_attention", False):
        return None
    if _terms(hf) != TERMS:
        raise CheckpointError(f"{what}config.json pos_att_type={hf.get('pos_att_type')!r} is not supported; "
                              "ortformer implements both c2p and p2c (\"p2c|c2p\")")
    max_distance = hf.get("max_relative_positions", -1)
    if isinstance(max_distance, bool) or not isinstance(max_distance, int) or max_distance < 1:
        max_distance = hf["max_position_embeddings"]
    buckets = -1 if v1 else hf.get("position_buckets", -1)
    if isinstance(buckets, bool) or not isinstance(buckets, int):
        raise CheckpointError(f"{what}config.json position_buckets={buckets!r} must be an int "
                              "(> 0: log buckets, e.g. 256; <= 0: plain distances)")
    shared = not v1 and hf.get("share_att_key", False)
    fields = {"projections": "shared" if shared else "separate",
              "norm": not v1 and "layer_norm" in str(hf.get("norm_rel_ebd", "none")).lower()}
    # S log buckets up to max_distance, or S = max_distance plain distances (max_distance 0: no log buckets)
    buckets, max_distance = (buckets, max_distance) if buckets > 0 else (max_distance, 0)
    return make_group(what.strip(), Disentangled, buckets=buckets, max_distance=max_distance, **fields)


def _convolution(hf: dict) -> Convolution | None:
    """The EncoderConfig group of the ConvLayer after the first layer (xlarge, xxlarge); None without one."""
    kernel = hf.get("conv_kernel_size", 0) or 0
    if not kernel:
        return None
    act = head_activation(hf.get("conv_act", "tanh"), "conv_act", WHAT.strip())
    return make_group(WHAT.strip(), Convolution, kernel_size=kernel, groups=hf.get("conv_groups", 1), activation=act)


def embedding_shapes(cfg: EncoderConfig) -> dict[str, tuple[int, ...]]:
    """The embeddings' and the relative table's tensor name -> shape (DeBERTa v1 and v2 alike)."""
    f = cfg.hidden_size
    out = {"embeddings.word_embeddings.weight": (cfg.vocab_size, f),
           "embeddings.LayerNorm.weight": (f,), "embeddings.LayerNorm.bias": (f,)}
    if cfg.positions == "learned":
        out["embeddings.position_embeddings.weight"] = (cfg.max_positions, f)
    if cfg.type_vocab_size:
        out["embeddings.token_type_embeddings.weight"] = (cfg.type_vocab_size, f)
    if cfg.disentangled:
        out["encoder.rel_embeddings.weight"] = (2 * cfg.disentangled.buckets, f)
    if cfg.disentangled and cfg.disentangled.norm:
        out["encoder.LayerNorm.weight"] = out["encoder.LayerNorm.bias"] = (f,)
    return out


def drop_unused(kept: Tensors, dropped: list[str], cfg: EncoderConfig) -> list[str]:
    """Move out of ``kept`` the tensors transformers builds or keeps but never uses (a position
    table without position_biased_input, the relative table's LayerNorm without relative
    attention); return ``dropped`` with their names."""
    unused = [] if cfg.positions == "learned" else ["embeddings.position_embeddings.weight"]
    if not (cfg.disentangled and cfg.disentangled.norm):
        unused += ["encoder.LayerNorm.weight", "encoder.LayerNorm.bias"]
    gone = [name for name in unused if kept.pop(name, None) is not None]
    return sorted([*dropped, *gone]) if gone else dropped


def embedding_tensors(kept: Tensors, cfg: EncoderConfig) -> Tensors:
    """The embeddings and the relative table (with its LayerNorm) under the encoder's names."""
    out = {"tokens.weight": kept["embeddings.word_embeddings.weight"],
           "norm.weight": kept["embeddings.LayerNorm.weight"], "norm.bias": kept["embeddings.LayerNorm.bias"]}
    if cfg.positions == "learned":
        out["positions.table.weight"] = kept["embeddings.position_embeddings.weight"]
    if cfg.type_vocab_size:
        out["types.weight"] = kept["embeddings.token_type_embeddings.weight"]
    if cfg.disentangled:
        out["disentangled.table.weight"] = kept["encoder.rel_embeddings.weight"]
    if cfg.disentangled and cfg.disentangled.norm:
        out["disentangled.norm.weight"] = kept["encoder.LayerNorm.weight"]
        out["disentangled.norm.bias"] = kept["encoder.LayerNorm.bias"]
    return out


def shapes(cfg: EncoderConfig) -> dict[str, tuple[int, ...]]:
    """transformers' DebertaV2Model tensor name -> shape (without dropped heads)."""
    f, ffn = cfg.hidden_size, cfg.ffn_size
    out = embedding_shapes(cfg)
    if cfg.convolution:
        out["encoder.conv.conv.weight"] = (f, f // cfg.convolution.groups, cfg.convolution.kernel_size)
        out["encoder.conv.conv.bias"] = out["encoder.conv.LayerNorm.weight"] = out["encoder.conv.LayerNorm.bias"] = (f,)
    linears = {"attention.self.query_proj": (f, f), "attention.self.key_proj": (f, f),
               "attention.self.value_proj": (f, f), "attention.output.dense": (f, f),
               "intermediate.dense": (ffn, f), "output.dense": (f, ffn)}
    if cfg.disentangled and cfg.disentangled.projections == "separate":
        linears.update({"attention.self.pos_query_proj": (f, f), "attention.self.pos_key_proj": (f, f)})
    for i in range(cfg.num_layers):
        out.update(layer_shapes(f"encoder.layer.{i}.", linears, ("attention.output.LayerNorm", "output.LayerNorm"), f))
    return out


def map_weights(raw: Tensors, cfg: EncoderConfig, what: str, duplicates, scale: float) -> tuple[Tensors, list[str]]:
    """Check a DeBERTa-v2 state dict and rename it: q/k/v fused, W_Q and b_Q times ``scale``
    (query_scale: 1/sqrt(3) with both position terms)."""
    kept, dropped = split_dropped(raw, "deberta.", DROPPED_PREFIXES)
    dropped = drop_unused(kept, dropped, cfg)
    check_tensors(kept, shapes(cfg), dtypes=HF_DTYPES, what=what, duplicates=duplicates)
    out = embedding_tensors(kept, cfg)
    if cfg.convolution:
        out.update({"conv.weight": kept["encoder.conv.conv.weight"], "conv.bias": kept["encoder.conv.conv.bias"],
                    "conv_norm.weight": kept["encoder.conv.LayerNorm.weight"],
                    "conv_norm.bias": kept["encoder.conv.LayerNorm.bias"]})
    qkv = ("attention.self.query_proj", "attention.self.key_proj", "attention.self.value_proj")
    out.update(post_norm_layers(kept, cfg.num_layers, qkv, BERT_LAYER_NAMES, scale))
    if cfg.disentangled and cfg.disentangled.projections == "separate":
        for i in range(cfg.num_layers):
            p = f"encoder.layer.{i}.attention.self."
            out.update(position_pair(kept[p + "pos_query_proj.weight"], kept[p + "pos_query_proj.bias"],
                                     kept[p + "pos_key_proj.weight"], kept[p + "pos_key_proj.bias"], i, scale))
    return out, dropped


def position_pair(query_weight, query_bias, key_weight, key_bias, layer: int, scale: float) -> Tensors:
    """A layer's own position projections as the encoder's rows [queries; keys], the query half
    times ``scale`` as W_Q is (p2c = k . pq appears once per score, like q)."""
    p = f"blocks.{layer}.attention.positions."
    return {p + "weight": torch.cat([query_weight.to(torch.float32) * scale, key_weight.to(torch.float32)]),
            p + "bias": torch.cat([query_bias.to(torch.float32) * scale, key_bias.to(torch.float32)])}


def load(folder, *, pooling: str | None = None, normalize: bool | None = None, name: str | None = None) -> Loaded:
    """Import a DeBERTa-v2 / v3 folder as an ortformer Encoder."""
    files = FolderFiles.of(folder)  # parsed once: load_any hands over the files it read
    # the score scale is not an EncoderConfig field: the mapping folds it into W_Q, read from config.json here
    scale = query_scale(files.config)
    return import_folder(files, family="deberta-v2", build=deberta_config,
                         map_weights=lambda raw, cfg, what, dup: map_weights(raw, cfg, what, dup, scale),
                         pooling=pooling, normalize=normalize, name=name)


FAMILY = Family("DeBERTa-v2", ("deberta-v2",), load,
                vocab_tokenizers={"deberta-v2": VocabTokenizer(deberta_tokenizer, ("spm.model",))})
