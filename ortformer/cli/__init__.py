"""The `ortformer` command: a click group; every verb is a thin wrapper over the library.

Each verb lives in its own module and is added to the group explicitly below
(no registration by import side effect).
"""
from __future__ import annotations

import click

from .common import GuardedGroup


@click.group(cls=GuardedGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show the full traceback on errors.")
@click.version_option(package_name="ortformer")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Export PyTorch Transformer encoders to ONNX and serve them with onnxruntime.

    \b
    Examples:
      ortformer export --preset tiny -o tiny.onnx
      ortformer infer tiny.onnx --ids '[[1, 2, 3]]'
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def _register() -> None:
    from . import bench_cmd, export_cmd, profile_cmd, runtime_cmd, scale_cmd, serve_cmd, tune_cmd

    for module in (export_cmd, runtime_cmd, profile_cmd, bench_cmd, scale_cmd, serve_cmd, tune_cmd):
        for command in module.COMMANDS:
            cli.add_command(command)


_register()
main = cli
