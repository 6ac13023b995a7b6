"""Every registered command answers --help, and every example in its help parses.

The examples are parsed by the command's own click parser (options, choices, types),
in an empty folder where each file or folder an example names exists as a placeholder;
nothing is run. A renamed option or choice left in an example fails here."""
import shlex
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from ortformer.cli import cli

COMMANDS = sorted(cli.commands)
PATHLIKE = (".onnx", ".json", ".npy", ".txt", ".jsonl", ".parquet")


def examples(command: click.Command) -> list[list[str]]:
    """The argument lists after `ortformer` in the help's Examples section (pipes: the part after |)."""
    lines = (command.help or "").split("Examples:", 1)
    found = []
    for line in lines[1].splitlines() if len(lines) == 2 else []:
        line = line.strip().split("| ")[-1]
        if line.startswith("ortformer "):
            words = shlex.split(line)
            # a shell redirection ends the command's own arguments
            redirect = next((i for i, w in enumerate(words) if w in (">", ">>", "<", "2>")), len(words))
            found.append(words[1:redirect])
    return found


def placeholders(args: list[str]) -> None:
    """Create every file (by suffix) and ./folder an example names, so Path(exists=True) holds."""
    for arg in args:
        if arg.startswith("./"):
            Path(arg).mkdir(parents=True, exist_ok=True)
        elif arg.endswith(PATHLIKE) and "/" not in arg:
            Path(arg).touch()


def test_the_group_lists_every_verb():
    assert {"export", "check", "infer", "info", "optimize", "profile", "bench", "triton-repo", "batch"} <= set(COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_help_works_and_the_examples_parse(name, tmp_path, monkeypatch):
    result = CliRunner().invoke(cli, [name, "--help"])
    assert result.exit_code == 0 and result.stdout.startswith("Usage:"), result.output
    command = cli.commands[name]
    cases = examples(command)
    assert cases, f"`ortformer {name} --help` shows no example"
    monkeypatch.chdir(tmp_path)
    for args in cases:
        assert args[0] == name, f"an example under {name} runs {args[0]}"
        placeholders(args)
        parent = cli.make_context("ortformer", [name], resilient_parsing=True)
        with command.make_context(name, args[1:], parent=parent):  # raises UsageError on a bad example
            pass


def test_a_broken_example_is_caught(tmp_path, monkeypatch):
    """The check can fail: an example with an option the command does not have."""
    monkeypatch.chdir(tmp_path)
    command = cli.commands["info"]
    parent = cli.make_context("ortformer", ["info"], resilient_parsing=True)
    placeholders(["tiny.onnx"])
    with pytest.raises(click.UsageError, match="--no-such-option"):
        command.make_context("info", ["tiny.onnx", "--no-such-option"], parent=parent)
