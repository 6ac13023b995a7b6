"""Import a DistilBERT folder.

DistilBERT is a post-norm BERT without token types, with its own config keys (dim,
n_heads, n_layers, hidden_dim, activation) and weight names, and LayerNorm eps fixed
at 1e-12. With ``sinusoidal_pos_embds`` the position table holds fixed sinusoids, but
it is still an Embedding saved in the file and read from there, so it is imported as
the learned table it is at run time.
"""
from __future__ import annotations

import torch

from ....config import EncoderConfig
from ...loaded import Loaded
from ...weights import Tensors, check_tensors
from ..activations import ACTIVATIONS
from ..config_checks import make_config, refuse, require
from ..folder_import import import_folder
from ..folder_layout import HF_DTYPES
from ..family import Family, VocabTokenizer
from ..vocab_tokenizers import wordpiece_tokenizer

DROPPED_PREFIXES = ("vocab_transform.", "vocab_layer_norm.", "vocab_projector.", "pre_classifier.",
                    "classifier.", "qa_outputs.")
DROPPED_BUFFERS = ("embeddings.position_ids",)
# (DistilBERT name, Encoder name) per layer; q/k/v are fused separately
LAYER_NAMES = (("attention.out_lin", "attention.out"), ("sa_layer_norm", "norm1"), ("ffn.lin1", "ffn.up"),
               ("ffn.lin2", "ffn.down"), ("output_layer_norm", "norm2"))


def distilbert_config(hf: dict, common: dict) -> EncoderConfig:
    refuse(hf, "activation", tuple(ACTIVATIONS), "gelu", "DistilBERT ")
    for flag in ("is_decoder", "add_cross_attention"):
        refuse(hf, flag, (False,), False, "DistilBERT ")
    require(hf, "DistilBERT", ("vocab_size", "dim", "n_heads", "n_layers", "hidden_dim", "max_position_embeddings"))
    return make_config(
        "DistilBERT", vocab_size=hf["vocab_size"], hidden_size=hf["dim"], num_heads=hf["n_heads"],
        num_layers=hf["n_layers"], ffn_size=hf["hidden_dim"], attention="softmax", norm="layernorm",
        norm_position="post", activation=ACTIVATIONS[hf.get("activation", "gelu")], positions="learned",
        max_positions=hf["max_position_embeddings"], type_vocab_size=0, norm_eps=1e-12, **common)


def shapes(cfg: EncoderConfig) -> dict[str, tuple[int, ...]]:
    f, ffn = cfg.hidden_size, cfg.ffn_size
    out = {"embeddings.word_embeddings.weight": (cfg.vocab_size, f),
           "embeddings.position_embeddings.weight": (cfg.max_positions, f),
           "embeddings.LayerNorm.weight": (f,), "embeddings.LayerNorm.bias": (f,)}
    for i in range(cfg.num_layers):
        p = f"transformer.layer.{i}."
        for sub, (rows, cols) in {"attention.q_lin": (f, f), "attention.k_lin": (f, f), "attention.v_lin": (f, f),
                                  "attention.out_lin": (f, f), "ffn.lin1": (ffn, f), "ffn.lin2": (f, ffn)}.items():
            out[p + sub + ".weight"], out[p + sub + ".bias"] = (rows, cols), (rows,)
        for norm in ("sa_layer_norm", "output_layer_norm"):
            out[p + norm + ".weight"], out[p + norm + ".bias"] = (f,), (f,)
    return out


def map_weights(raw: Tensors, cfg: EncoderConfig, what: str, duplicates) -> tuple[Tensors, list[str]]:
    kept, dropped = {}, []
    for name, tensor in raw.items():
        short = name.removeprefix("distilbert.")
        if short.startswith(DROPPED_PREFIXES) or short in DROPPED_BUFFERS:
            dropped.append(name)
        else:
            kept[short] = tensor
    check_tensors(kept, shapes(cfg), dtypes=HF_DTYPES, what=what, duplicates=duplicates)
    out = {"tokens.weight": kept["embeddings.word_embeddings.weight"],
           "positions.table.weight": kept["embeddings.position_embeddings.weight"],
           "norm.weight": kept["embeddings.LayerNorm.weight"], "norm.bias": kept["embeddings.LayerNorm.bias"]}
    for i in range(cfg.num_layers):
        p, q = f"transformer.layer.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            out[q + f"attention.qkv.{kind}"] = torch.cat(
                [kept[p + f"attention.{part}_lin.{kind}"] for part in "qkv"], dim=0)
            for src, dst in LAYER_NAMES:
                out[q + f"{dst}.{kind}"] = kept[p + f"{src}.{kind}"]
    return out, sorted(dropped)


def load(folder, *, pooling: str | None = None, normalize: bool | None = None, name: str | None = None) -> Loaded:
    """Import a DistilBERT folder as an ortformer Encoder."""
    return import_folder(folder, family="distilbert", build=distilbert_config, map_weights=map_weights,
                         pooling=pooling, normalize=normalize, name=name)


FAMILY = Family("DistilBERT", ("distilbert",), load,
                vocab_tokenizers={"distilbert": VocabTokenizer(wordpiece_tokenizer, ("vocab.txt",))})
