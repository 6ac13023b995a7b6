"""Parameter, FLOP and memory estimates from a config alone (torch-free, used by `info`).

Counts follow the matrix view of the encoder, F = hidden_size, N = sequence length,
D = head size, L = layers:
- attention projections W_Q, W_K, W_V, W_O: 4F^2 weights + 4F biases per layer
- feed-forward: 2 F ffn_size weights + ffn_size + F biases per layer
- embeddings: vocab x F tokens, max_positions x F learned positions, types x F
FLOPs count a multiply-add as 2.
"""
from __future__ import annotations

import os

from .config import EncoderConfig
from .errors import ConfigError


def _norm_params(cfg: EncoderConfig) -> int:
    return 2 * cfg.hidden_size if cfg.norm == "layernorm" else cfg.hidden_size


def parameter_breakdown(cfg: EncoderConfig) -> dict[str, int]:
    """Parameters per part; the values sum to ``parameter_count(cfg)``."""
    F, L = cfg.hidden_size, cfg.num_layers
    positions = cfg.max_positions * F if cfg.positions == "learned" else 0
    return {
        "token_embeddings": cfg.vocab_size * F,
        "position_embeddings": positions,
        "type_embeddings": cfg.type_vocab_size * F,
        "attention_weights": L * 4 * F * F,
        "attention_biases": L * 4 * F,
        "ffn_weights": L * 2 * F * cfg.ffn_size,
        "ffn_biases": L * (cfg.ffn_size + F),
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
        "ffn": L * 4 * n * F * cfg.ffn_size,
    }


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
