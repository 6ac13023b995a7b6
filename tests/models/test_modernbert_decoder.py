"""The ModernBERT decoder (Ettin decoders: ModernBERT's layers run causally, separate q / k / v, causal
sliding windows) against transformers."""
from __future__ import annotations

import pytest
import torch
from support.hf import (assert_matches_transformers, assert_only_the_import_matches, cases, hf_reference,
                        load_and_export, save_hf, transformers)

from ortformer.config import LocalAttention
from ortformer.models import load_any

SLIDING, FULL = "sliding_attention", "full_attention"
# layers [full, sliding, sliding] (global every 3rd), local_attention 8: the causal window i - 4 < j <= i;
# thetas far apart, so a swapped kind shows; weights wide enough that attention moves the outputs
SIZES = dict(initializer_range=0.5, vocab_size=120, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48,
             max_position_embeddings=64, local_attention=8, pad_token_id=0, bos_token_id=1, eos_token_id=2,
             cls_token_id=1, sep_token_id=2,
             rope_parameters={FULL: {"rope_type": "default", "rope_theta": 1000.0},
                              SLIDING: {"rope_type": "default", "rope_theta": 20.0}})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    config = transformers.ModernBertDecoderConfig(**SIZES)
    return save_hf(transformers.ModernBertDecoderForCausalLM, config, tmp_path_factory.mktemp("mbd") / "m", seed=1)


def test_eager_and_onnx_equal_transformers(saved, tmp_path):
    loaded, path = load_and_export(saved, tmp_path / "m.onnx")
    cfg = loaded.config
    assert loaded.family == "modernbert-decoder" and cfg.causal and cfg.embedding_norm and not cfg.first_block_norm
    assert cfg.rotary_theta == 1000.0
    assert cfg.local_attention == LocalAttention(window=7, global_every=3, global_offset=0, rotary_theta=20.0)
    assert max(c.sequence for c in cases(cfg)) > 4
    assert all(name.startswith(("lm_head.", "decoder.")) for name in loaded.dropped)
    reference = hf_reference(transformers.ModernBertDecoderModel, saved)
    assert assert_matches_transformers(loaded, reference, path, pad_id=0) >= 12


def test_without_the_window_the_model_differs(saved):
    loaded = load_any(saved)
    assert_only_the_import_matches(loaded, hf_reference(transformers.ModernBertDecoderModel, saved),
                                   local_attention=None)


@pytest.mark.parametrize("bias", [False, True])
def test_sequence_classifier_reads_the_last_token(tmp_path, bias):
    config = transformers.ModernBertDecoderConfig(**SIZES, num_labels=3, classifier_bias=bias)
    folder = save_hf(transformers.ModernBertDecoderForSequenceClassification, config, tmp_path / "m", seed=2,
                     random_biases=True)
    loaded = load_any(folder)
    cfg = loaded.config
    head = cfg.classifier
    assert (head.labels, head.pooling, head.pad_id, head.norm) == (3, "last", 0, True)
    model = transformers.ModernBertDecoderForSequenceClassification.from_pretrained(str(folder)).eval()
    ids = torch.randint(3, 120, (3, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    ids[1, 6:], mask[1, 6:] = 0, 0  # right padding with the pad id
    ids[2, :2], mask[2, :2] = 0, 0  # left padding
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ids, mask)["logits"], model(input_ids=ids, attention_mask=mask).logits,
                                   atol=2e-5, rtol=0)


@pytest.mark.parametrize("function, hf, message", [
    ("classifier_head", {"architectures": ["ModernBertDecoderForSequenceClassification"], "classifier_bias": "yes"},
     "classifier_bias='yes' must be true or false"),
    ("mlm_head", {"decoder_bias": "no", "vocab_size": 10}, "decoder_bias='no' must be true or false"),
])
def test_head_flags_must_be_booleans(function, hf, message):
    from ortformer.core.errors import CheckpointError
    from ortformer.models.hf import heads

    model_type = "modernbert-decoder" if function == "classifier_head" else "modernbert"
    with pytest.raises(CheckpointError, match=message):
        getattr(heads, function)(hf, model_type, "m")
