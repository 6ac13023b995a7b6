"""`ortformer profile` through click's CliRunner."""
import json

import pytest
from click.testing import CliRunner

from ortformer.cli import cli
from ortformer.cli.profile_cmd import COMMANDS

FAST = ("--sequence", "8", "--runs", "2", "--threads", "1")


def invoke(*args, code=0):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exit_code == code, (result.output, result.exception)
    return result


pytestmark = pytest.mark.usefixtures("clean_dirs")  # tests/conftest.py: no profile file left behind


def test_help_has_examples():
    (command,) = COMMANDS
    assert "Examples:" in command.help and "ortformer profile " in command.help
    assert "--top" in invoke("profile", "--help").stdout


def test_table(tokens_model):
    lines = invoke("profile", tokens_model, *FAST, "--batch", "2").stdout.splitlines()
    header, columns, rows = lines[0], lines[1], lines[2:]
    assert f"model {tokens_model}" in header and "provider cpu" in header and "threads 1" in header
    assert "shape 2x8" in header and "median run" in header
    assert columns.split() == ["op", "nodes", "ms/run", "share"]
    assert len(rows) >= 5
    shares = [float(row.split()[-1].rstrip("%")) for row in rows]
    assert shares == sorted(shares, reverse=True) and sum(shares) == pytest.approx(100, abs=0.1 * len(rows))
    assert any(row.split()[0] in ("MatMul", "FusedMatMul") for row in rows)


def test_top_limits_rows(tokens_model):
    full = invoke("profile", tokens_model, *FAST).stdout.splitlines()
    top = invoke("profile", tokens_model, *FAST, "--top", "3").stdout.splitlines()
    assert len(top) == 2 + 3 and len(full) > len(top)


def test_default_sequence_fits_the_model(tokens_model):
    """128 tokens by default, or the model's max_positions when shorter (the test model's)."""
    from ortformer.runtime import read_model_file

    longest = read_model_file(tokens_model).config.max_positions
    header = invoke("profile", tokens_model, "--runs", "1", "--threads", "1").stdout.splitlines()[0]
    assert f"shape 1x{min(128, longest)} " in header


def test_json_respects_top(tokens_model):
    report = json.loads(invoke("profile", tokens_model, *FAST, "--json", "--top", "2").stdout)
    assert len(report["ops"]) == 2


def test_json(features_model):
    report = json.loads(invoke("profile", features_model, *FAST, "--json").stdout)
    assert {"model", "provider", "threads", "batch", "sequence", "runs", "median_run_ms", "kernel_ms_per_run",
            "ops", "top_nodes"} <= set(report)
    assert (report["batch"], report["sequence"], report["runs"], report["provider"]) == (1, 8, 2, "cpu")
    assert sum(op["share"] for op in report["ops"]) == pytest.approx(1.0)
    assert all(set(op) == {"op", "nodes", "ms_per_run", "share"} for op in report["ops"])
    assert all(set(node) == {"node", "op", "ms_per_run"} for node in report["top_nodes"])


def test_sequence_beyond_max_positions_is_a_usage_error(tokens_model):
    result = invoke("profile", tokens_model, "--sequence", "65", code=2)
    assert result.stderr.strip().splitlines()[-1] == ("Error: Invalid value for '--sequence': 65 must be an int in [1, 64] "
                                                      "(max_positions: the longest sequence the model takes)")
    assert result.stdout == ""


@pytest.mark.parametrize("args", [("--batch", "0"), ("--sequence", "0"), ("--runs", "0"), ("--threads", "0"),
                                  ("--top", "0"), ("--provider", "tpu")])
def test_bad_options_are_usage_errors(tokens_model, args):
    result = invoke("profile", tokens_model, *args, code=2)
    assert args[0] in result.stderr


def test_missing_model(tmp_path):
    assert "does not exist" in invoke("profile", tmp_path / "missing.onnx", code=2).stderr


def test_not_a_model_is_a_one_line_error(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    result = invoke("profile", bad, *FAST, code=1)
    assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1
