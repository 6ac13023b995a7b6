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


def echo_json(data) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True))
