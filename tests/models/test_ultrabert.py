"""UltraBERT (Llama layers run bidirectionally, sliding windows with the global layer last in each
group, a rotary theta per layer kind) against transformers."""
from __future__ import annotations

import json

import pytest
import torch
from support.hf import assert_matches_transformers, cases, hf_reference, load_and_export, save_hf, transformers, with_config

from ortformer.config import Classifier, LocalAttention
from ortformer.core.errors import CheckpointError
from ortformer.models import load_any

SLIDING, FULL = "sliding_attention", "full_attention"
# layers [sliding, sliding, full, sliding] (the default pattern), a radius of 3, 2 K/V heads for 4 query
# heads; thetas far apart, so a swapped theta, window or pattern shows
SIZES = dict(vocab_size=120, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, sliding_window=3, max_position_embeddings=64,
             rope_parameters={FULL: {"rope_type": "default", "rope_theta": 1000.0},
                              SLIDING: {"rope_type": "default", "rope_theta": 20.0}})


def tiny_config(**changes):
    return transformers.UltrabertConfig(**{**SIZES, **changes})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return save_hf(transformers.UltrabertModel, tiny_config(), tmp_path_factory.mktemp("ultrabert") / "m", seed=1)


def test_eager_and_onnx_equal_transformers(saved, tmp_path):
    loaded, path = load_and_export(saved, tmp_path / "m.onnx")
    cfg = loaded.config
    assert loaded.family == "ultrabert" and not loaded.dropped
    # the radius 3 is a window of 6 (|i - j| <= window // 2); layer 2 of each 3 is global
    assert cfg.local_attention == LocalAttention(window=6, global_every=3, global_offset=2, rotary_theta=20.0)
    assert (cfg.causal, cfg.rotary_theta, cfg.norm, cfg.norm_position) == (False, 1000.0, "rmsnorm", "pre")
    assert max(c.sequence for c in cases(cfg)) > 7  # rows longer than the window
    assert assert_matches_transformers(loaded, hf_reference(transformers.UltrabertModel, saved), path, pad_id=0) >= 12


def test_older_per_layer_keys(saved, tmp_path):
    """Older checkpoints list a window and a theta per layer (attention_windows, rope_theta)."""
    folder = with_config(saved, tmp_path / "m", {"attention_windows": [3, 3, 0, 3], "rope_theta": [20.0, 20.0, 1000.0, 20.0],
                                                  "sliding_window": 128})
    config = json.loads((folder / "config.json").read_text())
    for key in ("layer_types", "rope_parameters"):
        del config[key]
    (folder / "config.json").write_text(json.dumps(config))
    loaded = load_any(folder)
    cfg = loaded.config
    assert cfg.local_attention == LocalAttention(window=6, global_every=3, global_offset=2, rotary_theta=20.0)
    assert cfg.rotary_theta == 1000.0
    assert_matches_transformers(loaded, hf_reference(transformers.UltrabertModel, folder), None, pad_id=0)


@pytest.mark.parametrize("task, pooling", [("sequence", "cls"), ("sequence", "mean"), ("token", "cls")])
def test_classifiers(task, pooling, tmp_path):
    model_cls = transformers.UltrabertForSequenceClassification if task == "sequence" else \
        transformers.UltrabertForTokenClassification
    folder = save_hf(model_cls, tiny_config(num_labels=3, classifier_pooling=pooling), tmp_path / "m", seed=3)
    loaded = load_any(folder)
    cfg = loaded.config
    assert cfg.classifier == Classifier(labels=3, per_token=task == "token", pooling=pooling, dense="none")
    assert not loaded.dropped
    torch.manual_seed(0)
    ids = torch.randint(1, 120, (2, 11))
    mask = torch.tensor([[1] * 11, [1] * 6 + [0] * 5])
    with torch.no_grad():
        want = model_cls.from_pretrained(folder, attn_implementation="eager").eval()(input_ids=ids, attention_mask=mask).logits
        got = loaded.model(ids, mask)["logits"]
    keep = mask.bool() if task == "token" else torch.ones(2, dtype=torch.bool)
    torch.testing.assert_close(got[keep], want[keep], atol=2e-5, rtol=0)


def test_masked_lm_head_is_dropped(tmp_path):
    folder = save_hf(transformers.UltrabertForMaskedLM, tiny_config(), tmp_path / "m", seed=4)
    loaded = load_any(folder)
    assert loaded.dropped and all(name.startswith(("head.", "cls.")) for name in loaded.dropped)
    assert_matches_transformers(loaded, hf_reference(transformers.UltrabertModel, folder), None, pad_id=0)


@pytest.mark.parametrize("change, message", [
    ({"sliding_window": 0}, "sliding_window=0 is not supported"),
    ({"rope_parameters": None, "rope_theta": 5000.0}, "rope_theta=5000.0 is not supported; UltraBERT lists one theta per layer"),
    ({"layer_types": None, "attention_windows": [3, 0, 0, 3]}, "attention_windows gives layers"),
    ({"layer_types": [FULL, SLIDING, FULL, FULL]}, "a global layer every k layers"),
    ({"attention_windows": [3, 3]}, "attention_windows=.* is not supported"),
    ({"architectures": ["UltrabertForSequenceClassification"], "classifier_pooling": "max"},
     "classifier_pooling='max' is not supported"),
    ({"rope_parameters": {FULL: {"rope_type": "yarn", "rope_theta": 10.0, "factor": 4.0}}}, "rope_type='yarn'"),
])
def test_unsupported_configs_are_refused(saved, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_any(with_config(saved, tmp_path / "m", change))
