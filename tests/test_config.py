import dataclasses
import json
import subprocess
import sys

import pytest

from ortformer.config import PRESETS, EncoderConfig, field_names, preset
from ortformer.cost import flops_per_sequence, total_flops
from ortformer.errors import ConfigError


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_json_round_trip(name):
    cfg = PRESETS[name]
    assert EncoderConfig.from_json(cfg.to_json()) == cfg
    assert json.loads(cfg.to_json())["format"] == 1


def test_every_field_has_a_reason_comment():
    import inspect

    source = inspect.getsource(EncoderConfig)
    for name in field_names():
        line = next(i for i, l in enumerate(source.splitlines()) if l.strip().startswith(f"{name}:"))
        assert source.splitlines()[line - 1].strip().startswith("#"), name


@pytest.mark.parametrize("changes, field, valid", [
    ({"attention": "flash"}, "attention", "softmax, linear, efficient, cosine"),
    ({"norm": "batchnorm"}, "norm", "layernorm, rmsnorm"),
    ({"norm_position": "middle"}, "norm_position", "post, pre"),
    ({"activation": "swish"}, "activation", "relu, gelu"),
    ({"positions": "relative"}, "positions", "learned, sinusoidal, rotary, alibi, none"),
    ({"pooling": "weighted"}, "pooling", "none, mean, cls, last, max"),
    ({"hidden_size": 30, "num_heads": 4}, "hidden_size=30", "divisible"),
    ({"max_positions": 0}, "max_positions", ">= 1"),
    ({"num_layers": 0}, "num_layers", ">= 1"),
    ({"vocab_size": -1}, "vocab_size", ">= 0"),
    ({"norm_eps": 0.0}, "norm_eps", "(0, 1)"),
    ({"attention_eps": float("nan")}, "attention_eps", "(0, 1)"),
    ({"num_layers": True}, "num_layers", "int"),
    ({"hidden_size": "256"}, "hidden_size", "int"),
    ({"normalize_embeddings": 1}, "normalize_embeddings", "bool"),
    ({"positions": "sinusoidal", "hidden_size": 33, "num_heads": 3}, "sinusoidal", "even"),
    ({"vocab_size": 0, "type_vocab_size": 2}, "type_vocab_size", "vocab_size > 0"),
    ({"pooling": "none", "normalize_embeddings": True}, "normalize_embeddings", "pooling"),
    ({"relative_attention_buckets": 2}, "relative_attention_buckets=2", ">= 4"),
    ({"relative_attention_buckets": 32, "relative_attention_max_distance": 8}, "relative_attention_max_distance=8",
     "8 exact distances"),
    ({"relative_attention_buckets": 32, "attention": "linear"}, "relative_attention_buckets=32", "softmax"),
    ({"local_window": 8, "global_every": 3, "attention": "cosine"}, "local_window=8", "softmax"),
    ({"local_window": 8}, "global_every=1", "global_every >= 2"),
    ({"local_window": 8, "global_every": 3, "global_offset": 3}, "global_offset=3", "[0, global_every=3)"),
    ({"global_offset": 1, "global_every": 2}, "global_offset", "set local_window"),
    ({"sandwich_norm": True}, "sandwich_norm=True", "norm_position='pre'"),
    ({"first_block_norm": True, "norm_position": "pre"}, "first_block_norm=True", "set embedding_norm=True"),
    ({"num_kv_heads": 3}, "num_kv_heads=3", "must divide num_heads=4"),
    ({"num_kv_heads": -1}, "num_kv_heads=-1", "must divide num_heads=4"),
    ({"num_kv_heads": 2, "disentangled_buckets": 8, "disentangled_max_distance": 16, "positions": "none"},
     "num_kv_heads with disentangled_buckets", "not implemented"),
    ({"rotary_theta_local": 10.0, "local_window": 8, "global_every": 3}, "rotary_theta_local", "positions='rotary'"),
    ({"rotary_theta_local": 0.5, "positions": "rotary"}, "rotary_theta_local=0.5", "> 1"),
    ({"sentence_dense_size": -1}, "sentence_dense_size=-1", ">= 0"),
    ({"sentence_dense_activation": "swish"}, "sentence_dense_activation='swish'", "identity, tanh, relu"),
    ({"sentence_dense_size": 8, "pooling": "none"}, "sentence_dense_size=8", "choose a pooling"),
    ({"truncate_dim": 8, "pooling": "none"}, "truncate_dim=8", "got 'none'"),
    ({"truncate_dim": 33}, "truncate_dim=33", "1..32"),
    ({"truncate_dim": 49, "sentence_dense_size": 48}, "truncate_dim=49", "1..48"),
    ({"truncate_dim": -1}, "truncate_dim=-1", "or 0 for the whole embedding"),
    ({"classifier_pad_id": 3}, "classifier_pad_id=3", "classifier_pooling='last'"),
    ({"classifier_pad_id": 100, "classifier_labels": 2, "classifier_pooling": "last"}, "classifier_pad_id=100",
     "below vocab_size=100"),
])
def test_invalid_values_name_the_field_and_valid_choices(changes, field, valid):
    with pytest.raises(ConfigError) as err:
        preset("tiny").replace(**changes)
    assert field in str(err.value) and valid in str(err.value)


