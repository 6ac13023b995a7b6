"""ortformer.runtime.profile: onnxruntime's per-kernel trace folded into per-op rows."""
from collections import Counter

import onnx
import pytest
from support.torch_free import run_python

from ortformer.config import preset
from ortformer.core.errors import InputError, ModelFileError
from ortformer.runtime.profile import TOP_NODES, profile_ops, summarize

# op types onnxruntime's CPU graph rewrites may introduce (not in the exported file)
FUSED = {"SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "BiasGelu", "FastGelu", "FusedMatMul",
         "Attention", "MultiHeadAttention", "Gelu", "LayerNormalization", "SimplifiedLayerNormalization",
         "QuickGelu", "FusedGemm", "Gemm", "BiasSoftmax", "Softmax"}


@pytest.fixture(scope="module")
def report(tokens_model):
    return profile_ops(tokens_model, batch=2, sequence=16, runs=3, warmup=1, threads=1)


def graph_ops(path) -> Counter:
    return Counter(node.op_type for node in onnx.load(str(path), load_external_data=False).graph.node)


def test_report_shape_and_totals(report, tokens_model):
    assert report["model"] == str(tokens_model) and report["provider"] == "cpu" and report["threads"] == 1
    assert (report["batch"], report["sequence"], report["runs"]) == (2, 16, 3)
    assert report["profiled_runs"] == 3  # the timed runs; the warm-up run is left out
    assert report["median_run_ms"] > 0 and report["kernel_ms_per_run"] > 0
    assert sum(op["share"] for op in report["ops"]) == pytest.approx(1.0, abs=1e-9)
    assert sum(op["ms_per_run"] for op in report["ops"]) == pytest.approx(report["kernel_ms_per_run"])
    times = [op["ms_per_run"] for op in report["ops"]]
    assert times == sorted(times, reverse=True) and report["ops"][0]["share"] > 0
    assert len({op["op"] for op in report["ops"]}) == len(report["ops"])


def test_ops_come_from_the_graph_or_onnxruntime_fusions(report, tokens_model):
    in_graph = graph_ops(tokens_model)
    seen = {op["op"]: op["nodes"] for op in report["ops"]}
    assert set(seen) <= set(in_graph) | FUSED, set(seen) - set(in_graph) - FUSED
    assert "MatMul" in seen or "FusedMatMul" in seen
    for op, nodes in seen.items():  # fusions only ever remove nodes of an existing type
        if op in in_graph:
            assert 1 <= nodes <= in_graph[op], op
    # every layer's attention is timed: the exported graph holds one attention node per layer
    attention = seen.get("MultiHeadAttention", 0) + seen.get("Attention", 0)
    assert attention == preset("tiny").num_layers


def test_top_nodes_are_the_slowest_and_consistent_with_ops(report):
    top = report["top_nodes"]
    assert 0 < len(top) <= TOP_NODES
    times = [n["ms_per_run"] for n in top]
    assert times == sorted(times, reverse=True)
    per_op = {op["op"]: op["ms_per_run"] for op in report["ops"]}
    for node in top:
        assert node["ms_per_run"] <= per_op[node["op"]] + 1e-12
    for op in report["ops"]:  # the slowest node is at least any op type's average node
        assert top[0]["ms_per_run"] >= op["ms_per_run"] / op["nodes"] - 1e-12


def test_summarize_divides_by_profiled_runs_not_requested():
    events = [{"cat": "Session", "name": "model_run"}] * 4 + [
        {"cat": "Node", "name": "a_kernel_time", "dur": 3000, "args": {"op_name": "MatMul"}},
        {"cat": "Node", "name": "a_fence_before", "dur": 99999, "args": {"op_name": "MatMul"}},
        {"cat": "Node", "name": "b_kernel_time", "dur": 1000, "args": {"op_name": "Add"}},
        {"cat": "Node", "name": "a_kernel_time", "dur": 1000, "args": {"op_name": "MatMul"}},
    ]
    runs, ops, nodes = summarize(events)
    assert runs == 4
    assert ops == [{"op": "MatMul", "nodes": 1, "ms_per_run": 1.0, "share": 0.8},
                   {"op": "Add", "nodes": 1, "ms_per_run": 0.25, "share": 0.2}]
    assert nodes == [{"node": "a", "op": "MatMul", "ms_per_run": 1.0}, {"node": "b", "op": "Add", "ms_per_run": 0.25}]


