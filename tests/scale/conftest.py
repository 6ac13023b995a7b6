"""Fixtures of tests/scale. Its models are the session ones of tests/conftest.py: features_model
(float features, no token types) and text_model (support/text_models.py)."""
from __future__ import annotations


import click
import pytest



def pytest_configure(config):
    config.addinivalue_line("markers", "ray: starts a local Ray instance (needs the 'ray' extra)")


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
