"""The optional groups of an EncoderConfig: each is None when its variant is off, so a field that
shapes a variant exists only where the variant does. Each group checks its own fields; the rules
between a group and the rest of the model live in config._check_variants. Torch-free."""
from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, fields
from typing import Any

from ..core.checks import is_int
from ..core.errors import ConfigError

# non-linearity after the sentence-embedding Dense head (sentence-transformers' Dense module)
DENSE_ACTIVATIONS = ("identity", "tanh", "relu", "gelu", "sigmoid")
# classifier head: "none" = logits = W p + b; else a hidden Dense with this act first
# (BERT's pooler and RoBERTa's head: tanh; DistilBERT: relu; ELECTRA, DeBERTa: gelu)
CLASSIFIER_DENSE = ("none", "tanh", "relu", "gelu", "gelu_tanh", "silu")
CLASSIFIER_POOLINGS = ("mean", "cls", "last", "max")
# how disentangled attention projects its relative table: each layer's W_Q, W_K, or a pair of its own
DISENTANGLED_PROJECTIONS = ("shared", "separate")

_TYPES = {"int": int, "float": float, "str": str, "bool": bool}


def check_types(obj: Any, where: str = "") -> None:
    """Every plain field of the dataclass obj holds its annotated type (int, float, str, bool);
    an int is accepted for a float (1 is a fine spelling of 1.0), a bool never for a number."""
    for f in fields(obj):
        want = _TYPES.get(f.type)
        if want is None:
            continue  # a group: EncoderConfig checks those
        value = getattr(obj, f.name)
        typed = checked_type(where + f.name, value, want)
        if typed is not value:
            object.__setattr__(obj, f.name, typed)


def checked_type(name: str, value: Any, want: type) -> Any:
    """value as a want (int, float, str, bool): an int is accepted for a float and returned as
    one (1 is a fine spelling of 1.0); ConfigError for anything else. bool is a subclass of int,
    yet True must not pass as a layer count."""
    if want is float and is_int(value):
        return float(value)
    if not isinstance(value, want) or (want is not bool and isinstance(value, bool)):
        raise ConfigError(f"{name}={value!r} must be of type {want.__name__}, got {type(value).__name__}")
    return value


