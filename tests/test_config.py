import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ortformer.config import format1 as config_format1
from ortformer.config import (PRESETS, Classifier, Convolution, Disentangled, EncoderConfig, Experts, LocalAttention,
                              RelativeAttention, SentenceDense, ShortConv, TokenDense, preset)
from ortformer.config.groups import GROUPS
from ortformer.contract.cost import flops_per_sequence, total_flops
from ortformer.core.errors import ConfigError


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_json_round_trip(name):
    cfg = PRESETS[name]
    assert EncoderConfig.from_json(cfg.to_json()) == cfg
    assert json.loads(cfg.to_json())["format"] == 2


@pytest.mark.parametrize("cls", [EncoderConfig, *GROUPS.values()], ids=lambda c: c.__name__)
def test_every_field_has_a_reason_comment(cls):
    import inspect

    lines = inspect.getsource(cls).splitlines()
    for field in dataclasses.fields(cls):
        line = next(i for i, l in enumerate(lines) if l.strip().startswith(f"{field.name}:"))
        assert lines[line - 1].strip().startswith("#"), field.name


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
    # groups are given as their JSON objects here: a group's class would raise while the list is collected
    ({"relative_attention": {"buckets": 2}}, "relative_attention.buckets=2", ">= 4"),
    ({"relative_attention": {"buckets": 32, "max_distance": 8}}, "relative_attention.max_distance=8",
     "8 exact distances"),
    ({"relative_attention": {"buckets": 32}, "attention": "linear"}, "relative_attention needs", "attention='softmax'"),
    ({"local_attention": {"window": 8, "global_every": 3}, "attention": "cosine"}, "local_attention needs", "softmax"),
    ({"local_attention": {"window": 8, "global_every": 1}}, "local_attention.global_every=1", "must be >= 2"),
    ({"local_attention": {"window": 8}}, "config local_attention needs window, global_every", "got ['window']"),
    ({"local_attention": {"window": 8, "global_every": 3, "global_offset": 3}}, "local_attention.global_offset=3",
     "[0, global_every=3)"),
    ({"sandwich_norm": True}, "sandwich_norm=True", "norm_position='pre'"),
    ({"first_block_norm": True, "norm_position": "pre"}, "first_block_norm=True", "set embedding_norm=True"),
    ({"num_kv_heads": 3}, "num_kv_heads=3", "must divide num_heads=4"),
    ({"num_kv_heads": -1}, "num_kv_heads=-1", "must divide num_heads=4"),
    ({"num_kv_heads": 2, "disentangled": {"buckets": 8, "max_distance": 16}, "positions": "none"},
     "disentangled with num_kv_heads", "not implemented"),
    ({"local_attention": {"window": 8, "global_every": 3, "rotary_theta": 10.0}}, "local_attention.rotary_theta",
     "positions='rotary'"),
    ({"local_attention": {"window": 8, "global_every": 3, "rotary_theta": 0.5}, "positions": "rotary"},
     "local_attention.rotary_theta=0.5", "> 1"),
    ({"sentence_dense": {"size": -1}}, "sentence_dense.size=-1", ">= 1"),
    ({"sentence_dense": {"size": 8, "activation": "swish"}}, "sentence_dense.activation='swish'", "identity, tanh, relu"),
    ({"sentence_dense": {"size": 8}, "pooling": "none"}, "sentence_dense maps", "choose a pooling"),
    ({"truncate_dim": 8, "pooling": "none"}, "truncate_dim=8", "got 'none'"),
    ({"truncate_dim": 33}, "truncate_dim=33", "1..32"),
    ({"truncate_dim": 49, "sentence_dense": {"size": 48}}, "truncate_dim=49", "1..48"),
    ({"truncate_dim": -1}, "truncate_dim=-1", "or 0 for the whole embedding"),
    ({"classifier": {"labels": 2, "pad_id": 3}}, "classifier.pad_id=3", "pooling='last'"),
    ({"classifier": {"labels": 2, "pooling": "last", "pad_id": 100}}, "classifier.pad_id=100", "below vocab_size=100"),
])
def test_invalid_values_name_the_field_and_valid_choices(changes, field, valid):
    with pytest.raises(ConfigError) as err:
        preset("tiny").replace(**changes)
    assert field in str(err.value) and valid in str(err.value)


