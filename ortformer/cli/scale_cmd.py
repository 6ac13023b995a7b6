"""`ortformer triton-repo` and `ortformer batch`: thin wrappers over ortformer.scale.

Neither imports torch; `batch` imports ray only when it runs.
"""
from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

import click

from ..scale.ray_batch import BATCH_PROVIDERS
from .common import CliError, check_output
from ..scale.triton import DEVICES, INT8_KERNELS, MODEL_FILENAME, VERSION, write_triton_repo


@click.command("triton-repo")
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("--repo", required=True, type=click.Path(file_okay=False), help="Triton model repository folder.")
@click.option("--name", default=None, help="Model name in the repository (default: the file's stem).")
@click.option("--max-batch-size", type=click.IntRange(min=1), default=64, show_default=True,
              help="Largest batch Triton's dynamic batcher forms.")
@click.option("--device", type=click.Choice(sorted(DEVICES)), default="cpu", show_default=True,
              help="Instance kind: KIND_CPU or KIND_GPU.")
@click.option("--int8-kernel", type=click.Choice(INT8_KERNELS), default="portable", show_default=True,
              help="int8 files only: 'portable' writes the weights as uint8 (exact on any server CPU); 'vnni' "
                   "keeps them int8 (faster, but wrong on x86 servers without AVX512-VNNI / AVX-VNNI).")
@click.option("--force", is_flag=True, help="Replace an existing entry of that name.")
def triton_repo_command(model, repo, name, max_batch_size, device, int8_kernel, force):
    """Write MODEL into a Triton Inference Server model repository (onnxruntime backend).

    Writes REPO/NAME/config.pbtxt (inputs, outputs and dims from the model's graph,
    dynamic batching, one instance on the chosen device) and REPO/NAME/1/model.onnx,
    plus the tokenizer named in the model's metadata beside the version folder.

    \b
    Examples:
      ortformer triton-repo tiny.onnx --repo models
      ortformer triton-repo m.onnx --repo models --name encoder --device gpu --max-batch-size 32 --force
      ortformer triton-repo m.onnx --repo models --int8-kernel vnni
    """
    check_output(repo, force=force, option="--repo", folder=True)
    entry = write_triton_repo(model, repo, name=name, max_batch_size=max_batch_size, device=device, force=force,
                              int8_kernel=int8_kernel)
    click.echo(f"wrote {entry}/config.pbtxt and {entry}/{VERSION}/{MODEL_FILENAME}")
    extras = sorted(p.name for p in entry.iterdir() if p.is_file() and not p.is_symlink() and p.name != "config.pbtxt")
    for extra in extras:  # the tokenizer, at the path clients load it from
        click.echo(f"  tokenizer for clients: {entry / extra}")
    click.echo(f"  serve: tritonserver --model-repository={entry.parent.absolute()}")


class _ProgressLine:
    """Rows done and rows/s on stderr: rewritten in place on a terminal, else at most one
    line every few seconds (logs stay short)."""

    def __init__(self, stream=None, every_s: float = 5.0):
        self.stream = stream  # None: sys.stderr
        self.tty = (stream or sys.stderr).isatty()
        self.every_s = every_s
        self.last = 0.0

    def __call__(self, done: int, total: int, rate: float) -> None:
        now = time.monotonic()
        final = done >= total
        if not (self.tty or final or now - self.last >= self.every_s):
            return
        self.last = now
        percent = 100.0 * done / total if total else 100.0
        text = f"{done:,}/{total:,} rows ({percent:.0f}%), {rate:,.1f} rows/s"
        if self.tty:
            click.echo(f"\r{text}", err=self.stream is None, file=self.stream, nl=final)
        else:
            click.echo(text, err=self.stream is None, file=self.stream)


