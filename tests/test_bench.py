"""`ortformer bench --quick`: the pipeline runs end to end and writes its JSON schema.
Timings are not asserted (this is a shared 2-core machine); the shape of the report is."""
import json

import pytest
from click.testing import CliRunner

from ortformer.cli import cli


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    result = CliRunner().invoke(cli, ["bench", "--quick", "--iterations", "2", "--threads", "1", "--out", str(out)])
    assert result.exit_code == 0, (result.output, result.exception)
    return out, result.stdout, json.loads((out / "bench.json").read_text())


def test_report_schema(quick):
    _, _, data = quick
    assert data["schema"] == 1 and data["quick"] is True and data["threads"] == 1
    assert set(data["machine"]) == {"cpus", "processor", "onnxruntime", "torch"}
    assert set(data["scenarios"]) == {"latency", "throughput", "long"}
    for scenario in data["scenarios"].values():
        assert isinstance(scenario["rows"], list) and scenario["rows"] and scenario["seconds"] >= 0
        for target in scenario["targets"]:
            assert set(target) == {"name", "target", "measured", "unit", "met"} and isinstance(target["met"], bool)


def test_latency_compares_every_contender_against_eager(quick):
    rows = {r["contender"]: r for r in quick[2]["scenarios"]["latency"]["rows"]}
    assert set(rows) == {"eager", "ort_float32", "ort_float32_unfused", "ort_int8"}
    assert all(r["median_ms"] > 0 for r in rows.values())
    for row in rows.values():  # each ratio is eager's median over the contender's own
        assert row["speedup_vs_eager"] == pytest.approx(rows["eager"]["median_ms"] / row["median_ms"], rel=1e-9)


@pytest.mark.parametrize("scenario", ["latency", "throughput"])
def test_ortformer_and_its_peers_are_timed_in_one_run(quick, scenario):
    # two runs once gave one model two figures (int8: 7.59 ms in the rows, 0.245 ms beside the peers)
    data = quick[2]["scenarios"][scenario]
    same_run = data["peers"]["same_run"]
    assert {r["contender"] for r in data["rows"]} == set(same_run)
    for row in data["rows"]:
        assert row["median_ms"] == pytest.approx(same_run[row["contender"]]["median_s"] * 1e3, rel=1e-12)
        assert same_run[row["contender"]]["runs"] == quick[2]["iterations"]


def test_latency_profiles_ops_and_compares_session_settings(quick):
    latency = quick[2]["scenarios"]["latency"]
    for name in ("ort_float32", "ort_int8"):
        ops = latency["profiles"][name]["ops"]
        assert ops and all(op["ms_per_run"] > 0 and 0 < op["share"] <= 1 for op in ops)
        assert [op["ms_per_run"] for op in ops] == sorted((op["ms_per_run"] for op in ops), reverse=True)
    # the top-6 op types of a tiny model mix the integer GEMM with its per-row quantization ops
    int8_ops = {"MatMulIntegerToFloat", "QuantizeLinear", "ReduceMax", "ReduceMin"}
    assert any(op["op"] in int8_ops for op in latency["profiles"]["ort_int8"]["ops"])
    settings = latency["float32_session_settings"]
    assert set(settings) == {"runtime", "arena", "onnxruntime"}
    assert all(v["status"] == "ok" and v["seconds"] > 0 and v["torch_loaded"] is False for v in settings.values())


def test_throughput_reports_the_matmul_ceiling(quick):
    scenario = quick[2]["scenarios"]["throughput"]
    assert scenario["matmul_ceiling_gflops"] > 0
    assert all(0 < r["fraction_of_matmul_ceiling"] for r in scenario["rows"])


def test_long_points_run_torch_free_with_a_plot(quick):
    out, stdout, data = quick
    long = data["scenarios"]["long"]
    assert {(r["attention"], r["sequence"]) for r in long["rows"]} == {("linear", 64), ("linear", 256), ("softmax", 64), ("softmax", 256)}
    assert all(r["status"] == "ok" and r["torch_loaded"] is False and r["peak_rss_mb"] > 0 for r in long["rows"])
    assert [(r["sequence"], r["session"], r["status"]) for r in long["arena_rows"]] == [(64, "arena", "ok"), (256, "arena", "ok")]
    assert long["plot"] and (out / "bench_long.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wanted" in stdout and "[long]" in stdout


def test_unknown_scenario_is_refused():
    result = CliRunner().invoke(cli, ["bench", "--scenario", "warp"])
    assert result.exit_code == 2 and "Invalid value for '--scenario'" in result.stderr


def test_quick_labels_what_it_measured(quick):
    _, stdout, data = quick
    names = [t["name"] for s in data["scenarios"].values() for t in s.get("targets", [])]
    assert names and all("seq 128" not in n and "tiny" in n for n in names if "onnxruntime" in n)
    target_lines = [line for line in stdout.splitlines() if any(line.startswith(n[:40]) for n in names)]
    assert target_lines and all(line.rstrip().endswith("n/a (quick)") for line in target_lines)


@pytest.mark.parametrize("scenario", ["latency", "throughput"])
def test_peers_run_beside_ortformer_on_the_same_weights(quick, scenario):
    peers = quick[2]["scenarios"][scenario]["peers"]
    rows = {r["contender"]: r for r in peers["rows"]}
    assert set(rows) == {"transformers_eager", "transformers_onnx_optimized", "ortformer_float32", "ortformer_int8"}
    assert peers["unavailable"] == {} and peers["best_peer"] in ("transformers_eager", "transformers_onnx_optimized")
    best = rows[peers["best_peer"]]["median_ms"]
    assert best == min(r["median_ms"] for r in rows.values() if r["peer"])
    ceiling = peers["matmul_ceiling"]
    assert ceiling["gflops"] > 0 and len(ceiling["shapes"]) == 5 and all(s["gflops"] > 0 for s in ceiling["shapes"])
    for row in rows.values():  # both ratios come from this run's medians
        assert row["median_ms"] > 0
        assert row["vs_best_peer"] == pytest.approx(best / row["median_ms"], rel=1e-9)
        assert row["share_of_ceiling"] == pytest.approx(row["gflops"] / ceiling["gflops"], rel=1e-9)
    assert "vs best peer (" in quick[1] and "of ceiling" in quick[1]


def test_peer_ratios_are_taken_between_medians():
    from ortformer.bench.peers import peer_rows

    stats = {"a": {"median_s": 0.2}, "b": {"median_s": 0.1}, "ours": {"median_s": 0.05}}
    report = peer_rows(stats, ["a", "b"], flops=1e9, ceiling_gflops=40.0)
    rows = {r["contender"]: r for r in report["rows"]}
    assert report["best_peer"] == "b"
    assert rows["ours"]["vs_best_peer"] == pytest.approx(2.0) and rows["a"]["vs_best_peer"] == pytest.approx(0.5)
    assert rows["ours"]["gflops"] == pytest.approx(20.0) and rows["ours"]["share_of_ceiling"] == pytest.approx(0.5)
    assert [r["peer"] for r in report["rows"]] == [True, True, False]


def test_gemm_shapes_cover_the_model_flops():
    from ortformer.bench.peers import gemm_shapes
    from ortformer.config import preset
    from ortformer.contract.cost import total_flops

    cfg = preset("bert-base")
    flops = sum(s["count"] * 2 * s["batch"] * s["m"] * s["k"] * s["n"] for s in gemm_shapes(cfg, 2, 128))
    assert flops == total_flops(cfg, 128) * 2

