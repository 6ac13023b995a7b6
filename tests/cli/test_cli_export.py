"""`ortformer export` and `ortformer check` through click's CliRunner."""
import dataclasses
import json
import os
import sys

import onnx
import pytest

from ortformer.config import format1 as config_format1
from ortformer.cli.export_cmd import COMMANDS, config_from_options
from ortformer.config import EncoderConfig, preset
from ortformer.core.errors import ConfigError
from ortformer.runtime import Runtime
from support.cli import fail_stderr as fail, invoke  # noqa: E402

# the CLI around export is under test here, not tracing: one trace per model per session
pytestmark = pytest.mark.usefixtures("cached_tracing")


@pytest.fixture(scope="module")
def linear_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "lin.onnx"
    out = invoke("export", "--preset", "tiny", "--attention", "linear", "--layers", "1", "--hidden", "16",
                 "--heads", "2", "--pooling", "cls", "--seed", "4", "-o", path).stdout
    return path, out


def test_every_command_has_help_with_an_example():
    for command in COMMANDS:
        assert "Examples:" in command.help and f"ortformer {command.name} " in command.help
        assert invoke(command.name, "--help").stdout.startswith("Usage:")


def test_export_with_flags_prints_a_summary_and_writes_a_working_model(linear_model):
    path, out = linear_model
    assert f"wrote {path}" in out and "linear attention, 1 layer x 16" in out
    assert "input_ids [batch, sequence]" in out and "sentence_embedding [batch, 16]" in out
    assert "parity:  PASS over 20 cases" in out
    rt = Runtime(path, "cpu")
    assert (rt.config.attention, rt.config.hidden_size, rt.config.pooling, rt.source) == ("linear", 16, "cls", "random-init:seed=4")


def test_export_json_report(tmp_path):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"vocab_size": 0, "hidden_size": 8, "num_heads": 2, "num_layers": 1,
                                  "ffn_size": 16, "max_positions": 16, "attention": "cosine"}))
    data = json.loads(invoke("export", "--config", config, "--norm", "rmsnorm", "-o", tmp_path / "m.onnx", "--json").stdout)
    assert data["config"]["norm"] == "rmsnorm" and data["config"]["attention"] == "cosine"
    assert {i["name"]: i["shape"] for i in data["inputs"]} == {"inputs_embeds": ["batch", "sequence", 8],
                                                             "attention_mask": ["batch", "sequence"]}
    assert data["parity"]["passed"] is True and data["size_bytes"] == os.path.getsize(tmp_path / "m.onnx")


def test_variant_flags_reach_the_config(tmp_path):
    data = json.loads(invoke("export", "--preset", "tiny", "--layers", "1", "--ffn-gated", "--activation", "silu",
                             "--no-bias", "--relative-buckets", "8", "--relative-max-distance", "12",
                             "--positions", "rotary", "--rotary-theta", "160000", "--rotary-theta-local", "10000",
                             "--local-window", "8", "--global-every", "3",
                             "--no-parity", "-o", tmp_path / "m.onnx", "--json").stdout)
    config = data["config"]
    assert (config["ffn_gated"], config["activation"], config["bias"]) == (True, "silu", False)
    # the flags keep format 1's names; the report's config is format 2, each group an object
    assert config["format"] == 2
    assert config["relative_attention"] == {"buckets": 8, "max_distance": 12}
    assert (config["positions"], config["rotary_theta"]) == ("rotary", 160000.0)
    assert config["local_attention"] == {"window": 8, "global_every": 3, "global_offset": 0, "rotary_theta": 10000.0}
    stderr = fail("export", "--preset", "tiny", "--attention", "linear", "--relative-buckets", "8",
                  "-o", tmp_path / "x.onnx", code=2)
    assert "needs --attention 'softmax'" in stderr and not (tmp_path / "x.onnx").exists()


