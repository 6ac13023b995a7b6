"""`ortformer profile`: where a model's time goes, per operator type (no torch)."""
from __future__ import annotations

import click

from ..runtime import PROVIDERS
from ..runtime.profile import profile_ops
from .common import echo_json, model_argument, quiet_onnxruntime, threads_option, usage_errors


@click.command("profile")
@model_argument
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True, help="Rows B of the synthetic input.")
@click.option("--sequence", type=click.IntRange(min=1),
              help="Tokens N per row (default 128, or the model's max_positions when shorter).")
@click.option("--runs", type=click.IntRange(min=1), default=10, show_default=True, help="Timed runs (after 2 warm-up runs).")
@threads_option("onnxruntime intra-op threads (default: one per core).")
@click.option("--provider", type=click.Choice(PROVIDERS), default="auto", show_default=True,
              help="auto: CUDA when it loads, else CPU (as in `ortformer infer`).")
@click.option("--json", "as_json", is_flag=True, help="Print the report (ops, slowest nodes) as JSON.")
@click.option("--top", type=click.IntRange(min=1), help="Only the TOP slowest op types (default: all), also with --json.")
@click.pass_context
@usage_errors(sequence="--sequence")
def profile(ctx, model, batch, sequence, runs, threads, provider, as_json, top):
    """Time MODEL per operator type with onnxruntime's profiler, on random inputs.

    Op types are those onnxruntime runs after its fusions (e.g. MultiHeadAttention,
    SkipLayerNormalization), so they can differ from the ONNX file's nodes. "median
    run" is wall time per timed run; "kernels" is the mean of onnxruntime's own kernel
    times per run, which the profiler's overhead can push above the median.

    \b
    Examples:
      ortformer profile tiny.onnx
      ortformer profile minilm.onnx --batch 8 --sequence 256 --threads 4 --top 5
      ortformer profile minilm.onnx --provider cuda --json
    """
    quiet_onnxruntime(ctx)
    report = profile_ops(model, batch=batch, sequence=sequence, runs=runs, threads=threads, provider=provider)
    if as_json:
        echo_json({**report, "ops": report["ops"][:top]})
        return
    click.echo(f"model {report['model']}  provider {report['provider']}  threads {threads or 'default'}  "
               f"shape {batch}x{report['sequence']}  median run {report['median_run_ms']:.3f} ms "
               f"(kernels {report['kernel_ms_per_run']:.3f} ms mean, {runs} runs)")
    click.echo(f"{'op':<28} {'nodes':>6} {'ms/run':>10} {'share':>7}")
    for row in report["ops"][:top]:
        click.echo(f"{row['op']:<28} {row['nodes']:>6} {row['ms_per_run']:>10.3f} {row['share']:>6.1%}")


COMMANDS = [profile]
