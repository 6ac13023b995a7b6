"""The embedding-side variants (position offset and kept-token positions, an embedding
projection, a normalised embedding) and the last/max poolings: padding invariance,
parameter counts, and the export parity gate."""
import pytest
import torch

from ortformer.config import Disentangled, EncoderConfig, SentenceDense, preset
from ortformer.contract.cost import parameter_count
from ortformer.core.errors import ConfigError
from ortformer.exporter import export
from ortformer.models import build_encoder



def make_inputs(cfg, b, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    if cfg.takes_ids:
        return torch.randint(0, cfg.vocab_size, (b, n), generator=g)
    return torch.randn(b, n, cfg.hidden_size, generator=g)


def forward(model, x, mask):
    types = (torch.zeros(mask.shape, dtype=torch.long),) if model.config.type_vocab_size else ()
    with torch.no_grad():
        return model(x, mask, *types)

VARIANTS = [
    dict(position_offset=2, position_ids="kept", pooling="mean"),
    dict(position_offset=3, pooling="last"),
    dict(embedding_size=16, pooling="max"),
    dict(embedding_size=48, position_ids="kept", pooling="last", norm="rmsnorm"),
    dict(norm_position="pre", embedding_norm=True, pooling="max"),
    dict(norm_position="pre", embedding_norm=True, first_block_norm=True, position_offset=2, position_ids="kept"),
    dict(norm_position="pre", embedding_norm=True, embedding_size=16, positions="sinusoidal", attention="linear"),
    dict(norm_position="pre", position_offset=1, position_ids="kept", attention="efficient", pooling="last"),
    dict(sentence_dense=SentenceDense(size=8, activation="tanh"), pooling="mean", normalize_embeddings=True),
    dict(disentangled=Disentangled(buckets=8, max_distance=20), positions="none", pooling="max"),
    dict(disentangled=Disentangled(buckets=6, max_distance=0, projections="separate", norm=False), positions="none",
         pooling="mean"),
    dict(attention_head_size=12, pooling="mean"),
    dict(attention_head_size=6, num_heads=3, attention="cosine", hidden_size=30, positions="none"),
]
IDS = ["-".join(f"{k}={v}" for k, v in c.items()) for c in VARIANTS]


def _left_invariant(cfg) -> bool:
    # kept-token positions do not move with left padding; index positions do
    return cfg.positions == "none" or (cfg.positions == "learned" and cfg.position_ids == "kept")


@pytest.mark.parametrize("overrides", VARIANTS, ids=IDS)
def test_padding_invariance(overrides):
    cfg = preset("tiny", **overrides)
    model = build_encoder(cfg, seed=1)
    n, total = 5, 9
    x = make_inputs(cfg, 1, n, seed=2)
    alone = forward(model, x, torch.ones(1, n, dtype=torch.long))
    filler = make_inputs(cfg, 1, total - n, seed=3)
    checked = 0
    for side in ("right", "left"):
        if side == "left" and not _left_invariant(cfg):
            continue
        padded = torch.cat([x, filler], 1) if side == "right" else torch.cat([filler, x], 1)
        keep = slice(0, n) if side == "right" else slice(total - n, total)
        mask = torch.zeros(2, total, dtype=torch.long)
        mask[0, keep] = 1
        mask[1] = 1
        out = forward(model, torch.cat([padded, make_inputs(cfg, 1, total, seed=4)], 0), mask)
        torch.testing.assert_close(out["last_hidden_state"][0, keep], alone["last_hidden_state"][0], rtol=0, atol=1e-5)
        torch.testing.assert_close(out["sentence_embedding"][0], alone["sentence_embedding"][0], rtol=0, atol=1e-5)
        checked += 1
    assert checked == (2 if _left_invariant(cfg) else 1)


def test_kept_positions_count_only_kept_tokens():
    cfg = preset("tiny", position_offset=2, position_ids="kept", pooling="none")
    model = build_encoder(cfg, seed=1)
    mask = torch.tensor([[0, 0, 1, 1, 0, 1]])
    x = torch.zeros(1, 6, cfg.hidden_size)
    rows = model.positions(x, mask)[0]
    table = model.positions.table.weight
    for j, row in zip((2, 3, 5), (2, 3, 4)):  # offset + kept tokens before j
        torch.testing.assert_close(rows[j], table[row], rtol=0, atol=0)


def test_offset_shifts_the_table_rows():
    cfg = preset("tiny", position_offset=3, pooling="none")
    model = build_encoder(cfg, seed=1)
    rows = model.positions(torch.zeros(1, 4, cfg.hidden_size), torch.ones(1, 4))[0]
    torch.testing.assert_close(rows, model.positions.table.weight[3:7], rtol=0, atol=0)
    assert cfg.max_sequence == cfg.max_positions - 3


def test_embedding_norm_replaces_the_first_attention_norm():
    model = build_encoder(preset("tiny", norm_position="pre", embedding_norm=True), seed=0)
    assert isinstance(model.blocks[0].norm1, torch.nn.Identity)
    assert not isinstance(model.blocks[1].norm1, torch.nn.Identity) and model.embed_norm is not None


def test_projection_maps_embedding_width_to_hidden():
    model = build_encoder(preset("tiny", embedding_size=16), seed=0)
    assert model.tokens.weight.shape == (100, 16) and model.positions.table.weight.shape == (64, 16)
    assert model.project.weight.shape == (32, 16) and model.norm.weight.shape == (16,)


@pytest.mark.parametrize("overrides", VARIANTS, ids=IDS)
def test_parameter_count_matches_the_module(overrides):
    cfg = preset("tiny", **overrides)
    assert parameter_count(cfg) == sum(p.numel() for p in build_encoder(cfg).parameters())


def test_sentence_dense_head_maps_the_pooled_vector():
    cfg = preset("tiny", sentence_dense=SentenceDense(size=8, activation="tanh", bias=False), pooling="cls",
                 normalize_embeddings=True)
    model = build_encoder(cfg, seed=1)
    assert model.sentence_dense.weight.shape == (8, cfg.hidden_size) and model.sentence_dense.bias is None
    x, mask = make_inputs(cfg, 2, 5, seed=2), torch.ones(2, 5, dtype=torch.long)
    out = forward(model, x, mask)
    by_hand = torch.tanh(out["last_hidden_state"][:, 0] @ model.sentence_dense.weight.T)  # (B, 8)
    torch.testing.assert_close(out["sentence_embedding"], torch.nn.functional.normalize(by_hand, dim=-1))
    assert cfg.sentence_size == 8 and preset("tiny").sentence_size == cfg.hidden_size


def test_disentangled_buckets_follow_debertas_formula():
    from ortformer.models.layers import DisentangledPositions, log_bucket

    # S = 8 (mid 4), max distance 20: |d| <= 4 exact; beyond, 4 + ceil(log(|d| / 4) / log(19 / 4) * 3)
    d = torch.tensor([0, 1, -3, 4, -4, 5, 9, -19, 40])
    want = [0, 1, -3, 4, -4, 5, 6, -7, 9]  # 9 > S: the index clamps it to 2S - 1
    assert log_bucket(d, 8, 20).tolist() == want
    cfg = preset("tiny", disentangled=Disentangled(buckets=8, max_distance=20), positions="none")
    table, index = DisentangledPositions(cfg)(6)
    assert table.shape == (16, cfg.hidden_size) and index.shape == (6, 6)
    assert index[5, 0] == 8 + 5 and index[0, 5] == 8 - 5 and (index.diagonal() == 8).all()
    # no log buckets (DeBERTa v1): I = clamp(i - j + S, 0, 2S - 1), the table read as stored
    cfg = preset("tiny", disentangled=Disentangled(buckets=3, max_distance=0, norm=False), positions="none")
    positions = DisentangledPositions(cfg)
    table, index = positions(6)
    assert torch.equal(table, positions.table.weight)
    assert index[:, 0].tolist() == [3, 4, 5, 5, 5, 5] and index[0].tolist() == [3, 2, 1, 0, 0, 0]


def test_attention_head_size_sets_the_attention_width():
    cfg = preset("tiny", attention_head_size=12)  # 4 heads of 12: A = 48 in a 32-wide model
    model = build_encoder(cfg, seed=1)
    assert cfg.attention_size == 48 and model.blocks[0].attention.qkv.weight.shape == (144, 32)
    assert model.blocks[0].attention.out.weight.shape == (32, 48)
    with pytest.raises(ConfigError, match="or set attention_head_size"):
        preset("tiny", hidden_size=30)


def test_last_and_max_pooling_by_hand():
    from ortformer.models.encoder import pool

    x = torch.arange(24, dtype=torch.float32).view(2, 4, 3) * torch.tensor([1.0, -1.0, 1.0])
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 0, 0]], dtype=torch.bool)
    torch.testing.assert_close(pool(x, mask, "last"), torch.stack([x[0, 2], torch.zeros(3)]))
    torch.testing.assert_close(pool(x, mask, "max"), torch.stack([x[0, 1:3].max(0).values, torch.zeros(3)]))


