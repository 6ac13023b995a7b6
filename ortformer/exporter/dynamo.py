"""One call into torch.onnx's dynamo exporter, quiet, with its errors typed, and its op registry built once.

torch.onnx (2.13) rebuilds onnxscript's ATen -> ONNX registry on every `export` call: 0.7 s
(1.6 s the first time) of a tiny model's 2.5 s export on this project's 2-core machine, and a
linear-family model is exported four times (the model and its chunk stages). The registry is a
pure function of the opset, so it is built once per opset and each export gets a fresh copy of
its table (the custom translation table is registered into that copy, never into the shared
one). The cache relies on two private names (`ONNXRegistry.from_torchlib`, `.functions`); if a
torch release renames them, the cache switches itself off and every export builds its own
registry, as torch does.
"""
from __future__ import annotations

import contextlib
import io
import logging
import threading
import warnings
from typing import TYPE_CHECKING

import torch

from ..core.errors import ExportError

if TYPE_CHECKING:  # the return annotation only; onnx loads where the program is saved
    import onnx

_lock = threading.Lock()
_built: dict[int | None, object] = {}  # opset (None: torch's default) -> registry


def _registry_class():
    try:
        from torch.onnx._internal.exporter import _registration
    except ImportError:
        return None
    cls = getattr(_registration, "ONNXRegistry", None)
    if cls is None or not callable(getattr(cls, "from_torchlib", None)):
        return None
    return cls


@contextlib.contextmanager
def _registry_built_once():
    cls = _registry_class()
    if cls is None:
        yield
        return
    original = cls.__dict__["from_torchlib"]  # the classmethod object, restored as it was

    def from_torchlib(klass, *args, **kwargs):
        opset = kwargs.get("opset_version", args[0] if args else None)
        base = _built.get(opset)
        if base is None:
            base = original.__get__(None, klass)(*args, **kwargs)
            _built[opset] = base
        fresh = klass.__new__(klass)
        fresh.__dict__.update(base.__dict__)
        fresh.functions = {target: list(decomps) for target, decomps in base.functions.items()}
        return fresh

    with _lock:
        cls.from_torchlib = classmethod(from_torchlib)
        try:
            yield
        finally:
            cls.from_torchlib = original


def export_program(module: torch.nn.Module, args: tuple, *, what: str, **options) -> onnx.ModelProto:
    """`torch.onnx.export(module, args, dynamo=True, **options).model_proto`, with the exporter's
    own prints, warnings and logs kept out of the user's terminal; a failure raises ExportError
    naming `what` and the last lines the exporter printed."""
    log = io.StringIO()
    onnx_logger = logging.getLogger("torch.onnx")
    level = onnx_logger.level
    onnx_logger.setLevel(logging.ERROR)  # torchvision-missing notes are noise here
    try:
        with _registry_built_once(), contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), \
                warnings.catch_warnings():
            # the exporter warns about merged axis names and deprecations; not the user's concern
            warnings.simplefilter("ignore")
            program = torch.onnx.export(module, args, dynamo=True, verbose=False, **options)
        return program.model_proto
    except Exception as exc:
        tail = "\n".join(log.getvalue().strip().splitlines()[-5:])
        raise ExportError(f"{what} failed: {type(exc).__name__}: {exc}\n{tail}".strip()) from exc
    finally:
        onnx_logger.setLevel(level)
