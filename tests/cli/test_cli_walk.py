"""Every verb that writes refuses cleanly: an unwritable output path, an existing output
without --force, an output folder named through a symbolic link. A clean refusal is one
`error:` line and exit 1 (or click's usage error, exit 2), never a traceback, and nothing
is written."""
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from ortformer.cli import cli

UNWRITABLE = Path("/proc")  # refuses new files even to root


def refused(args, cwd: Path):
    before = sorted(str(p) for p in cwd.rglob("*"))
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exit_code in (1, 2), (args, result.output, result.exception)
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith(("error:", "Error:"))]
    assert len(errors) == 1, result.stderr
    assert sorted(str(p) for p in cwd.rglob("*")) == before, "a refused command wrote something"
    return errors[0]


def verbs(model: Path, inputs: Path):
    """verb -> (arguments before the output, output option, output is a folder)."""
    return {
        "export": (["export", "--preset", "tiny", "--no-parity"], "-o", False),
        "infer": (["infer", model, "--ids", "[[1, 2]]"], "-o", False),
        "optimize": (["optimize", model], "-o", False),
        "bench": (["bench", "--quick"], "--out", True),
        "triton-repo": (["triton-repo", model, "--name", "m"], "--repo", True),
        "batch": (["batch", model, "--input", inputs], "--output", True),
    }


@pytest.fixture
def setup(tmp_path, tokens_model):
    work = tmp_path / "work"
    work.mkdir()
    inputs = tmp_path / "texts.jsonl"
    inputs.write_text('{"text": "a"}\n')
    return work, tokens_model, inputs


@pytest.mark.parametrize("verb", ["export", "infer", "optimize", "bench", "triton-repo", "batch"])
def test_unwritable_output(setup, verb):
    work, model, inputs = setup
    args, option, folder = verbs(model, inputs)[verb]
    refused([*args, option, UNWRITABLE / "out" / ("" if folder else "x.onnx")], work)


@pytest.mark.parametrize("verb", ["export", "infer", "optimize", "bench", "triton-repo", "batch"])
def test_existing_output_without_force(setup, verb):
    work, model, inputs = setup
    args, option, folder = verbs(model, inputs)[verb]
    if folder:
        out = work / "out"
        existing = {"bench": out / "bench.json", "triton-repo": out / "m" / "config.pbtxt",
                    "batch": out / "part-00000.parquet"}[verb]
        existing.parent.mkdir(parents=True)
    else:
        out = existing = work / "x.onnx"
    existing.write_text("precious")
    message = refused([*args, option, out], work)
    assert "already exists" in message or "not an ortformer batch output" in message
    assert existing.read_text() == "precious"


@pytest.mark.parametrize("verb", ["export", "infer", "optimize", "bench", "triton-repo", "batch"])
def test_symlinked_output_folder(setup, tmp_path, verb):
    work, model, inputs = setup
    args, option, folder = verbs(model, inputs)[verb]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, work / "link")
    out = work / "link" if folder else work / "link" / "x.onnx"
    assert "symbolic link" in refused([*args, option, out, "--force"] if verb != "batch" else [*args, option, out], work)
    assert list(elsewhere.iterdir()) == []
