"""Walking an ONNX model's tensors, and finding its side files (onnx only: no onnxruntime, no torch)."""
from __future__ import annotations

from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import TYPE_CHECKING, Iterator

from ..core.errors import ModelFileError

if TYPE_CHECKING:  # imported where used: the runtime imports this module before it needs onnx
    import onnx


def external_locations(model: onnx.ModelProto) -> set[str]:
    """The `location` of every external-data entry in the model, as written (unchecked)."""
    import onnx

    return {entry.value for tensor in all_tensors(model) if tensor.data_location == onnx.TensorProto.EXTERNAL
            for entry in tensor.external_data if entry.key == "location"}


def all_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every TensorProto that may hold data: initializers and tensor attributes, subgraphs and functions included."""

    def graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield sparse.values
            yield sparse.indices
        yield from node_tensors(graph.node)

    def node_tensors(nodes) -> Iterator[onnx.TensorProto]:
        for node in nodes:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors
                if attr.HasField("g"):
                    yield from graph_tensors(attr.g)
                for sub in attr.graphs:
                    yield from graph_tensors(sub)

    yield from graph_tensors(model.graph)
    for function in model.functions:
        yield from node_tensors(function.node)


def check_location_name(name: str, what: str) -> None:
    """Refuse a name that leaves any folder by its spelling alone: a NUL byte, an absolute
    path (POSIX or Windows spelling) or a `..` component."""
    valid = "a plain file name or relative path inside the model's folder"
    if "\0" in name:
        raise ModelFileError(f"{what}: location {name!r} contains a NUL byte; only {valid} is allowed")
    if PurePosixPath(name).is_absolute() or PureWindowsPath(name).is_absolute() or PureWindowsPath(name).drive:
        raise ModelFileError(f"{what}: location {name!r} is an absolute path; only {valid} is allowed")
    if ".." in PureWindowsPath(name).parts:  # Windows parsing splits on both / and \
        raise ModelFileError(f"{what}: location {name!r} contains '..'; only {valid} is allowed")


def resolve_inside(folder: Path, name: str, what: str, missing_ok: bool = False, *,
                   model_path: Path | None = None, hard_links_ok: bool = False) -> Path | None:
    """The existing file `name` relative to `folder`, refusing anything that leaves it
    (missing_ok: None when nothing at all is there, a name that would leave still refused).

    Refused: the names check_location_name refuses, names whose resolved path (symlinks
    followed) is outside the resolved folder, and files with more than one hard link. With
    model_path, the folder the model file itself resolves into counts as inside too: a
    Hugging Face cache snapshot holds symlinks into blobs/, where the model file's own bytes
    live. A hard link is a second name for a file that may live anywhere on the same
    filesystem (a tar member, `cp -al`, a cache that links): no path check can see where its
    other names are, and a hostile graph can route weight bytes to its outputs. Such a file
    is refused (copying it gives it a single link), unless hard_links_ok: files whose bytes
    never reach the outputs as numbers (a tokenizer).
    """
    check_location_name(name, what)
    try:
        roots = [folder.resolve()] + ([model_path.resolve().parent] if model_path is not None else [])
        target = (folder / name).resolve()
        if not any(target.is_relative_to(root) for root in roots):
            raise ModelFileError(f"{what}: location {name!r} resolves to {target}, outside the model's folder "
                                 f"{roots[0]} (symlink?)")
        if missing_ok and (not target.exists() or target.is_dir()):  # absent, dangling inside, a folder
            return None
        if not target.is_file():
            raise ModelFileError(f"{what}: file {name!r} is missing from the model's folder {roots[0]}")
        links = target.stat().st_nlink
    except (OSError, RuntimeError) as exc:  # a name too long, a permission denied, a symlink loop
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ModelFileError(f"{what}: cannot check location {name!r}: {reason}") from None
    if links > 1 and not hard_links_ok:
        raise ModelFileError(
            f"{what}: file {name!r} has {links} hard links; a hard link may be a second name for a file outside "
            "the model's folder, so only files with a single link are read (copy it: cp FILE FILE.tmp && mv FILE.tmp FILE)"
        )
    return target
