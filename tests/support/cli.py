"""Run `ortformer ARGS...` in-process through click's CliRunner and check how it exited.
Shared by the tests/cli files and the family tests that drive the CLI."""
from click.testing import CliRunner

from ortformer.cli import cli


def invoke(*args, input=None, ok=True):
    """The click Result; with ok, asserts exit code 0. Arguments may be paths or numbers."""
    result = CliRunner().invoke(cli, [str(a) for a in args], input=input)
    if ok:
        assert result.exit_code == 0, (result.output, result.exception)
    return result


def fail_stderr(*args, input=None, code=1):
    """Asserts exit code `code`; the whole of stderr, stripped."""
    result = invoke(*args, input=input, ok=False)
    assert result.exit_code == code, result.output
    return result.stderr.strip()


def fail(*args, input=None, code=1):
    """Asserts exit code `code` and no traceback; for code 1 also that the error is one line,
    the last, starting "error: " (progress lines may come before). Returns that last line."""
    result = invoke(*args, input=input, ok=False)
    assert result.exit_code == code, (result.output, result.exception)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    if code == 1:
        assert lines[-1].startswith("error: ") and sum(x.startswith("error") for x in lines) == 1, result.stderr
    return lines[-1]
