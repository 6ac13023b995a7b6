"""What every verb writes: never an input, never an existing file without --force,
atomically, with the usual permissions, and a clean one-line error where it cannot."""
import json
import os
import shutil
import stat
import sys
from pathlib import Path

import numpy as np
import pytest

from ortformer.core import fsutil
# the session fixture text_model: tiny with BERT's vocabulary and the MiniLM tokenizer beside it
from support.cli import fail, invoke  # noqa: E402

# root writes through file modes; /proc refuses new files to everyone
UNWRITABLE = Path("/proc")


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield 0o640
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_infer_never_writes_over_its_model(tokens_model, tmp_path):
    model = tmp_path / "v.onnx"
    shutil.copy(tokens_model, model)
    before = model.read_bytes()
    assert "input" in fail("infer", model, "--ids", "[[1, 2]]", "-o", model)
    assert "input" in fail("infer", model, "--ids", "[[1, 2]]", "-o", model, "--force")
    assert "input" in fail("infer", model, "--ids", "[[1, 2]]", "-o", tmp_path / "." / "v.onnx", "--force")
    link = tmp_path / "hard.onnx"
    os.link(model, link)
    assert "input" in fail("infer", model, "--ids", "[[1, 2]]", "-o", link, "--force")
    assert model.read_bytes() == before


def test_stream_output_is_refused_without_force_and_atomic_with_it(tokens_model, tmp_path):
    precious = tmp_path / "k.txt"
    precious.write_text("precious\n")
    assert "already exists" in fail("infer", tokens_model, "-o", precious, input="[1, 2]\n[999]\n")
    assert "stdin line 2" in fail("infer", tokens_model, "-o", precious, "--force", input="[1, 2]\n[999]\n")
    assert precious.read_text() == "precious\n"
    assert [p.name for p in tmp_path.iterdir()] == ["k.txt"]  # no temporary file left
    invoke("infer", tokens_model, "-o", precious, "--force", input="[1, 2]\n[3]\n")
    assert len(precious.read_text().splitlines()) == 2


def test_npy_output_is_written_exactly_where_asked(tokens_model, tmp_path):
    out = tmp_path / "v.out"
    invoke("infer", tokens_model, "--ids", "[[1, 2]]", "-o", out, "--format", "npy")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v.out"]
    assert np.load(out).shape[0] == 1


def test_infer_output_names_the_file_and_tensor_picks_the_output(tokens_model, tmp_path):
    out = tmp_path / "h.json"
    invoke("infer", tokens_model, "--ids", "[[1, 2]]", "--output", out, "--tensor", "last_hidden_state")
    assert np.asarray(json.loads(out.read_text())).shape[:2] == (1, 2)
    assert "--tensor" in fail("infer", tokens_model, "--ids", "[[1, 2]]", "--output", "last_hidden_state", code=2)


@pytest.mark.parametrize("where", ["missing", "unwritable"])
def test_unwritable_outputs_are_one_line(tokens_model, tmp_path, where):
    folder = tmp_path / "no" / "d" if where == "missing" else UNWRITABLE
    fail("infer", tokens_model, "--ids", "[[1]]", "-o", folder / "x.json")
    fail("infer", tokens_model, "-o", folder / "x.json", input="[1]\n")
    fail("optimize", tokens_model, "-o", folder / "x.onnx")
    if where == "unwritable":  # a missing --out folder is created, with its parents
        fail("bench", "--quick", "--out", folder / "b")


def test_optimize_refuses_its_model_and_keeps_the_usual_mode(tokens_model, tmp_path, umask_027):
    model = tmp_path / "m.onnx"
    shutil.copy(tokens_model, model)
    assert "input" in fail("optimize", model, "-o", model, "--force")
    out = tmp_path / "o.onnx"
    out.write_bytes(b"old")
    out.chmod(0o644)
    invoke("optimize", model, "-o", out, "--force")
    assert mode(out) == umask_027


def test_triton_and_shards_write_with_the_usual_mode(tokens_model, tmp_path, umask_027):
    entry = Path(invoke("triton-repo", tokens_model, "--repo", tmp_path / "repo", "--name", "m").stdout.split()[1]).parent
    assert mode(entry / "config.pbtxt") == umask_027
    assert mode(entry / "1" / "model.onnx") == umask_027
    from ortformer.scale.shards import write_json

    write_json(tmp_path / "plan.json", {"a": 1})
    assert mode(tmp_path / "plan.json") == umask_027
    fsutil.write_atomic(tmp_path / "x.bin", b"x")
    assert mode(tmp_path / "x.bin") == umask_027