def test_from_json_rejects_unknown_keys_versions_and_non_objects():
    data = json.loads(preset("tiny").to_json())
    with pytest.raises(ConfigError, match="unknown config key.*'dropout'"):
        EncoderConfig.from_dict({**data, "dropout": 0.1})
    with pytest.raises(ConfigError, match="format 2 is not supported"):
        EncoderConfig.from_dict({**data, "format": 2})
    with pytest.raises(ConfigError, match="JSON object"):
        EncoderConfig.from_json("[1, 2]")
    with pytest.raises(ConfigError, match="not valid JSON"):
        EncoderConfig.from_json("{nope")
    with pytest.raises(ConfigError, match="unknown config field"):
        preset("tiny").replace(layers=3)
    with pytest.raises(ConfigError, match="unknown preset 'huge'.*tiny"):
        preset("huge")


def test_partial_json_takes_defaults_for_missing_fields():
    cfg = EncoderConfig.from_json('{"hidden_size": 64, "num_heads": 2, "attention": "cosine"}')
    assert (cfg.hidden_size, cfg.num_heads, cfg.attention, cfg.num_layers) == (64, 2, "cosine", EncoderConfig().num_layers)


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        preset("tiny").hidden_size = 3


def test_flops_are_quadratic_for_softmax_and_linear_for_the_linear_family():
    soft, lin = preset("small"), preset("small", attention="linear")
    n = 4096
    assert flops_per_sequence(soft, 2 * n)["attention_core"] == 4 * flops_per_sequence(soft, n)["attention_core"]
    assert flops_per_sequence(lin, 2 * n)["attention_core"] == 2 * flops_per_sequence(lin, n)["attention_core"]
    assert total_flops(lin, 2 * n) == 2 * total_flops(lin, n)
    assert total_flops(soft, n) > total_flops(lin, n)


def test_config_and_cost_import_without_torch():
    code = "import sys, ortformer, ortformer.config, ortformer.cost, ortformer.contract; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("changes, message", [
    ({"conv_kernel_size": 4}, "conv_kernel_size=4 must be 0 \\(none\\) or odd"),
    ({"conv_kernel_size": -1}, "conv_kernel_size=-1 must be 0 \\(none\\) or odd"),
    ({"conv_kernel_size": 3, "conv_groups": 5}, "conv_groups=5 must be >= 1 and divide hidden_size"),
    ({"conv_groups": 2}, "conv_groups and conv_activation shape the convolution; with conv_kernel_size=0"),
    ({"conv_activation": "gelu"}, "conv_groups and conv_activation shape the convolution"),
    ({"conv_kernel_size": 3, "causal": True}, "reads positions on both sides; causal=True"),
    ({"conv_kernel_size": 3, "conv_activation": "sigmoid"}, "conv_activation='sigmoid' is not valid"),
])
def test_convolution_fields_that_cannot_work_are_refused_by_name(changes, message):
    with pytest.raises(ConfigError, match=message):
        preset("tiny", **changes)
    assert preset("tiny", conv_kernel_size=3, conv_groups=4, conv_activation="gelu").conv_kernel_size == 3


@pytest.mark.parametrize("changes", [{"token_dropout_id": -2}, {"token_dropout_id": 100}, {"token_dropout_id": 3, "vocab_size": 0}])
def test_token_dropout_id_must_be_off_or_a_token(changes):
    with pytest.raises(ConfigError, match=r"token_dropout_id=-?\d+ must be -1 \(off\) or a token id below vocab_size="):
        preset("tiny", **changes)
    assert preset("tiny", token_dropout_id=99).token_dropout_id == 99


@pytest.mark.parametrize("changes, message", [
    ({"positions": "rotary", "rotary_scale": 0.0}, "rotary_scale=0.0 must be a finite number > 0"),
    ({"positions": "rotary", "rotary_scale": float("inf")}, "rotary_scale=inf must be a finite number > 0"),
    ({"positions": "learned", "rotary_scale": 0.5}, "rotary_scale scales rotary angles; it needs positions='rotary'"),
])
def test_rotary_scale_must_be_positive_and_rotary(changes, message):
    with pytest.raises(ConfigError, match=message):
        preset("tiny", **changes)
    assert preset("tiny", positions="rotary", rotary_scale=0.5).rotary_scale == 0.5


def test_causal_rotary_is_softmax_only_and_qk_norm_not_with_disentangled_attention():
    assert preset("tiny", causal=True, positions="rotary", qk_norm=True).causal
    with pytest.raises(ConfigError, match="causal=True with positions='rotary' is not implemented"):
        preset("tiny", causal=True, positions="rotary", attention="linear")
    with pytest.raises(ConfigError, match="qk_norm with disentangled_buckets is not implemented"):
        preset("tiny", qk_norm=True, disentangled_buckets=8, disentangled_max_distance=16, positions="none")
