"""EncoderConfig: the one description of a model that travels from CLI flags to
the ONNX metadata and back into the runtime. Torch-free on purpose.

A variant that only some models have (a classifier head, a convolution, relative or disentangled
attention, local windows, the sentence and token Dense heads) is an optional group, None when off
(config_groups.py). Format 2 writes the groups as nested objects; format 1, the flat layout of
earlier releases, is still read (config_format1.py)."""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field, fields
from typing import Any

from . import format1 as config_format1
from .groups import (CLASSIFIER_DENSE, DENSE_ACTIVATIONS, DISENTANGLED_PROJECTIONS, GROUPS, Classifier, Adapters,
                     Convolution, Disentangled, Experts, LocalAttention, RelativeAttention, SentenceDense, ShortConv,
                     TokenDense, check_types, group_from_dict)
from ..core.checks import is_int, json_object
from ..core.errors import ConfigError

__all__ = ["CONFIG_FORMAT", "EncoderConfig", "Adapters", "Classifier", "Convolution", "Disentangled", "Experts", "LocalAttention",
           "ShortConv",
           "RelativeAttention", "SentenceDense", "TokenDense", "CLASSIFIER_DENSE", "DENSE_ACTIVATIONS",
           "DISENTANGLED_PROJECTIONS", "PRESETS", "preset"]

CONFIG_FORMAT = 2  # bump when a field changes meaning; from_json reads this and format 1
READABLE_FORMATS = (1, CONFIG_FORMAT)

ATTENTION_KINDS = ("softmax", "linear", "efficient", "cosine")
NORMS = ("layernorm", "rmsnorm")
NORM_POSITIONS = ("post", "pre")
# gelu: the exact erf form; gelu_tanh: the tanh approximation; silu: x * sigmoid(x) (SwiGLU's gate)
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")
POSITIONS = ("learned", "sinusoidal", "rotary", "alibi", "none")
# index: position p of the sequence; kept: the count of kept tokens before it (padding skipped, RoBERTa)
POSITION_IDS = ("index", "kept")
# mean_sqrt_len: the kept tokens' sum over sqrt(their count); weighted_mean: token j weighted by its
# place j - first + 1 from the first kept token (both sentence-transformers' modes)
POOLINGS = ("none", "mean", "cls", "last", "max", "mean_sqrt_len", "weighted_mean")
SENTENCE_POOLINGS = ", ".join(POOLINGS[1:])  # for messages
# SPLADE: the sentence embedding pooled from a per-token head over the vocabulary (an MLM head)
SPLADE_POOLINGS = ("splade_max", "splade_sum")
# SPLADE's term weight: log1p(relu(logit)), or log1p of that again (sentence-transformers' log1p_relu)
SPLADE_ACTIVATIONS = ("relu", "log1p_relu")
# the groups that act on the (N, N) score matrix, which only the softmax kernel forms
SOFTMAX_ONLY = ("relative_attention", "local_attention", "disentangled")

_CHOICES = {
    "attention": ATTENTION_KINDS,
    "norm": NORMS,
    "norm_position": NORM_POSITIONS,
    "activation": ACTIVATIONS,
    "positions": POSITIONS,
    "position_ids": POSITION_IDS,
    "pooling": POOLINGS + SPLADE_POOLINGS,
    "splade_activation": SPLADE_ACTIVATIONS,
}


