"""The ONNX contract between the exporter and the runtime (torch-free).

Names of inputs, outputs, dynamic axes and metadata keys live here once, so the
two sides cannot drift apart.
"""
from __future__ import annotations

import json

from ..config import EncoderConfig

FORMAT = "1"  # ortformer.format: bump when the contract below changes meaning

META_FORMAT = "ortformer.format"
META_VERSION = "ortformer.version"
META_CONFIG = "ortformer.config"
META_PARITY = "ortformer.parity"
META_SOURCE = "ortformer.source"
META_TOKENIZER = "ortformer.tokenizer"  # optional: tokenizer file name beside the model
# optional: default truncation length for text (e.g. sentence-transformers' max_seq_length)
META_TEXT_MAX_LENGTH = "ortformer.text_max_length"
# optional: "true" when texts are lowercased by a Lowercase step ahead of the tokenizer's own
# normalizer, as sentence-transformers does for do_lower_case; absent or "false": as given
META_TEXT_LOWERCASE = "ortformer.text_lowercase"
# optional: the Hugging Face model_type the weights were imported from (e.g. "roberta")
META_FAMILY = "ortformer.family"
# optional: sentence-transformers prompts, a JSON object {"prompts": {name: text}, "default": name or null};
# the text is prepended to each input before tokenizing (e5's "query: ", bge's instructions)
META_PROMPTS = "ortformer.prompts"
# optional: the chunk stages of a linear-family model (exporter/chunked.py, runtime/chunked.py)
META_CHUNKED = "ortformer.chunked"
# optional, int8 files: how they were quantized and which weight MatMuls stayed float, and why
META_INT8 = "ortformer.int8"
# optional (files from before it was written): "sha256:<hex>" over the graph's weights as exported
# (modelfile.tensors_digest), so `ortformer check` sees bytes changed after the export
META_WEIGHTS = "ortformer.weights"
# optional: how texts become late-interaction vectors and sparse weights (markers, query expansion,
# skiplist, special ids), a JSON object read by late.LateInteraction.from_json
META_LATE = "ortformer.late_interaction"
# optional: "right" when the file's fused attention takes one key length per row, (B,) int32 (export
# padding="right": the mask form onnxruntime's fused CUDA kernels accept); the Runtime then right-aligns
# any row whose kept tokens are not a prefix before the call (runtime/right_padding.py). Absent: any padding
META_PADDING = "ortformer.padding"
PADDINGS = ("any", "right")  # export's padding choices; "any" writes no key
REQUIRED_META = (META_FORMAT, META_VERSION, META_CONFIG, META_PARITY, META_SOURCE)

BATCH_AXIS = "batch"
SEQUENCE_AXIS = "sequence"

INPUT_IDS = "input_ids"
INPUTS_EMBEDS = "inputs_embeds"
ATTENTION_MASK = "attention_mask"
TOKEN_TYPE_IDS = "token_type_ids"
# optional, models with task adapters (config adapters): int64 [batch], each row's task index into
# adapters.tasks; the Runtime feeds the default task's where a request names none
TASK_ID = "task_id"
LAST_HIDDEN_STATE = "last_hidden_state"
SENTENCE_EMBEDDING = "sentence_embedding"
# a model whose graph normalizes its sentence embedding: the vector right before that normalization
# (after pooling and any Dense head; truncate_dim applied), (B, S), what TEI's normalize=false answers.
# Optional on reading: files written before it lack it (OPTIONAL_OUTPUTS)
SENTENCE_EMBEDDING_UNNORMALIZED = "sentence_embedding_unnormalized"
LOGITS = "logits"
# late interaction: per-token unit vectors (B, N, D) (ColBERT, bge-m3's colbert_linear), and one
# weight per token (B, N) (bge-m3's sparse_linear); see late.py for what the runtime keeps of them
TOKEN_EMBEDDINGS = "token_embeddings"
SPARSE = "sparse"
# optional: the classifier's label names, a JSON list of classifier.labels strings
META_LABELS = "ortformer.labels"
# optional: an LLM yes/no reranker's prompt template (rerank_template.RerankTemplate as JSON); its file's
# logits (B, 1) are z_yes - z_no at the last kept token
META_RERANK = "ortformer.rerank_template"


def input_names(cfg: EncoderConfig) -> list[str]:
    """Graph inputs in positional order of Encoder.forward."""
    names = [INPUT_IDS if cfg.takes_ids else INPUTS_EMBEDS, ATTENTION_MASK]
    if cfg.type_vocab_size:
        names.append(TOKEN_TYPE_IDS)
    if cfg.adapters:
        names.append(TASK_ID)
    return names


