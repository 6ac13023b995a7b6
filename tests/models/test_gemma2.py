"""Gemma 2 (causal, sandwich norms, attention logit soft-capping, causal sliding windows)
against transformers."""
from __future__ import annotations

import json

import pytest
import torch
from support.hf import (assert_matches_transformers, assert_only_the_import_matches, cases, hf_reference,
                        load_and_export, transformers, with_config)

from ortformer.config import EncoderConfig, RelativeAttention
from ortformer.core.errors import CheckpointError, ConfigError
from ortformer.models import load_any

SLIDING, FULL = "sliding_attention", "full_attention"
# heads of 24 on a width of 32 (not hidden / heads), one K/V head for two query heads, a query scalar of
# 12 (not the head size), biased attention Linears, and a cap of 1.5 that bites: the q / k weights are
# scaled up so scores reach several units (at init they stay near 0, where c tanh(s / c) = s)
SIZES = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
             head_dim=24, query_pre_attn_scalar=12, intermediate_size=48, max_position_embeddings=64,
             attn_logit_softcapping=1.5, attention_bias=True, rope_parameters={"rope_type": "default", "rope_theta": 300.0})


def save_gemma2(folder, model_cls=None, seed: int = 1, **changes):
    """A random Gemma 2 model saved as transformers saves it, with scores large enough to be capped."""
    config = transformers.Gemma2Config(**{**SIZES, **changes})
    torch.manual_seed(seed)
    model = (model_cls or transformers.Gemma2Model)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):  # away from their zero init, so a slip shows
                p.add_(torch.randn_like(p) * 0.3)
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(25.0)
    model.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def full_layers(tmp_path_factory):
    return save_gemma2(tmp_path_factory.mktemp("gemma2") / "m", layer_types=[FULL, FULL])


def test_eager_and_onnx_equal_transformers(full_layers, tmp_path):
    loaded, path = load_and_export(full_layers, tmp_path / "m.onnx")
    cfg = loaded.config
    assert loaded.family == "gemma2" and not loaded.dropped
    assert (cfg.causal, cfg.qk_norm, cfg.sandwich_norm, cfg.attention_softcap, cfg.num_kv_heads) == (True, False, True, 1.5, 1)
    assert (cfg.attention_head_size, cfg.rotary_theta, cfg.max_positions, cfg.local_attention) == (24, 300.0, 64, None)
    assert assert_matches_transformers(loaded, hf_reference(transformers.Gemma2Model, full_layers), path, pad_id=0) >= 12


def test_without_the_cap_the_model_differs(full_layers):
    """A mutation check: the test model's scores are large enough that the cap changes the outputs."""
    loaded = load_any(full_layers)
    assert_only_the_import_matches(loaded, hf_reference(transformers.Gemma2Model, full_layers), attention_softcap=0.0)


def test_sliding_layers_have_the_causal_window(tmp_path):
    """Gemma2Config's default pattern (even layers sliding, i - w < j <= i): a causal local window of 2w - 1
    in layers 0, 2, ..., over the whole length."""
    folder = save_gemma2(tmp_path / "m", transformers.Gemma2ForCausalLM, seed=2, sliding_window=7,
                         attn_logit_softcapping=None)
    loaded = load_any(folder)
    cfg = loaded.config
    local = cfg.local_attention
    assert (cfg.max_positions, cfg.attention_softcap, local.window, local.global_every, local.global_offset) == (
        64, 0.0, 13, 2, 1)
    assert max(c.sequence for c in cases(cfg)) > 7
    assert_matches_transformers(loaded, hf_reference(transformers.Gemma2Model, folder), None, pad_id=0)


def test_the_default_cap_is_gemma2_configs(full_layers, tmp_path):
    """A config.json without attn_logit_softcapping caps at Gemma2Config's 50, as transformers reads it."""
    folder = with_config(full_layers, tmp_path / "m", {})
    config = json.loads((folder / "config.json").read_text())
    del config["attn_logit_softcapping"]
    (folder / "config.json").write_text(json.dumps(config))
    assert load_any(folder).config.attention_softcap == 50.0
    assert transformers.AutoConfig.from_pretrained(str(folder)).attn_logit_softcapping == 50.0


@pytest.mark.parametrize("change, message", [
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention=True is not supported"),
    ({"attn_logit_softcapping": -1.0}, "attn_logit_softcapping=-1.0 is not supported"),
    ({"layer_types": [SLIDING, FULL], "sliding_window": None}, "sliding_window=None is not supported"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),
])
def test_unsupported_configs_are_refused(full_layers, tmp_path, change, message):
    with pytest.raises(CheckpointError, match=message):
        load_any(with_config(full_layers, tmp_path / "m", change))


@pytest.mark.parametrize("change, message", [
    (dict(attention_softcap=-1.0), "attention_softcap=-1.0 must be a finite number >= 0"),
    (dict(attention_softcap=float("inf")), "must be a finite number"),
    (dict(attention_softcap=30.0, attention="linear"), "the linear kernel never forms them"),
    (dict(attention_softcap=30.0, relative_attention=RelativeAttention(buckets=8)),
     "attention_softcap with relative_attention"),
    (dict(attention_softcap=30.0, positions="alibi"), "attention_softcap with positions='alibi'"),
])
def test_softcap_config_is_checked(change, message):
    with pytest.raises(ConfigError, match=message):
        EncoderConfig(**change)


def test_a_capped_bidirectional_model_exports_the_cap_unfused(tmp_path):
    """The fused attention kernel has no cap: a capped layer exports as written-out ops (Tanh on the
    scores), gated against eager, and its outputs are not the uncapped model's."""
    import numpy as np
    import onnx

    from ortformer.config import preset
    from ortformer.exporter import export
    from ortformer.models.encoder import build_encoder
    from ortformer.runtime import Runtime

    cfg = preset("tiny", attention_softcap=0.2)
    path = export(cfg, tmp_path / "m.onnx", seed=4).path
    ops = {node.op_type for node in onnx.load(str(path)).graph.node}
    assert "Tanh" in ops and "MultiHeadAttention" not in ops
    ids, mask = np.array([[5, 9, 17, 3, 44, 8, 61, 2]]), np.ones((1, 8), dtype=np.int64)
    got = Runtime(path, "cpu").run(ids, mask)["last_hidden_state"]
    uncapped = build_encoder(cfg.replace(attention_softcap=0.0), seed=4)
    with torch.no_grad():
        plain = uncapped(torch.from_numpy(ids), torch.from_numpy(mask), torch.zeros(1, 8, dtype=torch.long))
    assert np.abs(got - plain["last_hidden_state"].numpy()).max() > 1e-3