@click.command("batch")
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("--input", "input_path", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Texts: .jsonl (one object per line) or .parquet.")
@click.option("-o", "--output", "output_path", required=True, type=click.Path(),
              help="Output folder of parquet shards (id, embedding), e.g. embeddings.parquet.")
@click.option("--ray-address", default=None, help="Ray cluster address (default: start a local Ray instance).")
@click.option("--num-actors", type=click.IntRange(min=1), default=1, show_default=True,
              help="Actors, each holding one onnxruntime session.")
@click.option("--batch-size", type=click.IntRange(min=1), default=64, show_default=True,
              help="Texts per model call (sorted by token length first).")
@click.option("--provider", type=click.Choice(BATCH_PROVIDERS), default="cpu", show_default=True,
              help="cuda gives each actor one GPU.")
@click.option("--resume", is_flag=True, help="Continue an interrupted output, skipping its finished shards.")
@click.option("--text-field", default="text", show_default=True, help="Field (or column) holding the text.")
@click.option("--id-field", default="id", show_default=True, help="Field holding the id; rows without one get their row number.")
@click.option("--shard-rows", type=click.IntRange(min=1), default=None,
              help="Rows per output shard (default: about 64 shards of 1,024-10,000 rows).")
def batch_command(model, input_path, output_path, ray_address, num_actors, batch_size, provider, resume,
                  text_field, id_field, shard_rows):
    """Embed every text of a corpus with Ray into resumable parquet shards.

    MODEL must pool (sentence_embedding) and name a tokenizer in its metadata. The
    output has exactly one row (id, embedding) per input row.

    \b
    Examples:
      ortformer batch minilm.onnx --input texts.jsonl --output emb.parquet
      ortformer batch model.onnx --input texts.parquet --output emb.parquet --num-actors 2 --resume
      ortformer batch model.onnx --input texts.jsonl --output emb.parquet --ray-address ray://head:10001 --provider cuda --num-actors 4
    """
    from ..scale.ray_batch import DuplicateIdWarning, embed_corpus
    from ..scale.shards import INPUT_KINDS
    from ..config.text import TruncationWarning

    if Path(input_path).suffix not in INPUT_KINDS:
        raise click.BadParameter(f"{input_path} must be a {' or '.join(INPUT_KINDS)} file", param_hint="'--input'")

    out = check_output(output_path, force=True, option="-o/--output", folder=True, inputs=[model, input_path])
    if not resume and out.is_dir() and any(out.iterdir()):  # before the model and input are read
        raise CliError(f"output {out} already exists; pass --resume to continue it, or remove it to start over")

    from ..scale.ray_guard import held_stderr

    debug = (click.get_current_context().find_root().obj or {}).get("debug", False)
    # Ray's processes write to descriptor 2 directly; our own lines go to the real stderr
    with warnings.catch_warnings(record=True) as caught, held_stderr(replay_on_error=debug) as stderr:
        warnings.simplefilter("always", DuplicateIdWarning)
        warnings.simplefilter("always", TruncationWarning)
        stats = embed_corpus(model, input_path, output_path, ray_address=ray_address, num_actors=num_actors,
                             batch_size=batch_size, provider=provider, resume=resume, text_field=text_field,
                             id_field=id_field, progress=_ProgressLine(stderr), shard_rows=shard_rows)
    for warning in caught:  # Ray's own (deprecations, resource notes) are not the user's concern
        if issubclass(warning.category, (DuplicateIdWarning, TruncationWarning)):
            click.echo(f"warning: {warning.message}", err=True)
    resumed = f", {stats['rows'] - stats['rows_embedded']:,} already done" if stats["shards_skipped"] else ""
    click.echo(f"embedded {stats['rows_embedded']:,} rows{resumed} in {stats['seconds']:.1f} s "
               f"({stats['rows_per_s']:,.1f} rows/s over {stats['num_actors']} actor(s)) -> {stats['output']} "
               f"[{stats['rows']:,} rows, {stats['shards']} shards, dim {stats['dim']}]")


COMMANDS = [triton_repo_command, batch_command]
