"""What every verb shares: one-line errors, --debug tracebacks, JSON output."""
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
