"""The OpenVINO runtime behind Runtime(provider="openvino"), shaped as the part of an
onnxruntime InferenceSession the Runtime uses: run(names, feeds), get_inputs(),
get_outputs(), get_providers().

onnxruntime's own OpenVINO execution provider offers no device on every CPU (none on
AMD ones), so this reads the same ONNX file with the OpenVINO runtime itself; it reads
the com.microsoft ops the exporter fuses. Measured 1.1-1.5x onnxruntime's CPU provider
on all-MiniLM-L6-v2 in float32, same outputs; in bfloat16, on a CPU that computes it
(AVX512_BF16 or AMX), 1.9-2.5x at sentence cosine 0.9999 (docs/performance.md).

Thread safety: the CompiledModel is shared; an InferRequest holds its own tensors, so
each call takes one from a pool (a new one when all are busy) and gives it back.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.errors import ModelFileError, ProviderError, require

OPENVINO_EP = "OpenVINOExecutionProvider"
# Runtime's precision -> OpenVINO's INFERENCE_PRECISION_HINT (the element type its CPU plugin computes in)
PRECISION_HINTS = {"float32": "f32", "bfloat16": "bf16"}


@dataclass(frozen=True)
class NodeArg:
    """The .name of onnxruntime's NodeArg, which is all the Runtime reads of one."""

    name: str


def int8_refused(path) -> ProviderError:
    """Why an int8 file is not run here: its ops are onnxruntime's own CPU kernels."""
    return ProviderError(f"{path} is an int8 file, whose MatMulIntegerToFloat and per-row QuantizeLinear are "
                         "onnxruntime's CPU kernels; use provider='cpu' for it, or a float32 export for "
                         "provider='openvino'")


def _import_openvino():
    return require("provider='openvino'", "openvino", "openvino")


class OpenVINOSession:
    """An ONNX file compiled for OpenVINO's CPU plugin, run like an InferenceSession.

    threads: INFERENCE_NUM_THREADS. precision: INFERENCE_PRECISION_HINT, always set.
    "float32" (f32) by default: OpenVINO's CPU default on a CPU with bf16 instructions is bf16
    (8-bit mantissa), which would put a float32 file far past the float32 gate; a float32 file
    computes in float32 (and a float16 one too). "bfloat16" (bf16) is asked for by name only,
    after the caller checked the CPU has it (machine.CPU.bfloat16_missing): its gate is
    parity.GATES["bfloat16"].
    """

    def __init__(self, path: str | Path, threads: int, precision: str = "float32"):
        ov = _import_openvino()
        core = ov.Core()
        config = {"INFERENCE_NUM_THREADS": int(threads), "PERFORMANCE_HINT": "LATENCY",
                  "INFERENCE_PRECISION_HINT": PRECISION_HINTS[precision]}
        try:
            self._compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
        except Exception as exc:  # OpenVINO raises RuntimeError subclasses without a shared base of its own
            raise ModelFileError(f"{path}: OpenVINO cannot load the model: {exc}") from None
        self._inputs = [NodeArg(port.get_any_name()) for port in self._compiled.inputs]
        self._outputs = [NodeArg(port.get_any_name()) for port in self._compiled.outputs]
        self._idle: list = []  # InferRequests not in use; each holds its own input/output tensors
        self._lock = threading.Lock()

    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def get_providers(self) -> list[str]:
        return [OPENVINO_EP]

    def run(self, names: list[str] | None, feeds: dict[str, np.ndarray], run_options=None) -> list[np.ndarray]:
        """Outputs `names` (all when None) for `feeds`, as InferenceSession.run returns them.
        run_options (onnxruntime's) has no OpenVINO meaning and is ignored. Any (B, N) may
        come: the file's batch and sequence axes are dynamic."""
        names = [o.name for o in self._outputs] if names is None else names
        with self._lock:
            request = self._idle.pop() if self._idle else self._compiled.create_infer_request()
        try:
            # share_outputs: the results are views of the request's own tensors, so only the outputs
            # asked for are copied (not token_embeddings when the sentence vector is wanted); each
            # copy is made before the request goes back to _idle and is reused
            results = request.infer(feeds, share_outputs=True)
            return [np.array(results[name], copy=True) for name in names]
        finally:
            with self._lock:
                self._idle.append(request)
