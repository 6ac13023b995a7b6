"""Encoder-level properties that every variant must have."""
import pytest
import torch
import torch.nn.functional as F

import dataclasses

from ortformer.config import (ACTIVATIONS, ATTENTION_KINDS, Adapters, Convolution, Experts, LocalAttention, RelativeAttention,
                              ShortConv, preset)
from ortformer.contract.cost import parameter_breakdown, parameter_count
from ortformer.models import build_encoder


def variants():
    """A covering set: every attention kind meets every norm, norm position,
    activation, feed-forward kind, bias setting, position kind and input kind at least once."""
    combos = []
    for i in range(24):
        vocab = [100, 0][(i // 3) % 2]
        combos.append(dict(
            attention=ATTENTION_KINDS[i % 4], norm_position=["post", "pre"][(i // 4) % 2],
            norm=["layernorm", "rmsnorm"][(i // 8 + i) % 2], activation=ACTIVATIONS[(i // 2) % 4],
            positions=["learned", "sinusoidal", "none"][i % 3], vocab_size=vocab,
            type_vocab_size=2 if vocab else 0, pooling=["mean", "cls", "none"][(i // 4) % 3],
            ffn_gated=bool((i // 5) % 2), bias=not (i // 6) % 2,
        ))
    # softmax-only variants: a relative position bias (buckets 8, so the grid's lengths
    # reach the logarithmic buckets and beyond max_distance)
    for base, positions in zip(combos[0:8:4], ["none", "learned"]):
        combos.append({**base, "positions": positions, "relative_attention": RelativeAttention(buckets=8, max_distance=6)})
    # local windows with global layers every k (softmax only), alone, with rotary and its own
    # local theta (and Gemma's sandwich norms, the global layer last), and with a relative bias;
    # 3 layers: global, local, local (local, local, global with global_offset 2)
    assert combos[4]["norm_position"] == "pre"  # sandwich norms are pre-norm's
    local = LocalAttention(window=2, global_every=3)
    for base, extra in zip(combos[0:12:4], [dict(positions="none", local_attention=local),
                                            dict(positions="rotary", sandwich_norm=True, local_attention=LocalAttention(
                                                window=2, global_every=3, global_offset=2, rotary_theta=100.0)),
                                            dict(positions="none", local_attention=local,
                                                 relative_attention=RelativeAttention(buckets=8, max_distance=6))]):
        combos.append({**base, **extra, "num_layers": 3})
    # rotary positions, for every attention kind in both norm positions
    combos += [{**base, "positions": "rotary"} for base in combos[8:16]]
    # causal softmax with rotary positions, per-head q/k norms, scaled angles and grouped-query attention
    # (2 K / V heads for 4 query heads: Qwen3-Embedding's layers); grouped K / V in a linear-family model
    # (one K / V head); token dropout (ESM)
    combos += [{**combos[4], "positions": "rotary", "causal": True, "qk_norm": True, "rotary_scale": 0.5,
                "num_kv_heads": 2},
               {**combos[1], "num_kv_heads": 1},
               {**combos[0], "token_dropout_id": 7}]
    # causal sliding windows (Mistral's, Gemma 2 / 3's: i - w < j <= i is window 2w - 1), every layer
    # local (global_every past the last layer), and local between global ones with their own theta
    combos += [{**combos[4], "positions": "rotary", "causal": True,
                "local_attention": LocalAttention(window=5, global_every=4, global_offset=3), "num_layers": 3},
               {**combos[4], "positions": "rotary", "causal": True,
                "local_attention": LocalAttention(window=3, global_every=2, rotary_theta=100.0), "num_layers": 3}]
    # DeBERTa-v2's convolution after the first layer, softmax and linear
    combos += [{**combos[0], "convolution": Convolution(kernel_size=3, activation="gelu")},
               {**combos[1], "convolution": Convolution(kernel_size=5, groups=2)}]
    # ALiBi (JinaBERT), alone and under local windows (softmax, bidirectional)
    assert combos[0]["attention"] == "softmax"
    combos += [{**combos[0], "positions": "alibi"},
               {**combos[4], "positions": "alibi", "local_attention": local, "num_layers": 3}]
    # soft-capped softmax scores (Gemma 2): bidirectional alone and under local windows, causal with rotary
    combos += [{**combos[0], "attention_softcap": 0.5},
               {**combos[4], "attention_softcap": 0.5, "local_attention": local, "num_layers": 3},
               {**combos[4], "positions": "rotary", "causal": True, "attention_softcap": 2.0}]
    # a mixture of experts in every other layer (NomicBERT-MoE), softmax and linear; short convolutions in
    # place of attention in layers 0 and 2 of a causal rotary model with q / k norms (LFM2)
    assert not combos[0]["ffn_gated"] and not combos[1]["ffn_gated"]
    combos += [{**combos[0], "experts": Experts(count=4, top_k=2), "num_layers": 3},
               {**combos[1], "experts": Experts(count=3, top_k=1, every=1, offset=0)},
               {**combos[4], "positions": "rotary", "causal": True, "qk_norm": True, "num_kv_heads": 2,
                "short_conv": ShortConv(kernel_size=3, layers=(0, 2)), "num_layers": 3}]
    # task adapters (jina-embeddings-v3), with token types and without (task_id then comes third); run with
    # the default task
    assert combos[0]["vocab_size"] and combos[8]["vocab_size"]
    combos += [{**combos[0], "adapters": Adapters(tasks=("a", "b"), rank=2, default="b")},
               {**combos[8], "positions": "rotary", "type_vocab_size": 0,
                "adapters": Adapters(tasks=("a", "b", "c"), rank=3, scale=0.5, default="a")}]
    return combos


VARIANTS = variants()
# a group by its field values (local_attention 2-3-0-0.0), not its dataclass repr
IDS = ["-".join("-".join(map(str, dataclasses.astuple(v))) if dataclasses.is_dataclass(v) else str(v)
                for v in c.values()) for c in VARIANTS]


def make_inputs(cfg, b, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    if cfg.takes_ids:
        return torch.randint(0, cfg.vocab_size, (b, n), generator=g)
    return torch.randn(b, n, cfg.hidden_size, generator=g)


def forward(model, x, mask, types=None):
    cfg = model.config
    args = (x, mask) + ((types if types is not None else torch.zeros(mask.shape, dtype=torch.long),) if cfg.type_vocab_size else ())
    with torch.no_grad():
        return model(*args)


def test_covering_set_covers_every_option():
    seen = {key: {c.get(key) for c in VARIANTS} for key in VARIANTS[0]}
    assert {c["attention"] for c in VARIANTS if c.get("relative_attention")} == {"softmax"}
    assert {c["attention"] for c in VARIANTS if c.get("local_attention")} == {"softmax"}
    assert {(c["attention"], c["norm_position"]) for c in VARIANTS if c["positions"] == "rotary"} == {
        (a, p) for a in ATTENTION_KINDS for p in ("post", "pre")}
    assert seen["norm"] == {"layernorm", "rmsnorm"} and seen["positions"] == {"learned", "sinusoidal", "none", "rotary", "alibi"}
    assert seen["norm_position"] == {"post", "pre"} and seen["vocab_size"] == {100, 0}
    assert seen["activation"] == set(ACTIVATIONS)
    for attention in ATTENTION_KINDS:
        mine = [c for c in VARIANTS if c["attention"] == attention]
        assert {c["norm_position"] for c in mine} == {"post", "pre"}
        assert {c["ffn_gated"] for c in mine} == {False, True} and {c["bias"] for c in mine} == {False, True}


@pytest.mark.parametrize("overrides", VARIANTS, ids=IDS)
def test_padding_invariance_right_and_left(overrides):
    cfg = preset("tiny", **overrides)
    model = build_encoder(cfg, seed=1)
    n, total = 5, 9
    x = make_inputs(cfg, 1, n, seed=2)
    alone = forward(model, x, torch.ones(1, n, dtype=torch.long))
    filler = make_inputs(cfg, 1, total - n, seed=3)
    for side in ("right", "left"):
        padded_x = torch.cat([x, filler], 1) if side == "right" else torch.cat([filler, x], 1)
        mask = torch.zeros(2, total, dtype=torch.long)
        keep = slice(0, n) if side == "right" else slice(total - n, total)
        mask[0, keep] = 1
        mask[1, :] = 1  # a neighbour row of full length shares the batch
        batch_x = torch.cat([padded_x, make_inputs(cfg, 1, total, seed=4)], 0)
        # positions count from the first column, so left padding shifts positions:
        # invariance to left padding holds only without absolute position information
        # (relative biases, rotary and windows see i - j alone)
        if side == "left" and cfg.positions in ("learned", "sinusoidal"):
            continue
        out = forward(model, batch_x, mask)
        torch.testing.assert_close(out["last_hidden_state"][0, keep], alone["last_hidden_state"][0], rtol=0, atol=1e-5)
        if "sentence_embedding" in out and cfg.pooling == "mean":
            torch.testing.assert_close(out["sentence_embedding"][0], alone["sentence_embedding"][0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("overrides", VARIANTS[::3], ids=IDS[::3])
def test_fully_padded_row_is_finite(overrides):
    cfg = preset("tiny", **overrides)
    model = build_encoder(cfg)
    mask = torch.ones(3, 6, dtype=torch.long)
    mask[1] = 0
    out = forward(model, make_inputs(cfg, 3, 6), mask)
    assert all(torch.isfinite(v).all() for v in out.values())


@pytest.mark.parametrize("attention", ATTENTION_KINDS)
def test_permutation_equivariance_without_positions(attention):
    cfg = preset("tiny", attention=attention, positions="none", pooling="mean")
    model = build_encoder(cfg)
    x = make_inputs(cfg, 2, 7)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    perm = torch.randperm(7, generator=torch.Generator().manual_seed(0))
    out = forward(model, x, mask)
    permuted = forward(model, x[:, perm], mask[:, perm])
    torch.testing.assert_close(permuted["last_hidden_state"], out["last_hidden_state"][:, perm], rtol=0, atol=1e-5)
    torch.testing.assert_close(permuted["sentence_embedding"], out["sentence_embedding"], rtol=0, atol=1e-5)


@pytest.mark.parametrize("attention", ATTENTION_KINDS)
def test_padded_token_ids_do_not_change_kept_outputs(attention):
    cfg = preset("tiny", attention=attention)
    model = build_encoder(cfg)
    x = make_inputs(cfg, 2, 8)
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[:, 5:] = 0
    y = x.clone()
    y[:, 5:] = (y[:, 5:] + 17) % cfg.vocab_size
    a, b = forward(model, x, mask), forward(model, y, mask)
    torch.testing.assert_close(a["last_hidden_state"][:, :5], b["last_hidden_state"][:, :5], rtol=0, atol=1e-6)
    torch.testing.assert_close(a["sentence_embedding"], b["sentence_embedding"], rtol=0, atol=1e-6)


def test_positions_matter_when_present():
    cfg = preset("tiny", positions="sinusoidal")
    model = build_encoder(cfg)
    x = make_inputs(cfg, 1, 6)
    mask = torch.ones(1, 6, dtype=torch.long)
    out = forward(model, x, mask)["last_hidden_state"]
    flipped = forward(model, x.flip(1), mask)["last_hidden_state"].flip(1)
    assert (out - flipped).abs().max() > 1e-3


def test_outputs_and_shapes_follow_pooling():
    cfg = preset("tiny", pooling="cls", normalize_embeddings=True)
    out = forward(build_encoder(cfg), make_inputs(cfg, 4, 5), torch.ones(4, 5, dtype=torch.long))
    assert out["last_hidden_state"].shape == (4, 5, cfg.hidden_size)
    assert out["sentence_embedding"].shape == (4, cfg.hidden_size)
    torch.testing.assert_close(out["sentence_embedding"].norm(dim=-1), torch.ones(4))
    torch.testing.assert_close(out["sentence_embedding"], torch.nn.functional.normalize(out["last_hidden_state"][:, 0], dim=-1))
    cfg = preset("tiny", pooling="none")
    assert set(forward(build_encoder(cfg), make_inputs(cfg, 1, 3), torch.ones(1, 3, dtype=torch.long))) == {"last_hidden_state"}


def test_seed_makes_weights_reproducible():
    cfg = preset("tiny")
    a, b, c = build_encoder(cfg, seed=5), build_encoder(cfg, seed=5), build_encoder(cfg, seed=6)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))


SANDWICH = [c for c in VARIANTS if c.get("sandwich_norm")]


@pytest.mark.parametrize("overrides", VARIANTS[:12] + VARIANTS[-4:] + SANDWICH, ids=IDS[:12] + IDS[-4:] + ["sandwich"])
def test_parameter_count_matches_the_module(overrides):
    cfg = preset("tiny", **overrides)
    assert parameter_count(cfg) == sum(p.numel() for p in build_encoder(cfg).parameters())


@pytest.mark.parametrize("name", ["bert-base", "small"])
def test_preset_parameter_count_matches_module(name):
    cfg = preset(name)
    with torch.device("meta"):  # no memory, just shapes
        from ortformer.models import Encoder

        model = Encoder(cfg)
    assert parameter_count(cfg) == sum(p.numel() for p in model.parameters())


def test_bert_preset_sizes_by_hand():
    # BERT without its pooler dense layer (F^2 + F = 0.59M): 108.9M and 334.1M
    F, V, P, T, L, I = 768, 30522, 512, 2, 12, 3072
    per_layer = 4 * F * F + 4 * F + 2 * F * I + I + F + 2 * 2 * F
    assert parameter_count(preset("bert-base")) == V * F + P * F + T * F + 2 * F + L * per_layer
    assert 108e6 < parameter_count(preset("bert-base")) < 111e6
    assert 333e6 < parameter_count(preset("bert-large")) < 336e6
    parts = parameter_breakdown(preset("bert-base"))
    assert parts["attention_weights"] == L * 4 * F * F and parts["ffn_weights"] == L * 2 * F * I


@pytest.mark.parametrize("activation, expected", [
    ("gelu", lambda a: F.gelu(a)), ("gelu_tanh", lambda a: F.gelu(a, approximate="tanh")),
    ("silu", lambda a: a * torch.sigmoid(a)), ("relu", lambda a: a.clamp(min=0)),
])
@pytest.mark.parametrize("bias", [True, False])
def test_gated_feed_forward_is_down_of_act_a_times_g(activation, expected, bias):
    cfg = preset("tiny", ffn_gated=True, activation=activation, bias=bias)
    ffn = build_encoder(cfg).blocks[0].ffn
    assert ffn.up.weight.shape == (2 * cfg.ffn_size, cfg.hidden_size) and (ffn.up.bias is not None) == bias
    x = torch.randn(2, 3, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    w1, w2 = ffn.up.weight.detach(), ffn.down.weight.detach()
    a, g = x @ w1[:cfg.ffn_size].T, x @ w1[cfg.ffn_size:].T  # rows [a; g]
    if bias:
        a, g = a + ffn.up.bias[:cfg.ffn_size].detach(), g + ffn.up.bias[cfg.ffn_size:].detach()
    want = (expected(a) * g) @ w2.T + (ffn.down.bias.detach() if bias else 0)
    with torch.no_grad():
        torch.testing.assert_close(ffn(x), want, rtol=0, atol=1e-5)


def test_no_bias_leaves_no_bias_anywhere():
    model = build_encoder(preset("tiny", bias=False))
    names = [name for name, _ in model.named_parameters()]
    assert not [n for n in names if n.endswith(".bias")], names
    x = torch.randn(1, 4, 32)
    torch.testing.assert_close(model.norm(x), torch.nn.functional.layer_norm(x, (32,), model.norm.weight, None, 1e-5))


def test_relative_buckets_equal_transformers_mpnet():
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder


    for buckets, distance, n in [(32, 128, 300), (8, 6, 40), (6, 3, 20)]:
        cfg = preset("tiny", relative_attention=RelativeAttention(buckets=buckets, max_distance=distance),
                     max_positions=512)
        module = build_encoder(cfg).relative
        position = torch.arange(n)
        want = MPNetEncoder.relative_position_bucket(position[None, :] - position[:, None], buckets, distance)
        with torch.no_grad():
            bias = module(n)
        assert bias.shape == (1, cfg.num_heads, n, n)
        torch.testing.assert_close(bias, module.table.weight[want].permute(2, 0, 1)[None], rtol=0, atol=0)
        # every bucket is reached but the upper half's first: distance 0 has no direction
        assert set(want.flatten().tolist()) == set(range(buckets - buckets % 2)) - {buckets // 2}


def test_relative_bias_changes_the_output_and_is_in_the_parameter_count():
    cfg = preset("tiny", relative_attention=RelativeAttention(buckets=8, max_distance=6))
    model, plain = build_encoder(cfg, seed=1), build_encoder(cfg.replace(relative_attention=None), seed=1)
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("relative.")})
    x, mask = make_inputs(cfg, 1, 9), torch.ones(1, 9, dtype=torch.long)
    assert (forward(model, x, mask)["last_hidden_state"] - forward(plain, x, mask)["last_hidden_state"]).abs().max() > 1e-3
    assert parameter_count(cfg) == sum(p.numel() for p in model.parameters()) == parameter_count(plain.config) + 8 * 4


@pytest.mark.parametrize("attention", ATTENTION_KINDS)
def test_rotary_sees_order_but_not_where_the_sequence_starts(attention):
    """Rotary makes the output depend on order; with position = index, a shift of the whole
    sequence (left padding) changes nothing, for the linear family too (numerator only)."""
    cfg = preset("tiny", attention=attention, positions="rotary")
    model = build_encoder(cfg, seed=2)
    x, mask = make_inputs(cfg, 1, 6), torch.ones(1, 6, dtype=torch.long)
    out = forward(model, x, mask)["last_hidden_state"]
    flipped = forward(model, x.flip(1), mask)["last_hidden_state"].flip(1)
    assert (out - flipped).abs().max() > 1e-3


def test_window_bias_is_modernberts_sliding_window():
    from ortformer.models.layers import window_bias

    for window, n in [(4, 9), (5, 9), (128, 300)]:
        bias = window_bias(n, window, torch.zeros(1))
        rows = torch.arange(n).unsqueeze(0)
        inside = (torch.abs(rows - rows.T) <= window // 2)[None, None]  # ModernBERT's window_mask
        assert bias.shape == (1, 1, n, n)
        assert torch.equal(bias == 0, inside) and (bias[~inside] == torch.finfo(torch.float32).min).all()


def test_local_layers_follow_global_every_and_see_only_their_window():
    cfg = preset("tiny", local_attention=LocalAttention(window=4, global_every=3), num_layers=7, positions="none")
    model = build_encoder(cfg, seed=3)
    assert model.local_layers == [1, 2, 4, 5]
    assert [layer for layer in range(7) if not cfg.is_global(layer)] == model.local_layers
    offset = cfg.replace(local_attention=dataclasses.replace(cfg.local_attention, global_offset=2))
    assert build_encoder(offset).local_layers == [0, 1, 3, 4, 6]  # Gemma's: the group's last
    from ortformer.models.layers import window_bias

    block, n = model.blocks[1], 9
    x = torch.randn(1, n, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    y = x.clone()
    y[0, 8] += 1.0  # a key outside the window of tokens 0..5 (|i - 8| > 2)
    mask = torch.ones(1, n, dtype=torch.bool)
    with torch.no_grad():
        a, b = (block(t, mask, window_bias(n, 4, t)) for t in (x, y))
        unwindowed = block(y, mask) - block(x, mask)
    torch.testing.assert_close(a[0, :6], b[0, :6], rtol=0, atol=1e-6)
    assert (a[0, 6:] - b[0, 6:]).abs().amax(dim=-1).min() > 1e-4  # tokens 6, 7, 8 do see it
    assert unwindowed[0, :6].abs().max() > 1e-4  # and a global layer would have


def test_causal_local_layers_see_the_window_behind_them_only():
    """causal with local_attention.window W: token i sees i - W // 2 <= j <= i, a decoder's sliding window of w = W // 2 + 1."""
    from ortformer.models.layers import window_bias

    cfg = preset("tiny", causal=True, local_attention=LocalAttention(window=5, global_every=3, global_offset=2),
                 num_layers=2, positions="none")
    block, n = build_encoder(cfg, seed=3).blocks[0], 9
    x = torch.randn(1, n, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    mask = torch.ones(1, n, dtype=torch.bool)
    for key in (2, 5):
        y = x.clone()
        y[0, key] += 1.0
        with torch.no_grad():
            moved = (block(y, mask, window_bias(n, 5, y)) - block(x, mask, window_bias(n, 5, x))).abs().amax(dim=-1)[0]
        sees = [i for i in range(n) if moved[i] > 1e-4]
        assert sees == list(range(key, key + 3)), (key, sees)  # i - 2 <= key <= i


def test_alibi_bias_stays_float32_in_a_half_model():
    """The slopes are not a buffer that .half() would round (2^-(k + 1/2) slopes are not float16 numbers)."""
    cfg = preset("tiny", positions="alibi", num_heads=12, hidden_size=48)
    bias, half = build_encoder(cfg).relative(9), build_encoder(cfg).half().relative(9)
    assert half.dtype == torch.float32 and torch.equal(bias, half)


def test_rotary_tables_stay_float32_in_a_half_model():
    cfg = preset("tiny", positions="rotary", max_positions=512)
    model = build_encoder(cfg)
    half = build_encoder(cfg).half()
    for a, b in zip(model.rotary(512), half.rotary(512)):
        assert b.dtype == torch.float32 and torch.equal(a, b)


@pytest.mark.parametrize("overrides", [dict(positions="rotary", qk_norm=True, norm="rmsnorm"),
                                       dict(positions="none", qk_norm=True, relative_attention=RelativeAttention(buckets=8)),
                                       dict(positions="alibi", qk_norm=True)])
def test_fused_softmax_path_equals_the_plain_one(overrides):
    """The fused path (one op per layer, what the exporter translates) against the plain
    (B, H, N, D) path, where q/k norms and rotary are applied per head in plain sight."""
    cfg = preset("tiny", **overrides)
    model = build_encoder(cfg, seed=3)
    with torch.no_grad():  # q/k norm weights away from 1, so a skipped norm shows
        for block in model.blocks:
            block.attention.q_norm.weight.uniform_(0.5, 1.5)
            block.attention.k_norm.weight.uniform_(0.5, 1.5)
    x, mask = make_inputs(cfg, 2, 7, seed=1), torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    fused = forward(model, x, mask)["last_hidden_state"]
    for block in model.blocks:
        assert block.attention.fused
        block.attention.fused = False
    plain = forward(model, x, mask)["last_hidden_state"]
    torch.testing.assert_close(fused[mask.bool()], plain[mask.bool()], rtol=0, atol=1e-5)
