"""Import a NeoBERT folder (``model_type: neobert``: chandar-lab/NeoBERT, made for the remote code its
``auto_map`` names, which transformers does not ship).

NeoBERT is a pre-norm encoder with RMSNorm (n(x) = w * x / sqrt(mean(x^2) + eps), eps = norm_eps),
no biases, no token types and no position table:

    x = embed(ids);  per layer:  x = x + W_o attn(n_attn(x));  x = x + W_3 (silu(a) * g), [a; g] = W_12 n_ffn(x)
    out = n_final(x)

attention over all kept keys (bidirectional), q and k rotated by position with the interleaved
(complex) pairs (2j, 2j + 1) of a head turning by p * 10000^(-2j/D), scores over sqrt(D). The fused
``qkv`` Linear's rows are grouped per head, [q_h; k_h; v_h] for each head h (its output is viewed as
(H, 3D) and chunked); the import regroups them as [Q; K; V] and permutes each head's query and key
rows to rotate-half order, as roformer.py does (q . k is unchanged). The SwiGLU's inner width is
NeoBERT's 2/3 of intermediate_size rounded up to a multiple of 8. The masked-LM head (``decoder``) is
set aside; a sequence-classification head is not imported (it is listed as dropped).
"""
from __future__ import annotations

import torch

from ....config import EncoderConfig
from ...loaded import Loaded
from ...weights import Tensors, check_tensors
from ..config_checks import make_config, refuse, require
from ..family import Family
from ..folder_import import import_folder
from ..folder_layout import HF_DTYPES
from .roformer import rotate_half_order

WHAT = "NeoBERT "
REQUIRED = ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size")
# the remote code's NeoBERTConfig defaults, for keys a config.json leaves out
DEFAULTS = {"norm_eps": 1e-6, "max_length": 1024}
DROPPED_PREFIXES = ("decoder.", "dense.", "classifier.")
ROTARY_THETA = 10000.0  # the remote code's precompute_freqs_cis default; config.json has no key for it


def ffn_size(intermediate: int) -> int:
    """NeoBERT's SwiGLU width: int(2 * intermediate_size / 3) rounded up to a multiple of 8."""
    inner = int(2 * intermediate / 3)
    return 8 * ((inner + 7) // 8)


def neobert_config(hf: dict, common: dict) -> EncoderConfig:
    require(hf, WHAT.strip(), REQUIRED)
    # keys of later NeoBERT code that switch its layers to other forms; the released model has none
    refuse(hf, "rope", (True,), True, WHAT)
    refuse(hf, "rms_norm", (True,), True, WHAT)
    refuse(hf, "hidden_act", ("swiglu", "SwiGLU"), "swiglu", WHAT)
    refuse(hf, "ngpt", (False,), False, WHAT)
    return make_config(
        WHAT.strip(), vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_heads=hf["num_attention_heads"],
        num_layers=hf["num_hidden_layers"], ffn_size=ffn_size(hf["intermediate_size"]), ffn_gated=True, bias=False,
        attention="softmax", norm="rmsnorm", norm_position="pre", activation="silu", positions="rotary",
        rotary_theta=ROTARY_THETA, type_vocab_size=0, max_positions=hf.get("max_length", DEFAULTS["max_length"]),
        norm_eps=hf.get("norm_eps", DEFAULTS["norm_eps"]), **common)


def names(cfg: EncoderConfig) -> dict[str, tuple[int, ...]]:
    """Saved tensor name (without "model.") -> shape."""
    f, ffn = cfg.hidden_size, cfg.ffn_size
    shapes = {"encoder.weight": (cfg.vocab_size, f), "layer_norm.weight": (f,)}
    for i in range(cfg.num_layers):
        p = f"transformer_encoder.{i}."
        shapes.update({p + "qkv.weight": (3 * f, f), p + "wo.weight": (f, f), p + "ffn.w12.weight": (2 * ffn, f),
                       p + "ffn.w3.weight": (f, ffn), p + "attention_norm.weight": (f,), p + "ffn_norm.weight": (f,)})
    return shapes


def split_qkv(qkv: torch.Tensor, heads: int) -> torch.Tensor:
    """NeoBERT's per-head [q_h; k_h; v_h] rows (3F, F) as [Q; K; V], q and k in rotate-half order."""
    d = qkv.shape[0] // (3 * heads)
    per_head = qkv.reshape(heads, 3, d, qkv.shape[1])  # (H, 3, D, F)
    q, k, v = (per_head[:, part].reshape(heads * d, -1) for part in range(3))
    return torch.cat([rotate_half_order(q, heads), rotate_half_order(k, heads), v])


def map_weights(raw: Tensors, cfg: EncoderConfig, what: str, duplicates) -> tuple[Tensors, list[str]]:
    kept, dropped = {}, []
    for name, tensor in raw.items():
        short = name.removeprefix("model.")
        if short.startswith(DROPPED_PREFIXES) or short == "freqs_cis":
            dropped.append(name)
        else:
            kept[short] = tensor
    check_tensors(kept, names(cfg), dtypes=HF_DTYPES, what=what, duplicates=duplicates)
    out = {"tokens.weight": kept["encoder.weight"], "norm.weight": kept["layer_norm.weight"]}
    for i in range(cfg.num_layers):
        p, q = f"transformer_encoder.{i}.", f"blocks.{i}."
        out[q + "attention.qkv.weight"] = split_qkv(kept[p + "qkv.weight"], cfg.num_heads)
        out[q + "attention.out.weight"] = kept[p + "wo.weight"]
        out[q + "ffn.up.weight"], out[q + "ffn.down.weight"] = kept[p + "ffn.w12.weight"], kept[p + "ffn.w3.weight"]
        out[q + "norm1.weight"], out[q + "norm2.weight"] = kept[p + "attention_norm.weight"], kept[p + "ffn_norm.weight"]
    return out, sorted(dropped)


def load(folder, *, pooling: str | None = None, normalize: bool | None = None, name: str | None = None) -> Loaded:
    """Import a NeoBERT folder as an ortformer Encoder."""
    return import_folder(folder, family="neobert", build=neobert_config, map_weights=map_weights,
                         pooling=pooling, normalize=normalize, name=name)


FAMILY = Family("NeoBERT", ("neobert",), load)
