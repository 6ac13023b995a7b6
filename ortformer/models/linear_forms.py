"""The linear attention family in factored form: global sums, and prefix sums with a carried state.

linear and cosine both read as ``out = num / (den + eps)`` with ``[num, den] = fq @ T``, where
``T = sum_j fk_j^T [v_j, 1]`` over the keys a query sees (all of them, or j <= i when causal):

- linear:  fq = phi(q),     fk = phi(k) m,     phi = elu + 1, m = key kept (0/1)
- cosine:  fq = [q̂, 1],    fk = [k̂ m, m]      so fq·fk_j = m_j (1 + q̂·k̂_j)

The column of ones appended to V makes the last column of T the normalizer ``z = sum_j fk_j``.
T has shape (B, H, Dk, D + 1): Dk = D for linear, D + 1 for cosine. A chunked run sums T over
chunks; a causal run carries T as the state of an RNN ("Transformers are RNNs", Katharopoulos
et al. 2020).

efficient (softmax over positions per key feature) keeps a running max per feature:
``m = max_j k_j``, ``T = sum_j exp(k_j - m)^T [v_j, 1]``; chunks combine by rescaling to the
larger max (the online-softmax trick), and ``context = T[..., :D] / T[..., D]``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

# tokens per block of the causal form: the intra-block part costs (C, C) per head, the
# inter-block part one (Dk, D + 1) state per block; 64 keeps both small
CAUSAL_BLOCK = 64


def features(kind: str, q: torch.Tensor, k: torch.Tensor, keep: torch.Tensor):
    """(fq, fk), float32 (B, H, N, Dk); keep is (B, 1, N, 1) float, 1 = kept key."""
    q, k = q.float(), k.float()
    if kind == "linear":
        return F.elu(q) + 1, (F.elu(k) + 1) * keep
    if kind == "cosine":
        ones = torch.ones_like(q[..., :1])
        fq = torch.cat([F.normalize(q, dim=-1), ones], dim=-1)
        fk = torch.cat([F.normalize(k, dim=-1) * keep, keep.expand_as(ones)], dim=-1)
        return fq, fk
    raise ValueError(f"no factored form for attention={kind!r}")


def with_ones(v: torch.Tensor) -> torch.Tensor:
    """[v, 1]: (B, H, N, D) -> (B, H, N, D + 1), float32."""
    v = v.float()
    return torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)


def sums(fk: torch.Tensor, v1: torch.Tensor) -> torch.Tensor:
    """T = fk^T [v, 1]: (B, H, Dk, D + 1)."""
    return fk.transpose(-2, -1) @ v1


def read_out(fq: torch.Tensor, t: torch.Tensor, eps: float) -> torch.Tensor:
    """[num, den] = fq T; num / (den + eps): (B, H, N, D)."""
    both = fq @ t  # (B, H, N, D + 1)
    return both[..., :-1] / (both[..., -1:] + eps)


def causal(fq: torch.Tensor, fk: torch.Tensor, v1: torch.Tensor, state: torch.Tensor, eps: float,
           block: int = CAUSAL_BLOCK):
    """out_i = [num, den]_i from T_i = state + sum_{j <= i} fk_j^T [v_j, 1]; returns (out, T_N).

    Blockwise, so memory is O(N (C + Dk D / C)) rather than the O(N Dk D) of a cumsum:
    inter-block through exclusive prefix sums of per-block T, intra-block through a
    (C, C) lower-triangular product. fq, fk (B, H, N, Dk); v1 (B, H, N, D + 1); state (B, H, Dk, D + 1).
    """
    b, h, n, dk = fk.shape
    # padded up to whole blocks by a fixed pad and a cut (a pad of (-N) % C breaks the export's
    # symbolic N): zero features add nothing to T, and the padded queries are cut off below
    nb = (n + block - 1) // block
    fq, fk, v1 = (F.pad(x, (0, 0, 0, block))[:, :, : nb * block] for x in (fq, fk, v1))
    fq_b = fq.reshape(b, h, nb, block, dk)
    fk_b = fk.reshape(b, h, nb, block, dk)
    v_b = v1.reshape(b, h, nb, block, v1.shape[-1])
    per_block = fk_b.transpose(-2, -1) @ v_b  # (B, H, nb, Dk, D + 1)
    inclusive = per_block.cumsum(dim=2)
    before = state.unsqueeze(2) + inclusive - per_block  # T entering each block
    tri = torch.ones(block, block, dtype=fq.dtype, device=fq.device).tril()
    both = fq_b @ before + ((fq_b @ fk_b.transpose(-2, -1)) * tri) @ v_b  # (B, H, nb, C, D + 1)
    both = both.reshape(b, h, nb * block, v1.shape[-1])[:, :, :n]
    out = both[..., :-1] / (both[..., -1:] + eps)
    return out, state + inclusive[:, :, -1]


def efficient_sums(k: torch.Tensor, v1: torch.Tensor, keep: torch.Tensor):
    """(m, T): m = max over kept positions per key feature (B, H, D), the float32 minimum when
    none is kept; T = sum_j exp(k_j - m)^T [v_j, 1] over kept j (B, H, D, D + 1)."""
    low = torch.finfo(torch.float32).min
    scores = k.float().masked_fill(keep == 0, low)
    m = scores.amax(dim=2)  # (B, H, D)
    weights = (scores - m.unsqueeze(2)).exp() * keep
    return m, weights.transpose(-2, -1) @ v1


def efficient_read(q: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
    """softmax_D(q) @ context, context = T[..., :D] / T[..., D] (zero where nothing is kept)."""
    return q.float().softmax(dim=-1) @ context


def state_width(kind: str, head_size: int) -> tuple[int, int]:
    """(Dk, D + 1): the shape of one head's T."""
    return (head_size + (kind == "cosine"), head_size + 1)
