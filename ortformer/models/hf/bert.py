"""Import a BERT-family model from a local Hugging Face / sentence-transformers folder.

A folder holds ``config.json`` (``model_type: bert``) and ``model.safetensors`` or
``pytorch_model.bin`` (read with weights_only=True). The Hugging Face BERT layer

    x = LN(x + O(softmax(Q K^T / sqrt(D) + mask) V));  x = LN(x + W2 act(W1 x))

with embeddings ``LN(word + token_type + position)`` is exactly ortformer's
post-norm softmax Encoder, so the import is a renaming plus one fusion: the
query, key and value Linears become one ``qkv`` Linear whose output rows are
``[Q; K; V]`` (MultiHeadAttention views them as (B, N, 3, H, D)).

"""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from ...config import EncoderConfig
from ...errors import CheckpointError, ConfigError
from ..loaded import Loaded
from ..weights import Tensors, check_tensors, checkpoint_digest, encoder_from_tensors, find_weights, read_weights
from .folder import HF_DTYPES, HF_WEIGHT_NAMES, find_tokenizer, read_json, read_pooling, transformer_dir

log = logging.getLogger(__name__)

ACTIVATIONS = {"gelu": "gelu", "relu": "relu"}  # HF "gelu" is the exact erf GELU, as nn.GELU()
# weights the Hugging Face folder may carry that an encoder does not use
DROPPED_PREFIXES = ("pooler.", "cls.")
DROPPED_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")  # index buffers, not weights


def bert_config(hf: dict, *, pooling: str = "none", normalize: bool = False, name: str = "bert") -> EncoderConfig:
    """EncoderConfig for a Hugging Face BERT config.json; CheckpointError for other variants."""
    model_type = hf.get("model_type")
    if model_type != "bert":
        raise CheckpointError(
            f"model_type {model_type!r} is not supported; ortformer imports model_type 'bert' "
            "(other families differ in positions, norms or layout)"
        )
    position = hf.get("position_embedding_type", "absolute")
    if position != "absolute":
        raise CheckpointError(f"position_embedding_type {position!r} is not supported; only 'absolute' is")
    for flag in ("is_decoder", "add_cross_attention"):
        if hf.get(flag):
            raise CheckpointError(f"{flag}=true is not supported; ortformer imports bidirectional encoders only")
    act = hf.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise CheckpointError(f"hidden_act {act!r} is not supported; valid: {', '.join(ACTIVATIONS)}")
    required = ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers",
                "intermediate_size", "max_position_embeddings")
    missing = [key for key in required if key not in hf]
    if missing:
        raise CheckpointError(f"BERT config.json lacks {', '.join(missing)}")
    try:
        return EncoderConfig(
            name=name, vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
            num_heads=hf["num_attention_heads"], num_layers=hf["num_hidden_layers"],
            ffn_size=hf["intermediate_size"], attention="softmax", norm="layernorm", norm_position="post",
            activation=ACTIVATIONS[act], positions="learned", max_positions=hf["max_position_embeddings"],
            type_vocab_size=hf.get("type_vocab_size", 2), norm_eps=hf.get("layer_norm_eps", 1e-12),
            pooling=pooling, normalize_embeddings=normalize,
        )
    except ConfigError as exc:
        raise CheckpointError(f"BERT config.json describes an encoder ortformer cannot build: {exc}") from None


def hf_shapes(cfg: EncoderConfig) -> dict[str, tuple[int, ...]]:
    """Hugging Face BertModel tensor name -> shape for ``cfg`` (without dropped heads)."""
    f, ffn = cfg.hidden_size, cfg.ffn_size
    shapes = {
        "embeddings.word_embeddings.weight": (cfg.vocab_size, f),
        "embeddings.position_embeddings.weight": (cfg.max_positions, f),
        "embeddings.token_type_embeddings.weight": (cfg.type_vocab_size, f),
        "embeddings.LayerNorm.weight": (f,), "embeddings.LayerNorm.bias": (f,),
    }
    for i in range(cfg.num_layers):
        p = f"encoder.layer.{i}."
        for sub, (rows, cols) in {"attention.self.query": (f, f), "attention.self.key": (f, f),
                                  "attention.self.value": (f, f), "attention.output.dense": (f, f),
                                  "intermediate.dense": (ffn, f), "output.dense": (f, ffn)}.items():
            shapes[p + sub + ".weight"], shapes[p + sub + ".bias"] = (rows, cols), (rows,)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            shapes[p + norm + ".weight"], shapes[p + norm + ".bias"] = (f,), (f,)
    if not cfg.type_vocab_size:
        del shapes["embeddings.token_type_embeddings.weight"]
    return shapes


