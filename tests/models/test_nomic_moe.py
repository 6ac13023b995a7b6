"""NomicBERT-MoE (nomic-embed-text-v2-moe: NomicBERT with routed experts in every other layer) against
a reference written from the model's published definition (the remote code modeling_hf_nomic_bert.py,
which transformers does not ship), with torch ops only and no ortformer module:

    e = LN_emb(word + type);  per layer:  x = LN_1(x + W_o attn(x) + b_o);  x = LN_2(x + mlp(x))

attention over [q; k; v] = W_qkv x + b, rotate-half rotary at the sequence index; mlp(x) = fc2(gelu(fc1 x))
in layers l % 2 == 0 and, in layers l % 2 == 1, the experts: p = softmax(W_r x) in float32, the top k of
p kept as they are (no renormalisation), y = sum over the chosen experts e of p_e gelu(x W1_e^T) W2_e,
then + b, run as the remote code does it: a ragged loop over experts, each on the tokens routed to it.
The folder holds the remote code's config keys and tensor names."""
from __future__ import annotations


import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from support.hf import GATE, assert_matches_reference, cases, load_and_export, write_folder

from ortformer.config import Experts
from ortformer.core.errors import CheckpointError
from ortformer.models import load_any

VOCAB, WIDTH, HEADS, LAYERS, INNER, EXPERTS, TOP_K, EPS, THETA = 120, 32, 4, 4, 40, 4, 2, 1e-5, 1000.0


def moe_config(**changes) -> dict:
    """config.json as nomic-embed-text-v2-moe holds it (the remote code's GPT-2 style keys)."""
    return {"model_type": "nomic_bert", "architectures": ["NomicBertModel"], "activation_function": "gelu",
            "auto_map": {"AutoConfig": "nomic-ai/nomic-bert-2048--configuration_hf_nomic_bert.NomicBertConfig",
                         "AutoModel": "nomic-ai/nomic-bert-2048--modeling_hf_nomic_bert.NomicBertModel"},
            "n_embd": WIDTH, "n_head": HEADS, "n_layer": LAYERS, "n_inner": INNER, "n_positions": 2048,
            "vocab_size": VOCAB, "pad_vocab_size_multiple": 8, "layer_norm_epsilon": EPS, "rotary_emb_base": THETA,
            "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False, "rotary_scaling_factor": None,
            "prenorm": False, "parallel_block": False, "qkv_proj_bias": True, "mlp_fc1_bias": True,
            "mlp_fc2_bias": True, "use_rms_norm": False, "type_vocab_size": 1, "causal": False,
            "max_trained_positions": 2048, "num_experts": EXPERTS, "moe_top_k": TOP_K, "moe_every_n_layers": 2,
            "moe_impl": "megablocks", "moe_normalize_expert_weights": False, "expert_choice_router": False,
            "num_shared_experts": 0, "router_aux_loss_coef": 0.1, "ffn_div": 1, **changes}


def moe_weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.3, base=0.0):
        return base + torch.randn(*shape, generator=g) * scale

    w = {"embeddings.word_embeddings.weight": rand(VOCAB, WIDTH, scale=1.0),
         "embeddings.token_type_embeddings.weight": rand(1, WIDTH), "emb_ln.weight": rand(WIDTH, base=1.0),
         "emb_ln.bias": rand(WIDTH, scale=0.1)}
    for i in range(LAYERS):
        p = f"encoder.layers.{i}."
        w.update({p + "attn.Wqkv.weight": rand(3 * WIDTH, WIDTH), p + "attn.Wqkv.bias": rand(3 * WIDTH, scale=0.1),
                  p + "attn.out_proj.weight": rand(WIDTH, WIDTH), p + "attn.out_proj.bias": rand(WIDTH, scale=0.1)})
        for norm in ("norm1", "norm2"):
            w[p + norm + ".weight"], w[p + norm + ".bias"] = rand(WIDTH, base=1.0, scale=0.1), rand(WIDTH, scale=0.1)
        if i % 2 == 1:  # the router sharp enough that the top k differ from token to token
            w.update({p + "mlp.router.layer.weight": rand(EXPERTS, WIDTH, scale=1.0),
                      p + "mlp.experts.mlp.w1": rand(EXPERTS * INNER, WIDTH), p + "mlp.experts.mlp.w2": rand(EXPERTS * INNER, WIDTH),
                      p + "mlp.experts.bias": rand(WIDTH, scale=0.1)})
        else:
            w.update({p + "mlp.fc1.weight": rand(INNER, WIDTH), p + "mlp.fc1.bias": rand(INNER, scale=0.1),
                      p + "mlp.fc2.weight": rand(WIDTH, INNER), p + "mlp.fc2.bias": rand(WIDTH, scale=0.1)})
    return w


def experts_reference(w: dict, p: str, x: torch.Tensor, renormalise: bool = False) -> torch.Tensor:
    """The routed experts of one layer, (T, F) -> (T, F), as the remote code runs them."""
    probs = F.linear(x, w[p + "mlp.router.layer.weight"]).softmax(dim=-1, dtype=torch.float32)
    top_weights, top_experts = torch.topk(probs, TOP_K, dim=-1)
    if renormalise:  # what most MoE code does, and NomicBERT-MoE does not
        top_weights = top_weights / top_weights.sum(-1, keepdim=True)
    w1 = w[p + "mlp.experts.mlp.w1"].view(EXPERTS, INNER, WIDTH)
    w2 = w[p + "mlp.experts.mlp.w2"].view(EXPERTS, INNER, WIDTH)
    out = torch.zeros_like(x)
    for e in range(EXPERTS):
        token, slot = torch.where(top_experts == e)
        if token.numel():
            y = F.gelu(x[token] @ w1[e].T) @ w2[e]
            out.index_add_(0, token, y * top_weights[token, slot, None])
    return out + w[p + "mlp.experts.bias"]


