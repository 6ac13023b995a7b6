"""Parameter and FLOP counts from a config alone (torch-free, used by `info`).

Counts follow the matrix view of the encoder, F = hidden_size, N = sequence length,
D = head size, L = layers:
- attention projections W_Q, W_K, W_V, W_O: 4F^2 weights + 4F biases per layer
- feed-forward: 2 F ffn_size weights + ffn_size + F biases per layer; a gated FFN's
  up projection is twice as wide: 3 F ffn_size weights + 2 ffn_size + F biases
- bias=False: no Linear biases, and LayerNorm keeps only its weight
- a relative position bias: one buckets x H table
- embeddings: vocab x F tokens, max_positions x F learned positions, types x F
FLOPs count a multiply-add as 2.
"""
from __future__ import annotations

from .config import EncoderConfig


def _norm_params(cfg: EncoderConfig) -> int:
    return 2 * cfg.hidden_size if cfg.norm == "layernorm" and cfg.bias else cfg.hidden_size


def parameter_breakdown(cfg: EncoderConfig) -> dict[str, int]:
    """Parameters per part; the values sum to ``parameter_count(cfg)``."""
    F, L = cfg.hidden_size, cfg.num_layers
    positions = cfg.max_positions * F if cfg.positions == "learned" else 0
    up = cfg.ffn_size * (2 if cfg.ffn_gated else 1)  # width of the up projection
    return {
        "token_embeddings": cfg.vocab_size * F,
        "position_embeddings": positions,
        "type_embeddings": cfg.type_vocab_size * F,
        "attention_weights": L * 4 * F * F,
        "attention_biases": L * 4 * F if cfg.bias else 0,
        "ffn_weights": L * (F * up + cfg.ffn_size * F),
        "ffn_biases": L * (up + F) if cfg.bias else 0,
        # MPNet-style relative position bias: one (buckets, H) table shared by all layers
        "relative_attention_bias": cfg.relative_attention_buckets * cfg.num_heads,
        # two norms per block, plus one at the embeddings (post) or at the end (pre)
        "norms": (2 * L + 1) * _norm_params(cfg),
    }


def parameter_count(cfg: EncoderConfig) -> int:
    return sum(parameter_breakdown(cfg).values())


def flops_per_sequence(cfg: EncoderConfig, n: int) -> dict[str, int]:
    """Forward FLOPs for one sequence of n tokens, per part.

    attention_core is QK^T and AV for softmax: 4 N^2 F per layer (O(N^2));
    for the linear family, K^T V and Q (K^T V): 4 N F D per layer (O(N)).
    """
    F, L, D = cfg.hidden_size, cfg.num_layers, cfg.head_size
    core = 4 * n * n * F if cfg.attention == "softmax" else 4 * n * F * D
    return {
        "projections": L * 8 * n * F * F,
        "attention_core": L * core,
        "ffn": L * (6 if cfg.ffn_gated else 4) * n * F * cfg.ffn_size,
    }


def total_flops(cfg: EncoderConfig, n: int) -> int:
    return sum(flops_per_sequence(cfg, n).values())
