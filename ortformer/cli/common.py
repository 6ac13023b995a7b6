"""What every verb shares: one-line errors, --debug tracebacks, JSON output, the MODEL
argument and a quiet onnxruntime logger."""
from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import signal
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Iterator

import click

from ..core.errors import OrtformerError
from ..core.fsutil import staged


class CliError(click.ClickException):
    """Printed as one line, `error: ...`, exit status 1."""

    def show(self, file=None) -> None:
        click.echo(f"error: {self.format_message()}", err=True, file=file)


# library messages name Python parameters ("pass force=True (--force)"); a CLI user reads flags
_CLI_SPELLING = [
    (re.compile(r"\b\w+=True \((--[\w-]+)\)"), r"\1"),        # force=True (--force) -> --force
    (re.compile(r"\b[a-z_]+ \((--[a-z-]+)\)"), r"\1"),           # text_field (--text-field) -> --text-field
    (re.compile(r"provider='cpu' or 'auto', or allow_fallback=True"), "--provider cpu or auto, or --allow-fallback"),
    (re.compile(r"\ballow_fallback=True\b"), "--allow-fallback"),
    (re.compile(r"\bnum_actors=(\d+) with provider='cuda'"), r"--num-actors \1 with --provider cuda"),
]


def cli_spelling(message: str) -> str:
    for pattern, replacement in _CLI_SPELLING:
        message = pattern.sub(replacement, message)
    return message


def usage_errors(**flags: str):
    """Decorate a command so that a library error about one of its option values
    ("sequence=1000 must be ...", the parameter named first) is a usage error for that
    option (exit 2), as click's own checks are: flags maps parameter -> option, e.g.
    sequence="--sequence". The bound often depends on the model, so click cannot check it."""
    def decorate(command):
        @functools.wraps(command)
        def wrapped(*args, **kwargs):
            try:
                return command(*args, **kwargs)
            except OrtformerError as exc:
                match = re.match(r"(\w+)=", str(exc))
                if match is None or match.group(1) not in flags:
                    raise
                raise click.BadParameter(cli_spelling(str(exc)[match.end():]),
                                         param_hint=f"'{flags[match.group(1)]}'") from exc
        return wrapped
    return decorate


class GuardedGroup(click.Group):
    """Turns every OrtformerError into a one-line CliError unless --debug was given."""

    def invoke(self, ctx: click.Context):
        previous = _terminate_as_interrupt()
        try:
            with warnings.catch_warnings():
                warnings.showwarning = _one_line_warning
                return super().invoke(ctx)
        except OrtformerError as exc:
            if (ctx.obj or {}).get("debug"):
                raise
            raise CliError(cli_spelling(str(exc))) from exc
        except BrokenPipeError:  # the reader left (`ortformer info m.onnx | head -1`): nothing to say
            _silence_stdout()
            ctx.exit(1)
        except OSError as exc:  # a file the checks could not foresee (a disk filling up, a race)
            if (ctx.obj or {}).get("debug"):
                raise
            where = f"{exc.filename}: " if exc.filename else ""
            raise CliError(f"{where}{exc.strerror or exc}") from exc
        except MemoryError:
            if (ctx.obj or {}).get("debug"):
                raise
            raise CliError("out of memory; try a smaller input, batch or model") from None
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)


def _terminate_as_interrupt():
    """SIGTERM (timeout, docker stop, systemd) ends a command as Ctrl-C does: the staging
    files and folders of a write are removed on the way out and click says "Aborted!".
    Returns the handler it replaced (None off the main thread, where none can be set)."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    try:
        return signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread (an app embedding the CLI)
        return None


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A library warning as one line, like errors: "warning: ..." on stderr."""
    click.echo(f"warning: {message}", err=True)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so Python's flush at exit does not fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):  # no real file descriptor (tests, embedding apps)
        pass


def given_options(ctx: click.Context, names) -> list[str]:
    """The options among ``names`` (parameter names) that the user gave, on the command line or
    by environment variable, each by its long spelling: ["--output", "--force"]."""
    from click.core import ParameterSource

    given = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
    return [max(param.opts, key=len) for param in ctx.command.params
            if param.name in names and ctx.get_parameter_source(param.name) in given]


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


def same_file(a, b) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_output(path, *, force: bool, option: str, inputs=(), folder: bool = False) -> Path:
    """Refuse an output path before any work is done; return it as a Path.

    Refused, each as one `error:` line: a path that is a symbolic link or sits in a folder
    named through one (the write would land outside the folder the user named); an input
    of the command (even with --force); an existing output file without --force; a folder
    that does not exist (for a file) or cannot be written.
    """
    if not str(path).strip():
        raise click.BadParameter("an empty path names no file; give a path", param_hint=f"'{option}'")
    path = Path(path)
    what = "folder" if folder else "file"
    for given in inputs:
        if given is not None and (same_file(path, given) or path.absolute() == Path(given).absolute()):
            raise CliError(f"{option} {path} is an input of this command; choose another {what}")
    if path.is_symlink():
        raise CliError(f"{option} {path} is a symbolic link; give the real path")
    if path.parent.is_symlink():
        raise CliError(f"{option} {path}: folder {path.parent} is a symbolic link; give the real path")
    if path.exists():
        if folder and not path.is_dir():
            raise CliError(f"{option} {path} exists and is not a folder")
        if not folder and not path.is_file():
            hint = "; to discard the output, leave -o out and redirect stdout" if path.is_char_device() else ""
            raise CliError(f"{option} {path} exists and is not a file (outputs are written whole, then renamed "
                           f"into place){hint}")
        if not force and not folder:
            raise CliError(f"{path} already exists; pass --force to replace it")
    parent = path.absolute().parent
    if not folder and not parent.is_dir():
        raise CliError(f"{option} {path}: folder {path.parent} does not exist; create it first")
    existing = path.absolute() if folder else parent
    while not existing.exists():  # a folder output is created with its parents
        existing = existing.parent
    if not existing.is_dir() or not _can_create_in(existing):
        raise CliError(f"{option} {path}: folder {existing} is not writable")
    return path


def _can_create_in(folder: Path) -> bool:
    """Create and remove a probe file: os.access says yes to root even where writes fail (/proc)."""
    try:
        fd, name = tempfile.mkstemp(prefix=".ortformer-probe.", dir=folder)
    except OSError:
        return False
    os.close(fd)
    os.unlink(name)
    return True


@contextlib.contextmanager
def written(path: Path, option: str) -> Iterator[Path]:
    """A temporary file that replaces ``path`` only when the block succeeds (fsutil.staged);
    an OSError becomes one `error:` line naming the option."""
    try:
        with staged(Path(path)) as tmp:
            yield tmp
    except OSError as exc:
        raise CliError(f"{option} {path}: cannot write: {exc.strerror or exc}") from None


def thread_limit() -> int:
    """Most --threads any verb takes: providers.THREADS_PER_CORE per usable core."""
    from ..core.cpus import available_cpus
    from ..runtime.providers import THREADS_PER_CORE

    return THREADS_PER_CORE * available_cpus()


def threads_option(help_text: str):
    """--threads, refused above thread_limit() as a usage error (10,000 threads hung a run)."""
    from ..runtime.providers import THREADS_PER_CORE

    return click.option("--threads", type=click.IntRange(min=1, max=thread_limit()),
                        help=f"{help_text} At most {THREADS_PER_CORE} per usable core ({thread_limit()} here).")