def reference(w: dict, ids, mask, renormalise: bool = False) -> torch.Tensor:
    """NomicBERT-MoE's last_hidden_state (B, N, F)."""
    ids, mask = torch.as_tensor(ids), torch.as_tensor(mask)
    b, n = ids.shape
    d = WIDTH // HEADS

    def ln(x, name):
        return F.layer_norm(x, (WIDTH,), w[name + ".weight"], w[name + ".bias"], EPS)

    angles = torch.outer(torch.arange(n).float(), 1.0 / THETA ** (torch.arange(0, d, 2).float() / d))
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()  # (N, D)

    def rotated(t):  # (B, H, N, D), rotate-half
        return t * cos + torch.cat([-t[..., d // 2:], t[..., :d // 2]], -1) * sin

    keep = mask.bool()[:, None, None, :]
    x = ln(w["embeddings.word_embeddings.weight"][ids] + w["embeddings.token_type_embeddings.weight"][0], "emb_ln")
    for i in range(LAYERS):
        p = f"encoder.layers.{i}."
        q, k, v = (t.view(b, n, HEADS, d).transpose(1, 2)
                   for t in F.linear(x, w[p + "attn.Wqkv.weight"], w[p + "attn.Wqkv.bias"]).chunk(3, dim=-1))
        context = F.scaled_dot_product_attention(rotated(q), rotated(k), v, attn_mask=keep)
        attn = F.linear(context.transpose(1, 2).reshape(b, n, WIDTH), w[p + "attn.out_proj.weight"], w[p + "attn.out_proj.bias"])
        x = ln(x + attn, p + "norm1")
        if i % 2 == 1:
            mlp = experts_reference(w, p, x.reshape(b * n, WIDTH), renormalise).view(b, n, WIDTH)
        else:
            mlp = F.linear(F.gelu(F.linear(x, w[p + "mlp.fc1.weight"], w[p + "mlp.fc1.bias"])), w[p + "mlp.fc2.weight"],
                           w[p + "mlp.fc2.bias"])
        x = ln(x + mlp, p + "norm2")
    return x


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    weights = moe_weights(seed=3)
    return write_folder(tmp_path_factory.mktemp("moe") / "m", moe_config(), weights), weights


def test_config_maps_the_experts(moe):
    folder, _ = moe
    cfg = load_any(folder).config
    assert cfg.experts == Experts(count=EXPERTS, top_k=TOP_K, every=2, offset=1)
    assert (cfg.activation, cfg.ffn_gated, cfg.norm_position, cfg.positions, cfg.rotary_theta) == \
        ("gelu", False, "post", "rotary", THETA)


def test_eager_and_onnx_equal_the_reference(moe, tmp_path):
    """Over the parity grid (batch and sequence axes dynamic in the one file), right and left padded."""
    folder, weights = moe
    loaded, path = load_and_export(folder, tmp_path / "m.onnx")
    assert len({(c.batch, c.sequence) for c in cases(loaded.config)}) > 3
    assert assert_matches_reference(loaded, lambda ids, mask: reference(weights, ids, mask).numpy(), path, 0) >= 12


def test_a_token_does_not_depend_on_padding_or_other_rows(moe, tmp_path):
    """The ONNX file: a text alone, beside another row, and left padded give the same kept vectors."""
    folder, _ = moe
    _, path = load_and_export(folder, tmp_path / "m.onnx")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids = np.array([[5, 9, 17, 3, 44, 8]])
    alone = session.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0][0]
    other = np.array([[7, 7, 7, 1, 2, 90, 11, 12, 13]])
    padded = np.array([[0, 0, 0, *ids[0]], other[0]])
    mask = np.array([[0, 0, 0, 1, 1, 1, 1, 1, 1], [1] * 9])
    both = session.run(["last_hidden_state"], {"input_ids": padded, "attention_mask": mask})[0]
    assert np.abs(both[0, 3:] - alone).max() <= GATE["max_abs"]


def test_the_top_k_weights_are_not_renormalised(moe):
    """A mutation check: the reference with renormalised top-k weights (most MoE code's) is another model."""
    folder, weights = moe
    ids, mask = np.array([[5, 9, 17, 3, 44, 8, 61]]), np.ones((1, 7), dtype=np.int64)
    with torch.no_grad():
        got = load_any(folder).model(torch.from_numpy(ids), torch.from_numpy(mask))["last_hidden_state"]
    assert (got - reference(weights, ids, mask)).abs().max() <= GATE["max_abs"]
    assert (got - reference(weights, ids, mask, renormalise=True)).abs().max() > 10 * GATE["max_abs"]


@pytest.mark.parametrize("change, message", [
    ({"moe_normalize_expert_weights": True}, "moe_normalize_expert_weights=True is not supported"),
    ({"expert_choice_router": True}, "expert_choice_router=True is not supported"),
    ({"num_shared_experts": 1}, "num_shared_experts=1 is not supported"),
    ({"moe_top_k": 5}, "experts.top_k=5 must be in 1..count=4"),
    ({"moe_every_n_layers": -2}, "moe_every_n_layers=-2 is not supported"),
    ({"activation_function": "relu"}, "activation_function='relu' is not supported"),
    ({"moe_every_n_layers": 3}, "missing .*mlp.router.layer.weight"),  # the weights are those of every other layer
])
def test_unsupported_configs_are_refused(tmp_path, change, message):
    folder = write_folder(tmp_path / "m", moe_config(**change), moe_weights(seed=1))
    with pytest.raises(CheckpointError, match=message):
        load_any(folder)
