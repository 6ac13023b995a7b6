"""Folders whose tokenizer is only a sentencepiece model (DeBERTa-v3's spm.model, XLM-R's
sentencepiece.bpe.model, T5's spiece.model) get a tokenizer.json built from it: the same ids as
transformers' own tokenizer for that folder, and the same embeddings end to end."""
from __future__ import annotations

import io
import json

import pytest
from support.hf import (assert_same_embeddings, load_and_export, mean_pooling_layout, save_hf, st_embeddings,
                        transformers)

from ortformer.core.corpus import sentences
from ortformer.core.errors import CheckpointError
from ortformer.models import load_any
from ortformer.models.hf.spm_tokenizers import read_spm
from ortformer.models.hf.vocab_tokenizers import built_tokenizer
from ortformer.runtime import Runtime
from ortformer.config.text import TextEncoder

spm = pytest.importorskip("sentencepiece")
pytest.importorskip("tokenizers")
TEXTS = ["Hello world", "``quoted'' 9,000 and 1,5 ,, 10,", "  leading and   inner   spaces ", "Café naïve ÅÄÖ 東京 über ﬁne ① ＡＢＣ", "tab\there\nnewline\r\nend",
         "It's 3.14 — yes!!! (maybe)", "", " ", "UPPER lower MiXeD", "emoji 😀 and zwj 👩‍💻", "x" * 300,
         "specials [MASK] [CLS] [SEP] [PAD] <mask> <s> </s> <pad> <unk> <extra_id_0> <extra_id_99> <sym>",
         "Ελληνικά σίσυφος ΣΊΣΥΦΟΣ", "a\u00a0b\u2003c\u200bd", "ｆｕｌｌｗｉｄｔｈ ｶﾀｶﾅ", "<sep> a <cls> b <q> the▁the"]
PAIR = ("a first text", "and a second, longer one")
# model_type -> (file name, the trainer's special pieces as the family's released models have them, class)
FAMILIES = {
    "deberta-v2": ("spm.model", dict(pad_id=0, pad_piece="[PAD]", bos_id=1, bos_piece="[CLS]", eos_id=2,
                                     eos_piece="[SEP]", unk_id=3, unk_piece="[UNK]"), "DebertaV2Tokenizer"),
    "xlm-roberta": ("sentencepiece.bpe.model", {}, "XLMRobertaTokenizer"),
    "camembert": ("sentencepiece.bpe.model", {}, "CamembertTokenizer"),
    "albert": ("spiece.model", dict(pad_id=0, pad_piece="<pad>", unk_id=1, bos_id=-1, eos_id=-1,
                                    control_symbols=["[CLS]", "[SEP]", "[MASK]"]), "AlbertTokenizer"),
    "t5": ("spiece.model", dict(pad_id=0, eos_id=1, unk_id=2, bos_id=-1), "T5Tokenizer"),
    "mt5": ("spiece.model", dict(pad_id=0, eos_id=1, unk_id=2, bos_id=-1), "T5Tokenizer"),
}
CASES = [("deberta-v2", {}, ()), ("deberta-v2", {"do_lower_case": True}, ()),
         ("deberta-v2", {"split_by_punct": True, "add_prefix_space": False}, ()),
         ("deberta-v2", {"added_tokens_decoder": {"400": {"content": "[MASK]", "special": True}}}, ("<sym>",)),
         ("xlm-roberta", {}, ()), ("xlm-roberta", {"add_prefix_space": False}, ()),
         ("camembert", {}, ()), ("camembert", {"add_prefix_space": False}, ("<sym>",)),
         ("albert", {}, ()), ("albert", {"do_lower_case": False, "keep_accents": True}, ("<sym>",)),
         ("t5", {}, ()), ("t5", {"extra_ids": 0}, ("<sym>",)), ("mt5", {"extra_ids": 7}, ()),
         # saves older than transformers 4.34 name extra special tokens only here
         ("deberta-v2", {"additional_special_tokens": ["[MASK]", "<sep>", "▁the"]}, ()),
         ("xlm-roberta", {"additional_special_tokens": ["<sep>", "<cls>"]}, ("<sym>",)),
         ("t5", {"extra_ids": 3, "additional_special_tokens": ["<extra_id_0>", "<extra_id_1>", "<extra_id_2>", "<q>"]}, ())]


def train_spm(model_type="unigram", vocab_size=400, user_symbols=(), **specials) -> bytes:
    """A small sentencepiece model trained here on real sentences."""
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences(600)), model_writer=out, vocab_size=vocab_size,
                                   model_type=model_type, character_coverage=1.0, hard_vocab_limit=False,
                                   minloglevel=2, user_defined_symbols=list(user_symbols), **specials)
    return out.getvalue()


