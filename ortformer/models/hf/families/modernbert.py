"""Import a ModernBERT folder.

transformers' ModernBertModel, with e = LN_emb(tok_embeddings(ids)):

    x = e;  per layer l:  x = x + Wo(attn(attn_norm(x)));  x = x + mlp.Wo(act(a) * g), [a; g] = mlp.Wi(mlp_norm(x))
    out = final_norm(x)

with attn_norm the Identity in layer 0, is ortformer's pre-norm encoder with
embedding_norm=True (which skips block 0's attention pre-norm) and a gated feed-forward
(``Wi(x).chunk(2)`` gives (input, gate): rows [a; g], as ffn_gated). Attention:

- ``Wqkv`` rows are [Q; K; V] (viewed as (B, N, 3, H, D)), ortformer's qkv layout as is;
- rotary positions (rotate-half) at the sequence index, theta per layer kind: full
  attention layers use the global theta, sliding layers the local one;
- layer l is global when l % global_attn_every_n_layers == 0 (layer_types may list another
  period or offset); a sliding layer attends to
  |i - j| <= local_attention // 2 (transformers' sliding_window, inclusive), which is
  EncoderConfig's local_attention group with window = config.json's local_attention.

Newer config.json files spell the pattern and thetas as ``layer_types`` and
``rope_parameters``, older ones as ``global_attn_every_n_layers``, ``global_rope_theta`` and
``local_rope_theta``; both are read, and a pattern or rope that ortformer cannot express
exactly is refused. ``attention_bias``, ``mlp_bias`` and ``norm_bias`` must agree (one
``bias`` field). Dropout, flash-attention and prediction-head options change nothing in an
encoder's inference and are ignored.

The ModernBERT decoder (``modernbert-decoder``: the Ettin decoders) is the same layer run causally,
with q, k and v as three Linears (fused here as rows [Q; K; V]) and a sliding layer's causal window
i - local_attention // 2 < j <= i (windows.causal_pattern). Its sequence classifier is the
prediction head and ``classifier`` on the last token whose id is not pad_token_id, as the
decoders' score heads (heads.py).
"""
from __future__ import annotations


import torch

from ....config import EncoderConfig
from ....core.errors import CheckpointError
from ...loaded import Loaded
from ...weights import Tensors, check_tensors
from ..activations import ACTIVATIONS
from ..config_checks import make_config, refuse, require
from ..folder_import import import_folder
from ..folder_files import FolderFiles
from ..folder_layout import HF_DTYPES
from ..family import Family
from ..windows import FULL, SLIDING, causal_pattern, check_layer_types, global_period, pattern_fields, rope_thetas

WHAT = "ModernBERT "
WHAT_DECODER = "ModernBERT decoder "
DEFAULT_THETA = {FULL: ("global_rope_theta", 160000.0), SLIDING: ("local_rope_theta", 10000.0)}
BIAS_FLAGS = ("attention_bias", "mlp_bias", "norm_bias")
# task heads of ModernBertFor... checkpoints (the base model sits under "model.")
DROPPED_PREFIXES = ("head.", "decoder.", "classifier.", "drop.", "lm_head.")
REQUIRED = ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size")


def layer_kinds(hf: dict, layers: int, what: str) -> tuple[list[str], int | None]:
    """(each layer's kind, local_attention) from layer_types or global_attn_every_n_layers
    (layer l global when l % n == 0); local_attention is None when every layer is global."""
    if hf.get("layer_types") is not None:
        kinds = check_layer_types(hf["layer_types"], layers, what)
    else:
        every = hf.get("global_attn_every_n_layers", 3)
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise CheckpointError(f"{what}config.json global_attn_every_n_layers={every!r} is not supported; "
                                  "it must be an int >= 1")
        kinds = [SLIDING if l % every else FULL for l in range(layers)]
    if SLIDING not in kinds:
        return kinds, None
    window = hf.get("local_attention", 128)
    if isinstance(window, bool) or not isinstance(window, int) or window < 2:
        raise CheckpointError(f"{what}config.json local_attention={window!r} is not supported; ortformer implements "
                              "windows of an int >= 2 tokens (|i - j| <= local_attention // 2)")
    return kinds, window


def layer_pattern(hf: dict, layers: int) -> tuple[int, int, int]:
    """(window, global_every, global_offset) of the bidirectional model: a sliding layer sees
    |i - j| <= local_attention // 2; (0, 1, 0) when every layer is global."""
    kinds, window = layer_kinds(hf, layers, WHAT)
    every, offset = global_period(kinds, WHAT)
    return (0, 1, 0) if window is None else (window, every, offset)


def shared_fields(hf: dict, what: str) -> dict:
    """The EncoderConfig fields the encoder and the decoder read alike."""
    require(hf, what.strip(), REQUIRED)
    refuse(hf, "hidden_activation", tuple(ACTIVATIONS), "gelu", what)
    biases = {flag: hf.get(flag, False) for flag in BIAS_FLAGS}
    if len(set(biases.values())) != 1 or not isinstance(biases["norm_bias"], bool):
        raise CheckpointError(f"{what}config.json {', '.join(f'{k}={v!r}' for k, v in biases.items())} is not "
                              "supported; ortformer implements the three all true or all false (one bias field)")
    head_dim = hf.get("head_dim")
    if head_dim is not None and not (isinstance(head_dim, int) and head_dim * hf["num_attention_heads"] == hf["hidden_size"]):
        raise CheckpointError(f"{what}config.json head_dim={head_dim!r} is not supported; ortformer implements "
                              "head_dim = hidden_size / num_attention_heads")
    return dict(vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_heads=hf["num_attention_heads"],
                num_layers=hf["num_hidden_layers"], ffn_size=hf["intermediate_size"], ffn_gated=True,
                bias=biases["norm_bias"], attention="softmax", norm="layernorm", norm_position="pre",
                embedding_norm=True, activation=ACTIVATIONS[hf.get("hidden_activation", "gelu")], positions="rotary",
                type_vocab_size=0, norm_eps=hf.get("norm_eps", 1e-5))


