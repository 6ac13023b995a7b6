"""benchmarks/cuda_parity.py's logic, with a stand-in for the CUDA runtime (no GPU here)."""
import importlib.util
import json
from pathlib import Path

import pytest

from ortformer.runtime import Runtime

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "cuda_parity.py"


@pytest.fixture
def script():
    spec = importlib.util.spec_from_file_location("cuda_parity", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_cuda(shift: float):
    """A Runtime factory whose 'cuda' runtime is the CPU one through IO binding, outputs shifted."""

    class FakeCuda(Runtime):
        def _execute(self, feeds, out=None, names=None):
            return {k: v + shift for k, v in self._run_bound(feeds, "cpu", 0, names).items()}

    def make(path, provider="auto", **kwargs):
        return FakeCuda(path, "cpu") if provider == "cuda" else Runtime(path, provider)

    return make


@pytest.mark.parametrize("shift, status", [(0.0, 0), (0.01, 1)])
def test_reports_and_gates(script, monkeypatch, capsys, tokens_model, shift, status):
    monkeypatch.setattr(script, "Runtime", fake_cuda(shift))
    assert script.main([str(tokens_model)]) == status
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] is (status == 0)
    assert report["max_abs"] == pytest.approx(shift, abs=1e-6)
    assert {c["sequence"] for c in report["cases"]} >= {1, 64}  # the grid reaches max_positions


def test_skips_where_cuda_is_unusable(script, capsys, tokens_model):
    if Runtime(tokens_model, "auto").provider == "cuda":
        pytest.skip("CUDA really loads here")
    assert script.main([str(tokens_model)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["skipped"] is True and "SKIPPED" in captured.err