def _choose(where: str, name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{where}{name}={value!r} is not valid; choose one of {', '.join(choices)}")


@dataclass(frozen=True)
class Classifier:
    """A fine-tuned *ForSequenceClassification / *ForTokenClassification head and its "logits"
    output: logits = W_o h + b_o, h = act(W_h p + b_h) (F -> F; h = p for dense "none"),
    (B, L) per sequence or (B, N, L) per token."""

    # the number of labels L
    labels: int
    # logits per token (B, N, L: tagging, NER) instead of per sequence (B, L)
    per_token: bool = False
    # the vector a per-sequence head reads: the first token (cls, BERT-family) or a pooling
    pooling: str = "cls"
    # the head's hidden Dense and its act, or "none"; a per-token head applies it to every token
    dense: str = "none"
    # normalise h with the config's norm after the Dense (ModernBERT's prediction head)
    norm: bool = False
    # a per-sequence head on the "last" token reads the last kept token whose id is not this one, -1 = the
    # last kept token: transformers' decoder classifiers look for the last non-pad id, so a text ending in
    # its pad id (an eos used as pad) is scored at the token before, and a text made only of it at its
    # first kept token (transformers' index 0 under right padding)
    pad_id: int = -1

    def __post_init__(self) -> None:
        where = "classifier."
        check_types(self, where)
        if self.labels < 1:
            raise ConfigError(f"classifier.labels={self.labels} must be >= 1 (no head: classifier null / None)")
        _choose(where, "pooling", self.pooling, CLASSIFIER_POOLINGS)
        _choose(where, "dense", self.dense, CLASSIFIER_DENSE)
        if self.norm and self.dense == "none":
            raise ConfigError("classifier.norm=True normalises the classifier's hidden Dense; set classifier.dense too")
        if self.pad_id != -1 and (self.per_token or self.pooling != "last" or self.pad_id < 0):
            raise ConfigError(f"classifier.pad_id={self.pad_id} skips a token id in a per-sequence head on the last "
                              "token: it needs per_token=False, pooling='last' and an id >= 0, or -1 (none)")


@dataclass(frozen=True)
class Convolution:
    """A convolution over positions after the first layer (DeBERTa-v2 xlarge / xxlarge):
    x_1 = norm(x_1 + act(conv(e))), e the embeddings (padding zeroed), a Conv1d F -> F."""

    # odd kernel size k: the sequence length is kept with (k - 1) / 2 positions of padding per side
    kernel_size: int
    # the convolution's groups (its weight is F x F / groups x k)
    groups: int = 1
    # act of the convolution (DeBERTa's conv_act; transformers' default is tanh)
    activation: str = "tanh"

    def __post_init__(self) -> None:
        check_types(self, "convolution.")
        if self.kernel_size < 1 or self.kernel_size % 2 == 0:
            raise ConfigError(f"convolution.kernel_size={self.kernel_size} must be odd and >= 1: the convolution keeps "
                              "the sequence length with (k - 1) / 2 positions of padding on each side")
        if self.groups < 1:
            raise ConfigError(f"convolution.groups={self.groups} must be >= 1")
        _choose("convolution.", "activation", self.activation, CLASSIFIER_DENSE[1:])


@dataclass(frozen=True)
class Experts:
    """A mixture of experts in place of the feed-forward network of the layers l with
    l % every == offset (NomicBERT-MoE): router probabilities p = softmax(W_r x) over ``count``
    experts, the ``top_k`` largest kept as they are (not renormalised: the inference formula, no
    load balancing), y = sum_e p_e [e in top-k] W2_e^T act(W1_e x) + b, each expert a plain
    ffn_size-wide MLP without biases, b one bias shared by the experts."""

    # E, the number of experts
    count: int
    # k, the experts each token is sent to
    top_k: int
    # the layers l with l % every == offset have experts (NomicBERT-MoE: every other layer ...)
    every: int = 2
    # ... from layer 1 on
    offset: int = 1

    def __post_init__(self) -> None:
        check_types(self, "experts.")
        if self.count < 2:
            raise ConfigError(f"experts.count={self.count} must be >= 2 (one expert is a feed-forward network)")
        if not 1 <= self.top_k <= self.count:
            raise ConfigError(f"experts.top_k={self.top_k} must be in 1..count={self.count}")
        if self.every < 1 or not 0 <= self.offset < self.every:
            raise ConfigError(f"experts.every={self.every}, experts.offset={self.offset}: every must be >= 1 and "
                              "offset in 0..every - 1")

    def has(self, layer: int) -> bool:
        """Whether layer ``layer`` has experts."""
        return layer % self.every == self.offset


@dataclass(frozen=True)
class ShortConv:
    """LFM2's gated short convolution in place of attention in ``layers``: [b; c; h] = W_in x
    (three F-wide parts), z = c * conv(b * h) with a depthwise causal convolution of ``kernel_size``
    taps (position i reads i - k + 1 .. i; padded and missing positions read as zeros), out = W_out z.
    No biases."""

    # k, the taps of each channel's convolution (LFM2's conv_L_cache)
    kernel_size: int
    # the layers whose attention is this convolution (0-based, ascending)
    layers: tuple = ()

    def __post_init__(self) -> None:
        check_types(self, "short_conv.")
        if not isinstance(self.layers, (list, tuple)) or not all(is_int(l) and l >= 0 for l in self.layers):
            raise ConfigError(f"short_conv.layers={self.layers!r} must list layer indices (ints >= 0)")
        layers = tuple(self.layers)
        if list(layers) != sorted(set(layers)) or not layers:
            raise ConfigError(f"short_conv.layers={list(layers)} must list at least one layer, ascending, each once")
        object.__setattr__(self, "layers", layers)
        if self.kernel_size < 1:
            raise ConfigError(f"short_conv.kernel_size={self.kernel_size} must be >= 1")


@dataclass(frozen=True)
class Adapters:
    """Task adapters kept side by side (jina-embeddings-v3's and v5's LoRA), chosen per row by the
    task_id input: for task t every block's Linears compute W x + b + s B_t (A_t x) (A_t (r, in),
    B_t (out, r)), and (``token_adapters``) the token embedding adds s A_t[id] B_t (A_t (V, r), B_t
    (r, E)) and a per-task vector (a folded token-type adapter), none of it merged into the weights.
    ``per_projection``: the adapters were trained on the unfused projections (q, k, v; gate, up), so
    a fused Linear of P projections holds P of them: A_t (P r, in) stacks theirs, and the rows of
    projection p read their own r columns of the low-rank product only (B_t stays (out, r))."""

    # the task names, in task_id order (0, 1, ...)
    tasks: tuple = ()
    # r, the adapters' rank
    rank: int = 4
    # s = lora_alpha / rank
    scale: float = 0.25
    # the task a request that names none runs with (the model card's)
    default: str = ""
    # the token embedding has adapters too (jina-embeddings-v3); False: the blocks' Linears only (v5)
    token_adapters: bool = True
    # one adapter per unfused projection: qkv holds 3 (rank 3 r), a gated up 2 (jina-embeddings-v5)
    per_projection: bool = False

    def __post_init__(self) -> None:
        check_types(self, "adapters.")
        tasks = tuple(self.tasks) if isinstance(self.tasks, (list, tuple)) else None
        if not tasks or not all(isinstance(t, str) and t for t in tasks) or len(set(tasks)) != len(tasks):
            raise ConfigError(f"adapters.tasks={self.tasks!r} must list at least one task name, each a non-empty "
                              "string, each once")
        object.__setattr__(self, "tasks", tasks)
        if self.rank < 1 or not (math.isfinite(self.scale) and self.scale > 0):
            raise ConfigError(f"adapters.rank={self.rank}, adapters.scale={self.scale}: the rank must be >= 1 and "
                              "the scale a finite number > 0")
        if self.default not in tasks:
            raise ConfigError(f"adapters.default={self.default!r} must be one of the tasks {list(tasks)}")


@dataclass(frozen=True)
class RelativeAttention:
    """T5-style bidirectional relative position buckets: one (buckets, H) table, computed once per
    call and added to every layer's scores (MPNet, T5). softmax only."""

    # the number of buckets: half per direction, half of each exact distances
    buckets: int
    # distance beyond which relative positions share the last logarithmic bucket
    max_distance: int = 128

    def __post_init__(self) -> None:
        check_types(self, "relative_attention.")
        # per direction buckets // 2, of which buckets // 4 are exact distances: with fewer
        # than 4 no distance is exact and the logarithmic part divides by log(max_distance / 0)
        if self.buckets < 4:
            raise ConfigError(f"relative_attention.buckets={self.buckets} must be >= 4 (half per direction, half of "
                              "each exact distances)")
        exact = self.buckets // 4
        if self.max_distance <= exact:
            raise ConfigError(f"relative_attention.max_distance={self.max_distance} must exceed the {exact} exact "
                              f"distances of buckets={self.buckets}")


@dataclass(frozen=True)
class Disentangled:
    """Disentangled relative attention (DeBERTa): S buckets of i - j per direction (2S rows of a
    relative table R shared by every layer, projected to position queries and keys in each layer),
    scores (q_i k_j + q_i (W_K R)[I_ij] + k_j (W_Q R)[I_ij]) / sqrt(D),
    I_ij = clamp(bucket(i - j) + S, 0, 2S - 1). softmax only."""

    # S, the buckets per direction
    buckets: int
    # distance where the buckets reach their last (logarithmic) bucket; 0: no log buckets,
    # I_ij = clamp(i - j + S, 0, 2S - 1) (DeBERTa v1, DeBERTa-v2 without position_buckets)
    max_distance: int = 512
    # how R becomes position keys and queries: "shared" = each layer's own W_Q, W_K (DeBERTa-v2's
    # share_att_key); "separate" = a position Linear pair per layer, F -> 2A (DeBERTa v1's pos_q_proj, pos_proj)
    projections: str = "shared"
    # normalise the relative table R (DeBERTa-v2's norm_rel_ebd); v1 reads it as stored
    norm: bool = True

    def __post_init__(self) -> None:
        check_types(self, "disentangled.")
        if self.buckets < 2:
            raise ConfigError(f"disentangled.buckets={self.buckets} must be >= 2")
        if self.max_distance < 0:
            raise ConfigError(f"disentangled.max_distance={self.max_distance} must be >= 0 (0: no log buckets)")
        _choose("disentangled.", "projections", self.projections, DISENTANGLED_PROJECTIONS)


@dataclass(frozen=True)
class LocalAttention:
    """Sliding-window attention on some layers: a local layer attends to keys with
    |i - j| <= window // 2 (ModernBERT's local_attention); with causal, i - window // 2 <= j <= i
    (a decoder's sliding window w is window 2 w - 1). Layer l is global when
    l % global_every == global_offset. softmax only."""

    # the window's width in tokens: a key within window // 2 positions of the query (either side)
    window: int
    # every global_every-th layer attends globally (>= 2: with 1 every layer would be global)
    global_every: int
    # where in each group of global_every layers the global one sits (ModernBERT: 0, the first;
    # Gemma 3: 5 of 6, the last)
    global_offset: int = 0
    # rotary theta of the local layers; 0 = the model's rotary_theta (ModernBERT: 10000 vs 160000)
    rotary_theta: float = 0.0

    def __post_init__(self) -> None:
        check_types(self, "local_attention.")
        if self.window < 1:
            raise ConfigError(f"local_attention.window={self.window} must be >= 1 (no windows: local_attention null / None)")
        if self.global_every < 2:
            raise ConfigError(f"local_attention.global_every={self.global_every} must be >= 2; with 1 every layer "
                              "is global (no windows: local_attention null / None)")
        if not 0 <= self.global_offset < self.global_every:
            raise ConfigError(f"local_attention.global_offset={self.global_offset} must be in [0, global_every="
                              f"{self.global_every}): layer l is global when l % global_every == global_offset")
        if not math.isfinite(self.rotary_theta) or self.rotary_theta < 0 or 0 < self.rotary_theta <= 1:
            raise ConfigError(f"local_attention.rotary_theta={self.rotary_theta} must be a finite number > 1 "
                              "(or 0 = the model's rotary_theta)")


@dataclass(frozen=True)
class SentenceDense:
    """sentence-transformers' Dense module on the pooled vector: s = act(W p + b), W (size, F),
    so sentence_embedding is size wide (LaBSE, distiluse)."""

    # S, the width of the head's output and so of sentence_embedding
    size: int
    # act of the Dense head (identity unless the model says; sentence-transformers' own default is tanh)
    activation: str = "identity"
    # b of the Dense head
    bias: bool = True

    def __post_init__(self) -> None:
        check_types(self, "sentence_dense.")
        if self.size < 1:
            raise ConfigError(f"sentence_dense.size={self.size} must be >= 1 (no head: sentence_dense null / None)")
        _choose("sentence_dense.", "activation", self.activation, DENSE_ACTIVATIONS)


@dataclass(frozen=True)
class TokenDense:
    """The multi-vector head of late interaction (ColBERT, bge-m3's colbert_linear): a
    "token_embeddings" output t_i = (W x_i + b) / ||W x_i + b|| per token, W (size, F), (B, N, size)."""

    # D, the width of each token vector
    size: int
    # b of the head (ColBERT's projection has none, bge-m3's colbert_linear has one)
    bias: bool = False

    def __post_init__(self) -> None:
        check_types(self, "token_dense.")
        if self.size < 1:
            raise ConfigError(f"token_dense.size={self.size} must be >= 1 (no head: token_dense null / None)")


# EncoderConfig's group fields and the dataclass each holds
GROUPS: dict[str, type] = {
    "classifier": Classifier, "convolution": Convolution, "relative_attention": RelativeAttention,
    "disentangled": Disentangled, "local_attention": LocalAttention, "sentence_dense": SentenceDense,
    "token_dense": TokenDense, "experts": Experts, "short_conv": ShortConv, "adapters": Adapters,
}


def group_from_dict(name: str, data: Any) -> Any:
    """A group from its JSON form: null (off) or an object of the group's fields."""
    cls = GROUPS[name]
    if data is None or isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise ConfigError(f"config {name} must be a JSON object or null (off), got {type(data).__name__}")
    valid = [f.name for f in fields(cls)]
    unknown = sorted(set(data) - set(valid))
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} in config {name}; valid keys: {', '.join(valid)}")
    try:
        return cls(**data)
    except TypeError:  # a required field left out
        required = [f.name for f in fields(cls) if f.default is MISSING]
        raise ConfigError(f"config {name} needs {', '.join(required)} (got {sorted(data)})") from None
