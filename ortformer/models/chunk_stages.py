"""An encoder cut into per-chunk stages for long sequences and streaming (torch side).

Non-causal linear-family models run in two passes per layer (runtime/chunked.py):
  embed:  x_c = embeddings of chunk c, positions offset by the chunk's start
  stats:  T_c = fk_c^T [v_c, 1] (efficient: (m_c, T_c)) from the layer's input chunk
  apply:  x_c <- block(x_c) with attention read from the summed T (efficient: the context)
  final:  the last norm of a pre-norm model
Causal models have one step stage: the whole encoder on one chunk, with T per layer as state.

Every stage takes its weights as graph inputs (``torch.func.functional_call``), so one
session per stage serves every layer and the weights live once, in the main graph.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call

from . import linear_forms
from .encoder import Block, Encoder

SUPPORTED_POOLING = ("none", "mean", "cls")


def chunkable(cfg) -> str | None:
    """None when the config runs chunk by chunk; else the reason it cannot."""
    if cfg.attention == "softmax":
        return "softmax attention needs every key for every query (O(N^2)): only the linear family runs in chunks"
    checks = [
        (cfg.positions in ("learned", "sinusoidal", "none"), f"positions={cfg.positions!r}"),
        (cfg.position_ids == "index" and not cfg.position_offset, "position ids other than the plain index"),
        (not cfg.embedding_size and not cfg.embedding_norm, "a separate embedding width or embedding norm"),
        (not cfg.ffn_gated and cfg.bias, "a gated or bias-free feed-forward network"),
        (cfg.pooling in SUPPORTED_POOLING, f"pooling={cfg.pooling!r}"),
        (not cfg.sentence_dense, "a Dense head on the sentence embedding"),
        (not cfg.classifier, "a classifier head"),
        (not cfg.convolution, "a convolution after the first layer"),
        (not cfg.attention_head_size, "an attention_head_size other than hidden_size / num_heads"),
        (cfg.token_dropout_id < 0, "token dropout (a scale from the whole sequence's masked share)"),
        (not cfg.qk_norm, "qk_norm"),
        (not cfg.grouped_kv, "num_kv_heads (grouped-query attention)"),
        (not cfg.sandwich_norm, "sandwich norms"),
        (not cfg.experts and not cfg.short_conv, "mixtures of experts or short convolutions"),
        (not cfg.adapters, "task adapters"),
        (not cfg.truncate_dim, "truncate_dim"),
        (not cfg.token_dense and not cfg.token_weights, "per-token heads (token_embeddings, sparse)"),
    ]
    for ok, what in checks:
        if not ok:
            return f"the chunked stages do not implement {what}"
    return None


def _heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    b, n, f = x.shape  # (B, N, F) -> (B, H, N, D)
    return x.view(b, n, num_heads, f // num_heads).transpose(1, 2)


def _qkv(block: Block, x: torch.Tensor):
    h = block.norm1(x) if block.pre_norm else x
    mha = block.attention
    f = x.shape[-1]
    qkv = mha.qkv(h)
    return (_heads(qkv[..., i * f:(i + 1) * f], mha.num_heads) for i in range(3))


def _finish(block: Block, x: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
    """Output projection, residuals, norms and FFN around attention's (B, H, N, D) result."""
    b, h, n, d = heads.shape
    attn = block.attention.out(heads.transpose(1, 2).reshape(b, n, h * d).to(x.dtype))
    if block.pre_norm:
        x = x + attn
        return x + block.ffn(block.norm2(x))
    x = block.norm1(x + attn)
    return block.norm2(x + block.ffn(x))


def embed(encoder: Encoder, inputs, types, start) -> torch.Tensor:
    """The encoder's embedding stage for tokens start .. start + C - 1: (B, C, F)."""
    x = encoder.tokens(inputs) if encoder.tokens is not None else inputs
    if encoder.types is not None:
        x = x + encoder.types(types)
    x = encoder.positions(x, start=start)
    return encoder.norm(x) if encoder.config.norm_position == "post" else x