@pytest.mark.parametrize("overrides, message", [
    (dict(embedding_size=16, vocab_size=0, type_vocab_size=0), "embedding_size projects token embeddings"),
    (dict(embedding_norm=True), "pre-norm"),
    (dict(position_offset=64), "leaves no row"),
    (dict(position_ids="kept", positions="none"), "learned position table"),
    # groups as their JSON objects: a group's class would raise while the list is collected
    (dict(sentence_dense={"size": 8}, pooling="none"), "with pooling='none' there is none"),
    (dict(disentangled={"buckets": 8, "max_distance": 5}), "needs max_distance > buckets // 2 \\+ 1 \\(got 5\\)"),
    (dict(disentangled={"buckets": 8}, attention="linear"), "disentangled needs attention='softmax'"),
    (dict(disentangled={"buckets": 8, "projections": "own"}), "disentangled.projections='own' is not valid"),
    (dict(disentangled={"buckets": 8, "max_distance": -1}), "disentangled.max_distance=-1 must be >= 0"),
    (dict(disentangled={"buckets": 8}, relative_attention={"buckets": 32}), "disentangled with relative_attention"),
    (dict(disentangled={"buckets": 8}, positions="rotary"), "disentangled with positions='rotary'"),
])
def test_invalid_combinations_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        preset("tiny", **overrides)


@pytest.mark.parametrize("flat", [dict(disentangled_projections="separate"), dict(disentangled_norm=False)])
def test_a_format_1_file_shaping_disentangled_attention_without_buckets_is_refused(flat):
    # only format 1's flat fields can shape a disentangled attention that is off
    with pytest.raises(ConfigError, match="shapes disentangled; with disentangled_buckets=0 there is none"):
        EncoderConfig.from_dict({"format": 1, **flat})
    assert EncoderConfig.from_dict({"format": 1, "disentangled_buckets": 8, **flat}).disentangled == Disentangled(
        buckets=8, **{name[len("disentangled_"):]: value for name, value in flat.items()})


@pytest.mark.parametrize("overrides", VARIANTS[:5] + VARIANTS[-4:], ids=IDS[:5] + IDS[-4:])
def test_export_passes_the_gate(overrides, tmp_path):
    cfg = preset("tiny", **overrides)
    result = export(cfg, tmp_path / "m.onnx", seed=2)
    assert result.report["passed"]
    # the grid's longest sequence is what the offset leaves of the table
    assert max(c["sequence"] for c in result.report["cases"]) == cfg.max_sequence
