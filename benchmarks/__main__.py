"""`python -m benchmarks` (./dev bench-peers): ortformer against other engines.

The peers run from folders beside the dev venv: set them up once with --setup-peers, then
run any of the scenarios; bench.json and the table come out as `ortformer bench` writes them.
"""
from __future__ import annotations

import click

from ortformer.cli.bench_cmd import run_options
from ortformer.cli.common import CliError, check_output
from ortformer.core.errors import OrtformerError

from .peers.scenarios import SCENARIOS


@click.command("benchmarks")
@run_options(click.Choice(list(SCENARIOS)), "Few sentences and iterations: checks the pipeline.",
             "Threads for every engine (default: all cores).", "bench-results/peers", "bench.json")
@click.option("--setup-peers", is_flag=True,
              help="Install the peers and exit: sentence-transformers' ONNX backend (pinned, with the "
                   "transformers<4.58 it needs), OpenVINO with NNCF, and CTranslate2 into the peers overlay beside "
                   "the venv ($ORTFORMER_PEERS_OVERLAY, default <venv>/peers-overlay), which the real and "
                   "cpu-engines scenarios time; and Infinity (infinity-emb, pinned) into a venv of its own "
                   "($ORTFORMER_INFINITY_VENV, default <venv>/peers-infinity), which the serve scenario "
                   "load-tests beside `ortformer serve`.")
def main(scenarios, quick, threads, iterations, out_dir, force, setup_peers):
    """ortformer against sentence-transformers, Infinity, OpenVINO and CTranslate2.

    \b
    Examples (from the repository root):
      python -m benchmarks --setup-peers
      python -m benchmarks --scenario real
      python -m benchmarks --scenario serve --threads 2
      python -m benchmarks --scenario cpu-engines --threads 1
    """
    if setup_peers:
        from .peers.infinity_peer import setup_infinity
        from .peers.overlay import setup_overlay

        folder = setup_overlay(log=lambda line: click.echo(line, err=True))
        click.echo(f"peers overlay ready at {folder}")
        folder = setup_infinity(log=lambda line: click.echo(line, err=True))
        click.echo(f"Infinity venv ready at {folder}")
        return
    out = check_output(out_dir, force=force, option="--out", folder=True)
    if (out / "bench.json").exists() and not force:
        raise CliError(f"{out / 'bench.json'} already exists; pass --force to replace it")
    from ortformer.bench.run import format_table, run_bench

    try:
        result = run_bench(list(scenarios) or list(SCENARIOS), out, threads=threads, quick=quick,
                           iterations=iterations, progress=lambda name: click.echo(f"running {name} ...", err=True),
                           registry=SCENARIOS)
    except OrtformerError as exc:
        raise CliError(str(exc)) from exc
    click.echo(format_table(result))
    click.echo(f"\nwrote {out}/bench.json")


if __name__ == "__main__":
    main()
