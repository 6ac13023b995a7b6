"""Import the pre-norm BERTs: XLM-RoBERTa-XL / -XXL (``xlm-roberta-xl``) and Megatron-BERT
(``megatron-bert``).

Both keep BERT's weights and names but move the LayerNorms in front of each sublayer:

    e = word + type + position;  per layer:  x = x + O(attn(LN_1 x));  x = x + W2 act(W1 LN_2 x)
    out = LN_final(x)

with no LayerNorm on the embeddings: ortformer's pre-norm encoder (its ``norm`` is the final
LayerNorm). XLM-R-XL counts positions as RoBERTa does (position_offset = pad_token_id + 1 over
kept tokens, one token type folded into the position table); Megatron-BERT as BERT does.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...config import EncoderConfig
from ..loaded import Loaded
from ..weights import Tensors, check_tensors
from .bert import DROPPED_PREFIXES as BERT_DROPPED
from .bert import bert_fields, check_bert_layout, layer_shapes, post_norm_layers, split_dropped
from .folder import HF_DTYPES, import_folder, make_config, read_json, transformer_dir
from .roberta import DROPPED_PREFIXES as ROBERTA_DROPPED
from .roberta import roberta_fields


@dataclass(frozen=True)
class Names:
    what: str
    prefix: str  # the base model's prefix in task checkpoints
    dropped: tuple[str, ...]
    norm1: str  # under encoder.layer.{i}.
    norm2: str
    final: str


XL = Names("XLM-RoBERTa-XL", "roberta.", ROBERTA_DROPPED, "attention.self_attn_layer_norm", "LayerNorm", "encoder.LayerNorm")
MEGATRON = Names("Megatron-BERT", "bert.", BERT_DROPPED, "attention.ln", "ln", "encoder.ln")


def megatron_config(hf: dict, common: dict) -> EncoderConfig:
    check_bert_layout(hf, "Megatron-BERT ")
    return make_config("Megatron-BERT", **{**bert_fields(hf), "norm_position": "pre"}, **common)


def xl_config(hf: dict, common: dict) -> EncoderConfig:
    return make_config("XLM-RoBERTa-XL", **{**roberta_fields(hf, "XLM-RoBERTa-XL "), "norm_position": "pre"}, **common)


def shapes(cfg: EncoderConfig, names: Names, hf_types: int) -> dict[str, tuple[int, ...]]:
    f, ffn = cfg.hidden_size, cfg.ffn_size
    out = {"embeddings.word_embeddings.weight": (cfg.vocab_size, f),
           "embeddings.position_embeddings.weight": (cfg.max_positions, f),
           names.final + ".weight": (f,), names.final + ".bias": (f,)}
    if hf_types:
        out["embeddings.token_type_embeddings.weight"] = (hf_types, f)
    linears = {"attention.self.query": (f, f), "attention.self.key": (f, f), "attention.self.value": (f, f),
               "attention.output.dense": (f, f), "intermediate.dense": (ffn, f), "output.dense": (f, ffn)}
    for i in range(cfg.num_layers):
        out.update(layer_shapes(f"encoder.layer.{i}.", linears, (names.norm1, names.norm2), f))
    return out


def map_weights(names: Names, raw: Tensors, cfg: EncoderConfig, what: str, duplicates) -> tuple[Tensors, list[str]]:
    # XLM-R-XL's config type_vocab_size 0 means the file's single type row is folded into the positions
    hf_types = (cfg.type_vocab_size or 1) if names is XL else cfg.type_vocab_size
    kept, dropped = split_dropped(raw, names.prefix, names.dropped)
    check_tensors(kept, shapes(cfg, names, hf_types), dtypes=HF_DTYPES, what=what, duplicates=duplicates)
    positions = kept["embeddings.position_embeddings.weight"]
    if hf_types == 1 and not cfg.type_vocab_size:
        positions = positions.float() + kept["embeddings.token_type_embeddings.weight"][0].float()
    out = {"tokens.weight": kept["embeddings.word_embeddings.weight"], "positions.table.weight": positions,
           "norm.weight": kept[names.final + ".weight"], "norm.bias": kept[names.final + ".bias"]}
    if cfg.type_vocab_size:
        out["types.weight"] = kept["embeddings.token_type_embeddings.weight"]
    layer_names = (("attention.output.dense", "attention.out"), (names.norm1, "norm1"), ("intermediate.dense", "ffn.up"),
                   ("output.dense", "ffn.down"), (names.norm2, "norm2"))
    out.update(post_norm_layers(kept, cfg.num_layers, ("attention.self.query", "attention.self.key",
                                                       "attention.self.value"), layer_names))
    return out, dropped


def load(folder, *, pooling: str | None = None, normalize: bool | None = None, name: str | None = None) -> Loaded:
    """Import an XLM-RoBERTa-XL or Megatron-BERT folder as an ortformer Encoder."""
    model_type = read_json(transformer_dir(Path(folder)) / "config.json").get("model_type")
    names, build = (XL, xl_config) if model_type == "xlm-roberta-xl" else (MEGATRON, megatron_config)

    def weights(raw, cfg, what, duplicates):
        return map_weights(names, raw, cfg, what, duplicates)

    return import_folder(folder, family=model_type, build=build, map_weights=weights,
                         pooling=pooling, normalize=normalize, name=name)