def spm_folder(folder, model_type, settings, user_symbols=()):
    name, specials, cls = FAMILIES[model_type]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(train_spm(user_symbols=user_symbols, **specials))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": cls, **settings}))
    if not (folder / "config.json").exists():
        (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    return folder


@pytest.mark.parametrize("model_type, settings, user_symbols", CASES)
def test_ids_match_transformers_tokenizer(tmp_path, model_type, settings, user_symbols):
    folder = spm_folder(tmp_path / model_type, model_type, settings, user_symbols)
    path = built_tokenizer(folder, folder, model_type)
    assert path is not None and not (folder / "tokenizer.json").exists()  # the folder is read, never written
    theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
    ours = TextEncoder(path)
    ids, _, _ = ours.encode(TEXTS, 10_000)
    assert ids == [theirs(t)["input_ids"] for t in TEXTS]
    from tokenizers import Tokenizer

    assert Tokenizer.from_file(str(path)).encode(*PAIR).ids == theirs(*PAIR)["input_ids"]
    assert ours.vocab_size == len(theirs)


def test_a_deberta_v3_folder_with_only_spm_model_embeds_as_sentence_transformers(tmp_path):
    pytest.importorskip("sentence_transformers")
    config = transformers.DebertaV2Config(
        vocab_size=420, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48,
        max_position_embeddings=64, relative_attention=True, position_buckets=8, max_relative_positions=-1,
        pos_att_type=["p2c", "c2p"], share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False,
        type_vocab_size=0, pad_token_id=0)
    folder = save_hf(transformers.DebertaV2Model, config, tmp_path / "deberta")
    spm_folder(folder, "deberta-v2", {"do_lower_case": False})
    mean_pooling_layout(folder, 32, 48)
    loaded, path = load_and_export(folder, tmp_path / "m.onnx", text=True)
    assert loaded.tokenizer is not None
    texts = [t for t in TEXTS if t.strip()]
    assert_same_embeddings(Runtime(path, "cpu").embed_texts(texts), st_embeddings(folder, texts))


SMALL = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48)
# a sentencepiece-only folder of each family (older CamemBERT and ALBERT releases ship no tokenizer.json)
SPM_ONLY_MODELS = {
    "camembert": lambda: (transformers.CamembertModel, transformers.CamembertConfig(
        vocab_size=420, max_position_embeddings=70, pad_token_id=1, **SMALL)),
    "albert": lambda: (transformers.AlbertModel, transformers.AlbertConfig(
        vocab_size=420, embedding_size=16, max_position_embeddings=64, pad_token_id=0, **SMALL)),
}


@pytest.mark.parametrize("model_type", sorted(SPM_ONLY_MODELS))
def test_a_sentencepiece_only_folder_embeds_texts_as_sentence_transformers(tmp_path, model_type):
    pytest.importorskip("sentence_transformers")
    cls, config = SPM_ONLY_MODELS[model_type]()
    folder = save_hf(cls, config, tmp_path / model_type)
    spm_folder(folder, model_type, {})
    mean_pooling_layout(folder, 32, 48)
    loaded, path = load_and_export(folder, tmp_path / "m.onnx", text=True)
    assert loaded.tokenizer is not None
    # RoBERTa-style positions count the tokens the attention mask keeps (layers.Positions);
    # transformers counts ids other than <pad>, so only a literal "<pad>" in a text tells them apart
    texts = [t for t in TEXTS if t.strip() and "<pad>" not in t]
    assert_same_embeddings(Runtime(path, "cpu").embed_texts(texts), st_embeddings(folder, texts))


def test_bad_sentencepiece_models_are_refused_by_name(tmp_path):
    folder = spm_folder(tmp_path / "t5", "t5", {})
    model = folder / "spiece.model"
    good = model.read_bytes()
    assert [p for p, _, _ in read_spm(model).pieces[:3]] == ["<pad>", "</s>", "<unk>"]
    for broken, why in [(good[:len(good) // 2], "not a sentencepiece model"), (b"", "holds no pieces"),
                        (b"\x0a\x02\x10\x01", "has no text"), (b"\x0f", "wire type 7")]:
        model.write_bytes(broken)
        with pytest.raises(CheckpointError, match=why):
            built_tokenizer(folder, folder, "t5")
    # a corrupt precompiled charsmap: the tokenizers library's own error, typed
    model.write_bytes(b"\x0a\x09\x0a\x05<unk>\x18\x02" + b"\x1a\x04\x12\x02\xff\xff")
    with pytest.raises(CheckpointError, match="cannot build a tokenizer from the files"):
        built_tokenizer(folder, folder, "t5")
    (folder / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": [1]}))
    model.write_bytes(good)
    with pytest.raises(CheckpointError, match="added_tokens_decoder must map ids to tokens"):
        built_tokenizer(folder, folder, "t5")
    (folder / "tokenizer_config.json").write_text(json.dumps({"additional_special_tokens": "<sep>"}))
    with pytest.raises(CheckpointError, match="additional_special_tokens must be a list of tokens, got str"):
        built_tokenizer(folder, folder, "t5")
    (folder / "tokenizer_config.json").write_text(json.dumps({"extra_ids": 10 ** 9}))
    with pytest.raises(CheckpointError, match="extra_ids=1000000000 must be a whole number in 0..10000"):
        built_tokenizer(folder, folder, "t5")
    # a BPE-type model is not converted: no tokenizer (export says how to write one), no error
    (folder / "tokenizer_config.json").write_text("{}")
    model.write_bytes(train_spm("bpe", **FAMILIES["t5"][1]))
    assert built_tokenizer(folder, folder, "t5") is None


def test_a_t5_encoder_folder_with_only_spiece_model_takes_text(tmp_path):
    config = transformers.T5Config(vocab_size=520, d_model=32, d_kv=8, d_ff=48, num_layers=1, num_heads=4,
                                   relative_attention_num_buckets=8, feed_forward_proj="relu")
    folder = save_hf(transformers.T5EncoderModel, config, tmp_path / "t5")
    spm_folder(folder, "t5", {})
    loaded = load_any(folder)
    assert loaded.tokenizer is not None
    theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
    ids, _, _ = TextEncoder(loaded.tokenizer).encode(TEXTS, 10_000)
    assert ids == [theirs(t)["input_ids"] for t in TEXTS]
