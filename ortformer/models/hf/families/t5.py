"""Import the encoder of a T5 / mT5 folder (sentence-t5, gtr-t5, flan-t5 and their kin).

transformers' T5 encoder, with RMS(x) = x / sqrt(mean(x^2) + eps) * w and no biases anywhere:

    x = embed(ids);  per layer:  x = x + O(softmax(Q K^T + bias + mask) V),  Q K V from RMS_1(x)
                                 x = x + wo(act(wi(RMS_2(x))))            (feed_forward_proj "relu")
                                 x = x + wo(act(wi_0 h) * wi_1 h), h = RMS_2(x)   ("gated-gelu")
    out = RMS_final(x)

is ortformer's pre-norm encoder with norm="rmsnorm", bias=False, positions="none" and the
T5 relative position bias (one (buckets, H) table, in layer 0, added to every layer's
scores: the relative_attention group's buckets / max_distance, as MPNet). Two
differences are folded into the weights instead of the config:

- T5 does not scale Q K^T by 1/sqrt(D); ortformer's attention does, so W_Q is stored
  multiplied by sqrt(D) (exact for the power-of-two head sizes T5 uses);
- a gated FFN's up projection is ortformer's rows [a; g] = [wi_0; wi_1].

The decoder, LM head and task heads of T5Model / T5ForConditionalGeneration /
T5ForSequenceClassification / T5ForQuestionAnswering folders are set aside by name;
T5ForTokenClassification keeps its per-token head (heads.py). Heads of d_kv
that do not split d_model (t5-3b/11b; the small v1.1, flan-t5 and mT5 sizes: 6 heads of 64
in 512) set attention_head_size. Refused: other activations, and UMT5 (a relative bias per
layer).
"""
from __future__ import annotations

import math

import torch

from ....config import EncoderConfig, RelativeAttention
from ....core.errors import CheckpointError
from ...loaded import Loaded
from ...weights import Tensors, check_tensors
from ..activations import ACTIVATIONS
from ..config_checks import make_config, make_group, require
from ..folder_import import import_folder
from ..folder_layout import HF_DTYPES
from ..family import Family, VocabTokenizer
from ..spm_tokenizers import t5_tokenizer

MODEL_TYPES = ("t5", "mt5")
# feed_forward_proj's activation (after "gated-") maps as BERT's hidden_act (ACTIVATIONS);
# transformers turns "gated-gelu" into gelu_new, the tanh approximation
DROPPED_PREFIXES = ("decoder.", "lm_head.", "classification_head.", "classifier.", "qa_outputs.")
# T5For{Sequence,Token}Classification keep the base model under this prefix
BASE_PREFIX = "transformer."
# transformers' default feed_forward_proj per model_type, for config.json files that leave it out
DEFAULT_FEED_FORWARD = {"t5": "relu", "mt5": "gated-gelu"}
REQUIRED = ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads")
# T5 has no position table: this is only the runtime's length limit when config.json names none
DEFAULT_MAX_POSITIONS = 512