def test_print_config_is_format_2_and_config_files_may_be_either_format(tmp_path):
    printed = json.loads(invoke("export", "--preset", "tiny", "--local-window", "8", "--global-every", "3",
                                "--print-config").stdout)
    assert printed["format"] == 2 and printed["classifier"] is None and "local_window" not in printed
    assert printed["local_attention"] == {"window": 8, "global_every": 3, "global_offset": 0, "rotary_theta": 0.0}
    # the printed config is a config file that gives the same config back
    (tmp_path / "v2.json").write_text(json.dumps(printed))
    assert json.loads(invoke("export", "--config", tmp_path / "v2.json", "--print-config").stdout) == printed
    # format 1's flat names, with and without "format": the same config
    flat = {"name": "tiny", "vocab_size": 100, "hidden_size": 32, "num_layers": 2, "ffn_size": 64, "max_positions": 64,
            "type_vocab_size": 2, "norm_eps": 1e-5, "local_window": 8, "global_every": 3}
    for data in (flat, {"format": 1, **flat}):
        (tmp_path / "v1.json").write_text(json.dumps(data))
        assert json.loads(invoke("export", "--config", tmp_path / "v1.json", "--print-config").stdout) == printed
    # a flag merges into the group a format-2 file set
    (tmp_path / "group.json").write_text(json.dumps({"format": 2, "classifier": {"labels": 3, "dense": "tanh"}}))
    cfg = config_from_options("tiny", str(tmp_path / "group.json"), {"vocab": None, "layers": 1})
    assert (cfg.classifier.labels, cfg.classifier.dense, cfg.num_layers) == (3, "tanh", 1)
    merged = json.loads(invoke("export", "--config", tmp_path / "group.json", "--global-every", "2", "--local-window",
                               "4", "--print-config").stdout)
    assert merged["classifier"]["dense"] == "tanh" and merged["local_attention"]["window"] == 4
    # a group's flag without its switch does nothing, so it is refused; a format-1 file may hold one, as the
    # previous release's --print-config wrote it after --global-every 3: dropped, as from a model's metadata
    assert "--global-every shapes local_attention; with --local-window 0" in fail(
        "export", "--preset", "tiny", "--global-every", "3", "--print-config", code=2)
    old = {**config_format1.to_flat(dataclasses.asdict(preset("tiny"))), "format": 1, "global_every": 3,
           "classifier_pooling": "mean"}
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert config_from_options("tiny", str(tmp_path / "old.json"), {}) == EncoderConfig.from_dict(old) == preset("tiny")
    result = invoke("export", "--config", tmp_path / "old.json", "--print-config")  # said, not silent
    assert json.loads(result.stdout) == preset("tiny").to_dict()
    for name, switch in (("global_every", "local_window"), ("classifier_pooling", "classifier_labels")):
        assert f"{name} has no effect while {switch} is 0" in result.stderr, result.stderr
    assert "--local-window 4 with --global-every 1 makes every layer global" in fail(
        "export", "--preset", "tiny", "--local-window", "4", "--print-config", code=2)
    (tmp_path / "old.json").write_text(json.dumps({**old, "conv_groups": 2}))  # the previous release refused it too
    assert "conv_groups shapes convolution; with conv_kernel_size=0" in fail("export", "--config",
                                                                             tmp_path / "old.json", "--print-config")
    (tmp_path / "bad.json").write_text(json.dumps({"format": 2, "classifier": {"labels": 3, "bias": True}}))
    assert "unknown key(s) ['bias'] in config classifier" in fail("export", "--config", tmp_path / "bad.json",
                                                                  "--print-config")


def test_vocab_zero_alone_means_float_features(tmp_path):
    flags = {"vocab": 0, "type_vocab": None}
    cfg = config_from_options("tiny", None, flags)
    assert (cfg.vocab_size, cfg.type_vocab_size) == (0, 0)
    with pytest.raises(ConfigError, match="type_vocab_size needs token input"):  # said explicitly: refused
        config_from_options("tiny", None, {**flags, "type_vocab": 2})
    assert config_from_options("tiny", None, {"vocab": 50, "type_vocab": None}).type_vocab_size == 2  # the preset's
    (tmp_path / "c.json").write_text('{"type_vocab_size": 2}')  # said in the config file: refused too
    with pytest.raises(ConfigError, match="type_vocab_size needs token input"):
        config_from_options("tiny", str(tmp_path / "c.json"), flags)