def test_from_json_rejects_unknown_keys_versions_and_non_objects():
    data = json.loads(preset("tiny").to_json())
    with pytest.raises(ConfigError, match="unknown config key.*'dropout'"):
        EncoderConfig.from_dict({**data, "dropout": 0.1})
    for version in (0, 3):
        with pytest.raises(ConfigError, match=re.escape(f"format {version!r} is not supported; this ortformer reads "
                                                        "formats 1, 2")):
            EncoderConfig.from_dict({**data, "format": version})
    for version in ("2", True, 2.0):  # True == 1 in Python, yet a format is a number, never a bool
        with pytest.raises(ConfigError, match=re.escape(f"format {version!r} must be an integer: 1, 2")):
            EncoderConfig.from_dict({**data, "format": version})
    with pytest.raises(ConfigError, match="format null is not supported"):  # not read as "no format key"
        EncoderConfig.from_dict({**data, "format": None})
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
    code = "import sys, ortformer, ortformer.config, ortformer.contract.cost, ortformer.contract; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("changes, message", [
    ({"convolution": {"kernel_size": 4}}, "convolution.kernel_size=4 must be odd and >= 1"),
    ({"convolution": {"kernel_size": -1}}, "convolution.kernel_size=-1 must be odd and >= 1"),
    ({"convolution": {"kernel_size": 3, "groups": 5}}, "convolution.groups=5 must divide hidden_size=32"),
    ({"convolution": {"kernel_size": 3, "groups": 0}}, "convolution.groups=0 must be >= 1"),
    ({"convolution": {"kernel_size": 3}, "causal": True}, "reads positions on both sides; causal=True"),
    ({"convolution": {"kernel_size": 3, "activation": "sigmoid"}}, "convolution.activation='sigmoid' is not valid"),
    # format 1's stray fields (conv_groups, conv_activation without conv_kernel_size): see
    # test_format_1_reader_still_refuses_a_group_field_without_its_switch
])
def test_convolution_fields_that_cannot_work_are_refused_by_name(changes, message):
    with pytest.raises(ConfigError, match=message):
        preset("tiny", **changes)
    conv = preset("tiny", convolution=Convolution(kernel_size=3, groups=4, activation="gelu")).convolution
    assert conv == Convolution(kernel_size=3, groups=4, activation="gelu")


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
    with pytest.raises(ConfigError, match="disentangled with qk_norm is not implemented"):
        preset("tiny", qk_norm=True, disentangled=Disentangled(buckets=8, max_distance=16), positions="none")


# a config with every group except disentangled, which excludes relative and local attention
ALL_GROUPS = dict(
    classifier=Classifier(labels=3, dense="tanh", norm=True, pooling="mean"),
    convolution=Convolution(kernel_size=3, groups=2, activation="gelu"),
    relative_attention=RelativeAttention(buckets=8, max_distance=16),
    local_attention=LocalAttention(window=8, global_every=2, global_offset=1, rotary_theta=5000.0),
    sentence_dense=SentenceDense(size=16, activation="tanh", bias=False),
    token_dense=TokenDense(size=8, bias=True),
    positions="rotary",
)
DATA = Path(__file__).parent / "data" / "config_format1"


@pytest.mark.parametrize("changes", [ALL_GROUPS, {"disentangled": Disentangled(buckets=8, max_distance=16,
                                                                             projections="separate", norm=False),
                                                  "positions": "none"}])
def test_format_2_writes_each_group_as_a_nested_object_and_reads_it_back(changes):
    cfg = preset("tiny", **changes)
    data = json.loads(cfg.to_json())
    assert data["format"] == 2
    assert not set(data) & set(config_format1.FLAT), "format 2 spells no flat group field"
    for name, cls in GROUPS.items():
        group = getattr(cfg, name)
        if name in changes:
            assert isinstance(group, cls) and data[name] == dataclasses.asdict(changes[name]), name
        else:
            assert group is None and data[name] is None, name
    back = EncoderConfig.from_json(cfg.to_json())
    assert back == cfg and all(type(getattr(back, name)) is type(getattr(cfg, name)) for name in GROUPS)
    # a group given as its JSON object is the same config as the group's class
    assert EncoderConfig(**dataclasses.asdict(cfg)) == cfg