def block_stats(block: Block, x: torch.Tensor, mask: torch.Tensor):
    """This chunk's share of the layer's sums: T (B, H, Dk, D + 1), or (m, T) for efficient."""
    _, k, v = _qkv(block, x)
    keep = mask[:, None, :, None].to(torch.float32)  # (B, 1, C, 1)
    v1 = linear_forms.with_ones(v)
    if block.attention.kind == "efficient":
        return linear_forms.efficient_sums(k, v1, keep)
    _, fk = linear_forms.features(block.attention.kind, k, k, keep)
    return linear_forms.sums(fk, v1)


def block_apply(block: Block, x: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """The layer on one chunk, attention read from the whole sequence's T (efficient: context)."""
    q, k, _ = _qkv(block, x)
    mha = block.attention
    if mha.kind == "efficient":
        heads = linear_forms.efficient_read(q, total)
    else:
        ones = torch.ones_like(k[:, :1, :, :1], dtype=torch.float32)  # queries need no mask
        fq, _ = linear_forms.features(mha.kind, q, k, ones)
        heads = linear_forms.read_out(fq, total, mha.eps)
    return _finish(block, x, heads)


def block_step(block: Block, x: torch.Tensor, mask: torch.Tensor, state: torch.Tensor):
    """A causal layer on one chunk given T of every earlier token: (x, T after the chunk)."""
    q, k, v = _qkv(block, x)
    keep = mask[:, None, :, None].to(torch.float32)
    fq, fk = linear_forms.features(block.attention.kind, q, k, keep)
    heads, state = linear_forms.causal(fq, fk, linear_forms.with_ones(v), state, block.attention.eps)
    return _finish(block, x, heads), state


class _Flow(nn.Module):
    """Holds the template module so functional_call can swap its parameters for inputs."""

    def __init__(self, stage: str, template: nn.Module):
        super().__init__()
        self.stage = stage
        self.template = template

    def forward(self, *args):
        t = self.template
        if self.stage in ("embed", "step") and t.types is None:
            args = args[:1] + (None,) + args[1:] if self.stage == "embed" else args[:2] + (None,) + args[2:]
        if self.stage == "embed":
            return embed(t, *args)
        if self.stage == "stats":
            return block_stats(t, *args)
        if self.stage == "apply":
            return block_apply(t, *args)
        if self.stage == "final":
            return t.norm(args[0])
        return _step(t, *args)


def _step(encoder: Encoder, inputs, mask, types, start, *states):
    x = embed(encoder, inputs, types, start)
    new_states = []
    for block, state in zip(encoder.blocks, states):
        x, state = block_step(block, x, mask, state)
        new_states.append(state)
    if encoder.config.norm_position == "pre":
        x = encoder.norm(x)
    return (x, *new_states)


class Stage(nn.Module):
    """forward(*tensors, *weights): one stage with the named weights as trailing inputs.

    The template's own parameters are not registered here (object.__setattr__), so an
    exported graph holds no weights: each one it reads must be among `weight_names`.
    """

    def __init__(self, stage: str, template: nn.Module, weight_names: list[str], n_tensors: int):
        super().__init__()
        object.__setattr__(self, "flow", _Flow(stage, template))
        self.weight_names = list(weight_names)
        self.n_tensors = n_tensors

    def forward(self, *args):
        tensors, weights = args[: self.n_tensors], args[self.n_tensors:]
        params = {f"template.{name}": w for name, w in zip(self.weight_names, weights)}
        return functional_call(self.flow, params, tuple(tensors), strict=False)


def stage_weights(stage: str, template: nn.Module) -> list[str]:
    """Names (in `template`) of the parameters a stage reads; all of them but stats' few."""
    names = [name for name, _ in template.named_parameters()]
    if stage == "stats":
        wanted = ("attention.qkv.",) + (("norm1.",) if template.pre_norm else ())
        names = [n for n in names if n.startswith(wanted)]
    if stage == "final":
        names = [n for n in names if n.startswith("norm.")]
    if stage == "embed":
        names = [n for n in names if not n.startswith("blocks.")
                 and (template.config.norm_position == "post" or not n.startswith("norm."))]
    return names
