"""Import an MPNet folder (all-mpnet-base-v2 and its kin).

MPNet's layers are BERT's post-norm layers with other weight names (``attention.attn.q``,
``k``, ``v``, ``o``); the differences from BERT are all EncoderConfig fields:

- a relative position bias: one encoder-level ``relative_attention_bias`` Embedding
  (32, H), looked up with T5's bidirectional buckets of j - i (max distance 128) and added
  to the scaled scores of every layer: the relative_attention group, buckets=32, max_distance=128.
  transformers computes 32 buckets whatever ``relative_attention_num_buckets`` says, so
  any other value is refused rather than guessed at;
- RoBERTa's positions: padding_idx is fixed at 1 in transformers, kept token k
  (1-based) takes row 1 + k, i.e. position_offset=2 with position_ids="kept". transformers
  counts tokens whose id is not 1; ortformer counts attention_mask, the same rows whenever
  padding is masked (id 1 is MPNet's <pad>);
- no token types.
"""
from __future__ import annotations

from ....config import EncoderConfig, RelativeAttention
from ....core.errors import CheckpointError
from ...loaded import Loaded
from ...weights import Tensors, check_tensors
from ..activations import ACTIVATIONS
from ..bert_layout import layer_shapes, post_norm_layers, split_dropped
from ..config_checks import make_config, refuse, require
from ..folder_import import import_folder
from ..folder_layout import HF_DTYPES
from ..family import Family

BUCKETS, MAX_DISTANCE = 32, 128  # fixed in transformers' MPNetEncoder.compute_position_bias
PADDING_IDX = 1  # fixed in transformers' MPNetEmbeddings
DROPPED_PREFIXES = ("pooler.", "lm_head.", "classifier.", "qa_outputs.")
REQUIRED = ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers",
            "intermediate_size", "max_position_embeddings")
# (MPNet name, Encoder name) per layer; q/k/v are fused separately
LAYER_NAMES = (("attention.attn.o", "attention.out"), ("attention.LayerNorm", "norm1"),
               ("intermediate.dense", "ffn.up"), ("output.dense", "ffn.down"), ("output.LayerNorm", "norm2"))


def mpnet_config(hf: dict, common: dict) -> EncoderConfig:
    refuse(hf, "hidden_act", tuple(ACTIVATIONS), "gelu", "MPNet ")
    refuse(hf, "relative_attention_num_buckets", (BUCKETS,), BUCKETS, "MPNet ")
    for flag in ("is_decoder", "add_cross_attention"):
        if hf.get(flag):
            raise CheckpointError(f"MPNet config.json {flag}=true is not supported; ortformer imports bidirectional encoders only")
    require(hf, "MPNet", REQUIRED)
    return make_config(
        "MPNet", vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_heads=hf["num_attention_heads"],
        num_layers=hf["num_hidden_layers"], ffn_size=hf["intermediate_size"], attention="softmax",
        norm="layernorm", norm_position="post", activation=ACTIVATIONS[hf.get("hidden_act", "gelu")],
        positions="learned", max_positions=hf["max_position_embeddings"], position_offset=PADDING_IDX + 1,
        position_ids="kept", type_vocab_size=0, norm_eps=hf.get("layer_norm_eps", 1e-12),
        relative_attention=RelativeAttention(buckets=BUCKETS, max_distance=MAX_DISTANCE), **common)


def shapes(cfg: EncoderConfig) -> dict[str, tuple[int, ...]]:
    """transformers' MPNetModel tensor name -> shape (without dropped heads)."""
    f, ffn = cfg.hidden_size, cfg.ffn_size
    out = {"embeddings.word_embeddings.weight": (cfg.vocab_size, f),
           "embeddings.position_embeddings.weight": (cfg.max_positions, f),
           "embeddings.LayerNorm.weight": (f,), "embeddings.LayerNorm.bias": (f,),
           "encoder.relative_attention_bias.weight": (BUCKETS, cfg.num_heads)}
    linears = {"attention.attn.q": (f, f), "attention.attn.k": (f, f), "attention.attn.v": (f, f),
               "attention.attn.o": (f, f), "intermediate.dense": (ffn, f), "output.dense": (f, ffn)}
    for i in range(cfg.num_layers):
        out.update(layer_shapes(f"encoder.layer.{i}.", linears, ("attention.LayerNorm", "output.LayerNorm"), f))
    return out


def map_weights(raw: Tensors, cfg: EncoderConfig, what: str, duplicates) -> tuple[Tensors, list[str]]:
    """Check an MPNet state dict and rename it, fusing q, k, v into rows [Q; K; V]."""
    kept, dropped = split_dropped(raw, "mpnet.", DROPPED_PREFIXES)
    check_tensors(kept, shapes(cfg), dtypes=HF_DTYPES, what=what, duplicates=duplicates)
    out = {"tokens.weight": kept["embeddings.word_embeddings.weight"],
           "positions.table.weight": kept["embeddings.position_embeddings.weight"],
           "norm.weight": kept["embeddings.LayerNorm.weight"], "norm.bias": kept["embeddings.LayerNorm.bias"],
           "relative.table.weight": kept["encoder.relative_attention_bias.weight"]}
    out.update(post_norm_layers(kept, cfg.num_layers, ("attention.attn.q", "attention.attn.k", "attention.attn.v"),
                                LAYER_NAMES))
    return out, dropped


def load(folder, *, pooling: str | None = None, normalize: bool | None = None, name: str | None = None) -> Loaded:
    """Import an MPNet folder as an ortformer Encoder."""
    return import_folder(folder, family="mpnet", build=mpnet_config, map_weights=map_weights,
                         pooling=pooling, normalize=normalize, name=name)


FAMILY = Family("MPNet", ("mpnet",), load)
