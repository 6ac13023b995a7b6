"""The BERT weight layout that most post-norm families share (BERT, RoBERTa, ELECTRA, ERNIE,
ALBERT, Longformer, and the pieces of it that DeBERTa, MPNet, RoFormer, JinaBERT and the
pre-norm variants reuse): config checks, the EncoderConfig fields, tensor names and shapes,
and the mapping to Encoder names, which fuses each layer's query, key and value Linears into
one ``qkv`` Linear whose output rows are ``[Q; K; V]`` (MultiHeadAttention views them as
(B, N, 3, H, D)).
"""
from __future__ import annotations

import torch

from ...config import EncoderConfig
from ...core.errors import CheckpointError
from ..weights import Tensors, check_tensors
from .activations import ACTIVATIONS
from .config_checks import refuse, require
from .folder_layout import HF_DTYPES

# weights the Hugging Face folder may carry that an encoder does not use: MLM / NSP and QA
# heads, and a base model's pooler; a classifier's head becomes the logits output (heads.py)
DROPPED_PREFIXES = ("pooler.", "cls.", "classifier.", "qa_outputs.")
DROPPED_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")  # index buffers, not weights
REQUIRED = ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers",
            "intermediate_size", "max_position_embeddings")


def refuse_decoder(hf: dict, what: str) -> None:
    """CheckpointError for a BERT-layout config.json set up as a decoder (is_decoder / add_cross_attention)."""
    for flag in ("is_decoder", "add_cross_attention"):
        if hf.get(flag):
            raise CheckpointError(f"{what}config.json {flag}=true is not supported; ortformer imports bidirectional encoders only")


def check_bert_layout(hf: dict, what: str) -> None:
    """The config values every BERT-layout family refuses unless they are BERT's."""
    refuse(hf, "position_embedding_type", ("absolute",), "absolute", what)
    refuse_decoder(hf, what)
    refuse(hf, "hidden_act", tuple(ACTIVATIONS), "gelu", what)
    require(hf, what.strip() or "BERT", REQUIRED)


def bert_fields(hf: dict) -> dict:
    """EncoderConfig fields of the shared BERT layout (post-norm softmax, learned positions)."""
    return dict(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_heads=hf["num_attention_heads"],
        num_layers=hf["num_hidden_layers"], ffn_size=hf["intermediate_size"], attention="softmax",
        norm="layernorm", norm_position="post", activation=ACTIVATIONS[hf.get("hidden_act", "gelu")],
        positions="learned", max_positions=hf["max_position_embeddings"],
        type_vocab_size=hf.get("type_vocab_size", 2), norm_eps=hf.get("layer_norm_eps", 1e-12),
    )


def layer_shapes(prefix: str, linears: dict[str, tuple[int, int]], norms: tuple[str, ...],
                 width: int) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of one layer: each Linear's (rows, cols) weight and (rows,) bias,
    each LayerNorm's (width,) weight and bias, names under ``prefix``."""
    shapes: dict[str, tuple[int, ...]] = {}
    for sub, (rows, cols) in linears.items():
        shapes[prefix + sub + ".weight"], shapes[prefix + sub + ".bias"] = (rows, cols), (rows,)
    for norm in norms:
        shapes[prefix + norm + ".weight"], shapes[prefix + norm + ".bias"] = (width,), (width,)
    return shapes


def bert_layout_shapes(cfg: EncoderConfig, hf_types: int) -> dict[str, tuple[int, ...]]:
    """Hugging Face BertModel tensor name -> shape (without dropped heads); hf_types rows
    of token types, embeddings E = embedding_size or F wide (ELECTRA)."""
    f, ffn, e = cfg.hidden_size, cfg.ffn_size, cfg.embedding_size or cfg.hidden_size
    shapes = {
        "embeddings.word_embeddings.weight": (cfg.vocab_size, e),
        "embeddings.position_embeddings.weight": (cfg.max_positions, e),
        "embeddings.token_type_embeddings.weight": (hf_types, e),
        "embeddings.LayerNorm.weight": (e,), "embeddings.LayerNorm.bias": (e,),
    }
    if cfg.embedding_size:
        shapes["embeddings_project.weight"], shapes["embeddings_project.bias"] = (f, e), (f,)
    linears = {"attention.self.query": (f, f), "attention.self.key": (f, f), "attention.self.value": (f, f),
               "attention.output.dense": (f, f), "intermediate.dense": (ffn, f), "output.dense": (f, ffn)}
    for i in range(cfg.num_layers):
        shapes.update(layer_shapes(f"encoder.layer.{i}.", linears, ("attention.output.LayerNorm", "output.LayerNorm"), f))
    if not hf_types:
        del shapes["embeddings.token_type_embeddings.weight"]
    return shapes


