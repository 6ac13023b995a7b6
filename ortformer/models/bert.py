"""Import a BERT-family model from a local Hugging Face / sentence-transformers folder.

A folder holds ``config.json`` (``model_type: bert``) and ``model.safetensors`` or
``pytorch_model.bin`` (read with weights_only=True). The Hugging Face BERT layer

    x = LN(x + O(softmax(Q K^T / sqrt(D) + mask) V));  x = LN(x + W2 act(W1 x))

with embeddings ``LN(word + token_type + position)`` is exactly ortformer's
post-norm softmax Encoder, so the import is a renaming plus one fusion: the
query, key and value Linears become one ``qkv`` Linear whose output rows are
``[Q; K; V]`` (MultiHeadAttention views them as (B, N, 3, H, D)).

Sentence-transformers configs, when present, set the pooling: ``modules.json``
lists the modules, ``1_Pooling/config.json`` picks mean or CLS, and a
``Normalize`` module means l2-normalised embeddings.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import EncoderConfig
from ..errors import CheckpointError, ConfigError
from .checkpoint import (TOKENIZER_NAME, Tensors, check_tensors, checkpoint_digest, encoder_from_tensors,
                         find_weights, read_weights)
from .encoder import Encoder

log = logging.getLogger(__name__)

HF_WEIGHT_NAMES = ("model.safetensors", "pytorch_model.bin")
ACTIVATIONS = {"gelu": "gelu", "relu": "relu"}  # HF "gelu" is the exact erf GELU, as nn.GELU()
# weights the Hugging Face folder may carry that an encoder does not use
DROPPED_PREFIXES = ("pooler.", "cls.")
DROPPED_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")  # index buffers, not weights
ST_MODULE = "sentence_transformers.models."
ST_SUPPORTED = {"Transformer", "Pooling", "Normalize"}
# half-precision folders are common; upcasting them to float32 is exact
HF_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class BertImport:
    """What ``load_bert`` found: the model and where it came from."""

    model: Encoder
    source: str  # "sha256:<hex>" of the weight file
    weights: Path
    tokenizer: Path | None  # tokenizer.json beside the weights, if any
    dropped: tuple[str, ...]  # Hugging Face tensors deliberately not imported
    max_seq_length: int | None  # sentence-transformers' max_seq_length, if configured

    @property
    def config(self) -> EncoderConfig:
        return self.model.config


def _read_json(path: Path, kind: type = dict):
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: nesting bombs
        raise CheckpointError(f"cannot read {path}: {type(exc).__name__}: {exc}") from None
    if not isinstance(data, kind):
        raise CheckpointError(f"{path} must hold a JSON {kind.__name__}, got {type(data).__name__}")
    return data


def _modules(folder: Path) -> list[dict]:
    """sentence-transformers' modules.json entries, [] when there is none."""
    path = folder / "modules.json"
    if not path.is_file():
        return []
    modules = _read_json(path, list)
    if not all(isinstance(m, dict) for m in modules):
        raise CheckpointError(f"{path} must be a list of module objects")
    return modules


def _module_dir(folder: Path, module: dict) -> Path:
    """A module's folder; modules.json may only point inside the model folder."""
    rel = Path(str(module.get("path", "")))
    if rel.is_absolute() or ".." in rel.parts:
        raise CheckpointError(f"modules.json path {str(rel)!r} leaves the model folder {folder}")
    return folder / rel


def _transformer_dir(folder: Path) -> Path:
    """The folder holding config.json: the root, or the Transformer module's path in modules.json."""
    if not (folder / "config.json").is_file():
        for module in _modules(folder):
            if module.get("type") == ST_MODULE + "Transformer":
                return _module_dir(folder, module)
    return folder


def is_bert_folder(path) -> bool:
    """True when ``path`` is a folder whose config.json is a Hugging Face config (has model_type)."""
    path = Path(path)
    try:
        config = _transformer_dir(path) / "config.json"
        return config.is_file() and "model_type" in _read_json(config)
    except CheckpointError:
        return False


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


def read_pooling(folder: Path) -> tuple[str | None, bool, int | None]:
    """(pooling or None, normalize, max_seq_length) from sentence-transformers configs.

    None means the folder has no sentence-transformers pooling module.
    """
    modules = _modules(folder)
    if not modules:
        return None, False, None
    kinds = [str(m.get("type", "")).removeprefix(ST_MODULE) for m in modules]
    unsupported = [k for k in kinds if k not in ST_SUPPORTED]
    if unsupported:
        raise CheckpointError(
            f"{folder / 'modules.json'} uses sentence-transformers modules ortformer does not implement: "
            f"{', '.join(unsupported)}; supported: {', '.join(sorted(ST_SUPPORTED))}"
        )
    pooling = None
    for module in modules:
        if module.get("type") == ST_MODULE + "Pooling":
            pooling = _pooling_mode(_read_json(_module_dir(folder, module) / "config.json"))
    st_config = folder / "sentence_bert_config.json"
    max_len = _read_json(st_config).get("max_seq_length") if st_config.is_file() else None
    return pooling, "Normalize" in kinds, max_len


def _pooling_mode(config: dict) -> str:
    modes = sorted(k.removeprefix("pooling_mode_") for k, v in config.items() if k.startswith("pooling_mode_") and v)
    mapping = {"mean_tokens": "mean", "cls_token": "cls"}
    if len(modes) != 1 or modes[0] not in mapping:
        raise CheckpointError(
            f"sentence-transformers pooling {modes or 'none'} is not supported; "
            "valid: exactly one of pooling_mode_mean_tokens, pooling_mode_cls_token"
        )
    return mapping[modes[0]]


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
              name: str | None = None) -> BertImport:
    """Import a BERT-family folder as an ortformer Encoder (eval mode, float32).

    pooling / normalize: override the sentence-transformers config; without one
    the default is pooling="none" (BERT's own pooler head is not imported).
    """
    root = Path(folder)
    if not root.is_dir():
        raise CheckpointError(f"{root} is not a folder; pass a Hugging Face model folder")
    model_dir = _transformer_dir(root)
    hf_config = _read_json(model_dir / "config.json")
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
    tokenizer = next((d / TOKENIZER_NAME for d in (model_dir, root) if (d / TOKENIZER_NAME).is_file()), None)
    return BertImport(model, f"sha256:{checkpoint_digest(weights)}", weights, tokenizer, tuple(dropped), max_len)