def feed_forward(hf: dict) -> tuple[str, bool]:
    """(ortformer activation, gated) as T5Config decides them: parsed from feed_forward_proj
    ("ACT" or "gated-ACT"; "gated-gelu" means gelu_new), unless config.json also holds
    ``dense_act_fn`` / ``is_gated_act`` (written by newer transformers), which then win."""
    proj = hf.get("feed_forward_proj", DEFAULT_FEED_FORWARD.get(hf.get("model_type"), "relu"))
    parts = proj.split("-") if isinstance(proj, str) else []
    if len(parts) not in (1, 2) or (len(parts) == 2 and parts[0] != "gated"):
        raise CheckpointError(f"T5 config.json feed_forward_proj={proj!r} is not supported; ortformer implements "
                              f"ACT or gated-ACT with ACT one of {', '.join(ACTIVATIONS)}")
    act = hf.get("dense_act_fn", "gelu_new" if proj == "gated-gelu" else parts[-1])
    gated = hf.get("is_gated_act", len(parts) == 2)
    if not isinstance(act, str) or act not in ACTIVATIONS or not isinstance(gated, bool):
        raise CheckpointError(f"T5 config.json feed_forward_proj={proj!r} (dense_act_fn={act!r}, is_gated_act="
                              f"{gated!r}) is not supported; ortformer implements ACT or gated-ACT with ACT one of "
                              f"{', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[act], gated


def t5_config(hf: dict, common: dict) -> EncoderConfig:
    if hf.get("model_type") not in MODEL_TYPES:
        from ...loading import unsupported_model_type
        raise unsupported_model_type(hf.get("model_type"))
    require(hf, "T5", REQUIRED)
    activation, gated = feed_forward(hf)
    relative = make_group("T5", RelativeAttention, buckets=hf.get("relative_attention_num_buckets", 32),
                          max_distance=hf.get("relative_attention_max_distance", 128))
    return make_config(
        "T5", vocab_size=hf["vocab_size"], hidden_size=hf["d_model"], num_heads=hf["num_heads"],
        # heads of d_kv need not split d_model (flan-t5-small: 6 x 64 in 512)
        attention_head_size=0 if hf["d_kv"] * hf["num_heads"] == hf["d_model"] else hf["d_kv"],
        num_layers=hf["num_layers"], ffn_size=hf["d_ff"], ffn_gated=gated, bias=False, attention="softmax",
        norm="rmsnorm", norm_position="pre", activation=activation, positions="none",
        max_positions=hf.get("n_positions") or DEFAULT_MAX_POSITIONS, type_vocab_size=0,
        norm_eps=hf.get("layer_norm_epsilon", 1e-6), relative_attention=relative, **common)


def shapes(cfg: EncoderConfig) -> dict[str, tuple[int, ...]]:
    """transformers' T5EncoderModel tensor name -> shape (the token table under one of its two names)."""
    f, ffn = cfg.hidden_size, cfg.ffn_size
    out = {"encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight":
           (cfg.relative_attention.buckets, cfg.num_heads), "encoder.final_layer_norm.weight": (f,)}
    up = ("wi_0", "wi_1") if cfg.ffn_gated else ("wi",)
    a = cfg.attention_size
    for i in range(cfg.num_layers):
        p = f"encoder.block.{i}.layer."
        for part in "qkv":
            out[f"{p}0.SelfAttention.{part}.weight"] = (a, f)
        out[f"{p}0.SelfAttention.o.weight"] = (f, a)
        for part in up:
            out[f"{p}1.DenseReluDense.{part}.weight"] = (ffn, f)
        out[f"{p}1.DenseReluDense.wo.weight"] = (f, ffn)
        out[f"{p}0.layer_norm.weight"] = out[f"{p}1.layer_norm.weight"] = (f,)
    return out


def map_weights(raw: Tensors, cfg: EncoderConfig, what: str, duplicates) -> tuple[Tensors, list[str]]:
    """Check a T5 encoder state dict and rename it (W_Q scaled by sqrt(D), q/k/v fused)."""
    raw = {name.removeprefix(BASE_PREFIX): tensor for name, tensor in raw.items()}
    # the token table is "shared.weight", tied to "encoder.embed_tokens.weight"; a file keeps one or both
    table = "encoder.embed_tokens.weight" if "encoder.embed_tokens.weight" in raw else "shared.weight"
    kept = {n: t for n, t in raw.items() if not n.startswith(DROPPED_PREFIXES) and n not in (
        "shared.weight", "encoder.embed_tokens.weight")}
    dropped = sorted(n for n in raw if n not in kept and n != table)
    if table not in raw:
        raise CheckpointError(f"{what} fails the checks against its config: missing (1): shared.weight "
                              "(or encoder.embed_tokens.weight), the token table")
    check_tensors({**kept, table: raw[table]}, {**shapes(cfg), table: (cfg.vocab_size, cfg.hidden_size)},
                  dtypes=HF_DTYPES, what=what, duplicates=duplicates)
    scale = math.sqrt(cfg.head_size)
    out = {"tokens.weight": raw[table], "norm.weight": kept["encoder.final_layer_norm.weight"],
           "relative.table.weight": kept["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]}
    for i in range(cfg.num_layers):
        p, q = f"encoder.block.{i}.layer.", f"blocks.{i}."
        attn = {part: kept[f"{p}0.SelfAttention.{part}.weight"].to(torch.float32) for part in "qkvo"}
        out[q + "attention.qkv.weight"] = torch.cat([attn["q"] * scale, attn["k"], attn["v"]], dim=0)
        out[q + "attention.out.weight"] = attn["o"]
        out[q + "norm1.weight"] = kept[f"{p}0.layer_norm.weight"]
        out[q + "norm2.weight"] = kept[f"{p}1.layer_norm.weight"]
        up = ("wi_0", "wi_1") if cfg.ffn_gated else ("wi",)
        out[q + "ffn.up.weight"] = torch.cat([kept[f"{p}1.DenseReluDense.{part}.weight"] for part in up], dim=0)
        out[q + "ffn.down.weight"] = kept[f"{p}1.DenseReluDense.wo.weight"]
    return out, dropped


def load(folder, *, pooling: str | None = None, normalize: bool | None = None, name: str | None = None) -> Loaded:
    """Import the encoder of a T5 / mT5 folder as an ortformer Encoder."""
    return import_folder(folder, family="t5", build=t5_config, map_weights=map_weights,
                         pooling=pooling, normalize=normalize, name=name)


FAMILY = Family("T5", ("t5", "mt5"), load,
                vocab_tokenizers={"t5": VocabTokenizer(t5_tokenizer, ("spiece.model",)),
                                  "mt5": VocabTokenizer(t5_tokenizer, ("spiece.model",))})