def split_dropped(tensors: Tensors, prefix: str | tuple[str, ...] = "bert.",
                  dropped_prefixes=DROPPED_PREFIXES) -> tuple[Tensors, list[str]]:
    """Strip the base-model prefix (task-head checkpoints; the first of several that matches)
    and set aside the tensors an encoder does not use (legacy gamma / beta names are renamed for
    every family by folder_import.legacy_names)."""
    prefixes = (prefix,) if isinstance(prefix, str) else prefix
    kept, dropped = {}, []
    for name, tensor in tensors.items():
        short = next((name[len(p):] for p in prefixes if name.startswith(p)), name)
        if short.startswith(dropped_prefixes) or short in DROPPED_BUFFERS:
            dropped.append(name)
            continue
        kept[short] = tensor
    return kept, sorted(dropped)


def to_ortformer(hf: Tensors, cfg: EncoderConfig, fold_types: bool = False) -> Tensors:
    """Rename checked Hugging Face tensors to Encoder names, fusing Q, K, V (rows [Q; K; V]).

    fold_types: a single token type (RoBERTa) is one vector added to every token, so it
    is added to every row of the position table instead of becoming a model input.
    """
    positions = hf["embeddings.position_embeddings.weight"]
    if fold_types:
        positions = positions.float() + hf["embeddings.token_type_embeddings.weight"][0].float()
    out = {
        "tokens.weight": hf["embeddings.word_embeddings.weight"],
        "positions.table.weight": positions,
        "norm.weight": hf["embeddings.LayerNorm.weight"],
        "norm.bias": hf["embeddings.LayerNorm.bias"],
    }
    if cfg.type_vocab_size:
        out["types.weight"] = hf["embeddings.token_type_embeddings.weight"]
    if cfg.embedding_size:
        out["project.weight"], out["project.bias"] = hf["embeddings_project.weight"], hf["embeddings_project.bias"]
    out.update(post_norm_layers(hf, cfg.num_layers, ("attention.self.query", "attention.self.key",
                                                     "attention.self.value"), BERT_LAYER_NAMES))
    return out


# (Hugging Face name, Encoder name) per BERT layer; q/k/v are fused separately
BERT_LAYER_NAMES = (("attention.output.dense", "attention.out"), ("attention.output.LayerNorm", "norm1"),
                    ("intermediate.dense", "ffn.up"), ("output.dense", "ffn.down"), ("output.LayerNorm", "norm2"))


def post_norm_layers(hf: Tensors, layers: int, qkv: tuple[str, str, str], names, query_scale: float = 1.0) -> Tensors:
    """Encoder names of ``encoder.layer.{i}.`` tensors with biases: the three ``qkv`` Linears
    fused into rows [Q; K; V] (Q times ``query_scale``), the rest renamed by ``names``."""
    out = {}
    for i in range(layers):
        p, q = f"encoder.layer.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            parts = [hf[p + f"{part}.{kind}"] for part in qkv]
            if query_scale != 1.0:
                parts[0] = parts[0].to(torch.float32) * query_scale
            out[q + f"attention.qkv.{kind}"] = torch.cat(parts, dim=0)
            for src, dst in names:
                out[q + f"{dst}.{kind}"] = hf[p + f"{src}.{kind}"]
    return out


def map_bert_layout(raw: Tensors, cfg: EncoderConfig, what: str, duplicates, *, prefix: str | tuple[str, ...] = "bert.",
                    dropped_prefixes=DROPPED_PREFIXES, hf_types: int | None = None) -> tuple[Tensors, list[str]]:
    """Check a BERT-layout state dict and map it; hf_types rows of token types in the
    file (default: the config's); one row with none in the config is folded (RoBERTa)."""
    hf_types = cfg.type_vocab_size if hf_types is None else hf_types
    kept, dropped = split_dropped(raw, prefix, dropped_prefixes)
    check_tensors(kept, bert_layout_shapes(cfg, hf_types), dtypes=HF_DTYPES, what=what, duplicates=duplicates)
    return to_ortformer(kept, cfg, fold_types=hf_types == 1 and not cfg.type_vocab_size), dropped
