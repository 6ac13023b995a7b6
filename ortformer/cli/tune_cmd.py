"""`ortformer tune`: measure every engine and precision this machine offers for a model, with
each one's gate verdict, and record the fastest that meets a quality floor (runtime/tune.py)."""
from __future__ import annotations

from pathlib import Path

import click

from ..contract.parity import GATES
from .common import echo_json, model_argument, quiet_onnxruntime, threads_option


@click.command("tune")
@model_argument
@click.option("--texts", "texts_file", type=click.Path(exists=True, dir_okay=False),
              help="Texts to measure on, one per line [default: 256 built-in English sentences].")
@click.option("--quality", type=click.Choice(["float32", "near-lossless", "int8"]), default="float32",
              show_default=True, help="The floor the choice must meet: float32 (the float32 gate), near-lossless "
                                      f"(bfloat16's, cosine >= {GATES['bfloat16']['min_cosine']}) or int8 (int8's, "
                                      f"cosine >= {GATES['int8']['min_cosine']}).")
@click.option("--int8", "int8_file", type=click.Path(exists=True, dir_okay=False),
              help="The model's int8 export [default: MODEL's sibling STEM.int8.onnx, -int8 or _int8, if any].")
@threads_option("Threads every engine runs with [default: the cores this process may use].")
@click.option("--rounds", type=click.IntRange(1, 100), default=3, show_default=True,
              help="Interleaved timed passes over the texts per engine (after one warm-up pass).")
@click.option("--write", is_flag=True, help="Record the choice beside MODEL (STEM.tuned.json) for --provider tuned.")
@click.option("--force", is_flag=True, help="With --write: replace a choice already recorded for this CPU and threads.")
@click.option("--json", "as_json", is_flag=True, help="Print the measurements as JSON.")
@click.pass_context
def tune_command(ctx, model, texts_file, quality, int8_file, threads, rounds, write, force, as_json):
    """Time MODEL on every engine and precision this CPU offers, and pick the fastest that passes
    its gate against onnxruntime float32 and meets --quality.

    Engines: onnxruntime float32 (the reference) and int8 (an int8 sibling file), OpenVINO float32
    and bfloat16 (the 'openvino' extra; bfloat16 where the CPU has AVX512_BF16 or AMX). Every
    engine embeds the same texts with the same threads, in rounds that alternate them; the
    figure is the median round. --write records the choice (STEM.tuned.json), keyed by this
    CPU's model, flags and thread count: Runtime(path, provider="tuned"), `infer --provider
    tuned` and `serve --provider tuned` use it here, and refuse it on another CPU or thread
    count with the command that tunes there.

    \b
    Examples:
      ortformer tune minilm.onnx
      ortformer tune minilm.onnx --quality near-lossless --write
      ortformer tune minilm.onnx --texts sentences.txt --threads 2 --json
    """
    quiet_onnxruntime(ctx)
    from ..core.cpus import available_cpus
    from ..runtime.machine import this_cpu
    from ..runtime.tune import choice_entry, read_texts, tune
    from ..runtime.tuned import check_writable, write_choice

    if force and not write:
        raise click.UsageError("--force replaces a recorded choice; it needs --write")
    cpu = this_cpu()
    count = threads or available_cpus()
    if write:  # refuse before minutes of measuring, not after
        check_writable(model, cpu.identity(count), force)
    texts = read_texts(texts_file) if texts_file else None
    result = tune(model, texts, quality, count, int8_file, rounds, cpu,
                  progress=lambda message: click.echo(message + " ...", err=True))
    if write:
        result["record"] = str(write_choice(model, choice_entry(result), force))
    if as_json:
        echo_json(result)
        return
    _table(result)


def _table(result: dict) -> None:
    load = result["load"]
    cpu = result["cpu"]
    click.echo(f"{Path(result['model']).name}: {result['texts']} texts, {result['threads']} thread(s), "
               f"{result['rounds']} round(s), {cpu['cpu'] or 'unnamed CPU'} ({' '.join(cpu['flags'])})"
               + (f", load {load['before'][0]} -> {load['after'][0]}" if load["before"] else ""))
    click.echo(f"{'engine':<12} {'precision':<10} {'texts/s':>9} {'vs f32':>7} {'min cos':>9} {'median cos':>10} "
               f"{'gate':<16} note")
    for row in result["candidates"]:
        if not row["available"]:
            click.echo(f"{row['engine']:<12} {row['precision']:<10} {'-':>9} {'-':>7} {'-':>9} {'-':>10} {'-':<16} "
                       f"unavailable: {row['unavailable']}")
            continue
        verdict = f"{row['gate']} {'pass' if row['passes'] else 'FAIL'}"
        note = "chosen" if row["chosen"] else ("" if row["eligible"] else f"below --quality {result['quality']}"
                                               if row["passes"] else "fails its gate")
        click.echo(f"{row['engine']:<12} {row['precision']:<10} {row['sentences_per_s']:>9.1f} "
                   f"{row['vs_float32']:>6.2f}x {row['min_cosine']:>9.6f} {row['median_cosine']:>10.6f} "
                   f"{verdict:<16} {note}")
    choice = result["choice"]
    click.echo(f"choice (--quality {result['quality']}): {choice['engine']} {choice['precision']} ({choice['file']}), "
               f"{choice['vs_float32']:.2f}x onnxruntime float32")
    if "record" in result:
        click.echo(f"wrote {result['record']}: --provider tuned uses it on this CPU at {result['threads']} thread(s)")


COMMANDS = [tune_command]