def test_summarize_counts_only_the_last_runs():
    """Warm-up runs are in the trace and slower; with last_runs only the timed spans count."""
    def run(ts, dur):
        return {"cat": "Session", "name": "model_run", "ts": ts, "dur": dur}

    def node(name, op, ts, dur):
        return {"cat": "Node", "name": f"{name}_kernel_time", "ts": ts, "dur": dur, "args": {"op_name": op}}

    events = [run(0, 100), node("a", "MatMul", 10, 90_000),          # warm-up: huge, must not count
              node("setup", "Cast", 150, 5_000),                        # between runs: counts nowhere
              run(200, 100), node("a", "MatMul", 210, 3000), node("b", "Add", 260, 1000),
              run(400, 100), node("a", "MatMul", 410, 1000)]
    runs, ops, _ = summarize(events, last_runs=2)
    assert runs == 2
    assert ops == [{"op": "MatMul", "nodes": 1, "ms_per_run": 2.0, "share": 0.8},
                   {"op": "Add", "nodes": 1, "ms_per_run": 0.5, "share": 0.2}]
    assert summarize(events)[0] == 3  # without last_runs every run counts


def test_only_the_timed_runs_are_counted(tokens_model, monkeypatch):
    """The trace holds warm-up + timed runs; the kernel time reported is the kernels inside
    the last `runs` model_run spans, per run (read back from the same trace)."""
    from ortformer.runtime import profile

    traces = []
    real = profile.summarize
    monkeypatch.setattr(profile, "summarize", lambda events, **kw: traces.append(events) or real(events, **kw))
    report = profile_ops(tokens_model, batch=4, sequence=32, runs=5, warmup=3, threads=1)
    (events,) = traces
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                   if e.get("cat") == "Session" and e.get("name") == "model_run")
    assert len(spans) == 3 + 5 and report["profiled_runs"] == 5

    def kernel_us(chosen):
        return sum(e["dur"] for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
                   and any(start <= e["ts"] <= end for start, end in chosen))

    assert report["kernel_ms_per_run"] == pytest.approx(kernel_us(spans[3:]) / 5 / 1e3, rel=1e-9)
    assert kernel_us(spans[:3]) > 0  # the warm-up runs had kernels too, and they are left out


def test_features_model(features_model, clean_dirs):
    result = profile_ops(features_model, batch=1, sequence=8, runs=2, warmup=0)
    assert result["profiled_runs"] == 2 and result["ops"]
    assert {op["op"] for op in result["ops"]} <= set(graph_ops(features_model)) | FUSED


def test_no_profile_file_is_left_behind(tokens_model, clean_dirs):
    profile_ops(tokens_model, sequence=4, runs=1, warmup=0)


@pytest.mark.parametrize("kwargs, message", [
    ({"batch": 0}, r"batch=0 .*>= 1"),
    ({"batch": True}, r"batch=True"),
    ({"batch": 1.5}, r"batch=1.5"),
    ({"runs": 0}, r"runs=0"),
    ({"warmup": -1}, r"warmup=-1 .*>= 0"),
    ({"sequence": 0}, r"sequence=0 .*\[1, 64\]"),
    ({"sequence": 65}, r"sequence=65 .*\[1, 64\].*max_positions"),
    ({"threads": 0}, r"threads=0"),
])
def test_invalid_arguments_raise_input_error(tokens_model, clean_dirs, kwargs, message):
    with pytest.raises(InputError, match=message):
        profile_ops(tokens_model, **kwargs)


def test_bad_model_file_is_refused(tmp_path, clean_dirs):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(ModelFileError):
        profile_ops(bad, runs=1)


def test_profile_runs_without_torch(tokens_model):
    done = run_python(f"""
import sys
from ortformer.runtime.profile import profile_ops
report = profile_ops({str(tokens_model)!r}, sequence=4, runs=1, warmup=0)
assert report["ops"] and 'torch' not in sys.modules
""")
    assert done.returncode == 0, done.stderr


def test_an_offline_optimized_file_is_profiled_as_written(tokens_model, tmp_path, monkeypatch):
    import onnxruntime as ort

    from ortformer.runtime import profile
    from ortformer.runtime.optimize import optimize_offline

    optimized = tmp_path / "opt.onnx"
    optimize_offline(tokens_model, optimized)
    levels, real = [], profile.Runtime

    def spy(*args, **kwargs):
        levels.append(kwargs["session_options"].graph_optimization_level)
        return real(*args, **kwargs)

    monkeypatch.setattr(profile, "Runtime", spy)
    profile_ops(optimized, batch=1, sequence=4, runs=1, warmup=0)
    profile_ops(tokens_model, batch=1, sequence=4, runs=1, warmup=0)
    assert levels == [ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL]