def modernbert_config(hf: dict, common: dict) -> EncoderConfig:
    fields = shared_fields(hf, WHAT)
    window, every, offset = layer_pattern(hf, hf["num_hidden_layers"])
    pattern = pattern_fields(window, every, offset, rope_thetas(hf, DEFAULT_THETA, WHAT), WHAT)
    return make_config("ModernBERT", **fields, **pattern, max_positions=hf.get("max_position_embeddings", 8192),
                       **common)


def decoder_config(hf: dict, common: dict) -> EncoderConfig:
    fields = shared_fields(hf, WHAT_DECODER)
    kinds, local = layer_kinds(hf, hf["num_hidden_layers"], WHAT_DECODER)
    # transformers' sliding_window = local_attention // 2, the causal i - w < j <= i
    pattern, longest = causal_pattern(kinds, None if local is None else local // 2,
                                      hf.get("max_position_embeddings", 8192),
                                      rope_thetas(hf, DEFAULT_THETA, WHAT_DECODER), WHAT_DECODER)
    return make_config("ModernBERT decoder", **fields, **pattern, causal=True, max_positions=longest, **common)


def names(cfg: EncoderConfig) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Encoder tensor name -> (ModernBertModel name, shape); the decoder's separate q, k, v are
    the qkv entry's name with "q_proj|k_proj|v_proj" in place of Wqkv (map_weights)."""
    f, ffn = cfg.hidden_size, cfg.ffn_size
    out = {"tokens.weight": ("embeddings.tok_embeddings.weight", (cfg.vocab_size, f))}
    pairs = {"embed_norm": ("embeddings.norm", f, None), "norm": ("final_norm", f, None)}
    for i in range(cfg.num_layers):
        p, q = f"layers.{i}.", f"blocks.{i}."
        if i:  # layer 0's attn_norm is the Identity
            pairs[q + "norm1"] = (p + "attn_norm", f, None)
        pairs[q + "attention.qkv"] = (p + "attn.Wqkv", 3 * f, f)
        pairs[q + "attention.out"] = (p + "attn.Wo", f, f)
        pairs[q + "norm2"] = (p + "mlp_norm", f, None)
        pairs[q + "ffn.up"] = (p + "mlp.Wi", 2 * ffn, f)
        pairs[q + "ffn.down"] = (p + "mlp.Wo", f, ffn)
    for ours, (theirs, rows, cols) in pairs.items():
        out[ours + ".weight"] = (theirs + ".weight", (rows,) if cols is None else (rows, cols))
        if cfg.bias:
            out[ours + ".bias"] = (theirs + ".bias", (rows,))
    return out


def map_weights(raw: Tensors, cfg: EncoderConfig, what: str, duplicates) -> tuple[Tensors, list[str]]:
    """Check a ModernBERT (or decoder) state dict and rename it; the decoder's q, k, v are fused
    into rows [Q; K; V], nothing else changes."""
    kept, dropped = {}, []
    for name, tensor in raw.items():
        short = name.removeprefix("model.")
        if short.startswith(DROPPED_PREFIXES):
            dropped.append(name)
        else:
            kept[short] = tensor
    table = names(cfg)
    if cfg.causal:  # the decoder: attn.q_proj / k_proj / v_proj, each (F, F)
        fused = {ours: entry for ours, entry in table.items() if ".attention.qkv." in ours}
        expected = {k: v for k, v in table.values() if ".attn.Wqkv." not in k}
        for theirs, shape in fused.values():
            for part in ("q_proj", "k_proj", "v_proj"):
                expected[theirs.replace("Wqkv", part)] = (shape[0] // 3, *shape[1:])
        check_tensors(kept, expected, dtypes=HF_DTYPES, what=what, duplicates=duplicates)
        kept = {**kept, **{theirs: torch.cat([kept[theirs.replace("Wqkv", part)] for part in ("q_proj", "k_proj", "v_proj")])
                           for theirs, _ in fused.values()}}
    else:
        check_tensors(kept, dict(table.values()), dtypes=HF_DTYPES, what=what, duplicates=duplicates)
    return {ours: kept[theirs] for ours, (theirs, _) in table.items()}, sorted(dropped)


def load(folder, *, pooling: str | None = None, normalize: bool | None = None, name: str | None = None) -> Loaded:
    """Import a ModernBERT (or ModernBERT decoder) folder as an ortformer Encoder."""
    files = FolderFiles.of(folder)  # parsed once: load_any hands over the files it read
    decoder = files.config.get("model_type") == "modernbert-decoder"
    return import_folder(files, family="modernbert-decoder" if decoder else "modernbert",
                         build=decoder_config if decoder else modernbert_config, map_weights=map_weights,
                         pooling=pooling, normalize=normalize, name=name)


FAMILY = Family("ModernBERT", ("modernbert", "modernbert-decoder"), load)
