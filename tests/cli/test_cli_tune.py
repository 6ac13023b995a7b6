"""`ortformer tune`: the table, the JSON, --write and its record, and the CLI's errors."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from support.cli import fail, invoke

from ortformer.contract.parity import GATES
from ortformer.runtime import Runtime


@pytest.fixture
def model(text_model, tmp_path):
    """A copy of the tiny text model (tiny.onnx + tokenizer.json), so records land in tmp_path."""
    for name in ("tiny.onnx", "tokenizer.json"):
        shutil.copy(text_model.with_name(name), tmp_path / name)
    return tmp_path / "tiny.onnx"


@pytest.fixture
def texts(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_text("a short one\n\nthe second text, a longer one than the first\nx\n")
    return path


def test_tune_prints_a_table_writes_the_record_and_json_agrees(model, texts):
    out = invoke("tune", model, "--texts", texts, "--threads", "1", "--rounds", "1", "--write").output
    assert "tiny.onnx: 3 texts, 1 thread(s), 1 round(s)" in out
    assert "onnxruntime  float32" in out and "float32 pass" in out and "no int8 sibling" in out
    assert "choice (--quality float32): " in out and "--provider tuned uses it on this CPU at 1 thread(s)" in out
    record = json.loads(model.with_name("tiny.tuned.json").read_text())
    assert record["choices"][0]["quality"] == "float32" and record["choices"][0]["precision"] == "float32"
    assert Runtime(model, "tuned", threads=1).tuned == record["choices"][0]
    result = json.loads(invoke("tune", model, "--texts", texts, "--threads", "1", "--rounds", "2", "--json").stdout)
    assert result["texts"] == 3 and result["rounds"] == 2 and result["threads"] == 1
    assert all(len(row["seconds"]) == 2 for row in result["candidates"] if row["available"])
    assert result["choice"]["chosen"] and "record" not in result


def test_infer_takes_provider_tuned(model, texts):
    invoke("tune", model, "--texts", texts, "--threads", "1", "--rounds", "1", "--write")
    tuned = invoke("infer", model, "--provider", "tuned", "--threads", "1", "--text", "one text").stdout
    plain = invoke("infer", model, "--provider", "cpu", "--threads", "1", "--text", "one text").stdout
    np.testing.assert_allclose(json.loads(tuned), json.loads(plain), atol=GATES["float32"]["max_abs"])


def test_tune_errors(model, texts, tmp_path):
    assert "does not exist" in fail("tune", tmp_path / "missing.onnx", code=2)
    invoke("tune", model, "--texts", texts, "--threads", "1", "--rounds", "1", "--write")
    line = fail("tune", model, "--texts", texts, "--threads", "1", "--rounds", "1", "--write")
    assert "already records a choice for this CPU at 1 thread(s)" in line and line.endswith("--force replaces it")
    invoke("tune", model, "--texts", texts, "--threads", "1", "--rounds", "1", "--write", "--force")
    assert "--force replaces a recorded choice; it needs --write" in fail("tune", model, "--force", code=2)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n")
    assert fail("tune", model, "--texts", empty) == f"error: --texts {empty} holds no text (one text per line)"
    assert "'fp8' is not one of 'float32', 'near-lossless', 'int8'" in fail("tune", model, "--quality", "fp8", code=2)
    line = fail("infer", model, "--provider", "tuned", "--threads", "2", "--ids", "[1]")
    assert "holds no choice for this CPU" in line and "tuned here for 1 thread(s) only" in line
