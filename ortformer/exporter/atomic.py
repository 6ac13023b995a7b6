"""Write an ONNX model so that a reader sees the old model or the complete new one.

A model may be one file or a pair (``model.onnx`` + external data). The data file
gets a fresh name per export (``model.onnx.<token>.data``) so the old ONNX file
keeps pointing at its own, intact data until the ONNX file itself is replaced;
``os.replace`` of the ONNX file is the single commit point. Old data files are
removed only after the commit.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from .. import contract
from ..core.errors import ExportError
from ..core.fsutil import fsync_dir, fsync_file
from ..modelfile.onnxfile import external_locations

# protobuf refuses messages over 2 GiB; stay clear of it with weights inline
INLINE_LIMIT_BYTES = 1_800_000_000


def external_data_files(onnx_path: Path) -> set[str]:
    """Relative locations of the external-data files an ONNX file refers to."""
    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except Exception:  # an unreadable old file has no data files we can name
        return set()
    return external_locations(model)


@dataclass
class StagedModel:
    """A model written under a temporary folder beside its destination."""

    dest: Path
    tmpdir: Path
    data_name: str | None
    side_names: list[str] = field(default_factory=list)  # e.g. the tokenizer, moved before the ONNX file

    @property
    def path(self) -> Path:
        return self.tmpdir / self.dest.name

    def _side(self) -> list[str]:
        return ([self.data_name] if self.data_name else []) + self.side_names

    def files(self) -> list[Path]:
        return [self.path] + [self.tmpdir / name for name in self._side()]

    def add_side_file(self, source: Path, name: str) -> None:
        """Stage a copy of ``source`` to land beside the model as ``name``."""
        if Path(name).name != name or name in (self.dest.name, self.data_name):
            raise ExportError(f"side file name {name!r} must be a plain file name unlike the model's")
        try:
            shutil.copyfile(source, self.tmpdir / name)
        except OSError as exc:
            raise ExportError(f"cannot copy {source}: {exc.strerror or exc}") from None
        self.side_names.append(name)

    def rewrite_metadata(self, props: dict[str, str]) -> None:
        """Set metadata entries in the staged ONNX file, leaving its data file as is."""
        model = onnx.load(str(self.path), load_external_data=False)
        set_metadata(model, props)
        onnx.save_model(model, str(self.path))

    def commit(self, force: bool) -> list[Path]:
        """Move data first, then the ONNX file (the commit point). Returns the final files."""
        check_destination(self.dest, force)
        folder = self.dest.parent
        for name in self.side_names:  # side files are outputs too
            check_destination(folder / name, force)
        old_data = external_data_files(self.dest) if self.dest.exists() else set()
        for staged in self.files():
            fsync_file(staged)
        for name in self._side():
            os.replace(self.tmpdir / name, folder / name)
        os.replace(self.path, self.dest)
        fsync_dir(folder)
        for name in old_data - {self.data_name}:
            stale = folder / name
            # only ever delete files inside the destination folder
            if stale.resolve().parent == folder.resolve() and stale.is_file():
                stale.unlink()
        self.discard()
        return [self.dest] + [folder / name for name in self._side()]

    def keep_as(self, path: Path) -> Path:
        """Keep a failed model for inspection under an explicit, different name, with its
        tokenizer beside it under the kept model's stem, so the kept file loads on its own."""
        model = onnx.load(str(self.path))  # pulls external data in, so the copy stands alone
        tokenizer = {p.key: p.value for p in model.metadata_props}.get(contract.META_TOKENIZER)
        kept_tokenizer = f"{Path(path).stem}.tokenizer.json"
        if tokenizer in self.side_names:
            set_metadata(model, {contract.META_TOKENIZER: kept_tokenizer})
        kept = stage_model(model, Path(path), force=True)
        try:
            if tokenizer in self.side_names:
                kept.add_side_file(self.tmpdir / tokenizer, kept_tokenizer)
            return kept.commit(force=True)[0]
        finally:
            kept.discard()

    def discard(self) -> None:
        shutil.rmtree(self.tmpdir, ignore_errors=True)


def check_destination(dest: Path, force: bool) -> None:
    if dest.exists() and not force:
        raise ExportError(f"{dest} already exists; pass force=True (--force) to replace it")
    if dest.exists() and not dest.is_file():
        raise ExportError(f"{dest} exists and is not a file; choose a file path ending in .onnx")
    folder = dest.parent
    if not folder.is_dir():
        raise ExportError(f"output folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ExportError(f"output folder {folder} is not writable")


def set_metadata(model: onnx.ModelProto, props: dict[str, str]) -> None:
    """Set metadata entries, keeping the required ones (contract.REQUIRED_META) last: protobuf has no
    end marker, so a file cut between two metadata entries parses, and with the required keys last
    every such cut loses one and is refused, rather than silently losing an optional key added later
    (ortformer.int8, ortformer.weights)."""
    values = {p.key: p.value for p in model.metadata_props}
    values.update(props)
    order = [k for k in values if k not in contract.REQUIRED_META] + [k for k in values if k in contract.REQUIRED_META]
    del model.metadata_props[:]
    for key in order:
        model.metadata_props.add(key=key, value=values[key])


def stage_model(model: onnx.ModelProto, dest: Path, force: bool) -> StagedModel:
    """Write ``model`` under a temporary folder beside ``dest``; inline when it fits."""
    dest = Path(dest).absolute()
    check_destination(dest, force)
    try:
        tmpdir = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    except OSError as exc:
        raise ExportError(f"cannot write into {dest.parent}: {exc.strerror}") from None
    staged = StagedModel(dest, tmpdir, None)
    try:
        if model.ByteSize() > INLINE_LIMIT_BYTES:
            staged.data_name = f"{dest.name}.{uuid.uuid4().hex[:12]}.data"
            onnx.save_model(model, str(staged.path), save_as_external_data=True,
                            all_tensors_to_one_file=True, location=staged.data_name, size_threshold=1024)
        else:
            onnx.save_model(model, str(staged.path))
    except OSError as exc:
        staged.discard()
        raise ExportError(f"cannot write {dest}: {exc.strerror or exc}") from None
    except BaseException:
        staged.discard()
        raise
    return staged
