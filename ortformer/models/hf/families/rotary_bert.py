"""Import the rotary post-norm BERTs of embedding models: NomicBERT (``nomic_bert``:
nomic-embed-text), GTE (``gte``, and ``new``, the model_type of Alibaba-NLP's own
gte-*-v1.5 / gte-multilingual folders) and Jina embeddings v3 (``jina_embeddings_v3``).

All three are, in transformers' terms (JinaEmbeddingsV3Layer):

    e = LN_emb(word + type);  per layer:  x = LN_1(x + O(attn(x)));  x = LN_2(x + mlp(x))

with rotate-half rotary positions at the sequence index (theta from rope_parameters), the
scores scaled by 1/sqrt(D): ortformer's post-norm softmax encoder with positions="rotary".
They differ in the MLP and in which Linears carry a bias:

- NomicBERT: SwiGLU, down(silu(fc12 x) * fc11 x), no Linear biases (LayerNorms have them);
  the original remote code's GELU MLP fc2(gelu(fc1 x)) (``activation_function: gelu``, erf form),
  and in NomicBERT-MoE (nomic-embed-text-v2-moe: ``num_experts``, ``moe_top_k``,
  ``moe_every_n_layers``) a mixture of experts in place of the MLP of layers l % n == 1, read from
  ``mlp.router.layer`` (E x F), ``mlp.experts.mlp.w1`` / ``w2`` (E x ffn rows each: act(x W1_e^T) W2_e)
  and ``mlp.experts.bias`` (the ``experts`` group; mixers.MixtureOfExperts has the formula);
- GTE: GeGLU, down(gelu(gate) * up) with ``up_gate_proj`` rows [up; gate], biases on the
  attention and on ``down_proj`` only;
- Jina v3: plain fc2(act(fc1 x)), biases everywhere.

ortformer's one ``bias`` field covers every Linear, so a Linear saved without a bias gets a
zero bias (exact; one add per Linear). Its gated up projection is rows [a; g] with act(a),
so the activated half goes first. A single token type (type_vocab_size 1) adds one vector
to every token: it is folded into the token table, and the model takes no token_type_ids.

The weights are read as transformers saves them, which is also how the Hub folders hold
them (NomicBERT's ``attn.Wqkv`` / ``mlp.fc11``, GTE's ``qkv_proj``, Jina's ``mixer.Wqkv``).
Folders written for the original remote code carry other config keys: NomicBERT's GPT-2
style ``n_embd`` / ``n_head`` / ``rotary_emb_base`` ..., GTE's ``model_type: new`` with
``rope_theta`` and its fixed NTK ``rope_scaling`` (see rotary); both are read, and what they
describe beyond the layout above (pre-norm, interleaved or partial rotary, logn scaling, ...) is
refused by name.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ....config import EncoderConfig, Experts
from ....core.checks import brief
from ....core.errors import CheckpointError
from ...loaded import Loaded
from ...weights import Tensors, check_tensors
from ..activations import ACTIVATIONS
from ..config_checks import make_config, make_group, refuse, require, rope_theta
from ..folder_import import import_folder
from ..folder_files import FolderFiles
from ..folder_layout import HF_DTYPES
from ..family import Family, VocabTokenizer
from ..vocab_tokenizers import wordpiece_tokenizer

MODEL_TYPES = ("nomic_bert", "gte", "new", "jina_embeddings_v3")
REQUIRED = ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size")
# prefixes of task models' base model, and heads an encoder does not use
PREFIXES = ("nomic_bert.", "gte.", "new.", "roberta.", "bert.")
DROPPED = ("pooler.", "lm_head.", "cls.", "classifier.", "qa_outputs.")


@dataclass(frozen=True)
class Layout:
    """Where a family keeps each tensor (names under encoder layer i) and which have biases."""
    what: str
    embed_norm: str
    layer: str  # prefix of layer i, with {i}
    qkv: str
    out: str
    norms: tuple[str, str]
    up: tuple[str, ...]  # gated: (activated half, other half) as saved; plain: (fc1,)
    down: str
    biased: frozenset  # which of "qkv", "out", "up", "down" are saved with a bias
    gte_up_gate: bool = False  # GTE saves the gated halves as one Linear, rows [up; gate]


ALL = frozenset({"qkv", "out", "up", "down"})
NOMIC = dict(embed_norm="emb_ln", layer="encoder.layers.{i}.", qkv="attn.Wqkv", out="attn.out_proj",
             norms=("norm1", "norm2"), down="mlp.fc2")
GTE = Layout("GTE ", "embeddings.LayerNorm", "encoder.layer.{i}.", "attention.qkv_proj", "attention.o_proj",
             ("attn_ln", "mlp_ln"), ("mlp.up_gate_proj",), "mlp.down_proj", frozenset({"qkv", "out", "down"}),
             gte_up_gate=True)
JINA = Layout("Jina v3 ", "emb_ln", "encoder.layers.{i}.", "mixer.Wqkv", "mixer.out_proj", ("norm1", "norm2"),
              ("mlp.fc1",), "mlp.fc2", ALL)
DEFAULTS = {  # transformers' defaults where config.json leaves a key out
    "nomic_bert": dict(theta=1000.0, act="silu", types=2, eps=1e-12, positions=2048),
    "gte": dict(theta=160000.0, act="gelu", types=1, eps=1e-12, positions=8192),
    "new": dict(theta=10000.0, act="gelu", types=0, eps=1e-12, positions=8192),
    "jina_embeddings_v3": dict(theta=20000.0, act="gelu", types=1, eps=1e-5, positions=8194),
}
# the original NomicBERT config's GPT-2 style names -> transformers' names
NOMIC_LEGACY_KEYS = {"n_embd": "hidden_size", "n_head": "num_attention_heads", "n_layer": "num_hidden_layers",
                     "n_inner": "intermediate_size", "n_positions": "max_position_embeddings",
                     "layer_norm_epsilon": "layer_norm_eps", "rotary_emb_base": "rope_theta"}
# original NomicBERT flags and the value of the layout above
NOMIC_LEGACY_FIXED = {"prenorm": False, "parallel_block": False, "rotary_emb_fraction": 1.0,
                      "rotary_emb_interleaved": False, "use_rms_norm": False, "rotary_scaling_factor": None,
                      "rotary_emb_scale_base": None, "causal": False, "scale_attn_by_inverse_layer_idx": False,
                      "scale_attn_weights": True}
NOMIC_LEGACY_REQUIRED = ("n_embd", "n_head", "n_layer", "n_inner", "vocab_size", "rotary_emb_base", "layer_norm_epsilon",
                         "rotary_emb_fraction", "qkv_proj_bias", "mlp_fc1_bias", "mlp_fc2_bias", "activation_function")
GTE_LEGACY_FIXED = {"position_embedding_type": "rope", "layer_norm_type": "layer_norm", "pack_qkv": True,
                    "logn_attention_scale": False}


def read_nomic_legacy(hf: dict) -> tuple[dict, Layout]:
    """transformers-named config of an original NomicBERT config.json, and its layout. The remote
    code's defaults differ from transformers' (no rotary, biases on, theta 10000, eps 1e-5), so the
    keys that shape the model must be written out, as every released config does."""
    missing = [key for key in NOMIC_LEGACY_REQUIRED if key not in hf]
    if missing:
        raise CheckpointError(f"NomicBERT config.json (the original remote code's keys) lacks {', '.join(missing)}; "
                              "ortformer reads these only as written, not by the remote code's defaults")
    for key, value in NOMIC_LEGACY_FIXED.items():
        refuse(hf, key, (value,), value, "NomicBERT ")
    out = {**hf, **{new: hf[old] for old, new in NOMIC_LEGACY_KEYS.items() if hf.get(old) is not None}}
    multiple = hf.get("pad_vocab_size_multiple") or 1
    if isinstance(out.get("vocab_size"), int) and isinstance(multiple, int) and multiple > 1:
        out["vocab_size"] = -(-out["vocab_size"] // multiple) * multiple  # the table is padded to a multiple
    # released NomicBERTs are SwiGLU, NomicBERT-MoE's dense layers GELU (erf); the remote code's other MLPs
    # are not read without an oracle
    refuse(hf, "activation_function", ("swiglu", "gelu"), "swiglu", "NomicBERT ")
    gated = hf["activation_function"] == "swiglu"
    out["hidden_act"] = "silu" if gated else "gelu"
    biased = {name for name, key in (("qkv", "qkv_proj_bias"), ("up", "mlp_fc1_bias"), ("down", "mlp_fc2_bias"))
              if hf.get(key, False)}
    if hf.get("qkv_proj_bias", False):
        biased.add("out")  # the original attention keeps one bias flag for Wqkv and out_proj
    up = ("mlp.fc12", "mlp.fc11") if gated else ("mlp.fc1",)
    return out, Layout("NomicBERT ", up=up, biased=frozenset(biased), **NOMIC)


# NomicBERT-MoE's keys, and the value of those that shape another model than mixers.MixtureOfExperts
NOMIC_MOE_FIXED = {"moe_normalize_expert_weights": False, "expert_choice_router": False, "num_shared_experts": 0,
                   "ffn_div": 1}


def nomic_experts(hf: dict) -> Experts | None:
    """The experts group of a NomicBERT-MoE config.json (the remote code's rule: layer l has experts
    when l % moe_every_n_layers == 1), None without experts."""
    every, count = hf.get("moe_every_n_layers") or 0, hf.get("num_experts") or 0
    if isinstance(every, bool) or not isinstance(every, int) or every < 0:
        raise CheckpointError(f"NomicBERT config.json moe_every_n_layers={every!r} is not supported; it must be an "
                              "int >= 0")
    if every < 2 or not count:  # 1: l % 1 is never 1, so no layer has experts, as the remote code reads it
        return None
    for key, value in NOMIC_MOE_FIXED.items():
        refuse(hf, key, (value,), value, "NomicBERT ")
    return make_group("NomicBERT", Experts, count=hf["num_experts"], top_k=hf.get("moe_top_k", 1), every=every, offset=1)


def read_layout(hf: dict) -> tuple[dict, Layout]:
    """(config with transformers' key names, weight layout) of a config.json of MODEL_TYPES."""
    model_type = hf.get("model_type")
    if model_type == "nomic_bert":
        if "n_embd" in hf:
            return read_nomic_legacy(hf)
        return hf, Layout("NomicBERT ", up=("mlp.fc12", "mlp.fc11"), biased=frozenset(), **NOMIC)
    if model_type in ("new", "gte"):  # "gte" folders of the remote code (snowflake-arctic-embed-*-v2.0) keep its keys
        for key, value in GTE_LEGACY_FIXED.items():
            refuse(hf, key, (value,), value, "GTE ")
        return hf, GTE
    return hf, JINA


def rotary(hf: dict, default: float, head_size: int, what: str) -> tuple[float, float]:
    """(rotary_theta, rotary_scale): the default rope's theta, from rope_parameters or the older
    rope_theta key; GTE's original fixed NTK scaling ({"type": "ntk", "factor": f}: frequencies
    (theta f)^(-2i/D) / f^(2/D), as its code computes them for every length) as theta x f and a
    position scale f^(-2/D)."""
    refuse(hf, "partial_rotary_factor", (None, 1, 1.0), None, what)
    theta = rope_theta(hf, default, what)
    scaling = hf.get("rope_scaling")
    if scaling is None:
        return theta, 1.0
    kind = scaling.get("type", scaling.get("rope_type")) if isinstance(scaling, dict) else None
    factor = scaling.get("factor") if isinstance(scaling, dict) else None
    if (hf.get("model_type") != "new" or kind != "ntk" or set(scaling) - {"type", "rope_type", "factor"}
            or isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor >= 1):
        raise CheckpointError(f"{what}config.json rope_scaling={brief(scaling, 120)} is not supported; ortformer implements "
                              "GTE's fixed NTK scaling ({'type': 'ntk', 'factor': f >= 1}, model_type 'new') or none")
    return theta * factor, float(factor) ** (-2 / head_size)


def rotary_config(hf: dict, common: dict) -> EncoderConfig:
    hf, layout = read_layout(hf)
    what, defaults = layout.what, DEFAULTS[hf["model_type"]]
    require(hf, what.strip(), REQUIRED)
    for flag in ("is_decoder", "add_cross_attention"):
        if hf.get(flag):
            raise CheckpointError(f"{what}config.json {flag}=true is not supported; ortformer imports bidirectional encoders only")
    refuse(hf, "hidden_act", tuple(ACTIVATIONS), defaults["act"], what)
    types = hf.get("type_vocab_size", defaults["types"])
    if isinstance(types, bool) or not isinstance(types, int) or types < 0:
        raise CheckpointError(f"{what}config.json type_vocab_size={types!r} is not supported; it must be an int >= 0")
    heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    if isinstance(head_dim, bool) or not isinstance(head_dim, int):
        raise CheckpointError(f"{what}config.json head_dim={head_dim!r} is not supported; it must be an int >= 1")
    theta, scale = rotary(hf, defaults["theta"], head_dim, what)
    experts = nomic_experts(hf) if hf["model_type"] == "nomic_bert" else None
    return make_config(
        what.strip(), vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_heads=heads,
        attention_head_size=0 if head_dim * heads == hf["hidden_size"] else head_dim,
        num_layers=hf["num_hidden_layers"], ffn_size=hf["intermediate_size"], ffn_gated=len(layout.up) == 2 or layout.gte_up_gate,
        attention="softmax", norm="layernorm", norm_position="post",
        activation=ACTIVATIONS[hf.get("hidden_act", defaults["act"])], positions="rotary",
        rotary_theta=theta, rotary_scale=scale,
        max_positions=hf.get("max_position_embeddings", defaults["positions"]),
        type_vocab_size=types if types > 1 else 0, norm_eps=hf.get("layer_norm_eps", defaults["eps"]), experts=experts,
        **common)


def saved_shapes(cfg: EncoderConfig, layout: Layout, types: int) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape as the folder saves them (without task heads)."""
    f, ffn, a = cfg.hidden_size, cfg.ffn_size, cfg.head_size * cfg.num_heads
    shapes = {"embeddings.word_embeddings.weight": (cfg.vocab_size, f),
              layout.embed_norm + ".weight": (f,), layout.embed_norm + ".bias": (f,)}
    if types:
        shapes["embeddings.token_type_embeddings.weight"] = (types, f)
    up_rows = 2 * ffn if layout.gte_up_gate else ffn
    for i in range(cfg.num_layers):
        p = layout.layer.format(i=i)
        linears = {"qkv": [(layout.qkv, 3 * a, f)], "out": [(layout.out, f, a)],
                   "up": [(name, up_rows, f) for name in layout.up], "down": [(layout.down, f, ffn)]}
        if cfg.experts and cfg.experts.has(i):  # the experts in place of the MLP
            e = cfg.experts.count
            del linears["up"], linears["down"]
            shapes.update({p + "mlp.router.layer.weight": (e, f), p + "mlp.experts.mlp.w1": (e * ffn, f),
                           p + "mlp.experts.mlp.w2": (e * ffn, f), p + "mlp.experts.bias": (f,)})
        for kind, entries in linears.items():
            for name, rows, cols in entries:
                shapes[p + name + ".weight"] = (rows, cols)
                if kind in layout.biased:
                    shapes[p + name + ".bias"] = (rows,)
        for norm in layout.norms:
            shapes[p + norm + ".weight"], shapes[p + norm + ".bias"] = (f,), (f,)
    return shapes


def linear(kept: Tensors, name: str, biased: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, bias) of a saved Linear; a zero bias where it was saved without one."""
    weight = kept[name + ".weight"]
    return weight, kept[name + ".bias"] if biased else torch.zeros(weight.shape[0], dtype=weight.dtype)


def map_weights(layout: Layout, types: int, raw: Tensors, cfg: EncoderConfig, what: str, duplicates):
    """Check a state dict of ``layout`` and map it to Encoder names (see the module docstring)."""
    kept, dropped = {}, []
    for name, tensor in raw.items():
        short = next((name[len(p):] for p in PREFIXES if name.startswith(p)), name)
        if short.startswith(DROPPED) or short.endswith("inv_freq"):
            dropped.append(name)
        else:
            kept[short] = tensor
    check_tensors(kept, saved_shapes(cfg, layout, types), dtypes=HF_DTYPES, what=what, duplicates=duplicates)
    tokens = kept["embeddings.word_embeddings.weight"]
    if types == 1:  # one type row: the same vector added to every token
        tokens = tokens.float() + kept["embeddings.token_type_embeddings.weight"][0].float()
    out = {"tokens.weight": tokens, "norm.weight": kept[layout.embed_norm + ".weight"],
           "norm.bias": kept[layout.embed_norm + ".bias"]}
    if types > 1:
        out["types.weight"] = kept["embeddings.token_type_embeddings.weight"]
    for i in range(cfg.num_layers):
        p, q = layout.layer.format(i=i), f"blocks.{i}."
        pairs = {"attention.qkv": linear(kept, p + layout.qkv, "qkv" in layout.biased),
                 "attention.out": linear(kept, p + layout.out, "out" in layout.biased)}
        if cfg.experts and cfg.experts.has(i):
            out.update({q + "ffn.router.weight": kept[p + "mlp.router.layer.weight"], q + "ffn.w1": kept[p + "mlp.experts.mlp.w1"],
                        q + "ffn.w2": kept[p + "mlp.experts.mlp.w2"], q + "ffn.bias": kept[p + "mlp.experts.bias"]})
        else:
            pairs["ffn.down"] = linear(kept, p + layout.down, "down" in layout.biased)
            ups = [linear(kept, p + name, "up" in layout.biased) for name in layout.up]
            if layout.gte_up_gate:  # rows [up; gate] -> [gate; up]: the activated half first
                weight, bias = ups[0]
                ups = [(w, b) for w, b in zip(weight.chunk(2)[::-1], bias.chunk(2)[::-1])]
            pairs["ffn.up"] = (torch.cat([w for w, _ in ups]), torch.cat([b for _, b in ups]))
        for ours, (weight, bias) in pairs.items():
            out[q + ours + ".weight"], out[q + ours + ".bias"] = weight, bias
        for ours, theirs in zip(("norm1", "norm2"), layout.norms):
            out[q + ours + ".weight"], out[q + ours + ".bias"] = kept[p + theirs + ".weight"], kept[p + theirs + ".bias"]
    return out, sorted(dropped)


def load(folder, *, pooling: str | None = None, normalize: bool | None = None, name: str | None = None) -> Loaded:
    """Import a NomicBERT, GTE or Jina v3 folder as an ortformer Encoder."""
    files = FolderFiles.of(folder)  # parsed once: load_any hands over the files it read
    hf, layout = read_layout(files.config)
    types = hf.get("type_vocab_size", DEFAULTS[hf["model_type"]]["types"])

    def weights(raw, cfg, what, duplicates):
        return map_weights(layout, types, raw, cfg, what, duplicates)

    family = {"nomic_bert": "nomic_bert", "jina_embeddings_v3": "jina_embeddings_v3"}.get(hf["model_type"], "gte")
    return import_folder(files, family=family, build=rotary_config, map_weights=weights,
                         pooling=pooling, normalize=normalize, name=name)


FAMILY = Family("rotary BERT", ("nomic_bert", "gte", "new", "jina_embeddings_v3"), load,
                vocab_tokenizers={"nomic_bert": VocabTokenizer(wordpiece_tokenizer, ("vocab.txt",))})
