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
    """LayerNorm whose statistics are taken in float32, also in a float16 model."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return super().forward(x)
        return F.layer_norm(x.float(), self.normalized_shape, self.weight.float(), self.bias.float(), self.eps).to(x.dtype)


def make_norm(cfg: EncoderConfig, size: int | None = None) -> nn.Module:
    """The config's norm over ``size`` features (default hidden_size)."""
    size = size or cfg.hidden_size
    if cfg.norm == "rmsnorm":
        return RMSNorm(size, cfg.norm_eps)
    return LayerNorm32(size, eps=cfg.norm_eps)


class FeedForward(nn.Module):
    """x -> W_2 act(W_1 x + b_1) + b_2, widening F -> ffn_size -> F."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.up = nn.Linear(cfg.hidden_size, cfg.ffn_size)
        self.down = nn.Linear(cfg.ffn_size, cfg.hidden_size)
        self.act = nn.GELU() if cfg.activation == "gelu" else nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
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
