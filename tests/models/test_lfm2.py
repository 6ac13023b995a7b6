"""LFM2 (causal hybrid: gated short convolutions and grouped-query attention with q / k norms) against
transformers' Lfm2Model, and LFM2-ColBERT's PyLate layout (the per-token Dense head of late interaction)."""
from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch
from support.hf import (GATE, assert_matches_transformers, cases, hf_reference,
                        inputs_for, load_and_export, save_hf, transformers, with_config)
from support.late import pylate_layout

from ortformer import contract
from ortformer.config import ShortConv, TokenDense
from ortformer.core.errors import CheckpointError
from ortformer.models import load_any

CONV, FULL = "conv", "full_attention"
# conv, full, conv, conv: a conv layer first and last, one attention layer between; 4 query heads on 2 K / V
# heads; 4 taps, so a token reads three before it; an inner width that the 2/3 and rounding rules change
SIZES = dict(vocab_size=120, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=96, block_multiple_of=16, block_ffn_dim_multiplier=1.5, conv_L_cache=4,
             max_position_embeddings=64, layer_types=[CONV, FULL, CONV, CONV],
             rope_parameters={"rope_type": "default", "rope_theta": 1000.0})


def tiny_config(**changes):
    return transformers.Lfm2Config(**{**SIZES, **changes})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return save_hf(transformers.Lfm2Model, tiny_config(), tmp_path_factory.mktemp("lfm2") / "m", seed=1)


def test_eager_and_onnx_equal_transformers(saved, tmp_path):
    loaded, path = load_and_export(saved, tmp_path / "m.onnx")
    cfg = loaded.config
    assert loaded.family == "lfm2" and not loaded.dropped
    assert cfg.short_conv == ShortConv(kernel_size=4, layers=(0, 2, 3))
    # int(2 * 96 / 3) = 64, times 1.5 = 96, rounded up to a multiple of 16: 96
    assert (cfg.causal, cfg.qk_norm, cfg.num_kv_heads, cfg.ffn_size, cfg.rotary_theta) == (True, True, 2, 96, 1000.0)
    # left padding too: padded rows are zeroed before each convolution, and rotary scores depend on i - j only
    assert assert_matches_transformers(loaded, hf_reference(transformers.Lfm2Model, saved), path, pad_id=0) >= 12


def test_with_the_taps_reversed_the_model_differs(saved):
    """A mutation check: the taps' order matters (a convolution read the other way round, which
    torch's cross-correlation against a true convolution would be, does not match)."""
    loaded = load_any(saved)
    want = hf_reference(transformers.Lfm2Model, saved)
    ids, mask = torch.tensor([[5, 9, 17, 3, 44, 8, 61, 2, 30]]), torch.ones(1, 9, dtype=torch.long)
    with torch.no_grad():
        reference = want(input_ids=ids, attention_mask=mask).last_hidden_state
        assert (loaded.model(ids, mask)["last_hidden_state"] - reference).abs().max() < 1e-4
        for layer in loaded.config.short_conv.layers:
            conv = loaded.model.blocks[layer].attention.conv
            conv.weight.copy_(conv.weight.flip(-1))
        # far outside the float32 gate the parity tests hold the import to
        assert (loaded.model(ids, mask)["last_hidden_state"] - reference).abs().max() > 10 * GATE["max_abs"]


def test_older_config_keys_and_the_causal_lm_layout(tmp_path):
    """Lfm2ForCausalLM's state dict ("model." prefix, a tied head left out) with the older keys:
    full_attn_idxs instead of layer_types, block_ff_dim for intermediate_size."""
    config = tiny_config(layer_types=None, full_attn_idxs=[1, 3])
    folder = save_hf(transformers.Lfm2ForCausalLM, config, tmp_path / "m", seed=2)
    data = json.loads((folder / "config.json").read_text())
    data.pop("layer_types")
    data["block_ff_dim"] = data.pop("intermediate_size")
    (folder / "config.json").write_text(json.dumps(data))
    loaded = load_any(folder)
    assert loaded.config.short_conv.layers == (0, 2)
    assert_matches_transformers(loaded, hf_reference(transformers.Lfm2Model, folder), None, pad_id=0)


def test_lfm2_colbert_pylate_layout_gives_normalised_token_vectors(saved, tmp_path):
    """LFM2-ColBERT: a PyLate folder (Transformer, then a bias-free Dense) over an LFM2 backbone; the
    file's token_embeddings are normalize(W h_i) of transformers' hidden states, over the grid."""
    import shutil

    folder = tmp_path / "colbert"
    shutil.copytree(saved, folder)
    torch.manual_seed(3)
    dense = torch.randn(16, 32) / 4
    pylate_layout(folder, dense, {"query_prefix": "[Q] ", "document_prefix": "[D] ", "query_length": 12,
                                  "document_length": 20, "do_query_expansion": True,
                                  "attend_to_expansion_tokens": False, "skiplist_words": [], "model_type": "ColBERT"})
    loaded, path = load_and_export(folder, tmp_path / "colbert.onnx")
    assert loaded.config.token_dense == TokenDense(size=16)
    hf = hf_reference(transformers.Lfm2Model, folder)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for i, case in enumerate(cases(loaded.config)):
        feeds = inputs_for(loaded.config, case, pad_id=0, seed=i)
        with torch.no_grad():
            hidden = hf(**{k: torch.from_numpy(v) for k, v in feeds.items()}).last_hidden_state
        want = torch.nn.functional.normalize(hidden @ dense.T, dim=-1).numpy()
        got = session.run([contract.TOKEN_EMBEDDINGS], feeds)[0]
        keep = feeds["attention_mask"].astype(bool)
        assert np.abs(got - want)[keep].max() <= GATE["max_abs"], case


@pytest.mark.parametrize("change, message", [
    ({"conv_bias": True}, "conv_bias=True is not supported"),
    ({"layer_types": [CONV, "sliding_attention", CONV, CONV]}, "layer_types=.* is not supported"),
    ({"num_key_value_heads": 3}, "num_key_value_heads=3 is not supported"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 10.0, "factor": 4.0}}, "rope_type='yarn' is not supported"),
])
def test_unsupported_configs_are_refused(saved, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_any(with_config(saved, tmp_path / "m", change))
