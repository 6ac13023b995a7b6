"""The package's layers, read from its source: every import (at the top of a module or
inside a function) goes to the module's own layer or one below, and the modules'
imports form no circle.

Layers, bottom to top (docs/layout.md): core (errors, fsutil, checks, cpus, corpus) and _version
-> config (EncoderConfig, its groups, format 1, text) -> contract (names, cost, late, rerank_template,
parity) -> models -> modelfile (the model file: onnxfile, chunkfile, int8_kernels) -> runtime ->
exporter -> bench/scale/serve -> cli. The root modules errors, cost and parity are deprecated
re-exports kept at their old import paths, in the layer of what they re-export.
"""
from __future__ import annotations

import ast
from pathlib import Path

import ortformer

PACKAGE = Path(ortformer.__file__).parent
LAYERS = [
    ("core", "_version", "errors"),
    ("config",),
    ("contract", "cost", "parity"),
    ("models",),
    ("modelfile",),
    ("runtime",),
    ("exporter",),
    ("bench", "scale", "serve"),
    ("cli",),
]
LEVEL = {part: level for level, parts in enumerate(LAYERS) for part in parts}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_package(name: str) -> bool:
    return (PACKAGE.parent / name.replace(".", "/") / "__init__.py").is_file()


def exists(name: str) -> bool:
    return is_package(name) or (PACKAGE.parent / (name.replace(".", "/") + ".py")).is_file()


def imports(path: Path, name: str | None = None) -> set[str]:
    """Every ortformer module `path` (the module `name`) imports, anywhere in the file.
    `from . import x` counts as importing the submodule x when there is one, else the package."""
    name = name or module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "ortformer"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "ortformer":
                continue
            for alias in node.names:
                child = f"{target}.{alias.name}"
                found.add(child if exists(child) else target)
    found.discard(name)
    return found


def level(name: str) -> int:
    parts = name.split(".")
    assert parts[0] == "ortformer"
    if len(parts) == 1:
        return len(LAYERS)  # the package facade: only the outside world imports it
    return LEVEL[parts[1]]


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_module_has_a_layer():
    unplaced = sorted({name.split(".")[1] for name in MODULES if "." in name} - set(LEVEL))
    assert not unplaced, f"modules with no layer in this test and docs/layout.md: {unplaced}"


def test_no_import_goes_up_a_layer():
    upward = [f"{name} (layer {level(name)}) imports {target} (layer {level(target)})"
              for name, path in MODULES.items() if name != "ortformer"
              for target in sorted(imports(path)) if level(target) > level(name)]
    assert not upward, "\n".join(upward)


def test_imports_form_no_circle():
    graph = {name: imports(path) & set(MODULES) for name, path in MODULES.items()}
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(name: str) -> None:
        state[name] = 1
        stack.append(name)
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                cycles.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_the_reader_sees_lazy_and_relative_imports(tmp_path):
    """The reader itself can fail: a lazy import of the CLI inside a runtime function, and a
    `from .. import __version__` (the package facade), are both seen as upward."""
    fake = tmp_path / "fake.py"
    fake.write_text("from .. import contract\nfrom .. import __version__\n\n"
                    "def f():\n    from ..cli import common\n    import ortformer.exporter.export\n")
    found = imports(fake, "ortformer.runtime.fake")
    assert found == {"ortformer.contract", "ortformer", "ortformer.cli.common", "ortformer.exporter.export"}
    assert sorted(t for t in found if level(t) > LEVEL["runtime"]) == [
        "ortformer", "ortformer.cli.common", "ortformer.exporter.export"]


def test_the_old_root_paths_warn_and_re_export():
    """ortformer.errors, ortformer.cost and ortformer.parity (paths the docs showed) still import,
    with a DeprecationWarning that names the new path, and give the very same objects."""
    import importlib
    import sys
    import warnings

    from ortformer.contract import cost, parity
    from ortformer.core import errors

    for old, new, name in [("ortformer.errors", errors, "ConfigError"), ("ortformer.cost", cost, "parameter_count"),
                           ("ortformer.parity", parity, "GATES")]:
        sys.modules.pop(old, None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = importlib.import_module(old)
        assert [str(w.message) for w in caught if w.category is DeprecationWarning] == [
            f"{old} is deprecated; import {new.__name__}"]
        assert getattr(module, name) is getattr(new, name)
