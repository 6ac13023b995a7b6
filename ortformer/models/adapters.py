"""Task adapters kept side by side in one model (the ``adapters`` group: jina-embeddings-v3's and
v5's LoRA), each row of a batch running with its own task: nothing is merged into the weights.

Per row b with task t = task_id[b], s = adapters.scale:
    every adapted Linear:  y = W x + b + s B_t (A_t x)        A (T, r, in), B (T, out, r)
    the token embedding:   e = E[id] + s A_t[id] B_t + c_t    A (T, V, r), B (T, r, E), c (T, E)
(c_t: a folded token-type adapter, zero where there is none; no token part without
``token_adapters``). A Linear that fuses P projections each trained with its own adapter
(``per_projection``: q, k, v into qkv, gate and up into up) holds A (T, P r, in), the P stacked,
and the output rows of projection p read columns p r .. (p + 1) r of A_t x only:
    y[rows_p] = W[rows_p] x + b[rows_p] + s B_t[rows_p] (A_t[p r:(p + 1) r] x)
which is the block-diagonal product of the P adapters, without storing its zeros. A row's
result depends on its own task and tokens only, so rows of different tasks share a batch. The
extra work per Linear is (P in + out) r multiply-adds per token, against in x out for the
Linear itself.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import EncoderConfig


class AdaptedLinear(nn.Linear):
    """A Linear with one low-rank adapter per task; ``task`` (B,) int64 is set by the Encoder for
    each call (None: the base weights alone). x (B, N, in) -> (B, N, out). ``parts``: the output
    widths of the projections it fuses, each with its own rank-r adapter (None: one adapter)."""

    def __init__(self, base: nn.Linear, tasks: int, rank: int, scale: float, parts: tuple[int, ...] | None = None):
        super().__init__(base.in_features, base.out_features, bias=base.bias is not None)
        if parts is not None and sum(parts) != base.out_features:
            raise ValueError(f"the parts {parts} must add up to the Linear's {base.out_features} outputs")
        self.parts = tuple(parts) if parts and len(parts) > 1 else None
        count = len(self.parts) if self.parts else 1
        # random, not LoRA's zero B: a random-init model's adapters then change its outputs, as loaded ones do
        self.lora_a = nn.Parameter(torch.randn(tasks, count * rank, base.in_features) * 0.1)
        self.lora_b = nn.Parameter(torch.randn(tasks, base.out_features, rank) * 0.1)
        self.rank, self.scale = rank, scale
        self.task: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        if self.task is None:
            return y
        low = x @ self.lora_a[self.task].transpose(1, 2)  # (B, N, P r)
        b = self.lora_b[self.task]  # (B, out, r)
        if self.parts is None:
            return y + (low @ b.transpose(1, 2)) * self.scale
        deltas, start, r = [], 0, self.rank
        for p, width in enumerate(self.parts):  # projection p: its rows of B, its r columns of the product
            deltas.append(low[..., p * r:(p + 1) * r] @ b[:, start:start + width].transpose(1, 2))
            start += width
        return y + torch.cat(deltas, dim=-1) * self.scale


class TokenAdapters(nn.Module):
    """The token embedding's per-task part, s A_t[id] B_t + c_t: (B, N) ids -> (B, N, E)."""

    def __init__(self, cfg: EncoderConfig, width: int):
        super().__init__()
        group = cfg.adapters
        tasks = len(group.tasks)
        self.scale = group.scale
        self.lora_a = nn.Parameter(torch.randn(tasks, cfg.vocab_size, group.rank) * 0.1)
        self.lora_b = nn.Parameter(torch.randn(tasks, group.rank, width) * 0.1)
        self.shift = nn.Parameter(torch.randn(tasks, width) * 0.1)

    def forward(self, ids: torch.Tensor, task: torch.Tensor) -> torch.Tensor:
        rows = self.lora_a[task[:, None], ids]  # (B, N, r)
        return (rows @ self.lora_b[task]) * self.scale + self.shift[task][:, None, :]


def adapt_blocks(blocks: nn.ModuleList, cfg: EncoderConfig) -> list[AdaptedLinear]:
    """Put an AdaptedLinear in place of each block's attention qkv and out and feed-forward up and
    down Linears; returns them, for the Encoder to hand each call's task_id to. With
    ``per_projection`` qkv holds the q, k and v adapters and a gated up the gate and up ones."""
    group, adapted = cfg.adapters, []
    parts = {"qkv": (cfg.attention_size, cfg.kv_size, cfg.kv_size),
             "up": (cfg.ffn_size, cfg.ffn_size) if cfg.ffn_gated else None} if group.per_projection else {}
    for block in blocks:
        for owner, name in ((block.attention, "qkv"), (block.attention, "out"), (block.ffn, "up"), (block.ffn, "down")):
            layer = AdaptedLinear(getattr(owner, name), len(group.tasks), group.rank, group.scale, parts.get(name))
            setattr(owner, name, layer)
            adapted.append(layer)
    return adapted