def test_existing_file_needs_force(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(b"keep me")
    assert "already exists" in fail("export", "--preset", "tiny", "-o", path, "--no-parity")
    assert path.read_bytes() == b"keep me"
    invoke("export", "--preset", "tiny", "-o", path, "--no-parity", "--force")
    assert onnx.load(str(path)).graph.input[0].name == "input_ids"
    assert "skipped" in invoke("info", path).stdout


@pytest.mark.parametrize("args, message", [
    (["--heads", "5"], "--hidden 32 is not divisible by --heads 5"),
    (["--attention", "flash"], "Invalid value for '--attention'"),
    (["--layers", "0"], "Invalid value for '--layers'"),
    (["--preset", "tiny", "--config", "x.json"], "duplicate key(s) ['num_layers']"),
    (["--opset", "11"], "opset 11 is not supported"),
    (["--dtype", "float16", "--quantize", "int8"], "--quantize int8 quantizes a float32 export; drop --dtype float16"),
])
def test_bad_flags_fail_with_one_line(args, message, tmp_path):
    if "x.json" in args:
        (tmp_path / "x.json").write_text('{"num_layers": 1, "num_layers": 2}')
        args = [str(tmp_path / "x.json") if a == "x.json" else a for a in args]
    stderr = fail("export", *(["--preset", "tiny"] if "--preset" not in args and "--config" not in args else []),
                  *args, "-o", tmp_path / "m.onnx", code=1 if "duplicate key" in message else 2)
    assert message in stderr
    assert not (tmp_path / "m.onnx").exists()


def test_unwritable_directory_is_one_line_error(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    # root writes through file modes; /proc refuses new files to everyone
    target = locked if not os.access(locked, os.W_OK) else "/proc"
    try:
        stderr = fail("export", "--preset", "tiny", "-o", f"{target}/m.onnx")
        assert "not writable" in stderr or "cannot write into" in stderr
    finally:
        locked.chmod(0o700)


def test_missing_folder_and_bad_config_file(tmp_path):
    assert "does not exist" in fail("export", "--preset", "tiny", "-o", tmp_path / "no" / "m.onnx")
    bad = tmp_path / "bad.json"
    bad.write_text('{"dropout": 0.1}')
    assert "unknown config key" in fail("export", "--config", bad, "-o", tmp_path / "m.onnx")


def test_check_reruns_parity_from_the_recorded_seed(linear_model):
    path, _ = linear_model
    out = invoke("check", path).stdout
    assert "checker ok" in out and "PASS over 20 cases" in out and "seed 4" in out
    data = json.loads(invoke("check", path, "--json").stdout)
    assert data["parity"]["passed"] is True


def test_check_fails_against_other_weights(linear_model):
    path, _ = linear_model
    assert "parity against random init, seed 5 failed" in fail("check", path, "--seed", "5")


def test_check_against_a_config_of_another_model(linear_model, tmp_path):
    path, _ = linear_model
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"attention": "softmax", "vocab_size": 100}))
    assert "describes another model" in fail("check", path, "--against", other)


def test_check_refuses_a_foreign_file(tmp_path):
    path = tmp_path / "x.onnx"
    path.write_bytes(b"\x00not onnx")
    assert fail("check", path).splitlines()[-1].startswith("error: ")  # after the progress lines


def test_export_writes_a_triton_repository_entry(tmp_path):
    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from google.protobuf import text_format

    repo = tmp_path / "models"
    result = invoke("export", "--preset", "tiny", "--no-parity", "-o", tmp_path / "tiny.onnx",
                    "--triton-repo", repo, "--triton-name", "enc", "--max-batch-size", "16")
    out = result.stdout
    # without the parity gate the export has three steps, and the progress lines count three
    steps = [line.split("]")[0] + "]" for line in result.stderr.splitlines() if line.startswith("[")]
    assert steps == ["[1/3]", "[2/3]", "[3/3]"], result.stderr
    assert f"triton:  {repo / 'enc'}" in out
    config = text_format.Parse((repo / "enc" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert (config.name, config.platform, config.max_batch_size) == ("enc", "onnxruntime_onnx", 16)
    assert [i.name for i in config.input] == ["input_ids", "attention_mask", "token_type_ids"]
    assert (repo / "enc" / "1" / "model.onnx").read_bytes() == (tmp_path / "tiny.onnx").read_bytes()


@pytest.mark.parametrize("name", ["../x", "a/b", ".hidden"])
def test_bad_triton_name_is_refused_before_exporting(name, tmp_path):
    assert "Triton model name" in fail("export", "--preset", "tiny", "-o", tmp_path / "m.onnx",
                                       "--triton-repo", tmp_path / "models", "--triton-name", name)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("verb", [["export", "--preset", "tiny"], ["check", "MODEL"], ["bench", "--quick"]])
def test_torch_verbs_without_torch_name_the_extra(verb, tmp_path):
    """In a process where torch cannot be imported, torch verbs say which extra to install."""
    import subprocess

    model = tmp_path / "m.onnx"
    model.write_bytes(b"placeholder")
    args = [str(model) if a == "MODEL" else a for a in verb] + (["-o", str(tmp_path / "o.onnx")] if verb[0] == "export" else [])
    code = ("import sys; sys.modules['torch'] = None\n"  # makes `import torch` raise ImportError
            "from ortformer.cli import cli\n"
            f"cli({args!r}, prog_name='ortformer')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: ")
    extra = "bench" if verb[0] == "bench" else "export"  # bench's own group pulls in export
    assert f"pip install 'ortformer[{extra}]'" in done.stderr


def test_embedding_flags_reach_the_config_and_pass_the_gate(tmp_path):
    data = json.loads(invoke("export", "--preset", "tiny", "--layers", "1", "--position-offset", "2",
                             "--position-ids", "kept", "--embedding-size", "16", "--norm-position", "pre",
                             "--embedding-norm", "-o", tmp_path / "m.onnx", "--json").stdout)
    config = data["config"]
    assert (config["position_offset"], config["position_ids"], config["embedding_size"], config["embedding_norm"]) \
        == (2, "kept", 16, True)
    assert data["parity"]["passed"] is True
    assert max(c["sequence"] for c in data["parity"]["cases"]) == 62  # 64 rows less the offset
