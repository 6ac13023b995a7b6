"""Attention kernels and multi-head attention.

Every kernel maps ``(q, k, v, key_mask, eps) -> out`` with q, k, v of shape
(B, H, N, D) and key_mask a bool (B, N), True = keep. All of them read as the
row-wise weighted average ``A(X_i) = sum_j sim(Q_i, K_j) V_j / sum_j sim(Q_i, K_j)``
with a different similarity; padded keys never contribute, and a row whose keys
are all padding gives zeros, never NaN.

Sequence reductions run in float32 even in a float16 model (``_f32``).

Rotary positions (``rotary=(cos, sin)``, each (N, D); R_i rotates a head vector by
position i, see layers.rotate): softmax rotates q and k. The linear family rotates its
feature-mapped queries and keys in the numerator only, as RoFormer does (section 3.3):
the denominator keeps non-negative weights, and the numerator depends on i - j alone.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..core.errors import ConfigError
from . import linear_forms
from .layers import RMSNorm, at_least_f32, rotate

Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]


def scaled_scores(q: torch.Tensor, k: torch.Tensor, softcap: float = 0.0) -> torch.Tensor:
    """s = Q K^T / sqrt(D) in float32 (B, H, N, N); with softcap c > 0, c tanh(s / c) (Gemma 2's
    attention logit soft-capping: scores bounded to (-c, c) before any bias or mask)."""
    scores = at_least_f32(q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    return torch.tanh(scores / softcap) * softcap if softcap else scores


def softmax_attention(q, k, v, key_mask, eps, scores_bias=None, rotary=None, softcap=0.0):
    """softmax(cap((R Q)(R K)^T / sqrt(D)) + scores_bias + mask) V.  O(N^2) time and memory.

    R: the rotary rotation by position (identity without rotary); cap: scaled_scores' soft-capping
    when softcap > 0, else the identity.
    mask is 0 for kept keys and the dtype's lowest value for padded ones;
    rows with no kept key are set to zero afterwards.
    scores_bias: optional additive (1 or B, 1 or H, N, N) term on the scaled scores: a
    relative position bias, a local window (0 inside, the dtype's lowest value outside),
    or their sum. Padded keys overwrite it (masked_fill, not add: lowest + lowest = -inf).
    """
    if rotary is not None:
        q, k = rotate(q, *rotary), rotate(k, *rotary)
    if scores_bias is None and softcap:
        scores_bias = torch.zeros((1, 1, 1, 1), dtype=torch.float32, device=q.device)
    if scores_bias is None:
        bias = torch.zeros(key_mask.shape, dtype=q.dtype, device=q.device)
        bias = bias.masked_fill(~key_mask, torch.finfo(q.dtype).min)[:, None, None, :]  # (B, 1, 1, N)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)  # (B, H, N, D)
    else:
        # written out rather than SDPA: the exporter's SDPA decomposition with a (1, H, N, N)
        # mask yields strides that its later reshape-as-view rejects
        bias = at_least_f32(scores_bias).masked_fill(~key_mask[:, None, None, :], torch.finfo(torch.float32).min)
        scores = scaled_scores(q, k, softcap) + bias  # (B, H, N, N)
        out = scores.softmax(dim=-1).to(q.dtype) @ v  # (B, H, N, D)
    return out * key_mask.any(dim=1).to(out.dtype)[:, None, None, None]  # finite out: 0 where nothing is kept


def linear_attention(q, k, v, key_mask, eps, rotary=None):
    """phi(Q) (phi(K)^T V) / (phi(Q) sum_j phi(K_j)^T + eps), phi = elu + 1.

    Katharopoulos et al. 2020. Padded keys are zeroed after phi. O(N D^2).
    With rotary (RoFormer): out_i = (R_i phi(q_i)) S / (phi(q_i) . z + eps), where
    S = sum_j (R_j phi(k_j))^T v_j  (B, H, D, D) and z = sum_j phi(k_j)  (B, H, 1, D).
    """
    keep = key_mask[:, None, :, None].to(q.dtype)  # (B, 1, N, 1)
    phi_q = at_least_f32(F.elu(q) + 1)
    phi_k = at_least_f32(F.elu(k) + 1) * keep
    k_sum = phi_k.sum(dim=2, keepdim=True)  # (B, H, 1, D)
    if rotary is not None:
        kv = rotate(phi_k, *rotary).transpose(-2, -1) @ at_least_f32(v)  # (B, H, D, D)
        numerator = rotate(phi_q, *rotary) @ kv  # (B, H, N, D)
    else:
        kv = phi_k.transpose(-2, -1) @ at_least_f32(v)  # (B, H, D, D)
        numerator = phi_q @ kv  # (B, H, N, D)
    denominator = (phi_q * k_sum).sum(dim=-1, keepdim=True) + eps  # (B, H, N, 1)
    return (numerator / denominator).to(q.dtype)


def efficient_attention(q, k, v, key_mask, eps, rotary=None):
    """softmax_D(Q) (softmax_N(K)^T V).  Shen et al., "Efficient Attention".

    softmax over features for each query, over kept positions for each key
    feature; padded keys get zero weight. O(N D^2).
    With rotary, the feature-mapped rows turn as in the linear kernel:
    out_i = (R_i softmax_D(q_i)) sum_j (R_j softmax_N(K)_j)^T v_j. Unrotated, the weights
    of row i sum to 1, which is this kernel's (implicit) denominator; it stays 1.
    """
    keep = key_mask[:, None, :, None]  # (B, 1, N, 1)
    q_soft = at_least_f32(q).softmax(dim=-1)
    k_scores = at_least_f32(k).masked_fill(~keep, torch.finfo(torch.float32).min)
    k_soft = k_scores.softmax(dim=2) * keep  # zero when every key is padding
    if rotary is not None:
        q_soft, k_soft = rotate(q_soft, *rotary), rotate(k_soft, *rotary)
    context = k_soft.transpose(-2, -1) @ at_least_f32(v)  # (B, H, D, D)
    return (q_soft @ context).to(q.dtype)


def cosine_attention(q, k, v, key_mask, eps, rotary=None):
    """sum_j (1 + q̂·k̂_j) v_j / sum_j (1 + q̂·k̂_j) with l2-normalised q̂, k̂.

    The similarity is >= 0, and factors as
    (sum_j v_j + q̂ (K̂^T V)) / (n_kept + q̂ sum_j k̂_j), so it costs O(N D^2).
    With rotary, the q̂·k̂ term becomes (R_i q̂_i)·(R_j k̂_j), in numerator and denominator
    alike: a rotation keeps unit length, so 1 + cos stays >= 0 and the output stays a
    weighted average, unlike the linear kernel's phi products.
    """
    keep = key_mask[:, None, :, None].to(torch.float32)  # (B, 1, N, 1)
    q_hat = F.normalize(at_least_f32(q), dim=-1)
    k_hat = F.normalize(at_least_f32(k), dim=-1) * keep
    if rotary is not None:
        q_hat, k_hat = rotate(q_hat, *rotary), rotate(k_hat, *rotary)
    v_kept = at_least_f32(v) * keep
    kv = k_hat.transpose(-2, -1) @ v_kept  # (B, H, D, D)
    numerator = v_kept.sum(dim=2, keepdim=True) + q_hat @ kv  # (B, H, N, D)
    n_kept = keep.sum(dim=2, keepdim=True)  # (B, 1, 1, 1)
    denominator = n_kept + q_hat @ k_hat.sum(dim=2).unsqueeze(-1) + eps  # (B, H, N, 1)
    return (numerator / denominator).to(q.dtype)


@torch.library.custom_op("ortformer::masked_softmax_attention", mutates_args=())
def masked_softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor,
                             num_heads: int) -> torch.Tensor:
    """softmax_attention on (B, N, F) tensors, heads split inside: (B, N, F) -> (B, N, F).

    One opaque op, so the exporter can emit onnxruntime's fused MultiHeadAttention
    kernel for it (see exporter/fused_ops.py) instead of a chain of MatMul/Softmax.
    """
    b, n, f = q.shape

    def heads(x):  # (B, N, F) -> (B, H, N, D)
        return x.reshape(b, n, num_heads, f // num_heads).transpose(1, 2)

    out = softmax_attention(heads(q), heads(k), heads(v), key_mask != 0, 0.0)
    return out.transpose(1, 2).reshape(b, n, f)


@masked_softmax_attention.register_fake
def _masked_softmax_attention_shape(q, k, v, key_mask, num_heads):
    return torch.empty_like(q)


@torch.library.custom_op("ortformer::projected_softmax_attention", mutates_args=())
def projected_softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
                                key_mask: torch.Tensor, num_heads: int) -> torch.Tensor:
    """masked_softmax_attention of q + b_q, k + b_k, v + b_v with bias = [b_q | b_k | b_v] (3F,):
    (B, N, F) -> (B, N, F).

    Exported as MultiHeadAttention's bias input (exporter/fused_ops.py): the kernel adds the
    projection's bias while it splits the heads, instead of an Add node over (B, N, 3F)."""
    b_q, b_k, b_v = bias.split(q.shape[-1])
    return masked_softmax_attention(q + b_q, k + b_k, v + b_v, key_mask, num_heads)


@projected_softmax_attention.register_fake
def _projected_softmax_attention_shape(q, k, v, bias, key_mask, num_heads):
    return torch.empty_like(q)


@torch.library.custom_op("ortformer::biased_softmax_attention", mutates_args=())
def biased_softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor,
                             scores_bias: torch.Tensor, num_heads: int) -> torch.Tensor:
    """masked_softmax_attention with an additive (1 or B, 1 or H, N, N) scores_bias: (B, N, F) -> (B, N, F).

    Exported as MultiHeadAttention's attention_bias input, which onnxruntime
    broadcasts over batch and heads: a (1, H, N, N) relative bias or a (1, 1, N, N)
    window is never expanded to (B, H, N, N).
    """
    b, n, f = q.shape

    def heads(x):  # (B, N, F) -> (B, H, N, D)
        return x.reshape(b, n, num_heads, f // num_heads).transpose(1, 2)

    out = softmax_attention(heads(q), heads(k), heads(v), key_mask != 0, 0.0, scores_bias)
    return out.transpose(1, 2).reshape(b, n, f)


@biased_softmax_attention.register_fake
def _biased_softmax_attention_shape(q, k, v, key_mask, scores_bias, num_heads):
    return torch.empty_like(q)


@torch.library.custom_op("ortformer::rotary_heads", mutates_args=())
def rotary_heads(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Rotate every head of x (B, N, F) by position: (B, N, F), with cos, sin (N, D).

    One opaque op so the exporter can emit onnxruntime's RotaryEmbedding kernel (measured
    about 4x faster than the Split/Neg/Concat/Mul/Add chain on (8, 256, 768)).
    """
    b, n, f = x.shape
    return rotate(x.reshape(b, n, num_heads, f // num_heads), cos[:, None, :], sin[:, None, :]).reshape(b, n, f)


@rotary_heads.register_fake
def _rotary_heads_shape(x, cos, sin, num_heads):
    return torch.empty_like(x)


KERNELS: dict[str, Kernel] = {
    "softmax": softmax_attention,
    "linear": linear_attention,
    "efficient": efficient_attention,
    "cosine": cosine_attention,
}


def causal_softmax_attention(q, k, v, key_mask, eps, softcap=0.0, scores_bias=None):
    """softmax(cap(Q K^T / sqrt(D)) + bias + mask + causal) V: query i sees kept keys j <= i (cap:
    scaled_scores' soft-capping when softcap > 0; scores_bias (1|B, 1|H, N, N): a sliding window).

    An additive bias (B, 1, N, N); a query with no kept key at or before it averages
    what the bias leaves (finite), and a fully padded row is zero, as for softmax_attention.
    """
    n = q.shape[2]
    later = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)  # (N, N): key after query
    if softcap or scores_bias is not None:
        # SDPA has no cap: softmax_attention's written-out scores, later keys blocked in the bias
        low = torch.finfo(torch.float32).min
        bias = (torch.zeros(1, 1, n, n, dtype=torch.float32, device=q.device) if scores_bias is None
                else scores_bias.to(torch.float32))
        return softmax_attention(q, k, v, key_mask, eps, bias.masked_fill(later, low), softcap=softcap)
    blocked = later[None, None] | ~key_mask[:, None, None, :]  # (B, 1, N, N)
    bias = torch.zeros(blocked.shape, dtype=q.dtype, device=q.device).masked_fill(blocked, torch.finfo(q.dtype).min)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)  # (B, H, N, D)
    return out * key_mask.any(dim=1).to(out.dtype)[:, None, None, None]


def _causal_factored(kind: str) -> Kernel:
    def kernel(q, k, v, key_mask, eps):
        keep = key_mask[:, None, :, None].to(torch.float32)  # (B, 1, N, 1)
        fq, fk = linear_forms.features(kind, q, k, keep)
        dk, dv = linear_forms.state_width(kind, q.shape[-1])
        state = fq.new_zeros(q.shape[0], q.shape[1], dk, dv)  # (B, H, Dk, D + 1)
        out, _ = linear_forms.causal(fq, fk, linear_forms.with_ones(v), state, eps)
        return out.to(q.dtype)

    kernel.__name__ = f"causal_{kind}_attention"
    kernel.__doc__ = (f"{kind} attention over keys j <= i: prefix sums of fk^T [v, 1] "
                      "(models/linear_forms.py: causal), O(N) memory.")
    return kernel


# causal versions: prefix sums for the factored kernels, a triangular bias for softmax.
# efficient has none: its softmax over positions would need each query's own running
# max over keys j <= i, which the factored (D, D) context cannot carry (config/__init__.py refuses it)
CAUSAL_KERNELS: dict[str, Kernel] = {
    "softmax": causal_softmax_attention,
    "linear": _causal_factored("linear"),
    "cosine": _causal_factored("cosine"),
}


def get_kernel(name: str, causal: bool = False) -> Kernel:
    table = CAUSAL_KERNELS if causal else KERNELS
    try:
        return table[name]
    except KeyError:
        if causal and name in KERNELS:
            raise ConfigError(f"attention={name!r} has no causal form; causal=True works with {', '.join(table)}") from None
        raise ConfigError(f"attention={name!r} is not valid; choose one of {', '.join(KERNELS)}") from None


class Projection(nn.Linear):
    """nn.Linear whose bias can be left out of one call (with_bias=False: x W^T), so the attention
    kernel can add it (projected_softmax_attention); called as the module, so the exported MatMul keeps
    the module's name (exporter/int8.module_of)."""

    def forward(self, x: torch.Tensor, with_bias: bool = True) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias if with_bias else None)


class MultiHeadAttention(nn.Module):
    """One fused QKV projection, a kernel per head, and an output projection."""

    def __init__(self, hidden_size: int, num_heads: int, kernel: str, eps: float, bias: bool = True,
                 causal: bool = False, head_size: int | None = None, position_projections: bool = False,
                 qk_norm_eps: float | None = None, kv_heads: int | None = None, softcap: float = 0.0):
        super().__init__()
        self.softcap = softcap  # Gemma 2's attention logit soft-capping (softmax only; 0 = none)
        self.num_heads = num_heads
        self.kv_heads = kv_heads or num_heads  # K / V heads, each shared by num_heads / kv_heads query heads
        self.eps = eps
        self.kind = kernel
        self.causal = causal
        self.kernel = get_kernel(kernel, causal)
        if softcap:  # the config allows it with softmax only
            self.kernel = functools.partial(self.kernel, softcap=softcap)
        # softmax runs as one opaque op that exports to a fused ONNX Runtime kernel;
        # the exporter turns this off for graphs that must use standard ONNX ops only.
        # causal softmax runs unfused, through an additive triangular bias, and so does a capped
        # one (the fused kernel has no cap)
        self.can_fuse = kernel == "softmax" and not causal and not softcap
        self.fused = self.can_fuse
        # A = H x D, the width attention works in: hidden_size unless head_size says otherwise (T5's d_kv)
        self.inner = num_heads * head_size if head_size else hidden_size
        self.kv_inner = self.kv_heads * (self.inner // num_heads)  # A_kv = H_kv x D
        self.qkv = Projection(hidden_size, self.inner + 2 * self.kv_inner, bias=bias)
        self.out = nn.Linear(self.inner, hidden_size, bias=bias)
        # disentangled attention with projections of its own (DeBERTa v1): rows [position queries; keys]
        self.positions = nn.Linear(hidden_size, 2 * self.inner) if position_projections else None
        # Qwen3's per-head RMSNorm of q and k (qk_norm), one (D,) weight each
        d = self.inner // num_heads
        self.q_norm = RMSNorm(d, qk_norm_eps) if qk_norm_eps is not None else None
        self.k_norm = RMSNorm(d, qk_norm_eps) if qk_norm_eps is not None else None

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor, scores_bias: torch.Tensor | None = None,
                rotary: tuple[torch.Tensor, torch.Tensor] | None = None,
                disentangled: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """x (B, N, F), key_mask bool (B, N); scores_bias (1|B, 1|H, N, N), softmax only;
        rotary (cos, sin), each (N, D); disentangled (R (2S, F), I (N, N)) from
        layers.DisentangledPositions, softmax only (its bias replaces scores_bias).
        Returns (B, N, F); q, k, v and the heads' output are A = H x D wide."""
        b, n, _ = x.shape
        f = self.inner
        if self.fused and isinstance(self.qkv, Projection) and self.qkv.bias is not None \
                and self.kv_heads == self.num_heads and self.q_norm is None and scores_bias is None \
                and rotary is None and disentangled is None:
            # nothing between the projection and the kernel: the kernel adds the bias itself (an
            # adapter-wrapped qkv, models/adapters.py, is not a Projection and keeps its own forward)
            q, k, v = self.qkv(x, with_bias=False).split(f, dim=-1)  # each (B, N, A), no bias yet
            out = projected_softmax_attention(q, k, v, self.qkv.bias, key_mask.to(torch.int32), self.num_heads)
            return self._fused_out(out, key_mask)
        projected = self.qkv(x)  # (B, N, A + 2 A_kv): [Q | K | V]
        if self.kv_heads != self.num_heads:
            projected = self.shared_heads(projected)  # (B, N, 3A)
        if disentangled is not None:  # the config refuses it with rotary, windows or a relative bias
            scores_bias = self.disentangled_bias(*projected.split(f, dim=-1)[:2], *disentangled)  # (B, H, N, N)
        if self.fused:
            q, k, v = projected.split(f, dim=-1)  # each (B, N, A)
            if self.q_norm is not None:  # over each head's D features: (B, N, H, D) views
                q = self.q_norm(q.view(b, n, self.num_heads, -1)).view(b, n, f)
                k = self.k_norm(k.view(b, n, self.num_heads, -1)).view(b, n, f)
            if rotary is not None:  # onnxruntime's RotaryEmbedding before the fused attention
                cos, sin = rotary[0].to(q.dtype), rotary[1].to(q.dtype)
                q, k = rotary_heads(q, cos, sin, self.num_heads), rotary_heads(k, cos, sin, self.num_heads)
            if scores_bias is None:
                out = masked_softmax_attention(q, k, v, key_mask.to(torch.int32), self.num_heads)
            else:
                out = biased_softmax_attention(q, k, v, key_mask.to(torch.int32), scores_bias.to(q.dtype),
                                               self.num_heads)
            return self._fused_out(out, key_mask)
        qkv = projected.view(b, n, 3, self.num_heads, f // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, N, D)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.causal:  # the config refuses causal with a relative bias, and windows or rotary but for softmax
            if rotary is not None:
                q, k = rotate(q, *rotary), rotate(k, *rotary)
            windowed = {} if scores_bias is None else {"scores_bias": scores_bias}  # a local layer's window
            heads = self.kernel(q, k, v, key_mask, self.eps, **windowed)  # (B, H, N, D)
        elif scores_bias is not None:
            heads = softmax_attention(q, k, v, key_mask, self.eps, scores_bias, rotary, self.softcap)  # softmax only
        elif rotary is not None:
            heads = self.kernel(q, k, v, key_mask, self.eps, rotary=rotary)
        else:
            heads = self.kernel(q, k, v, key_mask, self.eps)  # (B, H, N, D)
        return self.out(heads.transpose(1, 2).reshape(b, n, f))

    def _fused_out(self, out: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """The output projection of a fused kernel's (B, N, A) heads, rows with no kept key zero
        (the fused ONNX kernel would average them); a multiply by (B, 1, 1) instead of Where: no
        (B, N, F) zeros are materialised."""
        return self.out(out * key_mask.any(dim=1).to(out.dtype)[:, None, None])

    def shared_heads(self, projected: torch.Tensor) -> torch.Tensor:
        """[Q | K | V] (B, N, A + 2 A_kv) -> (B, N, 3A): each K / V head repeated for the
        num_heads / kv_heads query heads that share it (head h reads K / V head h // groups),
        which is Llama's repeat_kv."""
        b, n, _ = projected.shape
        q, k, v = projected.split([self.inner, self.kv_inner, self.kv_inner], dim=-1)
        groups, d = self.num_heads // self.kv_heads, self.inner // self.num_heads

        def repeat(t: torch.Tensor) -> torch.Tensor:  # (B, N, H_kv x D) -> (B, N, H x D)
            return t.view(b, n, self.kv_heads, 1, d).expand(b, n, self.kv_heads, groups, d).reshape(b, n, self.inner)

        return torch.cat([q, repeat(k), repeat(v)], dim=-1)

    def disentangled_bias(self, q: torch.Tensor, k: torch.Tensor, table: torch.Tensor,
                          index: torch.Tensor) -> torch.Tensor:
        """(c2p + p2c) / sqrt(D), (B, H, N, N), from q, k (B, N, F), the relative table R (2S, F)
        and I (N, N): c2p[i, j] = q_i . (W_K R + b_K)[I_ij], p2c[i, j] = k_j . (W_Q R + b_Q)[I_ij],
        per head. R goes through this layer's own Q and K projections (DeBERTa-v2's share_att_key),
        or through its position pair when it has one (DeBERTa v1)."""
        b, n, f = q.shape  # f = A
        h = self.num_heads
        if self.positions is not None:
            positions = self.positions(table.to(q.dtype))  # (2S, 2F): [position queries | keys]
        else:
            bias = self.qkv.bias[: 2 * f] if self.qkv.bias is not None else None
            positions = F.linear(table.to(q.dtype), self.qkv.weight[: 2 * f], bias)  # (2S, 2F): [W_Q R | W_K R]
        pos_q, pos_k = positions.view(-1, 2, h, f // h).permute(1, 2, 0, 3).unbind(0)  # each (H, 2S, D)
        q, k = (t.view(b, n, h, -1).transpose(1, 2) for t in (q, k))  # each (B, H, N, D)
        c2p = torch.gather(q @ pos_k.transpose(-1, -2), -1, index.expand(b, h, n, n))  # (B, H, N, N)
        # rows of k_j . (W_Q R)[r] are keys: gather at I^T, then transpose to (query, key)
        p2c = torch.gather(k @ pos_q.transpose(-1, -2), -1, index.transpose(0, 1).expand(b, h, n, n))
        return (c2p + p2c.transpose(-1, -2)) * (f // h) ** -0.5
