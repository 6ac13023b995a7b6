"""Shared fixtures, and Hypothesis profiles chosen with HYPOTHESIS_PROFILE (default "ci").

ci:   bounded and derandomized, so CI is reproducible and fast.
soak: thousands of examples per property, random seeds (tests/reliability scales its
      own loops, e.g. thread calls and kill trials, from the profile's max_examples).
"""
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from support.exported_models import exported
from support.text_models import export_text_model

settings.register_profile(
    "ci", max_examples=100, deadline=None, derandomize=True, database=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "soak", max_examples=3000, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# Models exported once per test session (cached in the session's temp folder),
# shared by the runtime, CLI and reliability tests.
@pytest.fixture(scope="session")
def tokens_model(tmp_path_factory) -> Path:
    return exported("tokens", tmp_path_factory)


@pytest.fixture(scope="session")
def features_model(tmp_path_factory) -> Path:
    return exported("features", tmp_path_factory)


@pytest.fixture(scope="session")
def text_model(tmp_path_factory) -> Path:
    return export_text_model(tmp_path_factory)


@pytest.fixture
def clean_dirs(tmp_path, monkeypatch):
    """Temp files and the working directory both point at empty folders; the test fails
    if anything is left in either (e.g. a profiler trace)."""
    temp, cwd = tmp_path / "temp", tmp_path / "cwd"
    temp.mkdir()
    cwd.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.chdir(cwd)
    yield temp, cwd
    assert list(temp.iterdir()) == [] and list(cwd.iterdir()) == [], "a file was left behind"


_TRACES: dict = {}  # (wrapper type, config, weights digest, opset, fused ops) -> traced ModelProto


@pytest.fixture
def cached_tracing(monkeypatch):
    """torch.onnx.export once per (model, weights, opset, fused ops, padding) for the whole session.

    For tests of export plumbing (destinations, metadata, staging, progress, the CLI
    around export), not of tracing: each export still writes, checks, gates and
    commits its own file; only the trace, the same bytes every time, is reused."""
    import importlib

    import onnx

    export_module = importlib.import_module("ortformer.exporter.export")  # the module, not the function

    real = export_module._trace_to_onnx

    def cached(model, opset, fused_ops=True, padding="any"):
        key = (type(model).__name__, model.config.to_json(), export_module.weights_digest(model), opset, fused_ops,
               padding)
        if key not in _TRACES:
            _TRACES[key] = real(model, opset, fused_ops, padding)
        copy = onnx.ModelProto()
        copy.CopyFrom(_TRACES[key])  # export edits the proto's metadata in place
        return copy

    monkeypatch.setattr(export_module, "_trace_to_onnx", cached)


# The slowest files first (figures of `./dev test --durations=0`, 30-290 s of worker time each):
# `--dist loadfile` hands whole files to the two workers in collection order, so a slow file
# collected last would leave one worker running it alone at the end.
SLOW_FIRST = ("tests/exporter/test_export.py", "tests/cli/test_cli_examples.py", "tests/runtime/test_chunked.py",
              "tests/exporter/test_atomic.py", "tests/cli/test_cli_export_checks.py", "tests/models/test_classifier_heads.py",
              "tests/test_bench.py", "tests/models/test_gemma.py", "tests/exporter/test_linear_memory.py",
              "tests/reliability/test_numerics.py", "tests/models/test_splade.py", "tests/models/test_checkpoint.py",
              "tests/serve/test_batching.py")


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest keep their order
