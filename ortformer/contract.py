"""The ONNX contract between the exporter and the runtime (torch-free).

Names of inputs, outputs, dynamic axes and metadata keys live here once, so the
two sides cannot drift apart.
"""
from __future__ import annotations

from .config import EncoderConfig

FORMAT = "1"  # ortformer.format: bump when the contract below changes meaning

META_FORMAT = "ortformer.format"
META_VERSION = "ortformer.version"
META_CONFIG = "ortformer.config"
META_PARITY = "ortformer.parity"
META_SOURCE = "ortformer.source"
META_TOKENIZER = "ortformer.tokenizer"  # optional: tokenizer file name beside the model
# optional: default truncation length for text (e.g. sentence-transformers' max_seq_length)
META_TEXT_MAX_LENGTH = "ortformer.text_max_length"
# optional, int8 files: how they were quantized and which weight MatMuls stayed float, and why
META_INT8 = "ortformer.int8"
REQUIRED_META = (META_FORMAT, META_VERSION, META_CONFIG, META_PARITY, META_SOURCE)

BATCH_AXIS = "batch"
SEQUENCE_AXIS = "sequence"

INPUT_IDS = "input_ids"
INPUTS_EMBEDS = "inputs_embeds"
ATTENTION_MASK = "attention_mask"
TOKEN_TYPE_IDS = "token_type_ids"
LAST_HIDDEN_STATE = "last_hidden_state"
SENTENCE_EMBEDDING = "sentence_embedding"


def input_names(cfg: EncoderConfig) -> list[str]:
    """Graph inputs in positional order of Encoder.forward."""
    names = [INPUT_IDS if cfg.takes_ids else INPUTS_EMBEDS, ATTENTION_MASK]
    if cfg.type_vocab_size:
        names.append(TOKEN_TYPE_IDS)
    return names


def output_names(cfg: EncoderConfig) -> list[str]:
    names = [LAST_HIDDEN_STATE]
    if cfg.pooling != "none":
        names.append(SENTENCE_EMBEDDING)
    return names


def output_shapes(cfg: EncoderConfig) -> dict[str, list]:
    """Declared output shapes, symbolic axes as strings."""
    shapes = {LAST_HIDDEN_STATE: [BATCH_AXIS, SEQUENCE_AXIS, cfg.hidden_size]}
    if cfg.pooling != "none":
        shapes[SENTENCE_EMBEDDING] = [BATCH_AXIS, cfg.hidden_size]
    return shapes


def input_shapes(cfg: EncoderConfig) -> dict[str, list]:
    shapes = {name: [BATCH_AXIS, SEQUENCE_AXIS] for name in input_names(cfg)}
    if not cfg.takes_ids:
        shapes[INPUTS_EMBEDS] = [BATCH_AXIS, SEQUENCE_AXIS, cfg.hidden_size]
    return shapes