def test_format_2_lists_every_field_of_a_group():
    data = preset("tiny", classifier=Classifier(labels=3)).to_dict()
    assert data["classifier"] == {"labels": 3, "per_token": False, "pooling": "cls", "dense": "none", "norm": False,
                                  "pad_id": -1}
    assert data["local_attention"] is None and "local_window" not in data and "classifier_labels" not in data


def _flat(cfg: EncoderConfig) -> dict:
    return config_format1.to_flat(dataclasses.asdict(cfg))


@pytest.mark.parametrize("with_format", [True, False])
def test_a_format_1_flat_dict_is_read_into_the_groups(with_format):
    cfg = preset("tiny", **ALL_GROUPS)
    flat = _flat(cfg)
    assert flat["classifier_labels"] == 3 and flat["local_window"] == 8 and "classifier" not in flat
    # a dict without "format" is read by its layout: flat names mean format 1
    data = {"format": 1, **flat} if with_format else flat
    assert EncoderConfig.from_dict(data) == cfg
    assert EncoderConfig.from_json(json.dumps(data)) == cfg
    # a partial flat dict: the group's other fields take the group's defaults, the rest EncoderConfig's
    partial = {"local_window": 8, "global_every": 3, "classifier_labels": 2}
    got = EncoderConfig.from_dict({"format": 1, **partial} if with_format else partial)
    assert got.local_attention == LocalAttention(window=8, global_every=3)
    assert got.classifier == Classifier(labels=2)
    assert got.num_labels == 2 and not got.per_token_logits
    assert (got.convolution, got.sentence_dense, got.hidden_size) == (None, None, EncoderConfig().hidden_size)


def test_a_format_1_file_of_the_earlier_release_maps_each_flat_field_to_its_group():
    names = sorted(DATA.glob("*.json"))
    checked = set()
    for path in names:
        if path.name.endswith(".params.json"):
            continue
        flat = json.loads(path.read_text())
        cfg = EncoderConfig.from_dict(flat)
        for group, switch in config_format1.SWITCHES.items():
            if not flat[switch]:
                assert getattr(cfg, group) is None, (path.name, group)
                continue
            for name, (g, field) in config_format1.FLAT.items():
                if g == group:
                    assert getattr(getattr(cfg, group), field) == flat[name], (path.name, name)
                    checked.add(group)
    assert checked == set(config_format1.SWITCHES), "the files hold every group format 1 had"
    # the groups added since are written in format 2 only
    assert set(GROUPS) - checked == {"experts", "short_conv", "adapters"}


def test_the_groups_newer_than_format_1_read_back_from_json():
    cfg = preset("tiny", num_layers=3, positions="rotary", causal=True, experts=Experts(count=4, top_k=2),
                 short_conv=ShortConv(kernel_size=3, layers=(0, 2)))
    data = json.loads(cfg.to_json())
    assert data["short_conv"] == {"kernel_size": 3, "layers": [0, 2]}
    assert data["experts"] == {"count": 4, "top_k": 2, "every": 2, "offset": 1}
    assert EncoderConfig.from_json(cfg.to_json()) == cfg


@pytest.mark.parametrize("changes, message", [
    ({"experts": {"count": 4, "top_k": 5}}, r"experts.top_k=5 must be in 1..count=4"),
    ({"experts": {"count": 1, "top_k": 1}}, r"experts.count=1 must be >= 2"),
    ({"experts": {"count": 4, "top_k": 2, "every": 2, "offset": 2}}, r"offset in 0..every - 1"),
    ({"experts": {"count": 4, "top_k": 2}, "ffn_gated": True}, r"set ffn_gated=False"),
    ({"short_conv": {"kernel_size": 3, "layers": [2, 0]}}, r"ascending, each once"),
    ({"short_conv": {"kernel_size": 3, "layers": []}}, r"at least one layer"),
    ({"short_conv": {"kernel_size": 3, "layers": [0, "1"]}}, r"must list layer indices"),
    ({"short_conv": {"kernel_size": 0, "layers": [0]}}, r"kernel_size=0 must be >= 1"),
    ({"short_conv": {"kernel_size": 3, "layers": [0, 2]}}, r"names a layer past num_layers=2"),
])
def test_the_newer_groups_refuse_what_cannot_be_built(changes, message):
    with pytest.raises(ConfigError, match=message):
        preset("tiny", **changes)


