"""Parameter, FLOP and memory estimates from a config alone (torch-free, used by `info`).

Counts follow the matrix view of the encoder, F = hidden_size, N = sequence length,
D = head size, L = layers:
- attention projections W_Q (F -> A), W_K, W_V (F -> A_kv) and W_O (A -> F): 2 F (A + A_kv)
  weights + A + 2 A_kv + F biases per layer, A = H x D (= F unless attention_head_size is set),
  A_kv = H_kv x D (= A unless num_kv_heads shares K and V between query heads)
- feed-forward: 2 F ffn_size weights + ffn_size + F biases per layer; a gated FFN's
  up projection is twice as wide: 3 F ffn_size weights + 2 ffn_size + F biases
- bias=False: no Linear biases, and LayerNorm keeps only its weight
- a relative position bias: one buckets x H table
- disentangled attention: one 2S x F relative table and its norm (S = disentangled.buckets),
  plus per layer a position pair F -> 2A (+ 2A bias) with disentangled.projections="separate"
- embeddings: vocab x E tokens, max_positions x E learned positions, types x E
  (E = embedding_size or F), and an E x F projection (+ F bias) when embedding_size is set
- a sentence Dense head: F x S weights (+ S bias), S = sentence_dense.size
- a classifier: F x L weights + L biases (L = classifier.labels), plus F x F + F for the
  head's hidden Dense and a norm's parameters when classifier.norm
- per-token heads: F x D weights (+ D bias) for token_embeddings (D = token_dense.size), F + 1 for sparse
FLOPs count a multiply-add as 2.
"""
from __future__ import annotations

import os

from ..config import EncoderConfig
from ..core.errors import ConfigError


def _norm_params(cfg: EncoderConfig, size: int | None = None) -> int:
    size = size or cfg.hidden_size
    return 2 * size if cfg.norm == "layernorm" and cfg.bias else size


