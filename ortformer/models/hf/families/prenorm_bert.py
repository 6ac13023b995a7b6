"""Import the pre-norm BERTs: XLM-RoBERTa-XL / -XXL (``xlm-roberta-xl``), Megatron-BERT
(``megatron-bert``), RoBERTa-PreLayerNorm (``roberta-prelayernorm``) and ESM protein language
models (``esm``).

Both keep BERT's weights and names but move the LayerNorms in front of each sublayer:

    e = word + type + position;  per layer:  x = x + O(attn(LN_1 x));  x = x + W2 act(W1 LN_2 x)
    out = LN_final(x)

with no LayerNorm on the embeddings (but RoBERTa-PreLayerNorm's and ESM-1b's, below): ortformer's
pre-norm encoder (its ``norm`` is the final LayerNorm). XLM-R-XL counts positions as RoBERTa does (position_offset = pad_token_id + 1 over
kept tokens, one token type folded into the position table); Megatron-BERT as BERT does.
RoBERTa-PreLayerNorm is XLM-R-XL's layout with a LayerNorm on the embeddings as well, ahead of
layer 0's own (embedding_norm with first_block_norm), its pre-norms named attention.LayerNorm and
intermediate.LayerNorm, the final one LayerNorm at the top.

ESM has no token types and GELU (erf) whatever hidden_act says; ESM-2 rotates q and k
(rotate-half at the sequence index; ESM scales q by 1/sqrt(D) before the rotation, which is the
same product), older ESM folders keep a learned table counted as RoBERTa's. ``token_dropout``
(ESM-2) becomes ``token_dropout_id = mask_token_id`` (encoder.token_dropout). ESM-1b / ESM-1v
(``emb_layer_norm_before``) normalise the embeddings ahead of layer 0's own LayerNorm, as
RoBERTa-PreLayerNorm does; ESMFold is refused by name.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from ....config import EncoderConfig
from ....core.errors import CheckpointError
from ...layers import Rotary
from ...loaded import Loaded
from ...weights import Tensors, check_tensors
from ..bert_layout import DROPPED_PREFIXES as BERT_DROPPED
from ..bert_layout import bert_fields, check_bert_layout, layer_shapes, post_norm_layers, split_dropped
from ..config_checks import default_rope_theta, make_config, refuse, require
from ..folder_import import import_folder
from ..folder_files import FolderFiles
from ..folder_layout import HF_DTYPES
from ..family import Family, VocabTokenizer
from ..spm_tokenizers import xlm_roberta_tokenizer
from ..vocab_tokenizers import byte_bpe_tokenizer, esm_tokenizer, wordpiece_tokenizer
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
    roberta_types: bool = False  # config type_vocab_size 0: the file's single type row is folded into the positions
    embed_norm: str | None = None  # the embeddings' LayerNorm, read when the config sets embedding_norm


ESM_DROPPED = ("pooler.", "contact_head.", "lm_head.", "classifier.", "qa_outputs.")
XL = Names("XLM-RoBERTa-XL", "roberta.", ROBERTA_DROPPED, "attention.self_attn_layer_norm", "LayerNorm", "encoder.LayerNorm",
           roberta_types=True)
MEGATRON = Names("Megatron-BERT", "bert.", BERT_DROPPED, "attention.ln", "ln", "encoder.ln")
ESM = Names("ESM", "esm.", ESM_DROPPED, "attention.LayerNorm", "LayerNorm", "encoder.emb_layer_norm_after",
            embed_norm="embeddings.layer_norm")
PRE_LAYER_NORM = Names("RoBERTa-PreLayerNorm", "roberta_prelayernorm.", ROBERTA_DROPPED, "attention.LayerNorm",
                       "intermediate.LayerNorm", "LayerNorm", roberta_types=True, embed_norm="embeddings.LayerNorm")
# both LayerNorms ahead of layer 0: the embeddings' own, then the layer's
TWICE_NORMED = {"norm_position": "pre", "embedding_norm": True, "first_block_norm": True}


def megatron_config(hf: dict, common: dict) -> EncoderConfig:
    check_bert_layout(hf, "Megatron-BERT ")
    return make_config("Megatron-BERT", **{**bert_fields(hf), "norm_position": "pre"}, **common)


def xl_config(hf: dict, common: dict) -> EncoderConfig:
    return make_config("XLM-RoBERTa-XL", **{**roberta_fields(hf, "XLM-RoBERTa-XL "), "norm_position": "pre"}, **common)


def prelayernorm_config(hf: dict, common: dict) -> EncoderConfig:
    fields = roberta_fields(hf, "RoBERTa-PreLayerNorm ")
    return make_config("RoBERTa-PreLayerNorm", **{**fields, **TWICE_NORMED}, **common)


def esm_config(hf: dict, common: dict) -> EncoderConfig:
    what = "ESM "
    refuse(hf, "is_folding_model", (False, None), False, what)
    refuse(hf, "emb_layer_norm_before", (False, True, None), None, what)
    refuse(hf, "position_embedding_type", ("rotary", "absolute"), "absolute", what)
    for flag in ("is_decoder", "add_cross_attention"):
        refuse(hf, flag, (False,), False, what)
    require(hf, "ESM", ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size",
                        "max_position_embeddings"))
    fields = {**bert_fields({**hf, "hidden_act": "gelu"}), "norm_position": "pre", "type_vocab_size": 0}
    if hf.get("emb_layer_norm_before"):  # ESM-1b / ESM-1v
        fields.update(TWICE_NORMED)
    if hf.get("position_embedding_type", "absolute") == "rotary":
        fields.update(positions="rotary", rotary_theta=default_rope_theta({}, hf.get("rope_theta", 10000.0), what))
    else:  # ESM's own create_position_ids: RoBERTa's count of kept tokens after padding_idx
        pad = hf.get("pad_token_id")
        if isinstance(pad, bool) or not isinstance(pad, int) or pad < 0:
            raise CheckpointError(f"{what}config.json pad_token_id={pad!r} is not supported; learned positions "
                                  "start at pad_token_id + 1, so it must be an int >= 0")
        fields.update(position_offset=pad + 1, position_ids="kept")
    if hf.get("token_dropout"):
        mask = hf.get("mask_token_id")
        if isinstance(mask, bool) or not isinstance(mask, int):
            raise CheckpointError(f"{what}config.json token_dropout=true needs an int mask_token_id, got {mask!r}")
        fields["token_dropout_id"] = mask
    return make_config("ESM", **fields, **common)


def check_rotary_tables(tables: Tensors, cfg: EncoderConfig, what: str) -> None:
    """ESM files store the rotary frequencies theta^(-2i/D) that transformers then uses; ortformer
    computes them from rope_theta. Equal: nothing to say. A float16 / bfloat16 rounding of them (a
    half-precision save): a warning, as transformers' outputs then carry that rounding and ortformer's
    do not. Anything else was made with another theta: CheckpointError."""
    d = cfg.head_size
    exact = Rotary(d, cfg.rotary_theta).frequencies()  # what the encoder computes
    rounded = []
    for name, table in tables.items():
        if tuple(table.shape) != tuple(exact.shape) or not table.is_floating_point():
            raise CheckpointError(f"{what}: {name} has shape {tuple(table.shape)} and dtype {table.dtype}; "
                                  f"expected ({d // 2},) rotary frequencies")
        if torch.allclose(table.float(), exact, rtol=1e-6, atol=0):
            continue
        if table.dtype in (torch.float16, torch.bfloat16) and torch.equal(table, exact.to(table.dtype)):
            rounded.append((name, table.dtype))
            continue
        raise CheckpointError(f"{what}: {name} holds rotary frequencies other than those of config.json rope_theta="
                              f"{cfg.rotary_theta:g} (second frequency {float(table[1]):.6g}, expected "
                              f"{float(exact[1]):.6g}); ortformer computes them from rope_theta: correct config.json")
    if rounded:
        warnings.warn(f"{what}: {rounded[0][0]} holds the rotary frequencies rounded to {rounded[0][1]} (a half-precision "
                      "save); transformers computes with the rounded ones, ortformer with the exact ones from "
                      "rope_theta, so outputs differ from transformers' by that rounding", stacklevel=2)


def shapes(cfg: EncoderConfig, names: Names, hf_types: int) -> dict[str, tuple[int, ...]]:
    f, ffn = cfg.hidden_size, cfg.ffn_size
    out = {"embeddings.word_embeddings.weight": (cfg.vocab_size, f), names.final + ".weight": (f,),
           names.final + ".bias": (f,)}
    if cfg.embedding_norm:
        out.update({f"{names.embed_norm}.weight": (f,), f"{names.embed_norm}.bias": (f,)})
    if cfg.positions == "learned":
        out["embeddings.position_embeddings.weight"] = (cfg.max_positions, f)
    if hf_types:
        out["embeddings.token_type_embeddings.weight"] = (hf_types, f)
    linears = {"attention.self.query": (f, f), "attention.self.key": (f, f), "attention.self.value": (f, f),
               "attention.output.dense": (f, f), "intermediate.dense": (ffn, f), "output.dense": (f, ffn)}
    for i in range(cfg.num_layers):
        out.update(layer_shapes(f"encoder.layer.{i}.", linears, (names.norm1, names.norm2), f))
    return out


def map_weights(names: Names, raw: Tensors, cfg: EncoderConfig, what: str, duplicates) -> tuple[Tensors, list[str]]:
    hf_types = (cfg.type_vocab_size or 1) if names.roberta_types else cfg.type_vocab_size
    rotary = [name for name in raw if name.endswith("rotary_embeddings.inv_freq")]  # ESM's angle buffers
    if cfg.positions == "rotary":
        check_rotary_tables({name: raw[name] for name in rotary}, cfg, what)
    kept, dropped = split_dropped({k: v for k, v in raw.items() if k not in rotary}, names.prefix, names.dropped)
    check_tensors(kept, shapes(cfg, names, hf_types), dtypes=HF_DTYPES, what=what, duplicates=duplicates)
    out = {"tokens.weight": kept["embeddings.word_embeddings.weight"],
           "norm.weight": kept[names.final + ".weight"], "norm.bias": kept[names.final + ".bias"]}
    if cfg.positions == "learned":
        positions = kept["embeddings.position_embeddings.weight"]
        if hf_types == 1 and not cfg.type_vocab_size:
            positions = positions.float() + kept["embeddings.token_type_embeddings.weight"][0].float()
        out["positions.table.weight"] = positions
    if cfg.type_vocab_size:
        out["types.weight"] = kept["embeddings.token_type_embeddings.weight"]
    if cfg.embedding_norm:
        out.update({f"embed_norm.{kind}": kept[f"{names.embed_norm}.{kind}"] for kind in ("weight", "bias")})
    layer_names = (("attention.output.dense", "attention.out"), (names.norm1, "norm1"), ("intermediate.dense", "ffn.up"),
                   ("output.dense", "ffn.down"), (names.norm2, "norm2"))
    out.update(post_norm_layers(kept, cfg.num_layers, ("attention.self.query", "attention.self.key",
                                                       "attention.self.value"), layer_names))
    return out, sorted(dropped + rotary)


def load(folder, *, pooling: str | None = None, normalize: bool | None = None, name: str | None = None) -> Loaded:
    """Import an XLM-RoBERTa-XL, Megatron-BERT, ESM or RoBERTa-PreLayerNorm folder as an ortformer Encoder."""
    files = FolderFiles.of(folder)  # parsed once: load_any hands over the files it read
    model_type = files.config.get("model_type")
    names, build = {"xlm-roberta-xl": (XL, xl_config), "esm": (ESM, esm_config),
                    "roberta-prelayernorm": (PRE_LAYER_NORM, prelayernorm_config)}.get(model_type,
                                                                                      (MEGATRON, megatron_config))

    def weights(raw, cfg, what, duplicates):
        return map_weights(names, raw, cfg, what, duplicates)

    return import_folder(files, family=model_type, build=build, map_weights=weights,
                         pooling=pooling, normalize=normalize, name=name)


FAMILY = Family("pre-norm BERT", ("xlm-roberta-xl", "megatron-bert", "esm", "roberta-prelayernorm"), load,
                vocab_tokenizers={"xlm-roberta-xl": VocabTokenizer(xlm_roberta_tokenizer, ("sentencepiece.bpe.model",)),
                                  "megatron-bert": VocabTokenizer(wordpiece_tokenizer, ("vocab.txt",)),
                                  "esm": VocabTokenizer(esm_tokenizer, ("vocab.txt",)),
                                  "roberta-prelayernorm": VocabTokenizer(byte_bpe_tokenizer, ("vocab.json", "merges.txt"))})
