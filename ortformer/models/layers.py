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


def make_norm(cfg: EncoderConfig) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return RMSNorm(cfg.hidden_size, cfg.norm_eps)
    return LayerNorm32(cfg.hidden_size, eps=cfg.norm_eps)


class FeedForward(nn.Module):
    """x -> W_2 act(W_1 x + b_1) + b_2, widening F -> ffn_size -> F."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.up = nn.Linear(cfg.hidden_size, cfg.ffn_size)
        self.down = nn.Linear(cfg.ffn_size, cfg.hidden_size)
        self.act = nn.GELU() if cfg.activation == "gelu" else nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


def sinusoids(position: torch.Tensor, size: int) -> torch.Tensor:
    """PE[p, 2i] = sin(p / 10000^(2i/F)), PE[p, 2i+1] = cos(same), float32 (N,) -> (N, F).

    Computed from the positions themselves, in the graph: a stored (P, F) table would put
    P x F floats into the model file (1 GiB for a million positions)."""
    inv_freq = torch.exp(torch.arange(0, size, 2, dtype=torch.float32, device=position.device)
                         * (-math.log(10000.0) / size))
    angle = position.to(torch.float32)[:, None] * inv_freq  # (N, F / 2)
    return torch.stack([angle.sin(), angle.cos()], dim=-1).reshape(position.shape[0], size)


def sinusoid_table(max_positions: int, size: int) -> torch.Tensor:
    """The sinusoids of positions 0 .. P - 1: (P, F)."""
    return sinusoids(torch.arange(max_positions), size)


class Positions(nn.Module):
    """Adds a position vector per token: a learned table, fixed sinusoids, or nothing.

    start: the position of the first token (a chunk of a longer sequence starts later);
    an int, or an int64 tensor of shape () for a chunk graph."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.kind = cfg.positions
        self.size = cfg.hidden_size
        if self.kind == "learned":
            self.table = nn.Embedding(cfg.max_positions, cfg.hidden_size)

    def forward(self, x: torch.Tensor, start: int | torch.Tensor = 0) -> torch.Tensor:
        n = x.shape[1]
        if self.kind == "none":
            return x
        index = torch.arange(n, device=x.device)
        if isinstance(start, torch.Tensor):
            index = index + start
        if self.kind == "learned":
            if isinstance(start, torch.Tensor):
                return x + self.table(index).to(x.dtype)
            return x + self.table.weight[start:start + n].to(x.dtype)  # (N, F) broadcast over batch
        return x + sinusoids(index + (start if isinstance(start, int) else 0), self.size).to(x.dtype)