def gives_unnormalized(cfg: EncoderConfig) -> bool:
    """Whether the exporter writes SENTENCE_EMBEDDING_UNNORMALIZED: the graph normalizes its pooled vector."""
    return cfg.pooling != "none" and cfg.normalize_embeddings


# outputs a file may lack and still be read (the exporter always writes them): older files
OPTIONAL_OUTPUTS = (SENTENCE_EMBEDDING_UNNORMALIZED,)


def output_names(cfg: EncoderConfig) -> list[str]:
    """Graph outputs in the order the exporter writes them (Encoder.forward's dict order); the
    optional ones last, so a file without them lists the others in the same order."""
    names = [LAST_HIDDEN_STATE]
    if cfg.pooling != "none":
        names.append(SENTENCE_EMBEDDING)
    if cfg.classifier:
        names.append(LOGITS)
    if cfg.token_dense:
        names.append(TOKEN_EMBEDDINGS)
    if cfg.token_weights:
        names.append(SPARSE)
    if gives_unnormalized(cfg):
        names.append(SENTENCE_EMBEDDING_UNNORMALIZED)
    return names


def output_shapes(cfg: EncoderConfig) -> dict[str, list]:
    """Declared output shapes, symbolic axes as strings."""
    shapes = {LAST_HIDDEN_STATE: [BATCH_AXIS, SEQUENCE_AXIS, cfg.hidden_size]}
    if cfg.pooling != "none":
        shapes[SENTENCE_EMBEDDING] = [BATCH_AXIS, cfg.sentence_size]
    if cfg.classifier:
        per_token = [SEQUENCE_AXIS] if cfg.per_token_logits else []
        shapes[LOGITS] = [BATCH_AXIS, *per_token, cfg.num_labels]
    if cfg.token_dense:
        shapes[TOKEN_EMBEDDINGS] = [BATCH_AXIS, SEQUENCE_AXIS, cfg.token_dense.size]
    if cfg.token_weights:
        shapes[SPARSE] = [BATCH_AXIS, SEQUENCE_AXIS]
    if gives_unnormalized(cfg):
        shapes[SENTENCE_EMBEDDING_UNNORMALIZED] = [BATCH_AXIS, cfg.sentence_size]
    return shapes


def input_shapes(cfg: EncoderConfig) -> dict[str, list]:
    shapes = {name: [BATCH_AXIS, SEQUENCE_AXIS] for name in input_names(cfg)}
    if not cfg.takes_ids:
        shapes[INPUTS_EMBEDS] = [BATCH_AXIS, SEQUENCE_AXIS, cfg.hidden_size]
    if cfg.adapters:
        shapes[TASK_ID] = [BATCH_AXIS]
    return shapes


def rerank_problem(cfg: EncoderConfig) -> str:
    """What a model with a META_RERANK template lacks ('' when none): a one-label head on the last token."""
    head = cfg.classifier
    if head is None or head.labels != 1 or head.per_token or head.pooling != "last":
        return "a one-label per-sequence classifier on the last token (classifier.labels=1, pooling='last')"
    return ""


def labels_json(labels) -> str:
    """The META_LABELS value; ValueError when it would not read back."""
    text = json.dumps(list(labels))
    parse_labels(text)
    return text


def parse_labels(text: str) -> list[str]:
    """The label names of a META_LABELS value; ValueError naming the problem."""
    try:
        labels = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    if not isinstance(labels, list) or not all(isinstance(label, str) for label in labels):
        raise ValueError("must be a JSON list of label names (strings)")
    return labels


def prompts_json(prompts: dict[str, str], default: str | None) -> str:
    """The META_PROMPTS value; ValueError when it would not read back."""
    text = json.dumps({"prompts": prompts, "default": default}, sort_keys=True)
    parse_prompts(text)
    return text


def parse_prompts(text: str) -> tuple[dict[str, str], str | None]:
    """(name -> prompt text, default name or None) from a META_PROMPTS value; ValueError naming the problem."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    if not isinstance(data, dict) or set(data) != {"prompts", "default"}:
        raise ValueError('must be a JSON object with exactly the keys "prompts" and "default"')
    prompts, default = data["prompts"], data["default"]
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise ValueError('"prompts" must map prompt names to prompt texts (strings)')
    if default is not None and default not in prompts:
        raise ValueError(f'"default" {default!r} is not one of the prompts {sorted(prompts)}')
    return prompts, default
