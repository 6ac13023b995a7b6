"""ONNX export with dynamic axes, checker, metadata and the parity gate. Needs torch."""
from ..core.errors import require_torch

require_torch("ortformer.exporter")

from .export import DEFAULT_OPSET, ExportResult, check_file, eager_runner, export, export_steps, weights_digest  # noqa: E402
from .settings import GateOptions, GraphOptions, Provenance, TextSettings  # noqa: E402
from ..contract.parity import GATES, format_report, grid, run_parity  # noqa: E402

__all__ = ["export", "export_steps", "ExportResult", "DEFAULT_OPSET", "check_file", "eager_runner", "weights_digest",
           "GraphOptions", "TextSettings", "Provenance", "GateOptions", "GATES", "grid", "run_parity", "format_report"]
