"""Import a DeBERTa (v1) folder (deberta-base, deberta-large, deberta-large-mnli and their kin).

transformers' DebertaModel is DeBERTa-v2's post-norm layer (deberta_v2.py) with three
differences, each an EncoderConfig field or a renaming here:

- relative positions are plain distances, I_ij = clamp(i - j + S, 0, 2S - 1) with
  S = max_relative_positions (disentangled.max_distance = 0), over a table R read as stored
  (disentangled.norm = False), projected by each layer's own pos_q_proj (with bias) and
  pos_proj (without) (disentangled.projections = "separate");
- Q, K, V come from one bias-free in_proj whose rows interleave the heads (head h's
  q, k, v rows follow each other), plus q_bias and v_bias: regrouped into [Q; K; V]
  with a zero K bias;
- the scale 1/sqrt(3D) is folded as in deberta_v2.py (W_Q, b_Q and the position queries
  times 1/sqrt(3)).

Refused: talking_head, and what deberta_v2.py refuses.
"""
from __future__ import annotations


import torch

from ....config import EncoderConfig
from ....core.errors import CheckpointError
from ...loaded import Loaded
from ...weights import Tensors, check_tensors
from ..activations import ACTIVATIONS
from ..bert_layout import BERT_LAYER_NAMES, layer_shapes, split_dropped
from .deberta_v2 import (DROPPED_PREFIXES, REQUIRED, disentangled_group, drop_unused, embedding_shapes,
                         embedding_tensors, position_pair, query_scale)
from ..config_checks import make_config, refuse, require
from ..folder_import import import_folder
from ..folder_files import FolderFiles
from ..folder_layout import HF_DTYPES
from ..family import Family, VocabTokenizer
from ..vocab_tokenizers import deberta_v1_tokenizer

WHAT = "DeBERTa "


def deberta_config(hf: dict, common: dict) -> EncoderConfig:
    require(hf, "DeBERTa", REQUIRED)
    refuse(hf, "hidden_act", tuple(ACTIVATIONS), "gelu", WHAT)
    f = hf["hidden_size"]
    if hf.get("talking_head", False):
        raise CheckpointError(f"{WHAT}config.json talking_head=true is not supported; ortformer's heads do not mix")
    if hf.get("embedding_size", f) != f:
        raise CheckpointError(f"{WHAT}config.json embedding_size={hf['embedding_size']} != hidden_size={f} is not "
                              "supported (a bias-free embedding projection)")
    return make_config(
        "DeBERTa", vocab_size=hf["vocab_size"], hidden_size=f, num_heads=hf["num_attention_heads"],
        num_layers=hf["num_hidden_layers"], ffn_size=hf["intermediate_size"], attention="softmax", norm="layernorm",
        norm_position="post", activation=ACTIVATIONS[hf.get("hidden_act", "gelu")],
        positions="learned" if hf.get("position_biased_input", True) else "none",
        max_positions=hf["max_position_embeddings"], type_vocab_size=hf.get("type_vocab_size", 0),
        norm_eps=hf.get("layer_norm_eps", 1e-7), disentangled=disentangled_group(hf, v1=True), **common)


def shapes(cfg: EncoderConfig) -> dict[str, tuple[int, ...]]:
    """transformers' DebertaModel tensor name -> shape (without dropped heads)."""
    f, ffn = cfg.hidden_size, cfg.ffn_size
    out = embedding_shapes(cfg)
    linears = {"attention.output.dense": (f, f), "intermediate.dense": (ffn, f), "output.dense": (f, ffn)}
    if cfg.disentangled:
        linears["attention.self.pos_q_proj"] = (f, f)
    for i in range(cfg.num_layers):
        p = f"encoder.layer.{i}."
        out.update(layer_shapes(p, linears, ("attention.output.LayerNorm", "output.LayerNorm"), f))
        out[p + "attention.self.in_proj.weight"] = (3 * f, f)
        out[p + "attention.self.q_bias"] = out[p + "attention.self.v_bias"] = (f,)
        if cfg.disentangled:
            out[p + "attention.self.pos_proj.weight"] = (f, f)
    return out


def map_weights(raw: Tensors, cfg: EncoderConfig, what: str, duplicates, scale: float) -> tuple[Tensors, list[str]]:
    """Check a DeBERTa state dict and rename it: in_proj regrouped into [Q; K; V] (Q times
    ``scale``), q_bias / v_bias around a zero K bias, pos_q_proj and pos_proj as the position pair."""
    kept, dropped = split_dropped(raw, "deberta.", DROPPED_PREFIXES)
    dropped = drop_unused(kept, dropped, cfg)
    check_tensors(kept, shapes(cfg), dtypes=HF_DTYPES, what=what, duplicates=duplicates)
    out = embedding_tensors(kept, cfg)
    h, f = cfg.num_heads, cfg.hidden_size
    for i in range(cfg.num_layers):
        p, q = f"encoder.layer.{i}.", f"blocks.{i}."
        # (H, 3, D, F): head h's rows are its q, k, v in turn
        q_w, k_w, v_w = kept[p + "attention.self.in_proj.weight"].to(torch.float32).view(h, 3, -1, f).unbind(1)
        q_bias, v_bias = (kept[p + f"attention.self.{n}"].to(torch.float32) for n in ("q_bias", "v_bias"))
        out[q + "attention.qkv.weight"] = torch.cat([q_w.reshape(f, f) * scale, k_w.reshape(f, f), v_w.reshape(f, f)])
        out[q + "attention.qkv.bias"] = torch.cat([q_bias * scale, torch.zeros(f), v_bias])
        for src, dst in BERT_LAYER_NAMES:
            for kind in ("weight", "bias"):
                out[q + f"{dst}.{kind}"] = kept[p + f"{src}.{kind}"]
        if cfg.disentangled:
            s = p + "attention.self."
            out.update(position_pair(kept[s + "pos_q_proj.weight"], kept[s + "pos_q_proj.bias"],
                                     kept[s + "pos_proj.weight"], torch.zeros(f), i, scale))
    return out, dropped


def load(folder, *, pooling: str | None = None, normalize: bool | None = None, name: str | None = None) -> Loaded:
    """Import a DeBERTa (v1) folder as an ortformer Encoder."""
    files = FolderFiles.of(folder)  # parsed once: load_any hands over the files it read
    scale = query_scale(files.config)
    return import_folder(files, family="deberta", build=deberta_config,
                         map_weights=lambda raw, cfg, what, dup: map_weights(raw, cfg, what, dup, scale),
                         pooling=pooling, normalize=normalize, name=name)


FAMILY = Family("DeBERTa", ("deberta",), load,
                vocab_tokenizers={"deberta": VocabTokenizer(deberta_v1_tokenizer, ("vocab.json", "merges.txt"))})
