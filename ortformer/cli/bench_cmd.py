"""`ortformer bench`: thin wrapper over ortformer.bench (imports torch inside the command)."""
from __future__ import annotations

import click

from .common import CliError, check_output, threads_option

SCENARIO_NAMES = ("latency", "throughput", "long")
# the scenarios that time other engines (each from a venv or overlay of its own) are the
# repository's peer harness, benchmarks/, run from a checkout
PEERS_COMMAND = "python -m benchmarks"
MOVED = ("real", "serve", "cpu-engines")


class _Scenario(click.Choice):
    """SCENARIO_NAMES; a moved scenario's name is refused with the command that runs it now."""

    def convert(self, value, param, ctx):
        if value in MOVED:
            self.fail(f"{value!r} times other engines: run `{PEERS_COMMAND} --scenario {value}` from a checkout "
                      f"of the repository (./dev bench-peers --scenario {value})", param, ctx)
        return super().convert(value, param, ctx)


def _setup_peers(ctx, param, value):
    if value:
        raise click.BadParameter(f"the peers are set up by `{PEERS_COMMAND} --setup-peers` from a checkout of the "
                                 "repository (./dev bench-peers --setup-peers)")
    return value


def run_options(scenario_type: click.ParamType, quick: str, threads: str, out: str, files: str):
    """The options `ortformer bench` and the peer harness (`python -m benchmarks`) share:
    --scenario (of ``scenario_type``), --quick, --threads, --iterations, --out (default ``out``), --force."""
    options = [
        click.option("--scenario", "scenarios", multiple=True, type=scenario_type,
                     help="Scenario to run (repeatable; default all)."),
        click.option("--quick", is_flag=True, help=quick),
        threads_option(threads),
        click.option("--iterations", type=click.IntRange(min=1), help="Timed runs per contender (default 20, quick 3)."),
        click.option("--out", "out_dir", type=click.Path(file_okay=False), default=out, show_default=True,
                     help=f"Folder for {files}."),
        click.option("--force", is_flag=True, help=f"Replace {files} from an earlier run."),
    ]

    def apply(func):
        for option in reversed(options):
            func = option(func)
        return func
    return apply


@click.command("bench")
@run_options(_Scenario(SCENARIO_NAMES), "Tiny models and few iterations: checks the pipeline in about a minute.",
             "Threads for both torch and onnxruntime (default: all cores).", "bench-results",
             "bench.json and bench_long.png")
@click.option("--setup-peers", is_flag=True, hidden=True, expose_value=False, callback=_setup_peers)
def bench(scenarios, quick, threads, iterations, out_dir, force):
    """Eager PyTorch vs onnxruntime side by side: medians, ratios, targets; JSON + PNG.

    \b
    Examples:
      ortformer bench --quick
      ortformer bench --scenario latency --scenario long --threads 2

    Other engines (sentence-transformers, Infinity, OpenVINO, CTranslate2) are timed by the
    repository's peer harness: `python -m benchmarks --help` from a checkout.
    """
    from ..core.errors import require_torch

    # refused before minutes of measuring, not after
    out = check_output(out_dir, force=force, option="--out", folder=True)
    for name in ("bench.json", "bench_long.png"):
        if (out / name).exists() and not force:
            raise CliError(f"{out / name} already exists; pass --force to replace it")
    require_torch("ortformer bench", "bench")
    from ..bench.run import format_table, run_bench

    names = list(scenarios) or list(SCENARIO_NAMES)
    result = run_bench(names, out_dir, threads=threads, quick=quick, iterations=iterations,
                       progress=lambda name: click.echo(f"running {name} ...", err=True))
    click.echo(format_table(result))
    click.echo(f"\nwrote {out_dir}/bench.json" + (f" and {result['scenarios']['long']['plot']}"
                                                   if result["scenarios"].get("long", {}).get("plot") else ""))


COMMANDS = [bench]
