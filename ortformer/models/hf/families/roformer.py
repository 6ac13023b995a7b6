"""Import a RoFormer folder (``model_type: roformer``: RoFormer / RoFormerV1, Chinese and char models).

RoFormer is BERT (post-norm, embeddings LN(word + type), ELECTRA's embedding_size projection when
set) without a position table: q and k are rotated by position instead, with the interleaved
pairs (2j, 2j + 1) of a head turning by p * 10000^(-2j/D). ortformer's rotary turns the
rotate-half pairs (j, j + D/2) by the same angles, so the import permutes each head's query and
key rows to [0, 2, 4, ..., 1, 3, 5, ...]: the same permutation on q and k leaves every q . k,
so the attention, unchanged. ``rotary_value`` (values rotated too) would change the output and
is refused. The tokenizer (jieba word segmentation ahead of WordPiece) has no tokenizers-library
equivalent: a folder without tokenizer.json exports for token ids.
"""
from __future__ import annotations

import torch

from ....config import EncoderConfig
from ...loaded import Loaded
from ...weights import Tensors, check_tensors
from ..bert_layout import (BERT_LAYER_NAMES, bert_fields, bert_layout_shapes, check_bert_layout, post_norm_layers,
                           split_dropped)
from ..config_checks import make_config, refuse
from ..folder_import import import_folder
from ..folder_layout import HF_DTYPES
from ..family import Family

DROPPED_PREFIXES = ("pooler.", "cls.", "classifier.", "qa_outputs.", "encoder.embed_positions.")
QKV = ("attention.self.query", "attention.self.key", "attention.self.value")


def roformer_config(hf: dict, common: dict) -> EncoderConfig:
    check_bert_layout(hf, "RoFormer ")
    refuse(hf, "rotary_value", (False,), False, "RoFormer ")
    fields = bert_fields(hf)
    size = hf.get("embedding_size") or hf["hidden_size"]
    fields.update(positions="rotary", rotary_theta=10000.0, embedding_size=0 if size == hf["hidden_size"] else size)
    return make_config("RoFormer", **fields, **common)


def rotate_half_order(rows: torch.Tensor, heads: int) -> torch.Tensor:
    """Each head's D rows (or bias entries) reordered [0, 2, 4, ..., 1, 3, 5, ...]: (H x D, ...) -> same."""
    d = rows.shape[0] // heads
    order = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])
    return rows.reshape(heads, d, *rows.shape[1:])[:, order].reshape(rows.shape)


def map_weights(raw: Tensors, cfg: EncoderConfig, what: str, duplicates) -> tuple[Tensors, list[str]]:
    kept, dropped = split_dropped(raw, "roformer.", DROPPED_PREFIXES)
    shapes = bert_layout_shapes(cfg, cfg.type_vocab_size)
    del shapes["embeddings.position_embeddings.weight"]
    check_tensors(kept, shapes, dtypes=HF_DTYPES, what=what, duplicates=duplicates)
    for i in range(cfg.num_layers):
        for part in QKV[:2]:
            for kind in ("weight", "bias"):
                name = f"encoder.layer.{i}.{part}.{kind}"
                kept[name] = rotate_half_order(kept[name], cfg.num_heads)
    out = {"tokens.weight": kept["embeddings.word_embeddings.weight"], "norm.weight": kept["embeddings.LayerNorm.weight"],
           "norm.bias": kept["embeddings.LayerNorm.bias"]}
    if cfg.type_vocab_size:
        out["types.weight"] = kept["embeddings.token_type_embeddings.weight"]
    if cfg.embedding_size:
        out["project.weight"], out["project.bias"] = kept["embeddings_project.weight"], kept["embeddings_project.bias"]
    out.update(post_norm_layers(kept, cfg.num_layers, QKV, BERT_LAYER_NAMES))
    return out, dropped


def load(folder, *, pooling: str | None = None, normalize: bool | None = None, name: str | None = None) -> Loaded:
    """Import a RoFormer folder as an ortformer Encoder."""
    return import_folder(folder, family="roformer", build=roformer_config, map_weights=map_weights,
                         pooling=pooling, normalize=normalize, name=name)


FAMILY = Family("RoFormer", ("roformer",), load)