def parameter_breakdown(cfg: EncoderConfig) -> dict[str, int]:
    """Parameters per part; the values sum to ``parameter_count(cfg)``."""
    F, L = cfg.hidden_size, cfg.num_layers
    E = cfg.embedding_size or F  # embedding width (ELECTRA projects E -> F)
    positions = cfg.max_positions * E if cfg.positions == "learned" else 0
    up = cfg.ffn_size * (2 if cfg.ffn_gated else 1)  # width of the up projection
    # post-norm: the embedding norm is E wide; pre-norm: the final norm is F wide, plus an
    # E-wide embedding norm when embedding_norm, which replaces the first block's pre-norm
    # unless first_block_norm
    norms = (2 * L) * _norm_params(cfg) + _norm_params(cfg, E if cfg.norm_position == "post" else F)
    if cfg.embedding_norm:
        norms += _norm_params(cfg, E) - (0 if cfg.first_block_norm else _norm_params(cfg))
    if cfg.sandwich_norm:  # each sublayer's output normalised too
        norms += (2 * L) * _norm_params(cfg)
    conv, dense, head = cfg.convolution, cfg.sentence_dense, cfg.classifier
    return {
        "token_embeddings": cfg.vocab_size * E,
        "position_embeddings": positions,
        "type_embeddings": cfg.type_vocab_size * E,
        "embedding_projection": (E * F + (F if cfg.bias else 0)) if cfg.embedding_size else 0,
        # Q and the output A wide, K and V A_kv wide (A unless num_kv_heads shares them)
        "attention_weights": L * 2 * F * (cfg.attention_size + cfg.kv_size),
        "attention_biases": L * (cfg.attention_size + 2 * cfg.kv_size + F) if cfg.bias else 0,
        "ffn_weights": L * (F * up + cfg.ffn_size * F),
        "ffn_biases": L * (up + F) if cfg.bias else 0,
        # MPNet-style relative position bias: one (buckets, H) table shared by all layers
        "relative_attention_bias": cfg.relative_attention.buckets * cfg.num_heads if cfg.relative_attention else 0,
        # two norms per block (four with sandwich_norm), plus one at the embeddings (post) or at the end (pre)
        "norms": norms,
        # Qwen3's per-head RMSNorm of q and k: two (D,) weights per layer
        "qk_norms": L * 2 * cfg.head_size if cfg.qk_norm else 0,
        # DeBERTa's relative table (2S, F) and its norm, shared by every layer
        "disentangled_positions": _disentangled_params(cfg),
        # DeBERTa-v2's convolution after the first layer: (F, F / groups, k) + bias, and its norm
        "convolution": (F * F // conv.groups * conv.kernel_size + F + _norm_params(cfg)) if conv else 0,
        "sentence_dense": dense.size * (F + (1 if dense.bias else 0)) if dense else 0,
        "classifier": (head.labels * (F + 1) + (F * (F + 1) if head.dense != "none" else 0)
                       + (_norm_params(cfg) if head.norm else 0)) if head else 0,
        "token_heads": (_token_dense_size(cfg) * (F + (1 if cfg.token_dense and cfg.token_dense.bias else 0))
                        + (F + 1 if cfg.token_weights else 0)),
        **_mixer_params(cfg),
    }


def _mixer_params(cfg: EncoderConfig) -> dict[str, int]:
    """What short-convolution layers and expert layers change against the attention and
    feed-forward counts above: negative entries take out what those layers do not have."""
    F, out = cfg.hidden_size, {}
    if cfg.short_conv:  # W_in (3F x F), W_out (F x F), k taps per channel; no attention, biases or q / k norms
        conv = len(cfg.short_conv.layers)
        attention = 2 * F * (cfg.attention_size + cfg.kv_size) + (
            cfg.attention_size + 2 * cfg.kv_size + F if cfg.bias else 0) + (2 * cfg.head_size if cfg.qk_norm else 0)
        out["short_convolution"] = conv * (4 * F * F + F * cfg.short_conv.kernel_size - attention)
    if cfg.experts:  # per expert layer: router (E x F), E x (W1, W2) and one bias, in place of one feed-forward network
        layers = sum(cfg.experts.has(l) for l in range(cfg.num_layers))
        ffn = 2 * F * cfg.ffn_size + (cfg.ffn_size + F if cfg.bias else 0)
        out["experts"] = layers * (cfg.experts.count * (F + 2 * F * cfg.ffn_size) + F - ffn)
    if cfg.adapters:  # T tasks of rank r: A and B beside qkv, out, up, down; the token table's A, B and shift
        group = cfg.adapters
        t, r, up = len(group.tasks), group.rank, cfg.ffn_size * (2 if cfg.ffn_gated else 1)
        E = cfg.embedding_size or F
        # per projection, qkv's A stacks 3 adapters' and a gated up's 2 (adapters.py)
        qkv_in, up_in = (3, 2 if cfg.ffn_gated else 1) if group.per_projection else (1, 1)
        linears = ((qkv_in * F + cfg.attention_size + 2 * cfg.kv_size) + (cfg.attention_size + F)
                   + (up_in * F + up) + (cfg.ffn_size + F))
        tokens = t * r * (cfg.vocab_size + E) + t * E if group.token_adapters else 0
        out["adapters"] = t * r * cfg.num_layers * linears + tokens
    return out


def _disentangled_params(cfg: EncoderConfig) -> int:
    group, F = cfg.disentangled, cfg.hidden_size
    if group is None:
        return 0
    separate = cfg.num_layers * 2 * cfg.attention_size * (F + 1) if group.projections == "separate" else 0
    return 2 * group.buckets * F + (_norm_params(cfg) if group.norm else 0) + separate


def _token_dense_size(cfg: EncoderConfig) -> int:
    return cfg.token_dense.size if cfg.token_dense else 0


def parameter_count(cfg: EncoderConfig) -> int:
    return sum(parameter_breakdown(cfg).values())


def flops_per_sequence(cfg: EncoderConfig, n: int) -> dict[str, int]:
    """Forward FLOPs for one sequence of n tokens, per part.

    attention_core is QK^T and AV for softmax: 4 N^2 A per layer (O(N^2));
    for the linear family, K^T V and Q (K^T V): 4 N A D per layer (O(N)).
    """
    F, L, D, A = cfg.hidden_size, cfg.num_layers, cfg.head_size, cfg.attention_size
    core = 4 * n * n * A if cfg.attention == "softmax" else 4 * n * A * D
    flops = {
        "projections": L * 4 * n * F * (A + cfg.kv_size),
        "attention_core": L * core,
        "ffn": L * (6 if cfg.ffn_gated else 4) * n * F * cfg.ffn_size,
    }
    if cfg.disentangled:  # per layer: W_Q R, W_K R (2S x F x 2F) and q . (W_K R), k . (W_Q R) (2 N 2S F)
        s = cfg.disentangled.buckets
        flops["disentangled_positions"] = L * (8 * s * F * A + 8 * n * s * A)
    if cfg.experts:  # computed densely (mixers.MixtureOfExperts): every expert on every token, plus the router
        layers = sum(cfg.experts.has(l) for l in range(cfg.num_layers))
        flops["ffn"] += layers * n * (4 * F * cfg.ffn_size * (cfg.experts.count - 1) + 2 * F * cfg.experts.count)
    if cfg.short_conv:  # W_in and W_out (8 n F^2) and k taps per channel, in place of the attention projections and core
        conv = len(cfg.short_conv.layers)
        flops["projections"] -= conv * 4 * n * F * (A + cfg.kv_size)
        flops["attention_core"] -= conv * core
        flops["short_convolution"] = conv * (8 * n * F * F + 2 * n * F * cfg.short_conv.kernel_size)
    if cfg.convolution:  # n outputs of F, each k F / groups multiply-adds
        flops["convolution"] = 2 * n * F * F // cfg.convolution.groups * cfg.convolution.kernel_size
    if cfg.classifier:  # the head's Dense (F x F) and classifier (F x L), per token or once
        vectors = n if cfg.classifier.per_token else 1
        flops["classifier"] = vectors * 2 * F * (cfg.num_labels + (F if cfg.classifier.dense != "none" else 0))
    if cfg.token_dense or cfg.token_weights:  # every token through F x D, and F x 1
        flops["token_heads"] = n * 2 * F * (_token_dense_size(cfg) + (1 if cfg.token_weights else 0))
    return flops


def total_flops(cfg: EncoderConfig, n: int) -> int:
    return sum(flops_per_sequence(cfg, n).values())


FLOAT32_BYTES = 4
# export holds the eager weights, the traced ONNX proto and its serialized bytes at once
EXPORT_COPIES = 3


def parameter_bytes(cfg: EncoderConfig, copies: int = EXPORT_COPIES) -> int:
    """float32 bytes of ``copies`` copies of the weights: what an export allocates, at least."""
    return copies * FLOAT32_BYTES * parameter_count(cfg)


def activation_bytes(cfg: EncoderConfig, batch: int, n: int) -> int:
    """float32 bytes one layer's activations take for a (batch, n) input, a lower bound on a run.

    Per token: the hidden state, Q, K, V and the attention output (5F) and the
    feed-forward's inner activations (ffn_size); softmax attention adds its
    (batch, heads, n, n) score matrix.
    """
    per_token = FLOAT32_BYTES * (5 * cfg.hidden_size + cfg.ffn_size)
    scores = FLOAT32_BYTES * batch * cfg.num_heads * n * n if cfg.attention == "softmax" else 0
    return batch * n * per_token + scores


def available_memory() -> int | None:
    """Bytes this process may still allocate: MemAvailable (or free pages), capped by RLIMIT_AS.
    None where neither can be read."""
    found = None
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    found = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    if found is None and hasattr(os, "sysconf"):
        try:
            found = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            pass
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            found = soft if found is None else min(found, soft)
    except (ImportError, ValueError, OSError):
        pass
    return found


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


def check_fits(needed: int, what: str, advice: str) -> None:
    """ConfigError naming both sizes when ``needed`` bytes exceed the memory available."""
    limit = available_memory()
    if limit is not None and needed > limit:
        raise ConfigError(f"{what} needs about {_gib(needed)} of memory, more than the {_gib(limit)} available; "
                          f"{advice}")
