"""The serve scenario's machinery with stand-in servers (no Infinity, no model): server
processes, pause and resume, interleaved rounds, ratios, and the report when the Infinity
peer is not installed."""
import statistics
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from benchmarks.peers import infinity_peer, serve_scenario
from ortformer.bench.run import format_table
from benchmarks.peers.servers import HOST, ServerError, ServerProcess, free_port

STANDIN = Path(__file__).resolve().parents[2] / "tests" / "support" / "standin_server.py"


def standin(tmp_path: Path, name: str) -> ServerProcess:
    port = free_port()
    server = ServerProcess(name, [sys.executable, str(STANDIN), str(port), str(serve_scenario.DIMENSION)],
                           f"http://{HOST}:{port}", tmp_path / f"{name}.log")
    server.wait_healthy(60)
    return server


def test_missing_or_stale_infinity_venv_names_the_setup_command(tmp_path, monkeypatch):
    monkeypatch.setenv(infinity_peer.ENV_VAR, str(tmp_path / "none"))
    assert infinity_peer.infinity_problem() == (
        f"no Infinity venv at {tmp_path / 'none'}: run `python -m benchmarks --setup-peers` (./dev bench-peers --setup-peers) "
        "to install infinity-emb[server,optimum,torch]==0.0.78 there")
    (tmp_path / "none" / "bin").mkdir(parents=True)
    (tmp_path / "none" / "bin" / "python").touch()
    (tmp_path / "none" / ".pins-sha256").write_text("an older digest\n")
    assert "was built from other pins: rerun `python -m benchmarks --setup-peers`" in infinity_peer.infinity_problem()
    (tmp_path / "none" / ".pins-sha256").write_text(infinity_peer.pins_digest() + "\n")
    assert infinity_peer.infinity_problem() is None


def test_without_infinity_ortformer_alone_is_measured_and_the_peer_named(tmp_path, monkeypatch):
    monkeypatch.setenv(infinity_peer.ENV_VAR, str(tmp_path / "none"))
    port = free_port()
    monkeypatch.setattr(serve_scenario, "_ortformer_server", lambda workdir, model, threads: ServerProcess(
        "ortformer", [sys.executable, str(STANDIN), str(port), "384"], f"http://{HOST}:{port}", workdir / "o.log"))
    servers, unavailable = serve_scenario._start(tmp_path, tmp_path, tmp_path / "m.onnx", 1, infinity_peer.ENGINES)
    try:
        assert list(servers) == ["ortformer"] and list(unavailable) == ["infinity"]
        assert "run `python -m benchmarks --setup-peers`" in unavailable["infinity"]
    finally:
        servers["ortformer"].stop()
    report = format_table({"quick": False, "scenarios": {"serve": {
        "model": "all-MiniLM-L6-v2", "seconds": 1.0, "rows": [], "targets": [], "unavailable": unavailable}}})
    assert f"infinity: not available here ({unavailable['infinity']})" in report


def test_interleaved_rounds_measure_each_server_at_each_concurrency(tmp_path):
    servers = {name: standin(tmp_path, name) for name in ("ortformer", "infinity_optimum")}
    try:
        texts, tokens = ["a short one", "a somewhat longer text"], [4, 6]
        rows = serve_scenario.measure(servers, texts, tokens, 1, {"concurrencies": (1, 4), "rounds": 2, "seconds": 0.15})
        # the server not under load is paused: its health check gets no answer until it resumes
        with pytest.raises(httpx.TimeoutException):
            httpx.get(servers["ortformer"].url + "/health", timeout=0.5, trust_env=False)
        servers["ortformer"].resume()
        assert servers["ortformer"].healthy()
    finally:
        for server in servers.values():
            server.stop()
    assert [(r["server"], r["concurrency"]) for r in rows] == [
        ("ortformer", 1), ("infinity_optimum", 1), ("ortformer", 4), ("infinity_optimum", 4)]
    for row in rows:
        assert row["errors"] == 0 and row["ok"] == sum(r["ok"] for r in row["rounds"]) > 0 and len(row["rounds"]) == 2
        assert row["p50_ms"] <= row["p99_ms"] and row["rps"] > 0
        assert row["health_errors"] == 0 and row["health_p99_ms"] > 0  # /health probed under the load
        assert row["tokens_per_s"] == statistics.median(r["tokens_per_s"] for r in row["rounds"])
    assert all(server.process.poll() is not None for server in servers.values())


def test_ratios_are_ortformer_over_each_peer():
    rows = [{"server": "ortformer", "concurrency": 8, "rps": 30.0, "tokens_per_s": 900.0, "p99_ms": 50.0},
            {"server": "infinity_optimum", "concurrency": 8, "rps": 20.0, "tokens_per_s": 600.0, "p99_ms": 100.0},
            {"server": "infinity_torch", "concurrency": 8, "rps": 10.0, "tokens_per_s": 300.0, "p99_ms": 40.0},
            {"server": "infinity_torch", "concurrency": 64, "rps": 10.0, "tokens_per_s": 300.0, "p99_ms": 40.0}]
    assert serve_scenario.ratios(rows) == [
        {"peer": "infinity_optimum", "concurrency": 8, "rps_ratio": 1.5, "tokens_per_s_ratio": 1.5, "p99_ratio": 0.5},
        {"peer": "infinity_torch", "concurrency": 8, "rps_ratio": 3.0, "tokens_per_s_ratio": 3.0, "p99_ratio": 1.25}]


def test_a_server_that_exits_is_reported_with_its_log(tmp_path):
    server = ServerProcess("broken", [sys.executable, "-c", "import sys; print('cannot load the model'); sys.exit(3)"],
                           f"http://{HOST}:{free_port()}", tmp_path / "broken.log")
    with pytest.raises(ServerError, match=r"broken exited with code 3 before it was healthy; .*cannot load the model"):
        server.wait_healthy(60)


def test_infinity_gets_the_thread_count_it_is_launched_with(tmp_path):
    """The launcher's pinning, in a fresh interpreter (it replaces onnxruntime.InferenceSession)."""
    code = f"""
import sys
sys.path.insert(0, {str(infinity_peer.LAUNCHER.parent)!r})
from infinity_launch import pin_threads
pin_threads(1)
import onnx, onnxruntime, torch
from onnx import TensorProto, helper
graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
options = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).get_session_options()
print(options.intra_op_num_threads, options.inter_op_num_threads, torch.get_num_threads())
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["1", "1", "1"], done.stderr


def test_infinity_is_started_as_the_model_needs(tmp_path):
    argv, cwd = infinity_peer.infinity_command("optimum", tmp_path / "onnx", "all-MiniLM-L6-v2", 8123, 2)
    assert cwd == tmp_path / "onnx" and argv[1:3] == [str(infinity_peer.LAUNCHER), "2"]
    flags = dict(zip(argv[3::2], argv[4::2]))
    assert flags["--model-id"] == "." and flags["--pooling-method"] == "mean" and flags["--url-prefix"] == "/v1"
    assert flags["--host"] == "127.0.0.1" and flags["--port"] == "8123" and flags["--engine"] == "optimum"
    argv, cwd = infinity_peer.infinity_command("torch", tmp_path / "st", "m", 8123, 2)
    assert dict(zip(argv[3::2], argv[4::2]))["--model-id"] == str(tmp_path / "st")
    with pytest.raises(Exception, match="unknown Infinity engine 'ct2'; choose from optimum, torch"):
        infinity_peer.infinity_command("ct2", tmp_path, "m", 1, 1)
