"""What every verb shares: one-line errors, --debug tracebacks, JSON output, the MODEL
argument and a quiet onnxruntime logger."""
from __future__ import annotations

import json

import click

from ..errors import OrtformerError


class CliError(click.ClickException):
    """Printed as one line, `error: ...`, exit status 1."""

    def show(self, file=None) -> None:
        click.echo(f"error: {self.format_message()}", err=True, file=file)


class GuardedGroup(click.Group):
    """Turns every OrtformerError into a one-line CliError unless --debug was given."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except OrtformerError as exc:
            if (ctx.obj or {}).get("debug"):
                raise
            raise CliError(str(exc)) from exc


def human_size(n: int) -> str:
    """1536 -> '1.5 KiB': binary units up to GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return f"{n} B"


def echo_json(data) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True))


def quiet_onnxruntime(ctx: click.Context) -> None:
    """onnxruntime logs a failed CUDA load to stderr in red; our own errors name the cause,
    so the CLI keeps its stderr to one line unless --debug."""
    if not (ctx.find_root().obj or {}).get("debug"):
        import onnxruntime

        onnxruntime.set_default_logger_severity(4)


def model_argument(func):
    """The MODEL argument of the verbs that read a model file."""
    return click.argument("model", type=click.Path(exists=True, dir_okay=False))(func)