def test_format_2_refuses_flat_names_and_unknown_keys_inside_a_group():
    with pytest.raises(ConfigError, match=re.escape("unknown config key(s) ['classifier_labels']")):
        EncoderConfig.from_dict({"format": 2, "classifier_labels": 3})
    with pytest.raises(ConfigError, match=re.escape("unknown key(s) ['bias', 'size'] in config classifier; valid keys: "
                                                    "labels, per_token, pooling, dense, norm, pad_id")):
        EncoderConfig.from_dict({"format": 2, "classifier": {"labels": 3, "bias": True, "size": 2}})
    # a group's flat-prefixed spelling inside the group is a different key, not an alias
    with pytest.raises(ConfigError, match=re.escape("unknown key(s) ['local_window'] in config local_attention")):
        preset("tiny", local_attention={"local_window": 8, "global_every": 2})
    with pytest.raises(ConfigError, match=re.escape("config classifier needs labels (got ['per_token'])")):
        EncoderConfig.from_dict({"format": 2, "classifier": {"per_token": True}})
    assert EncoderConfig.from_dict({"format": 2, "classifier": {"labels": 3}}).classifier == Classifier(labels=3)


@pytest.mark.parametrize("value, got", [(3, "int"), (True, "bool"), ("cls", "str"), ([3], "list"),
                                        (TokenDense(size=3), "TokenDense")])
def test_a_group_given_with_the_wrong_type_is_refused(value, got):
    with pytest.raises(ConfigError, match=re.escape(f"config classifier must be a JSON object or null (off), got {got}")):
        preset("tiny", classifier=value)
    with pytest.raises(ConfigError, match="config classifier must be a JSON object or null"):
        EncoderConfig.from_dict({"format": 2, "classifier": value})


