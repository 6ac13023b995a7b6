"""Each attention kernel against a naive reference written from its formula,
row by row: A(X_i) = sum_j sim(Q_i, K_j) V_j / sum_j sim(Q_i, K_j)."""
import pytest
import torch
import torch.nn.functional as F

from ortformer.models.attention import KERNELS, get_kernel
from ortformer.core.errors import ConfigError

EPS = 1e-6


def _sim(kind, q_i, k_j, k_all_kept):
    if kind == "softmax":
        return torch.exp(q_i @ k_j / q_i.shape[-1] ** 0.5)
    if kind == "linear":
        return (F.elu(q_i) + 1) @ (F.elu(k_j) + 1)
    if kind == "cosine":
        return 1 + F.normalize(q_i, dim=-1) @ F.normalize(k_j, dim=-1)
    raise AssertionError(kind)


def naive(kind, q, k, v, mask):
    """Loops over batch, head and query row; float64 throughout."""
    q, k, v = q.double(), k.double(), v.double()
    b, h, n, d = q.shape
    out = torch.zeros_like(q)
    for bi in range(b):
        kept = [j for j in range(n) if mask[bi, j]]
        for hi in range(h):
            if kind == "efficient":
                # weights over positions per feature, from the kept keys only
                if not kept:
                    continue
                k_soft = torch.softmax(k[bi, hi, kept], dim=0)  # (M, D)
                for i in range(n):
                    q_soft = torch.softmax(q[bi, hi, i], dim=-1)
                    out[bi, hi, i] = sum((q_soft @ k_soft[m]) * v[bi, hi, j] for m, j in enumerate(kept))
                continue
            for i in range(n):
                if not kept:
                    continue
                sims = [_sim(kind, q[bi, hi, i], k[bi, hi, j], kept) for j in kept]
                num = sum(s * v[bi, hi, j] for s, j in zip(sims, kept))
                den = sum(sims) + (0 if kind == "softmax" else EPS)
                out[bi, hi, i] = num / den
    return out


def random_qkv(seed, b=3, h=2, n=6, d=4):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, generator=g) for _ in range(3))
    mask = torch.rand(b, n, generator=g) < 0.7
    mask[:, 0] = True
    mask[-1] = False  # one fully padded row
    return q, k, v, mask


@pytest.mark.parametrize("kind", sorted(KERNELS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kernel_matches_row_by_row_formula(kind, seed):
    q, k, v, mask = random_qkv(seed)
    got = get_kernel(kind)(q, k, v, mask, EPS)
    want = naive(kind, q, k, v, mask).float()
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_softmax_matches_torch_sdpa_with_boolean_mask():
    q, k, v, mask = random_qkv(7)
    mask[-1, 2] = True  # sdpa gives NaN for an all-False row; compare rows with keys
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])
    got = get_kernel("softmax")(q, k, v, mask, EPS)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", sorted(KERNELS))
def test_fully_padded_row_gives_zeros(kind):
    q, k, v, mask = random_qkv(3)
    out = get_kernel(kind)(q, k, v, mask, EPS)
    assert torch.equal(out[-1], torch.zeros_like(out[-1]))


@pytest.mark.parametrize("kind", sorted(KERNELS))
def test_padded_keys_do_not_matter(kind):
    q, k, v, mask = random_qkv(4)
    k2, v2 = k.clone(), v.clone()
    k2[~mask[:, None, :, None].expand_as(k)] = 1e3  # garbage in padded keys
    v2[~mask[:, None, :, None].expand_as(v)] = -1e3
    a = get_kernel(kind)(q, k, v, mask, EPS)
    b = get_kernel(kind)(q, k2, v2, mask, EPS)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["linear", "efficient", "cosine"])
def test_float16_inputs_reduce_in_float32_and_stay_finite(kind):
    q, k, v, mask = random_qkv(5, n=300)
    # 300 keys x values ~ 1e2 overflow a float16 sum (max 65504) unless reduced in float32
    q, k, v = q * 4, k * 4, v * 100
    out = get_kernel(kind)(q.half(), k.half(), v.half(), mask, EPS)
    assert out.dtype == torch.float16
    assert torch.isfinite(out).all()
    want = get_kernel(kind)(q.half().float(), k.half().float(), v.half().float(), mask, EPS)
    torch.testing.assert_close(out.float(), want, rtol=2e-3, atol=0.1)


def test_unknown_kernel_is_a_config_error():
    with pytest.raises(ConfigError, match="softmax, linear, efficient, cosine"):
        get_kernel("flash")


