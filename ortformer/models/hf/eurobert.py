"""Import a EuroBERT folder (``model_type: eurobert``): Llama's layers run bidirectionally.

transformers' EuroBertModel, with RMSNorm n(x) = w * x / sqrt(mean(x^2) + eps):

    x = embed_tokens(ids);  per layer:  x = x + o(attn(n_1(x)));  x = x + down(act(gate(n_2 x)) * up(n_2 x))
    out = n_final(x)

with rotate-half rotary positions at the sequence index and scores scaled by 1/sqrt(D): ortformer's
pre-norm ``rmsnorm`` encoder with a final norm, ``ffn_gated`` (rows [gate; up], the activated half
first) and ``positions = "rotary"``. Grouped-query attention (num_key_value_heads < heads) is
expanded: each K / V head's rows are repeated for the query heads that share it, which is what
Llama's repeat_kv computes. ``attention_bias`` and ``mlp_bias`` must agree (one ``bias`` field;
RMSNorm has none either way, so with biases on its bias is zero).

Classifiers: a per-token head is one Linear; a per-sequence head with ``classifier_pooling`` "bos"
or "mean" is W_o gelu(W_h v + b_h) + b_o on the first token or the mean. "late" (the mean of
per-token logits) is refused.
"""
from __future__ import annotations

import torch

from ...config import EncoderConfig
from ...errors import CheckpointError
from ..loaded import Loaded
from ..weights import Tensors, check_tensors
from .activations import ACTIVATIONS
from .folder import HF_DTYPES, default_rope_theta, import_folder, make_config, refuse, require

WHAT = "EuroBERT "
REQUIRED = ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size")
# task heads of EuroBertFor... checkpoints (the base model sits under "model.")
DROPPED_PREFIXES = ("lm_head.", "dense.", "classifier.")


def kv_heads(hf: dict) -> int:
    heads, kv = hf["num_attention_heads"], hf.get("num_key_value_heads") or hf["num_attention_heads"]
    if isinstance(kv, bool) or not isinstance(kv, int) or kv < 1 or heads % kv:
        raise CheckpointError(f"{WHAT}config.json num_key_value_heads={kv!r} is not supported; it must be an int "
                              f"that divides num_attention_heads={heads}")
    return kv


def eurobert_config(hf: dict, common: dict) -> EncoderConfig:
    require(hf, WHAT.strip(), REQUIRED)
    refuse(hf, "hidden_act", tuple(ACTIVATIONS), "silu", WHAT)
    refuse(hf, "rope_scaling", (None,), None, WHAT)
    refuse(hf, "pretraining_tp", (1,), 1, WHAT)
    biases = {flag: hf.get(flag, False) for flag in ("attention_bias", "mlp_bias")}
    if len(set(biases.values())) != 1 or not isinstance(biases["mlp_bias"], bool):
        raise CheckpointError(f"{WHAT}config.json attention_bias={biases['attention_bias']!r}, mlp_bias="
                              f"{biases['mlp_bias']!r} is not supported; ortformer implements both true or both false")
    kv_heads(hf)
    heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    params = hf.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise CheckpointError(f"{WHAT}config.json rope_parameters={params!r:.80} is not supported")
    return make_config(
        "EuroBERT", vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_heads=heads,
        attention_head_size=0 if head_dim * heads == hf["hidden_size"] else head_dim,
        num_layers=hf["num_hidden_layers"], ffn_size=hf["intermediate_size"], ffn_gated=True, bias=biases["mlp_bias"],
        attention="softmax", norm="rmsnorm", norm_position="pre", activation=ACTIVATIONS[hf.get("hidden_act", "silu")],
        positions="rotary", rotary_theta=default_rope_theta(params, hf.get("rope_theta", 10000.0), WHAT),
        max_positions=hf.get("max_position_embeddings", 8192), type_vocab_size=0,
        norm_eps=hf.get("rms_norm_eps", 1e-5), **common)


def names(cfg: EncoderConfig, kv: int) -> dict[str, tuple[int, ...]]:
    """EuroBertModel tensor name -> shape, ``kv`` key / value heads."""
    f, ffn, d = cfg.hidden_size, cfg.ffn_size, cfg.head_size
    a = d * cfg.num_heads
    shapes = {"embed_tokens.weight": (cfg.vocab_size, f), "norm.weight": (f,)}
    linears = {"self_attn.q_proj": (a, f), "self_attn.k_proj": (kv * d, f), "self_attn.v_proj": (kv * d, f),
               "self_attn.o_proj": (f, a), "mlp.gate_proj": (ffn, f), "mlp.up_proj": (ffn, f), "mlp.down_proj": (f, ffn)}
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        for name, shape in linears.items():
            shapes[p + name + ".weight"] = shape
            if cfg.bias:
                shapes[p + name + ".bias"] = shape[:1]
        shapes[p + "input_layernorm.weight"] = shapes[p + "post_attention_layernorm.weight"] = (f,)
    return shapes


def map_weights(raw: Tensors, cfg: EncoderConfig, what: str, duplicates, kv: int) -> tuple[Tensors, list[str]]:
    """Check a EuroBERT state dict and map it: q, k, v fused (K, V heads repeated for GQA)."""
    kept, dropped = {}, []
    for name, tensor in raw.items():
        short = name.removeprefix("model.")
        if short.startswith(DROPPED_PREFIXES) or short.endswith("inv_freq"):
            dropped.append(name)
        else:
            kept[short] = tensor
    check_tensors(kept, names(cfg, kv), dtypes=HF_DTYPES, what=what, duplicates=duplicates)
    groups, d = cfg.num_heads // kv, cfg.head_size

    def expand(t: torch.Tensor) -> torch.Tensor:  # (kv x D, ...) -> (H x D, ...), head h reads group h // groups
        return t.reshape(kv, d, *t.shape[1:]).repeat_interleave(groups, dim=0).reshape(kv * groups * d, *t.shape[1:])

    out = {"tokens.weight": kept["embed_tokens.weight"], "norm.weight": kept["norm.weight"]}
    for i in range(cfg.num_layers):
        p, q = f"layers.{i}.", f"blocks.{i}."
        kinds = ("weight", "bias") if cfg.bias else ("weight",)
        for kind in kinds:
            attn = [kept[p + f"self_attn.{n}_proj.{kind}"] for n in "qkv"]
            out[q + f"attention.qkv.{kind}"] = torch.cat([attn[0], expand(attn[1]), expand(attn[2])])
            out[q + f"attention.out.{kind}"] = kept[p + f"self_attn.o_proj.{kind}"]
            out[q + f"ffn.up.{kind}"] = torch.cat([kept[p + f"mlp.gate_proj.{kind}"], kept[p + f"mlp.up_proj.{kind}"]])
            out[q + f"ffn.down.{kind}"] = kept[p + f"mlp.down_proj.{kind}"]
        out[q + "norm1.weight"], out[q + "norm2.weight"] = kept[p + "input_layernorm.weight"], kept[p + "post_attention_layernorm.weight"]
    return out, sorted(dropped)


def load(folder, *, pooling: str | None = None, normalize: bool | None = None, name: str | None = None) -> Loaded:
    """Import a EuroBERT folder as an ortformer Encoder."""
    heads = {}

    def build(hf: dict, common: dict) -> EncoderConfig:
        cfg = eurobert_config(hf, common)
        heads["kv"] = kv_heads(hf)
        return cfg

    def weights(raw, cfg, what, duplicates):
        return map_weights(raw, cfg, what, duplicates, heads["kv"])

    return import_folder(folder, family="eurobert", build=build, map_weights=weights,
                         pooling=pooling, normalize=normalize, name=name)
