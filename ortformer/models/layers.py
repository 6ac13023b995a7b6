"""Norms, the feed-forward network and position encodings."""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from ..config import EncoderConfig


def at_least_f32(x: torch.Tensor) -> torch.Tensor:
    """x in float32, or as it is when already float32 or float64.

    Half-precision models take norms and attention sums in float32; a float64 model (the
    reference the long-sequence tests compare against) must not be rounded down to it.
    A Python-level branch, so float32 graphs carry no Cast nodes.
    """
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


@torch.library.custom_op("ortformer::half_rms_norm", mutates_args=())
def half_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of a float16 x (..., F) with a float16 weight (F,): x / sqrt(mean(x^2) + eps) * weight
    in float32, rounded to float16 once: (..., F) float16 (RMSNorm.forward's arithmetic).

    One opaque op so the exporter can write onnxruntime's float16 SimplifiedLayerNormalization
    (float32 accumulation) instead of Cast -> float32 ops -> Cast (exporter/fused_ops.py)."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


@half_rms_norm.register_fake
def _half_rms_norm_shape(x, weight, eps):
    return torch.empty_like(x)


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in float32 (no mean, no bias).

    Gemma's (1 + w) scaling is folded into the stored weight at import (models/hf/families/gemma.py).
    fused (set by the exporter for float16 graphs with fused ops): a float16 x goes through
    half_rms_norm, the same arithmetic as one float16 SimplifiedLayerNormalization node.
    """
    fused = False

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused and x.dtype == torch.float16:
            return half_rms_norm(x, self.weight, self.eps)
        x32 = at_least_f32(x)
        normed = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (normed * at_least_f32(self.weight)).to(x.dtype)


@torch.library.custom_op("ortformer::half_layer_norm", mutates_args=())
def half_layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm of a float16 x (..., F) with float16 weight and bias (F,): statistics and the
    normalisation in float32, the result rounded to float16 once: (..., F) float16.

    One opaque op so the exporter can write ONNX LayerNormalization on float16 with
    stash_type=1 (float32 statistics) instead of Cast -> float32 LayerNormalization -> Cast
    (exporter/fused_ops.py), which onnxruntime then fuses with the residual Add into
    SkipLayerNormalization."""
    return F.layer_norm(x.float(), (x.shape[-1],), weight.float(), bias.float(), eps).to(x.dtype)


@half_layer_norm.register_fake
def _half_layer_norm_shape(x, weight, bias, eps):
    return torch.empty_like(x)


class LayerNorm32(nn.LayerNorm):
    """LayerNorm whose statistics are taken in float32, also in a float16 model.

    bias=False gives y = (x - mean) / sqrt(var + eps) * weight (ModernBERT's norms).
    fused (set by the exporter for float16 graphs with fused ops): a float16 x goes through
    half_layer_norm, the same arithmetic as one float16 LayerNormalization node.
    """
    fused = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype in (torch.float32, torch.float64):
            return super().forward(x)
        if self.fused and self.bias is not None and x.dtype == torch.float16:
            return half_layer_norm(x, self.weight, self.bias, self.eps)
        bias = None if self.bias is None else self.bias.float()
        return F.layer_norm(x.float(), self.normalized_shape, self.weight.float(), bias, self.eps).to(x.dtype)


def make_norm(cfg: EncoderConfig, size: int | None = None) -> nn.Module:
    """The config's norm over ``size`` features (default hidden_size)."""
    size = size or cfg.hidden_size
    if cfg.norm == "rmsnorm":
        return RMSNorm(size, cfg.norm_eps)
    return LayerNorm32(size, eps=cfg.norm_eps, bias=cfg.bias)


def make_activation(name: str) -> nn.Module:
    """The config's activation as a module; every name in config.ACTIVATIONS and
    config.DENSE_ACTIVATIONS has one."""
    return {
        "relu": nn.ReLU,
        "gelu": nn.GELU,  # erf form
        "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
        "silu": nn.SiLU,
        "tanh": nn.Tanh,
        "sigmoid": nn.Sigmoid,
        "identity": nn.Identity,
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


@functools.lru_cache(maxsize=None)
def _sinusoid_frequencies(size: int) -> tuple[float, ...]:
    """10000^(-2i/F) for i < F / 2, in Python's float64; a constant to the exporter, not ops."""
    return tuple(math.exp(-math.log(10000.0) * i / size) for i in range(0, size, 2))


def sinusoids(position: torch.Tensor, size: int) -> torch.Tensor:
    """PE[p, 2i] = sin(p / 10000^(2i/F)), PE[p, 2i+1] = cos(same), float32 (N,) -> (N, F).

    Computed from the positions themselves, in the graph: a stored (P, F) table would put
    P x F floats into the model file (1 GiB for a million positions).

    The frequencies 10000^(-2i/F) are taken in float64 and rounded once to float32, a constant
    of the graph, so torch and onnxruntime hold the same bits: their float32 Exp differ in the last place for about
    one frequency in ten, and an ulp of a frequency near 1 times position 131,072 turns
    the angle by 0.016 rad (7.6e-3 in the output of a 4-layer model). The angle itself is
    then one float32 product, rounded alike by both."""
    inv_freq = torch.tensor(_sinusoid_frequencies(size), dtype=torch.float32, device=position.device)  # (F / 2,)
    angle = position.to(torch.float32)[:, None] * inv_freq  # (N, F / 2)
    return torch.stack([angle.sin(), angle.cos()], dim=-1).reshape(position.shape[0], size)


def sinusoid_table(max_positions: int, size: int) -> torch.Tensor:
    """The sinusoids of positions 0 .. P - 1: (P, F)."""
    return sinusoids(torch.arange(max_positions), size)


class Positions(nn.Module):
    """Adds a position vector per token: a learned table, fixed sinusoids, or nothing.

    Row of token j in a learned table (offset = position_offset):
      position_ids="index": offset + start + j
      position_ids="kept":  offset + (number of kept tokens before j), i.e.
                            offset + cumsum(attention_mask)_j - 1 for kept tokens
    "kept" is RoBERTa's create_position_ids_from_input_ids computed from the attention
    mask instead of from input_ids != padding_idx: the same rows whenever padding is
    masked, and left padding then leaves kept tokens' positions unchanged. Padded
    tokens get a valid row too (their outputs are never read).

    start: the position of the first token (a chunk of a longer sequence starts later);
    an int, or an int64 tensor of shape () for a chunk graph. Sinusoids are computed from
    the positions in the graph, so nothing stored grows with max_positions.
    """

    def __init__(self, cfg: EncoderConfig, size: int | None = None):
        super().__init__()
        self.kind = cfg.positions
        self.size = size or cfg.hidden_size
        self.offset = cfg.position_offset
        self.kept = cfg.position_ids == "kept"
        if self.kind == "learned":
            self.table = nn.Embedding(cfg.max_positions, self.size)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None,
                start: int | torch.Tensor = 0) -> torch.Tensor:
        n = x.shape[1]
        if self.kind not in ("learned", "sinusoidal"):  # none, or rotary / alibi (inside attention)
            return x
        if self.kind == "learned" and self.kept:
            kept = (attention_mask != 0).to(torch.int64)  # (B, N)
            rows = (kept.cumsum(dim=1) - 1).clamp(min=0) + self.offset  # (B, N)
            return x + self.table(rows).to(x.dtype)  # (B, N, F)
        if self.kind == "learned":
            if isinstance(start, torch.Tensor):
                return x + self.table(torch.arange(n, device=x.device) + start + self.offset).to(x.dtype)
            first = self.offset + start
            return x + self.table.weight[first:first + n].to(x.dtype)  # (N, F) broadcast over batch
        index = torch.arange(n, device=x.device) + start
        return x + sinusoids(index, self.size).to(x.dtype)


def relative_position_bucket(relative_position: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """T5/MPNet bidirectional buckets of relative_position = j - i (key minus query).

    num_buckets // 2 buckets per direction (keys after the query take the upper half);
    in each, distances below half of them are exact and the rest grow logarithmically
    up to max_distance, beyond which they share the last bucket. The same arithmetic as
    transformers' MPNet ``relative_position_bucket``, so the buckets are bit-identical.
    """
    ret = 0
    n = -relative_position
    num_buckets //= 2
    ret = ret + (n < 0).to(torch.long) * num_buckets
    n = torch.abs(n)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    val_if_large = max_exact + (
        torch.log(n.float() / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).to(torch.long)
    val_if_large = torch.min(val_if_large, torch.full_like(val_if_large, num_buckets - 1))
    return ret + torch.where(is_small, n, val_if_large)


class RelativePositionBias(nn.Module):
    """bias[0, h, i, j] = table[bucket(j - i), h]: shape (1, H, N, N), shared by every layer.

    The bucket of a distance is looked up in a (max_distance + 1) table computed once
    here by relative_position_bucket, instead of running its log in the graph: onnxruntime's
    Log and torch's may differ by an ulp exactly where the float lands on a bucket
    boundary (16, 32, 64 with MPNet's 32/128), which would move a token to another bucket.
    Distances beyond max_distance all share the last bucket, so the table is exact.
    """

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        relative = cfg.relative_attention
        self.half = relative.buckets // 2
        self.max_distance = relative.max_distance
        distance = torch.arange(self.max_distance + 1)
        # a distance d with the key before the query: no direction offset
        buckets = relative_position_bucket(-distance, relative.buckets, self.max_distance)
        self.register_buffer("bucket_of_distance", buckets, persistent=False)  # (max_distance + 1,)
        self.table = nn.Embedding(relative.buckets, cfg.num_heads)

    def forward(self, n: int, device: torch.device | None = None) -> torch.Tensor:
        position = torch.arange(n, device=self.table.weight.device)
        query_minus_key = position[:, None] - position[None, :]  # (N, N): i - j
        buckets = (query_minus_key < 0).to(torch.long) * self.half \
            + self.bucket_of_distance[query_minus_key.abs().clamp(max=self.max_distance)]
        return self.table(buckets).permute(2, 0, 1).unsqueeze(0)  # (1, H, N, N)


def alibi_slopes(heads: int) -> list[float]:
    """ALiBi's head slopes (Press et al. 2022): for H a power of 2, m_h = s^(h + 1) with
    s = 2^(-8 / H); otherwise the slopes of the power of 2 below H, then every other slope
    of twice that power, as many as are missing (JinaBERT and MosaicBERT use these)."""
    def powers_of(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start ** h for h in range(n)]  # as s * s^h, the doubles those models round

    if math.log2(heads).is_integer():
        return powers_of(heads)
    below = 2 ** math.floor(math.log2(heads))
    return powers_of(below) + alibi_slopes(2 * below)[0::2][: heads - below]


class AlibiBias(nn.Module):
    """bias[0, h, i, j] = -m_h |i - j|: shape (1, H, N, N), shared by every layer (symmetric
    ALiBi, JinaBERT's), the same float32 products JinaBERT computes. It depends on i - j only,
    so left padding, which shifts every kept token alike, leaves it unchanged between them."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        # kept as Python floats, not a buffer: a half-precision copy (.half()) would round a buffer
        self.negative_slopes = [-m for m in alibi_slopes(cfg.num_heads)]

    def forward(self, n: int, device: torch.device | None = None) -> torch.Tensor:
        slopes = torch.tensor(self.negative_slopes, dtype=torch.float32, device=device)  # (H,)
        position = torch.arange(n, device=device)
        distance = (position[None, :] - position[:, None]).abs().to(torch.float32)  # (N, N): |i - j|
        return (slopes[:, None, None] * distance).unsqueeze(0)  # (1, H, N, N), float32


def log_bucket(distance: torch.Tensor, buckets: int, max_distance: int) -> torch.Tensor:
    """DeBERTa's log bucket of signed distances d = i - j (int64), m = buckets // 2:
    d itself when |d| <= m, else sign(d) (m + ceil(log(|d| / m) / log((max_distance - 1) / m) (m - 1))).

    Computed in float32 with the same operations transformers uses, so a distance that
    lands on a bucket boundary falls on the same side."""
    mid = buckets // 2
    sign = torch.sign(distance)
    size = torch.where((distance < mid) & (distance > -mid), torch.tensor(mid - 1), distance.abs())
    log_pos = torch.ceil(torch.log(size / mid) / torch.log(torch.tensor((max_distance - 1) / mid)) * (mid - 1)) + mid
    return torch.where(size <= mid, distance.to(log_pos.dtype), log_pos * sign).to(torch.int64)


class DisentangledPositions(nn.Module):
    """The relative table of disentangled attention (DeBERTa), shared by every layer.

    forward(n) -> (R, I): R = norm(table) (2S, F) (the table as stored without
    disentangled.norm); I (N, N) int64 with I[i, j] = clamp(bucket(i - j) + S, 0, 2S - 1)
    (bucket(d) = d without log buckets, disentangled.max_distance = 0), looked up in a
    bucket table over every distance the model takes (|i - j| < max_positions), computed
    once here: no Log runs in the graph.
    """

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        group = cfg.disentangled
        self.span, self.longest = group.buckets, cfg.max_positions
        distance = torch.arange(-(self.longest - 1), self.longest)  # (2 max_positions - 1,)
        buckets = log_bucket(distance, group.buckets, group.max_distance) if group.max_distance else distance
        index = (buckets + self.span).clamp(0, 2 * self.span - 1)
        self.register_buffer("index_of_distance", index, persistent=False)
        self.table = nn.Embedding(2 * group.buckets, cfg.hidden_size)
        self.norm = make_norm(cfg) if group.norm else nn.Identity()

    def forward(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        position = torch.arange(n, device=self.table.weight.device)
        distance = position[:, None] - position[None, :] + (self.longest - 1)  # (N, N): i - j, shifted to >= 0
        return self.norm(self.table.weight), self.index_of_distance[distance]


class Rotary(nn.Module):
    """Rotary position tables, rotate-half convention (transformers' LLaMA/GPT-NeoX/ModernBERT).

    Dimension pairs (d, d + D/2) of a head turn by the angle p * scale * theta^(-2d/D) at
    position p = the sequence index. forward(n) -> (cos, sin), each (N, D): the angles for d < D/2,
    repeated for the second half. Computed from the position index in the graph, so
    nothing stored grows with max_positions.
    """

    def __init__(self, head_size: int, theta: float, scale: float = 1.0):
        super().__init__()
        self.head_size, self.theta, self.scale = head_size, theta, scale

    def frequencies(self, device: torch.device | None = None) -> torch.Tensor:
        """theta^(-2i/D), (D/2,) float32: the same arithmetic as transformers' default rope init."""
        d = self.head_size
        return 1.0 / (self.theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d))

    def forward(self, n: int, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        # float32 always; not a buffer, which model.half() would round (at position 512 an angle
        # moves by ~0.25 rad)
        inv_freq = self.frequencies(device)
        if self.scale != 1.0:  # as the scaled inverse frequencies of GTE's NTK rope (same rounding)
            inv_freq = inv_freq * self.scale
        position = torch.arange(n, device=device, dtype=torch.float32)
        angles = position[:, None] * inv_freq[None, :]  # (N, D/2)
        angles = torch.cat([angles, angles], dim=-1)  # (N, D)
        return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """R_p x = x * cos + rotate_half(x) * sin, rotate_half([x1, x2]) = [-x2, x1].

    x (..., N, D) with cos, sin (N, D); or x (B, N, H, D) with cos, sin (N, 1, D).
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos.to(x.dtype) + torch.cat([-x2, x1], dim=-1) * sin.to(x.dtype)


def window_bias(n: int, window: int, like: torch.Tensor) -> torch.Tensor:
    """0 where |i - j| <= window // 2, the lowest float elsewhere: (1, 1, N, N) in like's dtype.

    ModernBERT's sliding window (local_attention // 2 on each side), built from the
    position index; added to the scores of local layers.
    """
    position = torch.arange(n, device=like.device)
    inside = (position[:, None] - position[None, :]).abs() <= window // 2  # (N, N)
    zeros = torch.zeros(n, n, dtype=like.dtype, device=like.device)
    return zeros.masked_fill(~inside, torch.finfo(like.dtype).min)[None, None]
