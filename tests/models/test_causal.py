"""Causal kernels against a row-by-row reference, and the carried state of the causal form."""
import pytest
import torch
import torch.nn.functional as F

from ortformer.config import EncoderConfig
from ortformer.core.errors import ConfigError
from ortformer.models import linear_forms
from ortformer.models.attention import CAUSAL_KERNELS, get_kernel


def _qkv(b=2, h=3, n=37, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, generator=g) for _ in range(3))
    mask = torch.rand(b, n, generator=g) < 0.7
    mask[:, 0] = True
    return q, k, v, mask


def _row_by_row(kind, q, k, v, mask, eps):
    """out_i = sum_{j <= i, kept} sim(q_i, k_j) v_j / (sum sim + eps) (softmax: its own normalizer)."""
    b, h, n, d = q.shape
    out = torch.zeros_like(q, dtype=torch.float64)
    q, k, v = q.double(), k.double(), v.double()
    for i in range(n):
        seen = mask[:, : i + 1].double()[:, None, :]  # (B, 1, i + 1)
        if kind == "linear":
            sim = ((F.elu(q[:, :, i : i + 1]) + 1) * (F.elu(k[:, :, : i + 1]) + 1)).sum(-1) * seen
        elif kind == "cosine":
            sim = (1 + (F.normalize(q[:, :, i : i + 1], dim=-1) * F.normalize(k[:, :, : i + 1], dim=-1)).sum(-1)) * seen
        else:
            scores = (q[:, :, i : i + 1] * k[:, :, : i + 1]).sum(-1) / d**0.5
            scores = scores.masked_fill(seen == 0, float("-inf"))
            out[:, :, i] = torch.nan_to_num(scores.softmax(-1)).unsqueeze(-1).mul(v[:, :, : i + 1]).sum(2)
            continue
        out[:, :, i] = (sim.unsqueeze(-1) * v[:, :, : i + 1]).sum(2) / (sim.sum(-1, keepdim=True) + eps)
    return out


@pytest.mark.parametrize("kind", ["linear", "cosine", "softmax"])
def test_causal_kernel_matches_row_by_row(kind):
    q, k, v, mask = _qkv()
    got = CAUSAL_KERNELS[kind](q, k, v, mask, 1e-6).double()
    want = _row_by_row(kind, q, k, v, mask, 1e-6)
    rows = mask[:, None, :, None].expand_as(got)  # queries that are kept themselves
    assert torch.allclose(got[rows], want[rows], atol=2e-5, rtol=0)


@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_causal_blocks_and_carried_state_equal_one_pass(kind):
    """Several small blocks, and the sequence split in two with the state carried across."""
    q, k, v, mask = _qkv(n=29)
    keep = mask[:, None, :, None].float()
    fq, fk = linear_forms.features(kind, q, k, keep)
    v1 = linear_forms.with_ones(v)
    dk, dv = linear_forms.state_width(kind, q.shape[-1])
    zero = torch.zeros(q.shape[0], q.shape[1], dk, dv)
    whole, end = linear_forms.causal(fq, fk, v1, zero, 1e-6, block=64)
    small, _ = linear_forms.causal(fq, fk, v1, zero, 1e-6, block=4)
    first, state = linear_forms.causal(fq[:, :, :11], fk[:, :, :11], v1[:, :, :11], zero, 1e-6, block=4)
    second, end2 = linear_forms.causal(fq[:, :, 11:], fk[:, :, 11:], v1[:, :, 11:], state, 1e-6, block=8)
    assert torch.allclose(small, whole, atol=1e-5, rtol=0)
    assert torch.allclose(torch.cat([first, second], dim=2), whole, atol=1e-5, rtol=0)
    assert torch.allclose(end2, end, atol=1e-4, rtol=0)
    assert torch.allclose(end, linear_forms.sums(fk, v1), atol=1e-4, rtol=0)  # the state is the global sum


def test_causal_output_ignores_later_tokens():
    q, k, v, mask = _qkv(n=20)
    base = CAUSAL_KERNELS["linear"](q, k, v, mask, 1e-6)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 12:] += 5.0
    v2[:, :, 12:] -= 3.0
    changed = CAUSAL_KERNELS["linear"](q, k2, v2, mask, 1e-6)
    assert torch.equal(changed[:, :, :12], base[:, :, :12])
    assert not torch.allclose(changed[:, :, 12:], base[:, :, 12:])


def test_causal_efficient_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match="running max"):
        EncoderConfig(attention="efficient", causal=True)
    with pytest.raises(ConfigError, match="no causal form"):
        get_kernel("efficient", causal=True)
