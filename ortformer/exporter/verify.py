"""Re-check a model file made earlier: `ortformer check`.

checker + metadata/contract validation always; the parity grid again when the
eager weights can be rebuilt: from ``--against`` (a config JSON or a checkpoint /
BERT folder) or, for random-init exports, from the seed recorded in the source.
"""
from __future__ import annotations

import re
from pathlib import Path

import onnxruntime as ort

from ..config import EncoderConfig
from ..errors import ConfigError, ModelFileError, ParityError
from ..models import Encoder, build_encoder, load_any
from ..runtime.modelfile import ModelFile, read_model_file
from .export import check_file, eager_runner
from ..parity import GATES, failed_cases, run_parity

_RANDOM_INIT = re.compile(r"random-init:seed=(-?\d+)$")


def _reference(model_file: ModelFile, against, seed: int | None) -> tuple[Encoder | None, str]:
    """The eager model to compare against, and a sentence saying where it came from."""
    cfg = model_file.config
    recorded = _RANDOM_INIT.match(model_file.source)
    if against is None:
        if recorded is None:
            return None, f"weights came from {model_file.source}; pass --against to rerun parity"
        s = seed if seed is not None else int(recorded.group(1))
        return build_encoder(cfg, seed=s), f"random init, seed {s}"
    against = Path(against)
    if against.suffix == ".json" and against.is_file() and "model_type" not in against.read_text(errors="replace"):
        expected = EncoderConfig.from_json(against.read_text())
        s = seed if seed is not None else int(recorded.group(1)) if recorded else 0
        model, where = build_encoder(expected, seed=s), f"{against} with random init, seed {s}"
    else:
        loaded = load_any(against)
        model, where = loaded.model, f"{against} ({loaded.source})"
    if model.config != cfg:
        diff = {k: (v, getattr(model.config, k)) for k, v in cfg.to_dict().items()
                if k != "format" and getattr(model.config, k) != v}
        raise ConfigError(f"{against} describes another model than the file; field: (file, against) = {diff}")
    return model, where


def file_dtype(model_file: ModelFile) -> str:
    """The precision the file was exported in, as its parity report records it (float32 if absent)."""
    dtype = model_file.parity.get("dtype", "float32")
    if dtype not in GATES:
        raise ModelFileError(f"{model_file.path}: the parity report names dtype {dtype!r}; known: {', '.join(GATES)}")
    return dtype


def verify(path, against=None, seed: int | None = None) -> dict:
    """Return {"path", "config", "source", "checker": "ok", "parity": report or None, "reference"}.

    Raises ModelFileError / ExportError for an invalid file, ParityError when the
    rerun grid fails the gate.
    """
    model_file = read_model_file(path)
    check_file(model_file.path, model_file.config)
    reference, where = _reference(model_file, against, seed)
    result = {"path": str(model_file.path), "config": model_file.config.to_dict(), "source": model_file.source,
              "checker": "ok", "reference": where, "parity": None}
    if reference is None:
        return result
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(model_file.path), options, providers=["CPUExecutionProvider"])
    report = run_parity(session, eager_runner(reference), model_file.config, file_dtype(model_file))
    result["parity"] = report
    if not report["passed"]:
        lines = failed_cases(report)
        raise ParityError(f"{path}: parity against {where} failed in {len(lines)} case(s); first: {lines[0]}", report)
    return result