def test_softmax_with_a_scores_bias_matches_the_formula():
    """exp(q_i.k_j / sqrt(D) + bias[h, i, j]) weights, for (1, H, N, N) and (1, 1, N, N) biases
    holding the lowest float (a window) as well as ordinary values."""
    q, k, v, mask = random_qkv(8)
    b, h, n, d = q.shape
    g = torch.Generator().manual_seed(1)
    for bias in (torch.randn(1, h, n, n, generator=g), torch.randn(1, 1, n, n, generator=g)):
        bias[..., 0, 1] = torch.finfo(torch.float32).min
        got = get_kernel("softmax")(q, k, v, mask, EPS, bias)
        want = torch.zeros(b, h, n, d, dtype=torch.float64)
        for bi in range(b):
            kept = [j for j in range(n) if mask[bi, j]]
            for hi in range(h):
                for i in range(n if kept else 0):
                    bij = bias[0, hi % bias.shape[1], i].double()
                    s = [torch.exp(q[bi, hi, i].double() @ k[bi, hi, j].double() / d ** 0.5 + bij[j]) for j in kept]
                    want[bi, hi, i] = sum(w * v[bi, hi, j].double() for w, j in zip(s, kept)) / sum(s)
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want.float(), rtol=0, atol=1e-5)


THETA = 10000.0


def turn(x, p):
    """R_p x by the formula: pair (d, d + D/2) turns by p * theta^(-2d/D). x (D,)."""
    x = x.double()
    half = x.shape[-1] // 2
    out = x.clone()
    for d in range(half):
        angle = torch.tensor(p * THETA ** (-2 * d / x.shape[-1]), dtype=torch.float64)
        out[d] = x[d] * angle.cos() - x[d + half] * angle.sin()
        out[d + half] = x[d + half] * angle.cos() + x[d] * angle.sin()
    return out


def naive_rotary(kind, q, k, v, mask):
    """Row by row: softmax and cosine rotate their q.k term everywhere; linear rotates the
    feature-mapped q, k in the numerator only; efficient rotates its feature-mapped rows."""
    q, k, v = q.double(), k.double(), v.double()
    b, h, n, d = q.shape
    out = torch.zeros_like(q)
    for bi in range(b):
        kept = [j for j in range(n) if mask[bi, j]]
        if not kept:
            continue
        for hi in range(h):
            if kind == "efficient":
                k_soft = torch.softmax(k[bi, hi, kept], dim=0)  # (M, D) over kept positions
                for i in range(n):
                    q_rot = turn(torch.softmax(q[bi, hi, i], dim=-1), i)
                    out[bi, hi, i] = sum((q_rot @ turn(k_soft[m], j)) * v[bi, hi, j] for m, j in enumerate(kept))
                continue
            for i in range(n):
                if kind == "softmax":
                    num = [torch.exp(turn(q[bi, hi, i], i) @ turn(k[bi, hi, j], j) / d ** 0.5) for j in kept]
                    den = num
                elif kind == "linear":
                    fq = F.elu(q[bi, hi, i]) + 1
                    fk = {j: F.elu(k[bi, hi, j]) + 1 for j in kept}
                    num = [turn(fq, i) @ turn(fk[j], j) for j in kept]
                    den = [fq @ fk[j] for j in kept]
                else:  # cosine
                    qh = F.normalize(q[bi, hi, i], dim=-1)
                    num = [1 + turn(qh, i) @ turn(F.normalize(k[bi, hi, j], dim=-1), j) for j in kept]
                    den = num
                out[bi, hi, i] = sum(s * v[bi, hi, j] for s, j in zip(num, kept)) / (
                    sum(den) + (0 if kind == "softmax" else EPS))
    return out


@pytest.mark.parametrize("kind", sorted(KERNELS))
@pytest.mark.parametrize("seed", [0, 1])
def test_rotary_kernel_matches_row_by_row_formula(kind, seed):
    from ortformer.models.layers import Rotary

    q, k, v, mask = random_qkv(seed, n=7, d=6)
    got = get_kernel(kind)(q, k, v, mask, EPS, rotary=Rotary(6, THETA)(7))
    want = naive_rotary(kind, q, k, v, mask).float()
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    # and it is not the unrotated kernel
    assert (got - get_kernel(kind)(q, k, v, mask, EPS)).abs().max() > 1e-3


def test_rotary_tables_and_rotation_equal_transformers():
    from transformers.models.modernbert.modeling_modernbert import apply_rotary_pos_emb

    from ortformer.models.layers import Rotary, rotate

    d, n, theta = 16, 40, 160000.0
    cos, sin = Rotary(d, theta)(n)
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float) / d))  # ModernBERT's default rope
    freqs = torch.arange(n)[:, None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    assert torch.equal(cos, emb.cos()) and torch.equal(sin, emb.sin())
    q, k = torch.randn(2, 3, n, d), torch.randn(2, 3, n, d)
    want_q, want_k = apply_rotary_pos_emb(q, k, cos[None], sin[None])
    assert torch.equal(rotate(q, cos, sin), want_q) and torch.equal(rotate(k, cos, sin), want_k)