def test_errors_name_cli_flags_not_python_parameters(tokens_model, tmp_path):
    invoke("triton-repo", tokens_model, "--repo", tmp_path / "repo", "--name", "m")
    message = fail("triton-repo", tokens_model, "--repo", tmp_path / "repo", "--name", "m")
    assert "--force" in message and "force=True" not in message
    message = fail("infer", tokens_model, "--ids", "[1]", "--provider", "cuda")
    assert "--allow-fallback" in message and "allow_fallback=True" not in message and "provider='cpu'" not in message


def test_a_full_disk_under_the_memmapped_output_is_one_line_and_leaves_nothing(tokens_model, tmp_path, monkeypatch):
    # a sparse memmap on a full disk dies by SIGBUS at its first page write; the space is reserved first
    def no_space(fd, offset, length):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    np.save(tmp_path / "ids.npy", np.array([[1, 2, 3]], np.int64))
    out = tmp_path / "states" / "h.npy"
    out.parent.mkdir()
    line = fail("infer", tokens_model, "--input", tmp_path / "ids.npy", "--tensor", "last_hidden_state", "-o", out)
    assert "No space left on device" in line and "-o/--output" in line
    assert list(out.parent.iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "posix_fallocate"), reason="no posix_fallocate on this platform")
def test_reserve_allocates_every_block_of_a_sparse_file(tmp_path):
    path = tmp_path / "sparse.bin"
    with open(path, "wb") as handle:
        handle.truncate(8 << 20)
    before = os.stat(path).st_blocks * 512
    fsutil.reserve(path)
    after = os.stat(path)
    assert after.st_size == 8 << 20 and after.st_blocks * 512 >= 8 << 20 > before


@pytest.mark.parametrize("args", [["info", "MODEL"], ["infer", "MODEL", "--input", "IDS", "--format", "npy",
                                                       "--tensor", "last_hidden_state"]])
def test_a_reader_that_leaves_early_ends_the_output_quietly(tokens_model, tmp_path, args):
    """`ortformer info m.onnx | head -1`: the closed pipe is not an error to print."""
    import subprocess

    np.save(tmp_path / "ids.npy", np.ones((400, 60), np.int64))
    argv = [str(tokens_model) if a == "MODEL" else str(tmp_path / "ids.npy") if a == "IDS" else a for a in args]
    code = f"from ortformer.cli import cli; cli({argv!r}, prog_name='ortformer')"
    writer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    writer.stdout.read(10)
    writer.stdout.close()  # the reader leaves after a few bytes
    stderr = writer.stderr.read().decode()
    writer.wait(timeout=120)
    assert "Traceback" not in stderr and "error" not in stderr, stderr


def test_optimize_never_writes_over_its_models_tokenizer_and_takes_a_model_without_one(text_model, tmp_path):
    model = tmp_path / "m.onnx"
    shutil.copy(text_model, model)
    shutil.copy(text_model.parent / "tokenizer.json", tmp_path / "tokenizer.json")  # the name its metadata gives
    before = (tmp_path / "tokenizer.json").read_bytes()
    assert "tokenizer of the model being optimized" in fail("optimize", model, "-o", tmp_path / "tokenizer.json",
                                                            "--force")
    assert (tmp_path / "tokenizer.json").read_bytes() == before
    (tmp_path / "tokenizer.json").unlink()  # the .onnx copied alone still serves ids: it optimizes too
    assert "is missing; the optimized copy takes token ids only" in invoke("optimize", model, "-o", tmp_path / "o.onnx").stderr
    assert not (tmp_path / "o.tokenizer.json").exists()


def test_triton_repo_refuses_to_replace_the_entry_its_model_lies_in(text_model, tmp_path):
    entry = tmp_path / "repo" / "m"
    entry.mkdir(parents=True)
    model = entry / "m.onnx"
    shutil.copy(text_model, model)
    shutil.copy(text_model.parent / "tokenizer.json", entry / "tokenizer.json")
    assert "lies inside the repository entry" in fail("triton-repo", model, "--repo", tmp_path / "repo", "--force")
    assert model.is_file() and (entry / "tokenizer.json").is_file()
    # a model copied without its tokenizer still serves token ids: a warning, not an error
    alone = tmp_path / "alone.onnx"
    shutil.copy(text_model, alone)
    result = invoke("triton-repo", alone, "--repo", tmp_path / "repo2")
    assert "warning:" in result.stderr and "is missing" in result.stderr
    assert (tmp_path / "repo2" / "alone" / "1" / "model.onnx").is_file()
