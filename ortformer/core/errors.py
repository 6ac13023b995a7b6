"""Typed errors. Every failure a user can cause is one of these, with a message
that names what was wrong and what would be valid."""
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # ortformer/ (this file is ortformer/core/errors.py)


class OrtformerError(Exception):
    """Base of every error ortformer raises on purpose."""


class ConfigError(OrtformerError, ValueError):
    """An EncoderConfig field, or a combination of fields, is invalid."""


class CheckpointError(OrtformerError):
    """A checkpoint is unreadable, unsafe, or does not match its config."""


class HubError(CheckpointError):
    """A model named by its Hugging Face hub id cannot be fetched: an unknown or gated repository,
    a revision it lacks, no cached copy offline, the hub unreachable."""


class ExportError(OrtformerError):
    """Exporting to ONNX failed, or the destination cannot be written."""


class OutputError(OrtformerError):
    """A destination other than an export's cannot be written as asked: a Triton
    repository entry (its name, settings or folder), a batch output folder."""


class ParityError(ExportError):
    """The exported model's outputs differ from eager PyTorch beyond the gate.

    ``report`` holds the full parity report (a JSON-able dict)."""

    def __init__(self, message: str, report: dict):
        super().__init__(message)
        self.report = report


class ModelFileError(OrtformerError):
    """An ONNX file is unreadable, unsafe, or not an ortformer model."""


class InputError(OrtformerError, ValueError):
    """A runtime input has the wrong name, dtype, rank, shape or values."""


class SequenceError(InputError):
    """An InputError in one sequence of a batch: ``index`` is its place in the batch and
    ``detail`` what is wrong within it; the message is "sequence {index}: {detail}"."""

    def __init__(self, index: int, detail: str):
        super().__init__(f"sequence {index}: {detail}")
        self.index, self.detail = index, detail


class ListenError(OrtformerError):
    """`ortformer serve` cannot listen where it was asked: the port is taken, the address is
    not this machine's, or binding it is not permitted."""


class ProviderError(OrtformerError):
    """The requested onnxruntime execution provider cannot be used here."""


class MissingExtraError(OrtformerError, ImportError):
    """A feature needs an optional dependency group that is not installed."""

    def __init__(self, feature: str, extra: str, missing: str):
        super().__init__(f"{feature} needs the '{extra}' extra ({missing} is not installed): {install_line(extra)}")
        self.extra = extra


def install_line(extra: str, package_dir: Path = _PACKAGE_DIR) -> str:
    """The pip command that adds ``extra`` where it works today: the checkout this package runs
    from (an editable install), else a clone of the repository; the published form beside it."""
    checkout = package_dir.parent
    published = f"pip install 'ortformer[{extra}]' once ortformer is on PyPI"
    if (checkout / "pyproject.toml").is_file():
        return f"pip install -e '{checkout}[{extra}]' (this checkout; {published})"
    return f"pip install '.[{extra}]' in a clone of the ortformer repository ({published})"


def require(feature: str, extra: str, *modules: str):
    """Import each of ``modules`` (dotted names) for ``feature``; the first module, or
    MissingExtraError naming ``extra`` and the module that could not be imported. The one
    guard of every optional import."""
    import importlib

    imported = []
    for name in modules:
        try:
            imported.append(importlib.import_module(name))
        except ImportError as exc:
            raise MissingExtraError(feature, extra, exc.name or name) from exc
    return imported[0]


def require_torch(feature: str, extra: str = "export"):
    """torch, or MissingExtraError naming the extra to install (``extra``: the feature's own
    group, e.g. "bench", which pulls in export)."""
    return require(feature, extra, "torch")
