"""The encoder: embeddings, L blocks, optional pooling, built from one config."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import EncoderConfig
from .attention import MultiHeadAttention
from .layers import FeedForward, Positions, make_norm


class Block(nn.Module):
    """One encoder layer.

    post-norm (BERT):  x = norm1(x + attn(x));  x = norm2(x + ffn(x))
    pre-norm:          x = x + attn(norm1(x));  x = x + ffn(norm2(x))
    """

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.pre_norm = cfg.norm_position == "pre"
        self.attention = MultiHeadAttention(cfg.hidden_size, cfg.num_heads, cfg.attention, cfg.attention_eps,
                                            causal=cfg.causal)
        self.norm1 = make_norm(cfg)
        self.ffn = FeedForward(cfg)
        self.norm2 = make_norm(cfg)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.attention(self.norm1(x), key_mask)
            return x + self.ffn(self.norm2(x))
        x = self.norm1(x + self.attention(x, key_mask))
        return self.norm2(x + self.ffn(x))


class Encoder(nn.Module):
    """forward(inputs, attention_mask[, token_type_ids]) -> dict of outputs.

    inputs: input_ids int64 (B, N) when vocab_size > 0, else inputs_embeds float (B, N, F).
    attention_mask: int (B, N), 1 = keep, 0 = padding.
    Returns last_hidden_state (B, N, F) and, when pooling is set, sentence_embedding (B, F).
    """

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.config = cfg
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size) if cfg.takes_ids else None
        self.types = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size) if cfg.type_vocab_size else None
        self.positions = Positions(cfg)
        # post-norm normalises the embeddings (as BERT); pre-norm normalises the final output
        self.norm = make_norm(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))

    def forward(self, inputs, attention_mask, token_type_ids=None):
        cfg = self.config
        x = self.tokens(inputs) if self.tokens is not None else inputs  # (B, N, F)
        if self.types is not None:
            types = token_type_ids if token_type_ids is not None else torch.zeros_like(inputs)
            x = x + self.types(types)
        x = self.positions(x)
        if cfg.norm_position == "post":
            x = self.norm(x)
        key_mask = attention_mask != 0  # (B, N) bool
        for block in self.blocks:
            x = block(x, key_mask)
        if cfg.norm_position == "pre":
            x = self.norm(x)
        outputs = {"last_hidden_state": x}
        if cfg.pooling != "none":
            outputs["sentence_embedding"] = pool(x, key_mask, cfg.pooling, cfg.normalize_embeddings)
        return outputs


def pool(x: torch.Tensor, key_mask: torch.Tensor, kind: str, normalize: bool) -> torch.Tensor:
    """mean: sum_i m_i x_i / max(sum_i m_i, 1) over kept tokens; cls: x_0. Shape (B, F)."""
    if kind == "cls":
        pooled = x[:, 0]
    else:
        weights = key_mask.unsqueeze(-1).to(torch.float32)  # (B, N, 1)
        total = (x.float() * weights).sum(dim=1)
        pooled = (total / weights.sum(dim=1).clamp(min=1.0)).to(x.dtype)
    return F.normalize(pooled, dim=-1) if normalize else pooled


def build_encoder(cfg: EncoderConfig, seed: int | None = 0) -> Encoder:
    """An Encoder in eval mode; with a seed its random weights are reproducible."""
    if seed is None:
        model = Encoder(cfg)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = Encoder(cfg)
    return model.eval()
