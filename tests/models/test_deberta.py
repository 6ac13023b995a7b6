"""DeBERTa (v1) import, and DeBERTa-v2 folders with v1's relative-attention parts, against transformers."""
from __future__ import annotations

import pytest
from support.hf import (assert_matches_transformers, cases, hf_reference, load_and_export, save_hf, transformers,
                        with_config)

from ortformer.config import Disentangled
from ortformer.core.errors import CheckpointError
from ortformer.models import load_any

# deberta-base's layout: plain distances up to max_position_embeddings, no absolute positions
V1 = dict(relative_attention=True, max_relative_positions=-1, pos_att_type="c2p|p2c", position_biased_input=False,
          type_vocab_size=0)


def tiny_config(**changes):
    base = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                max_position_embeddings=24, layer_norm_eps=1e-7, **V1)
    return transformers.DebertaConfig(**{**base, **changes})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = save_hf(transformers.DebertaModel, tiny_config(), tmp_path_factory.mktemp("deberta") / "m", seed=1)
    return folder, hf_reference(transformers.DebertaModel, folder)


def test_v1_layout_eager_and_onnx_equal_transformers(saved, tmp_path):
    loaded, path = load_and_export(saved[0], tmp_path / "m.onnx")
    cfg = loaded.config
    assert loaded.family == "deberta" and cfg.positions == "none"
    assert cfg.disentangled == Disentangled(buckets=24, max_distance=0, projections="separate", norm=False)
    assert assert_matches_transformers(loaded, saved[1], path, pad_id=0) >= 12


def test_distances_past_max_relative_positions_are_clamped(tmp_path):
    # S = 6 over sequences up to 24: |i - j| >= 6 reads the table's first or last row, as transformers' clamp
    config = tiny_config(max_relative_positions=6, position_biased_input=True, type_vocab_size=2, hidden_act="relu")
    folder = save_hf(transformers.DebertaModel, config, tmp_path / "m", seed=2)
    loaded = load_any(folder)
    assert (loaded.config.disentangled.buckets, loaded.config.positions, loaded.config.type_vocab_size) == (
        6, "learned", 2)
    assert max(c.sequence for c in cases(loaded.config)) > 12
    assert_matches_transformers(loaded, hf_reference(transformers.DebertaModel, folder), None, pad_id=0)


def test_the_in_proj_rows_are_regrouped_per_head(saved):
    """A mutation check: reading in_proj as [Q; K; V] (not interleaved per head) must not match."""
    import torch

    from ortformer.models.hf.families import deberta

    loaded = load_any(saved[0])
    qkv = loaded.model.state_dict()["blocks.0.attention.qkv.weight"]
    raw = transformers.DebertaModel.from_pretrained(saved[0]).state_dict()["encoder.layer.0.attention.self.in_proj.weight"]
    assert not torch.allclose(qkv[32:64], raw[32:64])  # K rows are not the file's second third
    assert torch.equal(qkv[32:40], raw[8:16])  # head 0's keys follow its 8 query rows
    assert deberta.WHAT.strip() == "DeBERTa"


def test_sequence_classifier_keeps_its_pooler_and_labels(tmp_path):
    config = tiny_config(num_labels=3, pooler_hidden_act="gelu_new", id2label={0: "neg", 1: "neu", 2: "pos"},
                         label2id={"neg": 0, "neu": 1, "pos": 2})
    folder = save_hf(transformers.DebertaForSequenceClassification, config, tmp_path / "m", seed=3)
    loaded = load_any(folder)  # the head's ONNX path is the other families' (test_classifier_heads.py)
    cfg = loaded.config
    assert (cfg.classifier.labels, cfg.classifier.dense, cfg.classifier.per_token) == (3, "gelu_tanh", False)
    assert loaded.labels == ("neg", "neu", "pos")
    import torch

    model = transformers.DebertaForSequenceClassification.from_pretrained(folder).eval()
    ids = torch.tensor([[1, 5, 7, 9, 2, 0], [1, 8, 2, 0, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
        got = loaded.model(ids, mask)["logits"]
    torch.testing.assert_close(got, want, atol=2e-5, rtol=0)


def test_tokenizer_built_from_vocab_and_merges_equals_transformers(saved, tmp_path):
    """Folders saved with vocab.json + merges.txt only get DeBERTa's byte-level BPE with [CLS] / [SEP]."""
    import shutil

    tokenizers = pytest.importorskip("tokenizers")
    from ortformer.models.hf.vocab_tokenizers import built_tokenizer

    folder = shutil.copytree(saved[0], tmp_path / "m")
    words = ["hello", "world", "the", "quick", "fox", "lazy", "dog"]
    chars = sorted({c for w in words for c in "Ġ" + w})
    vocab = {t: i for i, t in enumerate(["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]", *chars])}
    merges = []
    for w in words:  # merge each word left to right, with its leading space
        piece = "Ġ"
        for c in w:
            merges.append(f"{piece} {c}")
            piece += c
            vocab.setdefault(piece, len(vocab))
    (folder / "vocab.json").write_text(__import__("json").dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(dict.fromkeys(merges)) + "\n")
    reference = transformers.DebertaTokenizer.from_pretrained(folder)
    built = tokenizers.Tokenizer.from_file(str(built_tokenizer(folder, folder, "deberta")))
    for text in ("hello world", " the quick fox", "lazy dog [MASK] world"):
        assert built.encode(text).ids == reference(text)["input_ids"], text
    pair = built.encode("hello world", "the dog")
    ids = [vocab[t] for t in ("[CLS]",)] + built.encode("hello world", add_special_tokens=False).ids
    assert pair.ids[: len(ids) + 1] == ids + [vocab["[SEP]"]]  # [CLS] A [SEP] B [SEP], as the original DeBERTa
    assert pair.type_ids[-1] == 1 and pair.ids.count(vocab["[SEP]"]) == 2


def test_v2_folders_with_v1_relative_attention_equal_transformers(tmp_path):
    """DeBERTa-v2 with share_att_key=false, no relative LayerNorm and plain distances."""
    config = transformers.DebertaV2Config(
        vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
        max_position_embeddings=24, relative_attention=True, position_buckets=-1, max_relative_positions=10,
        pos_att_type=["p2c", "c2p"], share_att_key=False, norm_rel_ebd="none", position_biased_input=False,
        type_vocab_size=0)
    folder = save_hf(transformers.DebertaV2Model, config, tmp_path / "m", seed=4)
    loaded = load_any(folder)  # eager: the ONNX path is v1's, exported above
    cfg = loaded.config
    assert cfg.disentangled == Disentangled(buckets=10, max_distance=0, projections="separate", norm=False)
    assert_matches_transformers(loaded, hf_reference(transformers.DebertaV2Model, folder), None, pad_id=0)


@pytest.mark.parametrize("change, message", [
    ({"talking_head": True}, "talking_head=true is not supported"),
    ({"pos_att_type": "c2p"}, r"pos_att_type='c2p' is not supported"),
    ({"embedding_size": 16}, "embedding_size=16 != hidden_size=32"),
    ({"hidden_act": "quick_gelu"}, "hidden_act"),
])
def test_unsupported_configs_are_refused(saved, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_any(with_config(saved[0], tmp_path / "m", change))