@pytest.mark.parametrize("group, values, message", [
    ("classifier", {"labels": "3"}, "classifier.labels='3' must be of type int, got str"),
    ("classifier", {"labels": True}, "classifier.labels=True must be of type int, got bool"),
    ("classifier", {"labels": 3, "per_token": 1}, "classifier.per_token=1 must be of type bool, got int"),
    ("sentence_dense", {"size": 8.0}, "sentence_dense.size=8.0 must be of type int, got float"),
    ("local_attention", {"window": 8, "global_every": 2, "rotary_theta": "1e4"},
     "local_attention.rotary_theta='1e4' must be of type float, got str"),
])
def test_a_group_field_of_the_wrong_type_is_refused_by_its_dotted_name(group, values, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        GROUPS[group](**values)
    with pytest.raises(ConfigError, match=re.escape(message)):
        EncoderConfig.from_dict({"format": 2, group: values})


def test_an_int_is_a_fine_spelling_of_a_group_float():
    local = preset("tiny", positions="rotary", local_attention={"window": 8, "global_every": 2, "rotary_theta": 5000})
    assert local.local_attention.rotary_theta == 5000.0 and isinstance(local.local_attention.rotary_theta, float)


@pytest.mark.parametrize("group, values, message", [
    ("classifier", {"labels": 0}, "classifier.labels=0 must be >= 1 (no head: classifier null / None)"),
    ("classifier", {"labels": 3, "pooling": "first"}, "classifier.pooling='first' is not valid; choose one of mean, "
                                                      "cls, last, max"),
    ("classifier", {"labels": 3, "dense": "swish"}, "classifier.dense='swish' is not valid; choose one of none, tanh"),
    ("classifier", {"labels": 3, "norm": True}, "classifier.norm=True normalises the classifier's hidden Dense; set "
                                                "classifier.dense too"),
    ("classifier", {"labels": 3, "per_token": True, "pooling": "last", "pad_id": 0}, "classifier.pad_id=0 skips"),
    ("classifier", {"labels": 3, "pooling": "last", "pad_id": -2}, "classifier.pad_id=-2 skips"),
    ("convolution", {"kernel_size": 2}, "convolution.kernel_size=2 must be odd and >= 1"),
    ("convolution", {"kernel_size": 0}, "convolution.kernel_size=0 must be odd and >= 1"),
    ("convolution", {"kernel_size": 3, "groups": 0}, "convolution.groups=0 must be >= 1"),
    ("convolution", {"kernel_size": 3, "activation": "none"}, "convolution.activation='none' is not valid; choose one "
                                                              "of tanh, relu"),
    ("relative_attention", {"buckets": 3}, "relative_attention.buckets=3 must be >= 4"),
    ("relative_attention", {"buckets": 32, "max_distance": 8}, "relative_attention.max_distance=8 must exceed the 8 "
                                                                "exact distances of buckets=32"),
    ("disentangled", {"buckets": 1}, "disentangled.buckets=1 must be >= 2"),
    ("disentangled", {"buckets": 8, "max_distance": -1}, "disentangled.max_distance=-1 must be >= 0"),
    ("disentangled", {"buckets": 8, "projections": "own"}, "disentangled.projections='own' is not valid; choose one "
                                                            "of shared, separate"),
    ("local_attention", {"window": 0, "global_every": 2}, "local_attention.window=0 must be >= 1"),
    ("local_attention", {"window": 8, "global_every": 1}, "local_attention.global_every=1 must be >= 2"),
    ("local_attention", {"window": 8, "global_every": 2, "global_offset": -1}, "local_attention.global_offset=-1 "
                                                                              "must be in [0, global_every=2)"),
    ("local_attention", {"window": 8, "global_every": 2, "rotary_theta": 0.5}, "local_attention.rotary_theta=0.5 "
                                                                              "must be a finite number > 1"),
    ("local_attention", {"window": 8, "global_every": 2, "rotary_theta": float("inf")},
     "local_attention.rotary_theta=inf must be a finite number > 1"),
    ("local_attention", {"window": 8, "global_every": 2, "rotary_theta": -2.0}, "local_attention.rotary_theta=-2.0"),
    ("sentence_dense", {"size": 0}, "sentence_dense.size=0 must be >= 1 (no head: sentence_dense null / None)"),
    ("sentence_dense", {"size": 8, "activation": "swish"}, "sentence_dense.activation='swish' is not valid; choose "
                                                           "one of identity, tanh"),
    ("token_dense", {"size": 0}, "token_dense.size=0 must be >= 1 (no head: token_dense null / None)"),
    ("token_dense", {"size": -3}, "token_dense.size=-3 must be >= 1"),
])
def test_each_group_checks_its_own_fields(group, values, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        GROUPS[group](**values)
    # the same check, and message, where the group arrives inside a config
    with pytest.raises(ConfigError, match=re.escape(message)):
        EncoderConfig.from_dict({"format": 2, group: values})


@pytest.mark.parametrize("changes, message", [
    ({"disentangled": {"buckets": 32, "max_distance": 16}, "positions": "none"},
     "disentangled.buckets=32 needs max_distance > buckets // 2 + 1 (got 16)"),
    ({"disentangled": {"buckets": 8}, "relative_attention": {"buckets": 8}, "positions": "none"},
     "disentangled with relative_attention is not implemented"),
    ({"disentangled": {"buckets": 8}, "local_attention": {"window": 8, "global_every": 2}, "positions": "none"},
     "disentangled with local_attention is not implemented"),
    ({"disentangled": {"buckets": 8}, "causal": True, "positions": "none"}, "disentangled with causal is not implemented"),
    ({"disentangled": {"buckets": 8}, "positions": "rotary"}, "disentangled with positions='rotary' is not implemented"),
    ({"relative_attention": {"buckets": 8}, "attention_softcap": 30.0},
     "attention_softcap with relative_attention is not implemented"),
    ({"relative_attention": {"buckets": 8}, "positions": "alibi"}, "positions='alibi' with relative_attention"),
    ({"relative_attention": {"buckets": 8}, "causal": True}, "causal=True with relative_attention is not implemented"),
    ({"disentangled": {"buckets": 8}, "attention": "linear", "positions": "none"}, "disentangled needs attention='softmax'"),
    ({"pooling": "splade_max", "classifier": {"labels": 100}}, "pools a per-token head's logits"),
    ({"pooling": "splade_max", "classifier": {"labels": 100, "per_token": True}, "sentence_dense": {"size": 8}},
     "sentence_dense maps a pooled hidden vector"),
    ({"vocab_size": 0, "type_vocab_size": 0, "classifier": {"labels": 2, "pooling": "last", "pad_id": 0}},
     "classifier.pad_id=0 skips a token id of a token-id model"),
])
def test_the_rules_between_a_group_and_the_rest_of_the_config(changes, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        preset("tiny", **changes)


def test_with_fields_merges_a_format_2_dict_over_the_config():
    tiny = preset("tiny")
    cfg = tiny.with_fields({"local_attention": {"window": 8, "global_every": 2}, "hidden_size": 64})
    assert cfg.local_attention == LocalAttention(window=8, global_every=2)
    assert (cfg.hidden_size, cfg.name, cfg.num_layers) == (64, "tiny", tiny.num_layers)
    assert cfg.with_fields({"format": 2, "local_attention": None}).local_attention is None
    assert tiny.with_fields({"classifier": Classifier(labels=4)}).classifier == Classifier(labels=4)
    with pytest.raises(ConfigError, match=re.escape("unknown config key(s) ['dropout']")):
        tiny.with_fields({"dropout": 0.1})
    with pytest.raises(ConfigError, match=re.escape("local_attention.global_every=1 must be >= 2")):
        tiny.with_fields({"local_attention": {"window": 8, "global_every": 1}})


def test_with_fields_merges_format_1_flat_names_into_the_groups():
    tiny = preset("tiny")
    cfg = tiny.with_fields({"classifier_labels": 3, "classifier_per_token": True})
    assert cfg.classifier == Classifier(labels=3, per_token=True) and cfg.name == "tiny"
    # a flat field merges into the group the config already has
    local = tiny.with_fields({"local_window": 8, "global_every": 3})
    assert local.with_fields({"global_offset": 1}).local_attention == LocalAttention(window=8, global_every=3,
                                                                                     global_offset=1)
    assert local.with_fields({"format": 1, "global_offset": 2}).local_attention.global_offset == 2
    # the switch at 0 turns the group off
    assert cfg.with_fields({"classifier_labels": 0, "classifier_per_token": False}).classifier is None
    assert tiny.with_fields({"format": 1, "hidden_size": 64}).hidden_size == 64


@pytest.mark.parametrize("flat, stray", [
    ({"global_every": 3}, "global_every shapes local_attention; with local_window=0"),
    ({"global_offset": 1, "global_every": 2}, "global_every, global_offset shape local_attention"),
    ({"sentence_dense_activation": "tanh"}, "sentence_dense_activation shapes sentence_dense; with sentence_dense_size=0"),
    ({"relative_attention_max_distance": 64}, "relative_attention_max_distance shapes relative_attention"),
    ({"classifier_pooling": "mean"}, "classifier_pooling shapes classifier; with classifier_labels=0"),
    ({"classifier_norm": True, "classifier_dense": "tanh"}, "classifier_dense, classifier_norm shape classifier"),
])
def test_with_fields_refuses_a_flat_group_field_without_its_switch(flat, stray):
    # strict, unlike reading a file: export's flags spell format 1, and a flag that does nothing is a mistake
    with pytest.raises(ConfigError, match=re.escape(stray)):
        preset("tiny").with_fields(flat, strict=True)
    # not strict (export --config): what a model file's metadata may hold is read as from_dict reads it
    if set(flat) <= config_format1.HARMLESS_WHEN_OFF:
        assert preset("tiny").with_fields(flat) == EncoderConfig.from_dict({**_flat(preset("tiny")), **flat}) == preset("tiny")
    else:  # only the fields format 1 refused too
        kept = [name for name in config_format1.FLAT if name in flat and name not in config_format1.HARMLESS_WHEN_OFF]
        with pytest.raises(ConfigError, match=re.escape(", ".join(kept) + " shape")):
            preset("tiny").with_fields(flat)
    # with the switch the same field is taken
    switch = config_format1.SWITCHES[config_format1.FLAT[next(iter(flat))][0]]
    on = {"local_window": 8, "global_every": 4} if switch == "local_window" else {switch: 16}
    cfg = preset("tiny").with_fields({**on, **flat})
    for name, value in flat.items():
        group, field = config_format1.FLAT[name]
        assert getattr(getattr(cfg, group), field) == value


@pytest.mark.parametrize("flat, message", [
    ({"classifier_norm": True}, "classifier_norm shapes classifier; with classifier_labels=0 there is none"),
    ({"classifier_per_token": True, "classifier_dense": "tanh"},
     "classifier_per_token, classifier_dense shape classifier; with classifier_labels=0"),
    ({"classifier_pad_id": 3}, "classifier_pad_id shapes classifier"),
    ({"conv_groups": 2}, "conv_groups shapes convolution; with conv_kernel_size=0 there is none"),
    ({"conv_activation": "gelu"}, "conv_activation shapes convolution"),
    ({"disentangled_projections": "separate"}, "disentangled_projections shapes disentangled; with disentangled_buckets=0"),
    ({"disentangled_norm": False}, "disentangled_norm shapes disentangled"),
    # global_every is harmless and dropped; the offset is not
    ({"global_offset": 1, "global_every": 2}, "global_offset shapes local_attention; with local_window=0"),
    ({"rotary_theta_local": 10.0, "positions": "rotary"}, "rotary_theta_local shapes local_attention"),
    ({"token_dense_bias": True}, "token_dense_bias shapes token_dense; with token_dense_size=0"),
])
def test_format_1_reader_still_refuses_a_group_field_without_its_switch(flat, message):
    # the combinations the earlier release refused in its own files stay refused when read
    for data in ({"format": 1, **flat}, flat, {**_flat(preset("tiny")), **flat, "format": 1}):
        with pytest.raises(ConfigError, match=re.escape(message)):
            EncoderConfig.from_dict(data)
    # at its off value the field is no stray
    off = {name: config_format1.OFF.get(name, value) for name, value in flat.items()}
    assert EncoderConfig.from_dict({"format": 1, **off}) == EncoderConfig(**{k: v for k, v in off.items()
                                                                           if k not in config_format1.FLAT})


# a value other than its off one for each field format 1 accepted, without effect, while its group was off
HARMLESS = {"relative_attention_max_distance": 64, "disentangled_max_distance": 256, "global_every": 3,
            "sentence_dense_activation": "tanh", "sentence_dense_bias": False, "classifier_pooling": "mean"}


def test_the_harmless_fields_are_the_ones_listed():
    assert set(HARMLESS) == config_format1.HARMLESS_WHEN_OFF
    assert all(HARMLESS[name] != config_format1.OFF[name] for name in HARMLESS)


@pytest.mark.parametrize("name", sorted(HARMLESS))
def test_format_1_reader_drops_a_harmless_field_of_a_group_that_is_off(name):
    tiny = preset("tiny")
    group = config_format1.FLAT[name][0]
    for data in ({"format": 1, **_flat(tiny), name: HARMLESS[name]}, {name: HARMLESS[name], "name": "tiny",
                                                                     **{k: v for k, v in _flat(tiny).items()
                                                                        if k not in config_format1.FLAT}}):
        cfg = EncoderConfig.from_dict(data)
        assert cfg == tiny and getattr(cfg, group) is None
    # export's flags are strict about the same field; export --config's file is read as the metadata is
    with pytest.raises(ConfigError, match=re.escape(f"{name} shapes {group}")):
        tiny.with_fields({name: HARMLESS[name]}, strict=True)
    assert tiny.with_fields({name: HARMLESS[name]}) == tiny


@pytest.mark.parametrize("data", [
    {"classifier_labels": 3, "local_attention": {"window": 8, "global_every": 2}},
    {"format": 1, "local_attention": {"window": 8, "global_every": 2}},
    {"classifier_labels": 3, "classifier": {"labels": 5}},
])
def test_a_dict_mixing_flat_names_and_a_nested_group_is_refused_not_half_read(data):
    # format 1 had no group objects: read as format 1, the group would be dropped without a word
    with pytest.raises(ConfigError, match="the config mixes format 1's flat .* with format 2's group"):
        EncoderConfig.from_dict(data)
    with pytest.raises(ConfigError, match="the config mixes format 1's flat"):
        preset("tiny").with_fields(data)


@pytest.mark.parametrize("flat, message", [
    # an off group's fields still hold their type: 1 is not True, 0 not False, a float not an int
    ({"disentangled_norm": 1}, "disentangled_norm=1 must be of type bool, got int"),
    ({"classifier_per_token": 0}, "classifier_per_token=0 must be of type bool, got int"),
    ({"conv_groups": 1.0}, "conv_groups=1.0 must be of type int, got float"),
    ({"classifier_labels": False}, "classifier_labels=False must be of type int, got bool"),
    ({"classifier_labels": None}, "classifier_labels=None must be of type int, got NoneType"),
    ({"global_every": "3"}, "global_every='3' must be of type int, got str"),
    # and the harmless ones the values the earlier release took for them
    ({"global_every": 0}, "global_every=0 is not valid; it must be >= 1"),
    ({"relative_attention_max_distance": 0}, "relative_attention_max_distance=0 is not valid; it must be >= 1"),
    ({"disentangled_max_distance": -1}, "disentangled_max_distance=-1 is not valid; it must be >= 0"),
    ({"sentence_dense_activation": "bogus"}, "sentence_dense_activation='bogus' is not valid; it must be one of "
                                             "identity, tanh"),
    ({"classifier_pooling": "bogus"}, "classifier_pooling='bogus' is not valid; it must be one of mean, cls"),
])
def test_format_1_reader_checks_the_fields_of_an_off_group_it_drops(flat, message):
    for data in ({"format": 1, **flat}, {**_flat(preset("tiny")), **flat}):
        with pytest.raises(ConfigError, match=re.escape(message)):
            EncoderConfig.from_dict(data)
    assert EncoderConfig.from_dict({"format": 1, "rotary_theta_local": 0}) == EncoderConfig()  # 0 spells 0.0


def test_messages_name_format_1_spellings_where_format_2_keeps_them():
    # format 2 or Python given a flat name: where the group keeps it
    for call in (lambda: EncoderConfig.from_dict({"format": 2, "local_window": 8}),
                 lambda: preset("tiny").replace(local_window=8)):
        with pytest.raises(ConfigError, match=re.escape("(local_window is local_attention.window: format 2 and "
                                                        "Python write groups)")):
            call()
    # a typo in a flat file lists the flat names
    with pytest.raises(ConfigError, match=r"unknown config key\(s\) \['local_windw'\] in config format 1; valid keys: "
                                          r".*local_window, global_every"):
        EncoderConfig.from_dict({"local_windw": 8, "global_every": 2})
    # both layouts in one object: the flat keys named too, with their format-2 place
    with pytest.raises(ConfigError, match=re.escape("the config mixes format 1's flat ['local_window'] with format "
                                                    "2's group(s) ['classifier']: write it in one format (format 2: "
                                                    "local_window is local_attention.window)")):
        EncoderConfig.from_dict({"local_window": 8, "classifier": {"labels": 2}})
    # a window whose global_every was left at format 1's 1 (export --local-window alone)
    with pytest.raises(ConfigError, match=re.escape("local_window=8 with global_every=1 makes every layer global: "
                                                    "set global_every >= 2")):
        EncoderConfig.from_dict({"local_window": 8})
    assert config_format1.dropped_when_off({"global_every": 3, "classifier_pooling": "cls", "conv_groups": 2,
                                            "relative_attention_max_distance": 64, "relative_attention_buckets": 8}) \
        == ["global_every"]  # the off value and a group that is on are not dropped; conv_groups is refused instead


def test_with_fields_checks_the_format_as_from_dict_does():
    tiny = preset("tiny")
    for version, message in ((None, "format null is not supported"), (True, "format True must be an integer"),
                             (3, "format 3 is not supported")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            tiny.with_fields({"format": version, "local_window": 8, "global_every": 2})
    assert tiny.with_fields({"format": 2, "num_layers": 3}).num_layers == 3
    assert tiny.with_fields({"format": 1, "local_window": 8, "global_every": 2}).local_attention.window == 8