def split_dropped(tensors: Tensors) -> tuple[Tensors, list[str]]:
    """Strip a ``bert.`` prefix (task-head checkpoints), rename old gamma/beta
    LayerNorm names, and set aside the tensors an encoder does not use."""
    kept, dropped = {}, []
    for name, tensor in tensors.items():
        short = name.removeprefix("bert.")
        if short.startswith(DROPPED_PREFIXES) or short in DROPPED_BUFFERS:
            dropped.append(name)
            continue
        if ".LayerNorm." in short:
            short = short.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        kept[short] = tensor
    return kept, sorted(dropped)


def to_ortformer(hf: Tensors, cfg: EncoderConfig) -> Tensors:
    """Rename checked Hugging Face tensors to Encoder names, fusing Q, K, V (rows [Q; K; V])."""
    out = {
        "tokens.weight": hf["embeddings.word_embeddings.weight"],
        "positions.table.weight": hf["embeddings.position_embeddings.weight"],
        "norm.weight": hf["embeddings.LayerNorm.weight"],
        "norm.bias": hf["embeddings.LayerNorm.bias"],
    }
    if cfg.type_vocab_size:
        out["types.weight"] = hf["embeddings.token_type_embeddings.weight"]
    for i in range(cfg.num_layers):
        p, q = f"encoder.layer.{i}.", f"blocks.{i}."
        for kind in ("weight", "bias"):
            out[q + f"attention.qkv.{kind}"] = torch.cat(
                [hf[p + f"attention.self.{part}.{kind}"] for part in ("query", "key", "value")], dim=0)
            for src, dst in (("attention.output.dense", "attention.out"), ("attention.output.LayerNorm", "norm1"),
                             ("intermediate.dense", "ffn.up"), ("output.dense", "ffn.down"),
                             ("output.LayerNorm", "norm2")):
                out[q + f"{dst}.{kind}"] = hf[p + f"{src}.{kind}"]
    return out


def load_bert(folder, *, pooling: str | None = None, normalize: bool | None = None,
              name: str | None = None) -> Loaded:
    """Import a BERT-family folder as an ortformer Encoder (eval mode, float32).

    pooling / normalize: override the sentence-transformers config; without one
    the default is pooling="none" (BERT's own pooler head is not imported).
    """
    root = Path(folder)
    if not root.is_dir():
        raise CheckpointError(f"{root} is not a folder; pass a Hugging Face model folder")
    model_dir = transformer_dir(root)
    hf_config = read_json(model_dir / "config.json")
    st_pooling, st_normalize, max_len = read_pooling(root)
    pooling = pooling or st_pooling or "none"
    if normalize is None:  # a Normalize module means nothing without a pooled embedding
        normalize = st_normalize and pooling != "none"
    cfg = bert_config(hf_config, pooling=pooling, normalize=normalize, name=name or root.resolve().name)
    weights = find_weights(model_dir, HF_WEIGHT_NAMES)
    raw, _, duplicates = read_weights(weights)
    kept, dropped = split_dropped(raw)
    check_tensors(kept, hf_shapes(cfg), dtypes=HF_DTYPES, what=str(weights), duplicates=duplicates)
    if dropped:
        log.info("not imported from %s (unused by an encoder): %s", weights, ", ".join(dropped))
    model = encoder_from_tensors(cfg, to_ortformer(kept, cfg), what=f"{weights} (mapped)", dtypes=HF_DTYPES)
    return Loaded(model, f"sha256:{checkpoint_digest(weights)}", find_tokenizer(model_dir, root), max_len,
                  weights=weights, dropped=tuple(dropped), family="bert")
