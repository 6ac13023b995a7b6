"""Sublayers some families put in place of a block's attention or feed-forward network: a mixture
of experts (NomicBERT-MoE) and a gated short convolution (LFM2). Each works on every token by
itself (the experts) or on earlier positions only with padding read as zeros (the convolution),
so a kept token never depends on padding or on other rows."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import EncoderConfig
from .layers import make_activation


class MixtureOfExperts(nn.Module):
    """y = sum_e g_e W2_e^T act(W1_e x) + b, (B, N, F) -> (B, N, F), with E experts of ffn_size
    rows (W1_e and W2_e each (ffn_size, F), stored stacked as (E x ffn_size, F)), and gates
    g = p * [e among the top_k of p], p = softmax(W_r x) over the experts in float32 (not
    renormalised over the top k: NomicBERT-MoE's inference formula, without load balancing).

    Computed densely: every expert runs on every token and the gates zero all but the top k.
    In a layer with experts that costs E / k times the multiply-adds of the routed computation
    (4x for NomicBERT-MoE's 8 experts, top 2) and keeps the graph free of data-dependent shapes,
    so batch and sequence axes stay dynamic and a token's output depends on its own vector alone.
    """

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        experts = cfg.experts
        self.count, self.top_k, self.inner = experts.count, experts.top_k, cfg.ffn_size
        self.router = nn.Linear(cfg.hidden_size, experts.count, bias=False)
        self.w1 = nn.Parameter(torch.zeros(experts.count * cfg.ffn_size, cfg.hidden_size))
        self.w2 = nn.Parameter(torch.zeros(experts.count * cfg.ffn_size, cfg.hidden_size))
        self.bias = nn.Parameter(torch.zeros(cfg.hidden_size))
        self.act = make_activation(cfg.activation)

    def gates(self, x: torch.Tensor) -> torch.Tensor:
        """g (B, N, E): the router's probabilities at each token's top_k experts, zero elsewhere."""
        p = torch.softmax(self.router(x).float(), dim=-1)  # (B, N, E)
        top, index = torch.topk(p, self.top_k, dim=-1)  # (B, N, k)
        return torch.zeros_like(p).scatter(-1, index, top).to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.gates(x)  # (B, N, E)
        h = self.act(F.linear(x, self.w1))  # (B, N, E x ffn)
        h = (h.unflatten(-1, (self.count, self.inner)) * g[..., None]).flatten(-2)  # each expert's rows x its gate
        return h @ self.w2 + self.bias  # (B, N, F)


class ShortConvolution(nn.Module):
    """LFM2's gated short convolution, (B, N, F) -> (B, N, F):
    [b; c; h] = W_in (m x), z_i = c_i * sum_{t < k} w_t (b * h)_{i - k + 1 + t}, out = W_out z,
    m the attention mask (padded rows zeroed first, as transformers does), each channel's k taps
    w (depthwise), positions before the first read as zeros. Causal: position i reads i - k + 1 .. i,
    so right padding is never read and left padding reads as the zeros before a sequence."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        f, self.taps = cfg.hidden_size, cfg.short_conv.kernel_size
        self.in_proj = nn.Linear(f, 3 * f, bias=False)
        self.conv = nn.Conv1d(f, f, self.taps, groups=f, bias=False)
        self.out_proj = nn.Linear(f, f, bias=False)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        x = x * key_mask[:, :, None].to(x.dtype)
        b, c, h = self.in_proj(x).chunk(3, dim=-1)  # each (B, N, F)
        u = F.pad((b * h).transpose(1, 2), (self.taps - 1, 0))  # (B, F, k - 1 + N)
        return self.out_proj(c * self.conv(u).transpose(1, 2))
