"""What real folders carry: legacy gamma / beta LayerNorm names (in the encoder and in the SPLADE
head), a masked-LM decoder tied to the token table (one initializer in the ONNX file), and what
`ortformer info` shows of a SPLADE model (its prompts, no per-vocabulary label list)."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from models.test_splade import TEXTS, VOCAB, sparse_folder, their_weights
from safetensors.torch import load_file, save_file
from support.hf import assert_matches_transformers, hf_reference, load_and_export, save_hf, transformers

from ortformer.core.errors import CheckpointError
from ortformer.models import load_any
from ortformer.runtime import Runtime

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48)


def legacy_spelling(folder, *, also_current: bool = False) -> list[str]:
    """Rewrite ``folder``'s model.safetensors with every LayerNorm named gamma / beta, as TF-era saves
    (and folders re-saved from them) have it; returns the renamed names."""
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    renamed = {}
    for name, tensor in tensors.items():
        old = name.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        renamed[old] = tensor.clone()
        if also_current and old != name:
            renamed[name] = tensor.clone()
    save_file(renamed, str(path), metadata={"format": "pt"})
    return sorted(set(renamed) - set(tensors))


ENCODERS = {
    "bert": lambda: (transformers.BertModel, transformers.BertConfig(vocab_size=99, max_position_embeddings=64, **SMALL), 0),
    "roberta": lambda: (transformers.RobertaModel, transformers.RobertaConfig(
        vocab_size=99, max_position_embeddings=66, pad_token_id=1, **SMALL), 1),
    "electra": lambda: (transformers.ElectraModel, transformers.ElectraConfig(
        vocab_size=99, embedding_size=16, max_position_embeddings=64, **SMALL), 0),
    "mpnet": lambda: (transformers.MPNetModel, transformers.MPNetConfig(
        vocab_size=99, max_position_embeddings=66, pad_token_id=1, **SMALL), 1),
    "deberta-v2": lambda: (transformers.DebertaV2Model, transformers.DebertaV2Config(
        vocab_size=99, max_position_embeddings=64, relative_attention=True, position_buckets=8,
        pos_att_type=["c2p", "p2c"], position_biased_input=False, **SMALL), 0),
}


@pytest.mark.parametrize("family", sorted(ENCODERS))
def test_legacy_layer_norm_names_import_as_transformers_loads_them(tmp_path, family):
    cls, config, pad_id = ENCODERS[family]()
    folder = save_hf(cls, config, tmp_path / family)
    assert any(n.endswith("LayerNorm.gamma") for n in legacy_spelling(folder))
    hf = hf_reference(cls, folder)  # transformers renames LayerNorm.gamma / beta on load
    loaded, path = load_and_export(folder, tmp_path / "m.onnx")
    assert assert_matches_transformers(loaded, hf, path, pad_id) > 0


def test_a_splade_head_saved_with_gamma_beta_exports_and_equals_sentence_transformers(tmp_path):
    """The reported real folder: BERT's cls.predictions.transform.LayerNorm saved as gamma / beta."""
    folder = sparse_folder(tmp_path, "bert")
    renamed = legacy_spelling(folder)
    assert "cls.predictions.transform.LayerNorm.gamma" in renamed
    _, path = load_and_export(folder, tmp_path / "m.onnx", text=True)
    np.testing.assert_allclose(Runtime(path, "cpu").embed_texts(TEXTS), their_weights(folder, TEXTS),
                               atol=2e-4, rtol=1e-4)


def test_a_parameter_saved_under_both_spellings_is_refused(tmp_path):
    cls, config, _ = ENCODERS["bert"]()
    folder = save_hf(cls, config, tmp_path / "bert")
    legacy_spelling(folder, also_current=True)
    with pytest.raises(CheckpointError, match=r"holds both .*LayerNorm\.(gamma|beta) and .*LayerNorm\.(weight|bias)"):
        load_any(folder)


def _big_initializers(path, floor: int) -> list[str]:
    return [t.name for t in onnx.load(str(path)).graph.initializer if int(np.prod(t.dims)) >= floor]


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_a_tied_decoder_is_one_initializer_and_keeps_parity(tmp_path, family):
    folder = sparse_folder(tmp_path, family)
    loaded, path = load_and_export(folder, tmp_path / "m.onnx", text=True)
    assert loaded.model.classifier.weight is loaded.model.tokens.weight
    hidden = loaded.config.hidden_size
    assert len(_big_initializers(path, VOCAB * hidden)) == 1  # the token table, read by Gather and decoder
    table_bytes = VOCAB * hidden * 4
    assert path.stat().st_size < 1.5 * table_bytes  # one table of V x F float32 (and a small encoder), not two
    np.testing.assert_allclose(Runtime(path, "cpu").embed_texts(TEXTS), their_weights(folder, TEXTS),
                               atol=2e-4, rtol=1e-4)


def test_an_untied_decoder_keeps_its_own_weights(tmp_path):
    """A decoder saved with other values than the token table (tie_word_embeddings false) stays two tables."""
    cls, config = transformers.BertForMaskedLM, transformers.BertConfig(
        vocab_size=VOCAB, max_position_embeddings=128, tie_word_embeddings=False, **SMALL)
    mlm = save_hf(cls, config, tmp_path / "mlm")
    folder = sparse_folder(tmp_path, "bert")
    for name in ("config.json", "model.safetensors"):  # the SPLADE layout around the untied model
        (folder / name).write_bytes((mlm / name).read_bytes())
    loaded = load_any(folder)
    assert loaded.model.classifier.weight is not loaded.model.tokens.weight
    want = load_file(str(mlm / "model.safetensors"))["cls.predictions.decoder.weight"]
    assert torch.equal(loaded.model.classifier.weight.detach(), want)


def test_a_tied_model_saves_as_an_ortformer_checkpoint(tmp_path):
    from ortformer.models import load_checkpoint, save_checkpoint

    loaded = load_any(sparse_folder(tmp_path, "bert"))
    save_checkpoint(loaded.model, tmp_path / "ckpt")
    again = load_checkpoint(tmp_path / "ckpt")
    assert torch.equal(again.classifier.weight, loaded.model.tokens.weight.detach())


def test_info_shows_every_prompt_and_no_vocabulary_labels(tmp_path):
    from click.testing import CliRunner

    from ortformer.cli import cli

    folder = sparse_folder(tmp_path, "bert")
    st_config = folder / "config_sentence_transformers.json"
    st_config.write_text(json.dumps({**json.loads(st_config.read_text()), "default_prompt_name": "query",
                                     "prompts": {"query": "query: ", "document": "passage: "}}))
    _, path = load_and_export(folder, tmp_path / "m.onnx", text=True)
    assert Runtime(path, "cpu").labels == []
    text = CliRunner().invoke(cli, ["info", str(path)]).output
    assert "LABEL_" not in text and "per token over the 30,522-entry vocabulary" in text
    assert "prompts     2 " in text and "document: 'passage: '" in text and "query (default): 'query: '" in text
    report = json.loads(CliRunner().invoke(cli, ["info", str(path), "--json"]).output)
    assert report["labels"] == []
    assert report["prompts"] == {"prompts": {"query": "query: ", "document": "passage: "}, "default": "query"}
