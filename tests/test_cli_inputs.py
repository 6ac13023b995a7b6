"""What the CLI reads: never silently misread, never a traceback."""
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ortformer import contract
from ortformer.cli import cli
from ortformer.cli.common import thread_limit
from ortformer.config import preset
from ortformer.runtime import Runtime

sys.path.insert(0, str(Path(__file__).parent / "scale"))
from conftest import minilm_tokenizer, set_metadata  # noqa: E402

DEEP = "[" * 3000 + "]" * 3000


def invoke(*args, input=None, ok=True):
    result = CliRunner().invoke(cli, [str(a) for a in args], input=input)
    if ok:
        assert result.exit_code == 0, (result.output, result.exception)
    return result


def fail(*args, input=None, code=1):
    result = invoke(*args, input=input, ok=False)
    assert result.exit_code == code, (result.output, result.exception)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    if code == 1:
        assert lines[-1].startswith("error: ") and sum(x.startswith("error") for x in lines) == 1, result.stderr
    return lines[-1]


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    """tiny with BERT's vocabulary and the MiniLM tokenizer beside it."""
    from ortformer.exporter import export

    folder = tmp_path_factory.mktemp("text_model")
    path = folder / "tiny.onnx"
    export(preset("tiny", vocab_size=30522), path, parity=False)
    shutil.copy(minilm_tokenizer(), folder / "tokenizer.json")
    set_metadata(path, contract.META_TOKENIZER, "tokenizer.json")
    return path


def test_deeply_nested_json_is_one_line(tokens_model, tmp_path):
    assert "nested too deeply" in fail("infer", tokens_model, "--ids", DEEP)
    (tmp_path / "deep.json").write_text(DEEP)
    assert "nested too deeply" in fail("infer", tokens_model, "--input", tmp_path / "deep.json")
    assert "stdin line 1" in fail("infer", tokens_model, input=DEEP + "\n")


def test_non_utf8_files_are_one_line(tokens_model, tmp_path):
    bad = tmp_path / "bom.json"
    bad.write_bytes(b"\xff\xfe[\x001\x00]\x00")
    assert "UTF-8" in fail("infer", tokens_model, "--input", bad)
    assert "UTF-8" in fail("export", "--config", bad, "-o", tmp_path / "m.onnx")


def test_blank_lines_of_a_text_file_keep_their_rows(text_model, tmp_path):
    gap = tmp_path / "gap.txt"
    gap.write_text("a\n\nb\u2028c\n")
    rows = json.loads(invoke("infer", text_model, "--text-file", gap).stdout)
    given = json.loads(invoke("infer", text_model, "--text", "a", "--text", "", "--text", "b\u2028c").stdout)
    assert len(rows) == 3
    np.testing.assert_allclose(rows, given, atol=1e-6, rtol=0)


def test_text_input_writes_npy(text_model, tmp_path):
    """The --help example: --text-file sentences.txt -o embeddings.npy."""
    (tmp_path / "sentences.txt").write_text("A first sentence.\nAnother one.\n")
    out = tmp_path / "embeddings.npy"
    invoke("infer", text_model, "--text-file", tmp_path / "sentences.txt", "-o", out)
    assert np.load(out).shape == (2, Runtime(text_model, "cpu").config.hidden_size)


def test_ids_null_is_not_ignored(tokens_model):
    assert "--ids" in fail("infer", tokens_model, "--ids", "null", input="[5, 6]\n")


def test_threads_are_capped(tokens_model):
    too_many = str(thread_limit() + 1)
    assert "--threads" in fail("infer", tokens_model, "--ids", "[1]", "--threads", too_many, code=2)
    assert "--threads" in fail("profile", tokens_model, "--threads", too_many, code=2)
    assert "--threads" in fail("bench", "--quick", "--threads", too_many, code=2)
    from ortformer.errors import InputError

    with pytest.raises(InputError, match="threads"):
        Runtime(tokens_model, "cpu", threads=10_000)


def test_empty_input_is_an_empty_result_everywhere(tokens_model, tmp_path):
    np.save(tmp_path / "empty.npy", np.zeros((0, 3), np.int64))
    assert json.loads(invoke("infer", tokens_model, "--ids", "[]").stdout) == []
    assert json.loads(invoke("infer", tokens_model, "--input", tmp_path / "empty.npy").stdout) == []
    assert invoke("infer", tokens_model, input="").stdout == ""
    invoke("infer", tokens_model, "--ids", "[]", "--tensor", "last_hidden_state", "-o", tmp_path / "s.npy")
    assert np.load(tmp_path / "s.npy").shape[0] == 0


@pytest.mark.parametrize("report", [
    {"passed": True, "worst": {"sentence_embedding": {"max_abs": "NaN", "min_cosine": None}}, "cases": 3},
    {"passed": "yes", "worst": ["x"], "cases": [1]},
    {"passed": False, "worst": {"last_hidden_state": 5}},
])
def test_info_prints_a_malformed_parity_report_whole(tokens_model, tmp_path, report):
    import onnx

    model = onnx.load(str(tokens_model))
    for prop in model.metadata_props:
        if prop.key == contract.META_PARITY:
            prop.value = json.dumps(report)
    onnx.save(model, str(tmp_path / "m.onnx"))
    out = invoke("info", tmp_path / "m.onnx").stdout
    assert "parity" in out and "providers" in out
