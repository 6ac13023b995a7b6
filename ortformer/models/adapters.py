"""Task adapters kept side by side in one model (the ``adapters`` group: jina-embeddings-v3's LoRA),
each row of a batch running with its own task: nothing is merged into the weights.

Per row b with task t = task_id[b], s = adapters.scale:
    every adapted Linear:  y = W x + b + s B_t (A_t x)        A (T, r, in), B (T, out, r)
    the token embedding:   e = E[id] + s A_t[id] B_t + c_t    A (T, V, r), B (T, r, E), c (T, E)
(c_t: a folded token-type adapter, zero where there is none). A row's result depends on its own
task and tokens only, so rows of different tasks share a batch. The extra work per Linear is two
rank-r products, (in + out) r multiply-adds per token against in x out for the Linear itself.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import EncoderConfig


class AdaptedLinear(nn.Linear):
    """A Linear with one low-rank adapter per task; ``task`` (B,) int64 is set by the Encoder for
    each call (None: the base weights alone). x (B, N, in) -> (B, N, out)."""

    def __init__(self, base: nn.Linear, tasks: int, rank: int, scale: float):
        super().__init__(base.in_features, base.out_features, bias=base.bias is not None)
        # random, not LoRA's zero B: a random-init model's adapters then change its outputs, as loaded ones do
        self.lora_a = nn.Parameter(torch.randn(tasks, rank, base.in_features) * 0.1)
        self.lora_b = nn.Parameter(torch.randn(tasks, base.out_features, rank) * 0.1)
        self.scale = scale
        self.task: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        if self.task is None:
            return y
        low = x @ self.lora_a[self.task].transpose(1, 2)  # (B, N, r)
        return y + (low @ self.lora_b[self.task].transpose(1, 2)) * self.scale


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
    down Linears; returns them, for the Encoder to hand each call's task_id to."""
    group, adapted = cfg.adapters, []
    for block in blocks:
        for owner, name in ((block.attention, "qkv"), (block.attention, "out"), (block.ffn, "up"), (block.ffn, "down")):
            layer = AdaptedLinear(getattr(owner, name), len(group.tasks), group.rank, group.scale)
            setattr(owner, name, layer)
            adapted.append(layer)
    return adapted
