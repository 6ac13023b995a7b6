"""`ortformer bench`: thin wrapper over ortformer.bench (imports torch inside the command)."""
from __future__ import annotations


import click

from .common import CliError, check_output, threads_option

SCENARIO_NAMES = ("latency", "throughput", "long", "real", "serve", "cpu-engines")


@click.command("bench")
@click.option("--scenario", "scenarios", multiple=True, type=click.Choice(SCENARIO_NAMES),
              help="Scenario to run (repeatable; default all).")
@click.option("--quick", is_flag=True, help="Tiny models and few iterations: checks the pipeline in about a minute.")
@threads_option("Threads for both torch and onnxruntime (default: all cores).")
@click.option("--iterations", type=click.IntRange(min=1), help="Timed runs per contender (default 20, quick 3).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="bench-results", show_default=True,
              help="Folder for bench.json and bench_long.png.")
@click.option("--force", is_flag=True, help="Replace bench.json and bench_long.png from an earlier run.")
@click.option("--setup-peers", is_flag=True,
              help="Install the peers and exit: sentence-transformers' ONNX backend (pinned, with the "
                   "transformers<4.58 it needs), OpenVINO with NNCF, and CTranslate2 into the peers overlay beside "
                   "the venv ($ORTFORMER_PEERS_OVERLAY, default <venv>/peers-overlay), which the real and "
                   "cpu-engines scenarios time; and Infinity (infinity-emb, pinned) into a venv of its own "
                   "($ORTFORMER_INFINITY_VENV, default <venv>/peers-infinity), which the serve scenario "
                   "load-tests beside `ortformer serve`.")
def bench(scenarios, quick, threads, iterations, out_dir, force, setup_peers):
    """Eager PyTorch vs onnxruntime side by side: medians, ratios, targets; JSON + PNG.

    \b
    Examples:
      ortformer bench --quick
      ortformer bench --scenario latency --scenario long --threads 2
      ortformer bench --setup-peers
      ortformer bench --scenario real
      ortformer bench --scenario serve --threads 2
      ortformer bench --scenario cpu-engines --threads 2
    """
    from ..errors import require_torch

    if setup_peers:
        from ..bench.infinity_peer import setup_infinity
        from ..bench.overlay import setup_overlay

        folder = setup_overlay(log=lambda line: click.echo(line, err=True))
        click.echo(f"peers overlay ready at {folder}")
        folder = setup_infinity(log=lambda line: click.echo(line, err=True))
        click.echo(f"Infinity venv ready at {folder}")
        return

    # refused before minutes of measuring, not after
    out = check_output(out_dir, force=force, option="--out", folder=True)
    for name in ("bench.json", "bench_long.png"):
        if (out / name).exists() and not force:
            raise CliError(f"{out / name} already exists; pass --force to replace it")
    require_torch("ortformer bench", "bench")
    from ..bench.run import format_table, run_bench

    names = list(scenarios) or (["latency", "throughput", "long"] if quick else list(SCENARIO_NAMES))
    result = run_bench(names, out_dir, threads=threads, quick=quick, iterations=iterations,
                       progress=lambda name: click.echo(f"running {name} ...", err=True))
    click.echo(format_table(result))
    click.echo(f"\nwrote {out_dir}/bench.json" + (f" and {result['scenarios']['long']['plot']}"
                                                   if result["scenarios"].get("long", {}).get("plot") else ""))


COMMANDS = [bench]