@dataclass(frozen=True)
class EncoderConfig:
    """Every knob of an ortformer encoder. Defaults are the README's `small` model."""

    # rows of the token embedding; 0 means the model takes float features [B, N, hidden]
    vocab_size: int = 30522
    # width F of every token vector between blocks
    hidden_size: int = 256
    # heads H; each head works in D = hidden_size / num_heads dimensions
    num_heads: int = 4
    # D when it is not hidden_size / num_heads (0): attention then works in A = H x D
    # dimensions, Q/K/V project F -> A and the output A -> F (T5's d_kv, e.g. flan-t5-small)
    attention_head_size: int = 0
    # grouped-query attention: K and V project to num_kv_heads heads, each shared by
    # num_heads / num_kv_heads query heads (Llama / Qwen / Gemma's num_key_value_heads); 0 = num_heads
    num_kv_heads: int = 0
    # number of stacked encoder blocks L
    num_layers: int = 4
    # inner width of the feed-forward network (BERT uses 4F)
    ffn_size: int = 1024
    # gated feed-forward: W_2 (act(W_a x) * (W_g x)); the up projection is 2 x ffn_size wide,
    # rows [a; g]. GeGLU with activation gelu, SwiGLU with silu (ModernBERT, LLaMA-style FFNs)
    ffn_gated: bool = False
    # biases in every Linear and norm; ModernBERT has none
    bias: bool = True
    # similarity used by attention: softmax is O(N^2), the linear family O(N)
    attention: str = "softmax"
    # LayerNorm (BERT) or RMSNorm (no mean subtraction, no bias)
    norm: str = "layernorm"
    # post-norm as in BERT (norm after the residual add) or pre-norm (before each sublayer)
    norm_position: str = "post"
    # pre-norm only: normalise each sublayer's output too, before its residual add (Gemma 2 / 3):
    # x = x + n_1'(attn(n_1(x)));  x = x + n_2'(ffn(n_2(x)))
    sandwich_norm: bool = False
    # non-linearity inside the feed-forward network
    activation: str = "gelu"
    # how token order enters the model: a learned table, fixed sinusoids, rotary (q and k
    # rotated by position inside attention), alibi (a score bias -m_h |i - j| per head,
    # symmetric ALiBi as JinaBERT has it; softmax only), or not at all
    positions: str = "learned"
    # rotary base theta: frequencies theta^(-2i/D) per head dimension pair
    rotary_theta: float = 10000.0
    # rotary angles p * rotary_scale * theta^(-2i/D): positions scaled before the rotation (linear
    # RoPE scaling's 1 / factor; GTE's fixed NTK scaling is theta x f with rotary_scale f^(-2/D))
    rotary_scale: float = 1.0
    # table row of the first position; RoBERTa-style models start at padding_idx + 1
    position_offset: int = 0
    # index: position = sequence index; kept: position = number of kept tokens before it, so
    # padding is skipped (RoBERTa's create_position_ids_from_input_ids)
    position_ids: str = "index"
    # longest sequence the model accepts (size of the learned table; runtime limit)
    max_positions: int = 512
    # segment embeddings (BERT's token_type_ids); 0 disables the input
    type_vocab_size: int = 0
    # ESM's token dropout at inference, -1 = off: rows of this token id (<mask>) are zeroed and every
    # token embedding scaled by (1 - 0.15 x 0.8) / (1 - the sequence's share of such tokens among its
    # kept ones), as ESM-2 was trained with 15% of tokens masked, 80% of them by <mask>
    token_dropout_id: int = -1
    # width of the token embedding; 0 = hidden_size. Otherwise embeddings (and their norm) are
    # this wide and a Linear projects them to hidden_size (ELECTRA's embeddings_project)
    embedding_size: int = 0
    # pre-norm only: normalise the embeddings too, and skip the first block's attention
    # pre-norm, whose input is then already normalised (ModernBERT)
    embedding_norm: bool = False
    # with embedding_norm, the first block keeps its own attention pre-norm as well, so layer 0
    # reads norm1(embed_norm(e)) (RoBERTa-PreLayerNorm, ESM-1b's emb_layer_norm_before)
    first_block_norm: bool = False
    # a convolution over positions after the first layer (DeBERTa-v2 xlarge / xxlarge); None = none
    convolution: Convolution | None = None
    # a mixture of experts in place of some layers' feed-forward network (NomicBERT-MoE); None = none
    experts: Experts | None = None
    # a gated short convolution in place of some layers' attention (LFM2); None = none
    short_conv: ShortConv | None = None
    # per-task LoRA adapters chosen per row by a task_id input (jina-embeddings-v3); None = none
    adapters: Adapters | None = None
    # T5-style relative position buckets added to every layer's scores (MPNet); None = off. softmax only
    relative_attention: RelativeAttention | None = None
    # disentangled relative attention (DeBERTa); None = off. softmax only
    disentangled: Disentangled | None = None
    # sliding-window attention on the local layers (ModernBERT, Gemma 3); None = every layer global
    local_attention: LocalAttention | None = None
    # causal attention: token i sees keys j <= i only (prefix sums for the linear family),
    # which also allows a streaming (RNN-form) export of the linear kernels
    causal: bool = False
    # RMSNorm over each head's D features of q and k (learned (D,) weights, eps = norm_eps) before
    # the rotary rotation and the scores (Qwen3): keeps q . k bounded whatever the projections
    qk_norm: bool = False
    # softmax scores soft-capped to (-c, c) before any bias or mask: c tanh(s / c) with
    # s = q . k / sqrt(D) (Gemma 2's attn_logit_softcapping); 0 = none
    attention_softcap: float = 0.0
    # epsilon inside LayerNorm/RMSNorm
    norm_eps: float = 1e-12
    # epsilon guarding the linear-family denominators against division by zero
    attention_eps: float = 1e-6
    # sentence embedding: none, mean over kept tokens, the first token, the last kept token,
    # or the per-feature max over kept tokens; splade_max / splade_sum pool the per-token
    # head's logits instead: s_v = max_i (or sum_i) over kept tokens of log1p(relu(logits_iv))
    pooling: str = "mean"
    # SPLADE's term weight (splade_* pooling only): log1p(relu(l)), or log1p(log1p(relu(l)))
    splade_activation: str = "relu"
    # sentence-transformers' Dense head on the pooled vector; None = none
    sentence_dense: SentenceDense | None = None
    # l2-normalise the sentence embedding (cosine-ready vectors), after the Dense head
    normalize_embeddings: bool = False
    # keep the first K features of the sentence embedding, after the normalisation, as
    # sentence-transformers' truncate_dim does (Matryoshka models: smaller vectors); 0 = all
    truncate_dim: int = 0
    # classifier head (a fine-tuned *ForSequenceClassification / *ForTokenClassification) and its
    # "logits" output; None = none
    classifier: Classifier | None = None
    # multi-vector head (late interaction: ColBERT, bge-m3's colbert_linear) and its token_embeddings output
    token_dense: TokenDense | None = None
    # a "sparse" output of one weight per token, w_i = relu(u . x_i + c) (B, N): bge-m3's sparse_linear,
    # which the runtime turns into {token id: max weight} per text
    token_weights: bool = False
    # free-form label shown by `ortformer info`; has no effect on the math
    name: str = field(default="custom")

    def __post_init__(self) -> None:
        check_types(self)
        for name in GROUPS:  # a group may be given as its JSON object; None is off
            object.__setattr__(self, name, group_from_dict(name, getattr(self, name)))
        for name, choices in _CHOICES.items():
            value = getattr(self, name)
            if value not in choices:
                raise ConfigError(f"{name}={value!r} is not valid; choose one of {', '.join(choices)}")
        for name in ("hidden_size", "num_heads", "num_layers", "ffn_size", "max_positions"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 1")
        for name in ("vocab_size", "type_vocab_size"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 0 (0 disables it)")
        if self.attention_head_size < 0:
            raise ConfigError(f"attention_head_size={self.attention_head_size} must be >= 0 (0 = hidden_size / num_heads)")
        if self.hidden_size % self.num_heads and not self.attention_head_size:
            raise ConfigError(
                f"hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}; "
                f"valid num_heads divide {self.hidden_size}, e.g. {_divisors(self.hidden_size)} "
                "(or set attention_head_size)"
            )
        if self.num_kv_heads < 0 or (self.num_kv_heads and self.num_heads % self.num_kv_heads):
            raise ConfigError(f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}, e.g. "
                              f"{_divisors(self.num_heads)} (or be 0 = num_heads)")
        if self.positions == "sinusoidal" and self.hidden_size % 2:
            raise ConfigError(f"positions='sinusoidal' needs an even hidden_size, got {self.hidden_size}")
        for name in ("norm_eps", "attention_eps"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 < value < 1):
                raise ConfigError(f"{name}={value} must be a finite number in (0, 1)")
        if not -1 <= self.token_dropout_id < max(self.vocab_size, 0):
            raise ConfigError(f"token_dropout_id={self.token_dropout_id} must be -1 (off) or a token id below "
                              f"vocab_size={self.vocab_size}")
        if self.vocab_size == 0 and self.type_vocab_size:
            raise ConfigError("type_vocab_size needs token input: set vocab_size > 0 or type_vocab_size = 0")
        if self.normalize_embeddings and self.pooling == "none":
            raise ConfigError("normalize_embeddings=True needs a pooling other than 'none', got pooling='none'")
        _check_variants(self)

    @property
    def head_size(self) -> int:
        """D: attention_head_size, or hidden_size / num_heads when that is 0."""
        return self.attention_head_size or self.hidden_size // self.num_heads

    @property
    def attention_size(self) -> int:
        """A = H x D, the width of Q, K, V and the heads' output."""
        return self.num_heads * self.head_size

    @property
    def grouped_kv(self) -> bool:
        """True when K and V have fewer heads than Q (num_kv_heads not 0 and not num_heads)."""
        return self.num_kv_heads not in (0, self.num_heads)

    @property
    def kv_size(self) -> int:
        """H_kv x D, the width K and V project to (A unless num_kv_heads shares them)."""
        return (self.num_kv_heads or self.num_heads) * self.head_size

    @property
    def max_sequence(self) -> int:
        """Longest sequence the model takes: the position table's rows past position_offset."""
        return self.max_positions - self.position_offset

    @property
    def sparse(self) -> bool:
        """A SPLADE model: sentence_embedding holds one weight per vocabulary entry."""
        return self.pooling in SPLADE_POOLINGS

    @property
    def sentence_size(self) -> int:
        """Width of sentence_embedding: the head's labels (SPLADE), truncate_dim, the Dense head's
        size, else hidden_size."""
        if self.sparse:
            return self.num_labels
        return self.truncate_dim or (self.sentence_dense.size if self.sentence_dense else self.hidden_size)

    @property
    def num_labels(self) -> int:
        """L, the classifier's labels (the last axis of "logits"); 0 without a classifier."""
        return self.classifier.labels if self.classifier else 0

    @property
    def per_token_logits(self) -> bool:
        """True when "logits" is (B, N, L), one row per token."""
        return bool(self.classifier and self.classifier.per_token)

    def is_global(self, layer: int) -> bool:
        """True when layer attends over the whole sequence (always, without local_attention)."""
        local = self.local_attention
        return local is None or layer % local.global_every == local.global_offset

    @property
    def takes_ids(self) -> bool:
        return self.vocab_size > 0

    def replace(self, **changes: Any) -> "EncoderConfig":
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise ConfigError(f"unknown config field(s) {sorted(unknown)}; valid fields: {', '.join(field_names())}"
                              + _flat_hint(unknown))
        return dataclasses.replace(self, **changes)

    def with_fields(self, data: dict, strict: bool = False) -> "EncoderConfig":
        """A copy with data's fields set: format 2 (groups as objects or null) or format 1's flat
        names (classifier_labels, local_window, ... as export's flags and older config files spell
        them). A flat field of a group that stays off is refused, except those format 1 let pass
        without effect, which are dropped; strict (export's flags) refuses those too."""
        fields_only = {k: v for k, v in data.items() if k != "format"}
        version = data.get("format")
        if (type(version) is int and version == 1) or ("format" not in data and config_format1.is_flat(fields_only)):
            return EncoderConfig.from_dict(config_format1.merge_flat(self._fields_dict(), fields_only, strict))
        return EncoderConfig.from_dict({**self._fields_dict(), "format": CONFIG_FORMAT, **data})  # data's format checked

    def _fields_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_dict(self) -> dict[str, Any]:
        """Format 2: every field, each group an object of its fields or null."""
        return {"format": CONFIG_FORMAT, **self._fields_dict()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Any) -> "EncoderConfig":
        """Format 2, or format 1 (the flat layout, read as earlier releases wrote it). A dict
        without "format" is read by its layout."""
        if not isinstance(data, dict):
            raise ConfigError(f"config must be a JSON object, got {type(data).__name__}")
        data = dict(data)
        if "format" in data and data["format"] is None:
            raise ConfigError(f"config format null is not supported; give {', '.join(map(str, READABLE_FORMATS))} "
                              "or leave the key out")
        version = data.pop("format", None)
        if version is None:
            version = 1 if config_format1.is_flat(data) else CONFIG_FORMAT
        if not is_int(version):
            raise ConfigError(f"config format {version!r} must be an integer: {', '.join(map(str, READABLE_FORMATS))}")
        if version not in READABLE_FORMATS:
            raise ConfigError(f"config format {version!r} is not supported; this ortformer reads formats "
                              f"{', '.join(map(str, READABLE_FORMATS))}")
        valid = field_names()
        if version == 1:  # a typo's message lists the flat names this format spells
            flat_valid = tuple(n for n in valid if n not in GROUPS) + tuple(config_format1.FLAT)
            unknown = sorted(set(data) - set(flat_valid) - set(GROUPS))  # a group: from_flat names the mixed layouts
            if unknown:
                raise ConfigError(f"unknown config key(s) {unknown} in config format 1; valid keys: "
                                  f"{', '.join(flat_valid)}")
            data = config_format1.from_flat(data)
        unknown = sorted(set(data) - set(valid))
        if unknown:
            raise ConfigError(f"unknown config key(s) {unknown}; valid keys: {', '.join(valid)}" + _flat_hint(unknown))
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> "EncoderConfig":
        return cls.from_dict(json_object(text, "config", ConfigError))


def _flat_hint(names) -> str:
    """For a config of format 2 (or Python) given format 1's flat names: where each now lives."""
    where = config_format1.hint(sorted(names))
    return f" ({where}: format 2 and Python write groups)" if where else ""


def _check_variants(cfg: EncoderConfig) -> None:
    """The combinations the family cannot build, each refused with its reason."""
    for name in ("position_offset", "embedding_size"):
        if getattr(cfg, name) < 0:
            raise ConfigError(f"{name}={getattr(cfg, name)} must be >= 0")
    if not math.isfinite(cfg.rotary_theta) or cfg.rotary_theta <= 1:
        raise ConfigError(f"rotary_theta={cfg.rotary_theta} must be a finite number > 1")
    if cfg.positions == "rotary" and cfg.head_size % 2:
        raise ConfigError(f"positions='rotary' rotates dimension pairs: head size {cfg.head_size} must be even")
    if cfg.positions != "learned" and (cfg.position_offset or cfg.position_ids != "index"):
        what = "position_offset" if cfg.position_offset else "position_ids='kept'"
        raise ConfigError(f"{what} indexes a learned position table; positions={cfg.positions!r} has none")
    if cfg.positions == "learned" and cfg.position_offset >= cfg.max_positions:
        raise ConfigError(f"position_offset={cfg.position_offset} leaves no row of the {cfg.max_positions}-row position table")
    if cfg.positions == "sinusoidal" and cfg.embedding_size % 2:
        raise ConfigError(f"positions='sinusoidal' needs an even embedding_size, got {cfg.embedding_size}")
    if cfg.embedding_size and not cfg.takes_ids:
        raise ConfigError("embedding_size projects token embeddings; float-feature input (vocab_size=0) "
                          "already arrives hidden_size wide")
    if cfg.sandwich_norm and cfg.norm_position != "pre":
        raise ConfigError("sandwich_norm=True normalises pre-norm sublayers' outputs; post-norm already normalises "
                          "after each residual add: set norm_position='pre'")
    if cfg.embedding_norm and cfg.norm_position != "pre":
        raise ConfigError("embedding_norm=True is for pre-norm models; post-norm already normalises the embeddings")
    if cfg.first_block_norm and not cfg.embedding_norm:
        raise ConfigError("first_block_norm=True keeps the first block's pre-norm beside an embedding norm; without "
                          "embedding_norm every block keeps its own: set embedding_norm=True, or leave it False")
    if cfg.convolution:
        if cfg.hidden_size % cfg.convolution.groups:
            raise ConfigError(f"convolution.groups={cfg.convolution.groups} must divide hidden_size={cfg.hidden_size}")
        if cfg.causal:
            raise ConfigError("convolution reads positions on both sides; causal=True allows only earlier ones")
    if cfg.experts and cfg.ffn_gated:
        raise ConfigError("experts are plain MLPs act(W1 x) under W2 (NomicBERT-MoE); a gated feed-forward network "
                          "(ffn_gated=True) has no such experts: set ffn_gated=False")
    if cfg.adapters:
        for name, on in (("disentangled", cfg.disentangled), ("experts", cfg.experts), ("short_conv", cfg.short_conv),
                         ("embedding_size", cfg.embedding_size), ("vocab_size=0", not cfg.takes_ids)):
            if on:
                raise ConfigError(f"adapters with {name} is not implemented: the adapters cover the token table and "
                                  "the Linears of plain attention and feed-forward blocks")
    if cfg.short_conv and cfg.short_conv.layers[-1] >= cfg.num_layers:
        raise ConfigError(f"short_conv.layers={list(cfg.short_conv.layers)} names a layer past num_layers={cfg.num_layers}")
    _check_heads(cfg)
    _check_attention(cfg)


def _check_heads(cfg: EncoderConfig) -> None:
    """What the heads after the encoder need from the rest of the config."""
    if cfg.sentence_dense and cfg.pooling == "none":
        raise ConfigError(f"sentence_dense maps the pooled sentence embedding; with pooling='none' there is none: "
                          f"choose a pooling ({SENTENCE_POOLINGS}) or leave sentence_dense null / None")
    if cfg.sparse and not cfg.per_token_logits:
        raise ConfigError(f"pooling={cfg.pooling!r} pools a per-token head's logits (an MLM head over the vocabulary): "
                          f"set classifier with per_token=True, or choose {SENTENCE_POOLINGS}")
    if cfg.sparse and cfg.sentence_dense:
        raise ConfigError(f"sentence_dense maps a pooled hidden vector; pooling={cfg.pooling!r} gives vocabulary "
                          "weights: leave sentence_dense null / None")
    if cfg.truncate_dim:
        width = cfg.sentence_dense.size if cfg.sentence_dense else cfg.hidden_size
        if cfg.pooling == "none" or cfg.sparse or not 0 < cfg.truncate_dim <= width:
            raise ConfigError(f"truncate_dim={cfg.truncate_dim} keeps the first features of a pooled sentence embedding: "
                              f"it needs pooling {SENTENCE_POOLINGS} (got {cfg.pooling!r}) and a value in "
                              f"1..{width} (the embedding's width), or 0 for the whole embedding")
    if cfg.splade_activation != "relu" and not cfg.sparse:
        raise ConfigError(f"splade_activation={cfg.splade_activation!r} shapes SPLADE pooling; "
                          f"with pooling={cfg.pooling!r} leave it at 'relu'")
    pad_id = cfg.classifier.pad_id if cfg.classifier else -1
    if pad_id != -1 and not (cfg.takes_ids and pad_id < cfg.vocab_size):
        raise ConfigError(f"classifier.pad_id={pad_id} skips a token id of a token-id model: it needs an id below "
                          f"vocab_size={cfg.vocab_size}, or -1 (none)")


def _check_attention(cfg: EncoderConfig) -> None:
    """The attention variants that cannot be combined, each refused with its reason."""
    if cfg.disentangled:
        # the logarithmic buckets need max_distance > mid + 1; a model whose distances all stay
        # below mid = buckets // 2 only ever uses the exact ones
        buckets, max_distance = cfg.disentangled.buckets, cfg.disentangled.max_distance
        if max_distance and cfg.max_positions - 1 > buckets // 2 and max_distance <= buckets // 2 + 1:
            raise ConfigError(f"disentangled.buckets={buckets} needs max_distance > buckets // 2 + 1 (got "
                              f"{max_distance}): half the buckets are exact distances, the rest logarithmic up to "
                              "the max distance")
        for name, on in (("relative_attention", cfg.relative_attention), ("local_attention", cfg.local_attention),
                         ("causal", cfg.causal), ("positions='rotary'", cfg.positions == "rotary"),
                         ("num_kv_heads", cfg.grouped_kv), ("qk_norm", cfg.qk_norm)):
            if on:
                raise ConfigError(f"disentangled with {name} is not implemented: the disentangled attention brings "
                                  "its own relative positions over the whole sequence, projected through the "
                                  "full-width Q and K before any norm")
    if not (math.isfinite(cfg.attention_softcap) and cfg.attention_softcap >= 0):
        raise ConfigError(f"attention_softcap={cfg.attention_softcap} must be a finite number >= 0 (0 = no cap)")
    if cfg.attention_softcap and cfg.attention != "softmax":
        raise ConfigError(f"attention_softcap caps softmax scores; the {cfg.attention} kernel never forms them: "
                          "use attention='softmax', or leave it 0")
    if cfg.attention_softcap:
        # the cap bounds q . k / sqrt(D); where a per-pair bias is added too, no model says which comes first
        for name, on in (("relative_attention", cfg.relative_attention), ("disentangled", cfg.disentangled),
                         ("positions='alibi'", cfg.positions == "alibi")):
            if on:
                raise ConfigError(f"attention_softcap with {name} is not implemented: the cap bounds q . k / sqrt(D) "
                                  "and no model defines it beside a per-pair position bias; set one of them to 0 / "
                                  "None / another positions kind (local windows, rotary and learned positions "
                                  "combine with it)")
    if cfg.positions == "alibi":
        # a bias on the (N, N) scores, which only the bidirectional softmax kernel forms
        for name, on in (("attention=" + repr(cfg.attention), cfg.attention != "softmax"), ("causal", cfg.causal),
                         ("relative_attention", cfg.relative_attention), ("disentangled", cfg.disentangled)):
            if on:
                raise ConfigError(f"positions='alibi' with {name} is not implemented: ALiBi biases the bidirectional "
                                  "softmax scores and is the model's only relative position; use attention='softmax', "
                                  "causal=False and no relative_attention / disentangled, or another positions kind")
    if cfg.attention != "softmax":
        for name in SOFTMAX_ONLY:
            if getattr(cfg, name):
                raise ConfigError(
                    f"{name} needs attention='softmax': the {cfg.attention} kernel never forms "
                    "the (N, N) score matrix that a per-pair bias or window acts on")
    if cfg.causal and cfg.attention == "efficient":
        raise ConfigError(
            "causal=True does not work with attention='efficient': its softmax over positions would need "
            "a running max per query over keys j <= i, which its (D, D) context cannot carry; use "
            "linear or cosine (prefix sums) or softmax")
    if not (math.isfinite(cfg.rotary_scale) and cfg.rotary_scale > 0):
        raise ConfigError(f"rotary_scale={cfg.rotary_scale} must be a finite number > 0")
    if cfg.rotary_scale != 1.0 and cfg.positions != "rotary":
        raise ConfigError(f"rotary_scale scales rotary angles; it needs positions='rotary', got positions={cfg.positions!r}")
    if cfg.local_attention and cfg.local_attention.rotary_theta and cfg.positions != "rotary":
        raise ConfigError(f"local_attention.rotary_theta needs positions='rotary', got positions={cfg.positions!r}")
    if cfg.causal:
        # causal softmax rotates q and k before its masked scores (and windows them, local_attention);
        # the linear family's causal kernels and their streaming form take absolute positions only
        for name, on in (("positions='rotary'", cfg.positions == "rotary" and cfg.attention != "softmax"),
                         ("relative_attention", cfg.relative_attention)):
            if on:
                raise ConfigError(f"causal=True with {name} is not implemented: the causal kernels and their "
                                  "streaming form take absolute positions only (learned, sinusoidal or none; "
                                  "softmax also rotary and local windows)")


def field_names() -> tuple[str, ...]:
    return tuple(f.name for f in fields(EncoderConfig))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, min(n, 64) + 1) if n % d == 0][:8]


PRESETS: dict[str, EncoderConfig] = {
    # seconds-fast model for tests: every code path, tiny tables
    "tiny": EncoderConfig(
        name="tiny", vocab_size=100, hidden_size=32, num_heads=4, num_layers=2, ffn_size=64,
        max_positions=64, type_vocab_size=2, norm_eps=1e-5,
    ),
    # the README's first command: small enough to export in seconds on 2 cores
    "small": EncoderConfig(name="small"),
    "bert-base": EncoderConfig(
        name="bert-base", vocab_size=30522, hidden_size=768, num_heads=12, num_layers=12,
        ffn_size=3072, max_positions=512, type_vocab_size=2, pooling="cls",
    ),
    "bert-large": EncoderConfig(
        name="bert-large", vocab_size=30522, hidden_size=1024, num_heads=16, num_layers=24,
        ffn_size=4096, max_positions=512, type_vocab_size=2, pooling="cls",
    ),
}
DEFAULT_PRESET = "small"


def preset(name: str, **overrides: Any) -> EncoderConfig:
    """A named preset, optionally with some fields replaced."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name].replace(**overrides) if overrides else PRESETS[name]
