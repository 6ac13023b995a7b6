"""Norms, the feed-forward network and position encodings."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..config import EncoderConfig


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in float32 (no mean, no bias)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (normed * self.weight.float()).to(x.dtype)


class LayerNorm32(nn.LayerNorm):
    """LayerNorm whose statistics are taken in float32, also in a float16 model.

    bias=False gives y = (x - mean) / sqrt(var + eps) * weight (ModernBERT's norms).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return super().forward(x)
        bias = None if self.bias is None else self.bias.float()
        return F.layer_norm(x.float(), self.normalized_shape, self.weight.float(), bias, self.eps).to(x.dtype)


def make_norm(cfg: EncoderConfig, size: int | None = None) -> nn.Module:
    """The config's norm over ``size`` features (default hidden_size)."""
    size = size or cfg.hidden_size
    if cfg.norm == "rmsnorm":
        return RMSNorm(size, cfg.norm_eps)
    return LayerNorm32(size, eps=cfg.norm_eps, bias=cfg.bias)


def make_activation(name: str) -> nn.Module:
    """The config's activation as a module; every name in config.ACTIVATIONS has one."""
    return {
        "relu": nn.ReLU,
        "gelu": nn.GELU,  # erf form
        "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
        "silu": nn.SiLU,
    }[name]()


class FeedForward(nn.Module):
    """Plain:  x -> W_2 act(W_1 x + b_1) + b_2, widening F -> ffn_size -> F.

    Gated (GeGLU with gelu, SwiGLU with silu): the up projection is 2 x ffn_size wide,
    rows [a; g], and x -> W_2 (act(a) * g) + b_2 with [a; g] = W_1 x + b_1, each (B, N, ffn_size).
    bias=False drops b_1 and b_2.
    """

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.gated = cfg.ffn_gated
        self.up = nn.Linear(cfg.hidden_size, cfg.ffn_size * (2 if self.gated else 1), bias=cfg.bias)
        self.down = nn.Linear(cfg.ffn_size, cfg.hidden_size, bias=cfg.bias)
        self.act = make_activation(cfg.activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            a, g = self.up(x).chunk(2, dim=-1)  # each (B, N, ffn_size)
            return self.down(self.act(a) * g)
        return self.down(self.act(self.up(x)))


def sinusoid_table(max_positions: int, size: int) -> torch.Tensor:
    """PE[p, 2i] = sin(p / 10000^(2i/F)), PE[p, 2i+1] = cos(same). Shape (P, F)."""
    position = torch.arange(max_positions, dtype=torch.float32)[:, None]
    inv_freq = torch.exp(torch.arange(0, size, 2, dtype=torch.float32) * (-math.log(10000.0) / size))
    table = torch.zeros(max_positions, size)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq)
    return table


class Positions(nn.Module):
    """Adds a position vector per token: a learned table, fixed sinusoids, or nothing.

    Row of token j in a learned table (offset = position_offset):
      position_ids="index": offset + j
      position_ids="kept":  offset + (number of kept tokens before j), i.e.
                            offset + cumsum(attention_mask)_j - 1 for kept tokens
    "kept" is RoBERTa's create_position_ids_from_input_ids computed from the attention
    mask instead of from input_ids != padding_idx: the same rows whenever padding is
    masked, and left padding then leaves kept tokens' positions unchanged. Padded
    tokens get a valid row too (their outputs are never read).
    """

    def __init__(self, cfg: EncoderConfig, size: int):
        super().__init__()
        self.kind = cfg.positions
        self.offset = cfg.position_offset
        self.kept = cfg.position_ids == "kept"
        if self.kind == "learned":
            self.table = nn.Embedding(cfg.max_positions, size)
        elif self.kind == "sinusoidal":
            # a buffer, not a parameter: fixed, and not part of the checkpoint
            self.register_buffer("table", sinusoid_table(cfg.max_positions, size), persistent=False)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        if self.kind == "learned" and self.kept:
            kept = (attention_mask != 0).to(torch.int64)  # (B, N)
            rows = (kept.cumsum(dim=1) - 1).clamp(min=0) + self.offset  # (B, N)
            return x + self.table(rows).to(x.dtype)  # (B, N, F)
        if self.kind == "learned":
            return x + self.table.weight[self.offset:self.offset + n].to(x.dtype)  # (N, F) broadcast over batch
        if self.kind == "sinusoidal":
            return x + self.table[:n].to(x.dtype)
        return x
