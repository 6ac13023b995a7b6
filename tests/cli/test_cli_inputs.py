"""What the CLI reads: never silently misread, never a traceback."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from ortformer import contract
from ortformer.cli.common import thread_limit
from ortformer.runtime import Runtime
# the session fixture text_model: tiny with BERT's vocabulary and the MiniLM tokenizer beside it
from support.cli import fail, invoke  # noqa: E402

DEEP = "[" * 3000 + "]" * 3000


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


def test_undecodable_bytes_in_a_text_argument_are_one_line(text_model):
    # a shell passes bytes that are not UTF-8 as lone surrogates (Python's surrogateescape)
    line = fail("infer", text_model, "--text", "fine", "--text", "bad \udced\udca0\udc80 x")
    assert "texts[1] is not valid Unicode" in line


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
    from ortformer.core.errors import InputError

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


def test_text_errors_give_advice_the_cli_can_follow(text_model, tokens_model, tmp_path):
    line = fail("infer", text_model, "--text", "a", "--text", "a much longer sentence than that",
                "--tensor", "last_hidden_state", "-o", tmp_path / "x.npy")
    assert "ragged" in line and "--format json" in line
    assert not (tmp_path / "x.npy").exists()
    line = fail("infer", tokens_model, "--text", "hello")
    assert "names no tokenizer" in line and "export --tokenizer" in line and "infer --ids" in line


def test_a_text_file_keeps_its_lines_as_written(text_model, tmp_path):
    """A byte-order mark is not part of the first text; only "\\n" ends a line (a lone "\\r"
    stays inside its line, so rows still line up with lines); "-" reads stdin."""
    from ortformer.cli.runtime_cmd import _read_texts

    path = tmp_path / "t.txt"
    path.write_bytes(b"\xef\xbb\xbfhello world\r\na\rb\nc\n")
    assert _read_texts((), str(path)) == ["hello world", "a\rb", "c"]
    rows = json.loads(invoke("infer", text_model, "--text-file", path).stdout)
    given = json.loads(invoke("infer", text_model, "--text", "hello world", "--text", "a\rb", "--text", "c").stdout)
    assert len(rows) == 3
    np.testing.assert_allclose(rows, given, atol=1e-6, rtol=0)
    piped = json.loads(invoke("infer", text_model, "--text-file", "-", input=path.read_bytes()).stdout)
    np.testing.assert_allclose(piped, given, atol=1e-6, rtol=0)
    assert "cannot both read stdin" in fail("infer", text_model, "--text-file", "-", "--pair-file", "-", code=2)


def test_json_booleans_are_not_token_ids(tokens_model):
    assert "holds true/false" in fail("infer", tokens_model, "--ids", "[[5, true]]")
    assert "holds true/false" in fail("infer", tokens_model, "--ids", "[[5, 6]]", "--mask", "[[1, false]]")
    assert "holds true/false" in fail("infer", tokens_model, input="[5, true]\n")


def test_errors_in_batched_rectangular_input_name_the_row_of_the_input(tokens_model, tmp_path):
    ids = np.full((10, 4), 5, dtype=np.int64)
    ids[9, 3] = 10 ** 6
    (tmp_path / "ids.npy").write_bytes(b"")
    np.save(tmp_path / "ids.npy", ids)
    np.save(tmp_path / "mask.npy", np.ones((10, 4), dtype=np.int64))
    for extra in (["--mask", tmp_path / "mask.npy"], ["--tensor", "last_hidden_state", "-o", tmp_path / "h.npy"]):
        line = fail("infer", tokens_model, "--input", tmp_path / "ids.npy", "--batch-size", 4, *extra)
        assert "input_ids[9, 3]" in line and "rows 8..9 of the input" in line, line
    assert not (tmp_path / "h.npy").exists()


def test_npy_is_not_written_to_a_terminal(tokens_model):
    import os
    import pty
    import subprocess

    master, terminal = pty.openpty()
    try:
        done = subprocess.run([sys.executable, "-c", "from ortformer.cli import main; main()", "infer", str(tokens_model),
                               "--ids", "[[5, 6]]", "--format", "npy"], stdout=terminal, stderr=subprocess.PIPE,
                              text=True, timeout=300)
    finally:
        os.close(terminal)
        os.close(master)
    assert done.returncode == 2 and "--format npy writes binary" in done.stderr, done.stderr


def test_bad_option_values_are_usage_errors_naming_the_flag(tokens_model, text_model, tmp_path):
    """Values whose bound depends on the model or the suffix exit 2, as click's own checks do."""
    (tmp_path / "one.txt").write_text("a\n")
    cases = [
        (("batch", tokens_model, "--input", tmp_path / "one.txt", "-o", tmp_path / "x.parquet"),
         "Invalid value for '--input'", ".jsonl or .parquet"),
        (("export", "--preset", "tiny", "-o", tmp_path / "q.txt"), "Invalid value for '-o' / '--output'", "end in .onnx"),
        (("profile", tokens_model, "--sequence", 100000), "Invalid value for '--sequence'", "100000 must be an int"),
        (("infer", text_model, "--text", "hi", "--prompt-name", "nope"), "Invalid value for '--prompt-name'",
         "'nope' is not a prompt"),
        (("infer", tokens_model, "--ids", "[[1]]", "--format", "json", "-o", tmp_path / "x.npy"),
         "--format json does not fit", "name the file .json"),
        (("infer", tokens_model, "--ids", "[[1]]", "-o", ""), "Invalid value for '-o/--output'", "empty path"),
    ]
    for args, *wanted in cases:
        last = fail(*args, code=2)
        assert all(w in last for w in wanted), (args, last)
    assert not (tmp_path / "x.npy").exists() and not (tmp_path / "q.txt").exists()
    assert "-o" in fail("infer", tokens_model, "-o", tmp_path / "s.npy", input="[1]\n", code=2)


def test_a_model_file_of_any_name_is_read_as_binary_onnx(tokens_model, tmp_path):
    # onnx.load picks a text parser for *.json / *.textproto; onnxruntime reads binary whatever the name
    for name in ("model.json", "model.textproto", "model"):
        (tmp_path / name).write_bytes(Path(tokens_model).read_bytes())
        assert Runtime(tmp_path / name).run([[1, 2]])["last_hidden_state"].shape[:2] == (1, 2)
    (tmp_path / "big.json").write_text('{"x": "' + "y" * 20000 + '"}')
    assert len(fail("info", tmp_path / "big.json")) < 600  # the parser's quote of the file is cut
