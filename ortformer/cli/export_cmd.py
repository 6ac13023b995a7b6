"""`ortformer export` and `ortformer check`: thin wrappers over ortformer.exporter.

torch is imported inside the commands, so `ortformer infer` works without it.
"""
from __future__ import annotations

from pathlib import Path

import click

from .. import contract
from ..config import ACTIVATIONS, ATTENTION_KINDS, DEFAULT_PRESET, NORM_POSITIONS, NORMS, POOLINGS, POSITIONS, PRESETS, EncoderConfig, preset
from ..errors import ConfigError
from .common import echo_json, human_size

# CLI flag -> EncoderConfig field, for the explicit-architecture flags
FLAG_FIELDS = {
    "attention": "attention", "norm": "norm", "norm_position": "norm_position", "activation": "activation",
    "positions": "positions", "layers": "num_layers", "hidden": "hidden_size", "heads": "num_heads",
    "ffn": "ffn_size", "vocab": "vocab_size", "max_positions": "max_positions",
    "type_vocab": "type_vocab_size", "pooling": "pooling", "normalize": "normalize_embeddings",
    "causal": "causal",
}


def config_from_options(preset_name: str | None, config_file: str | None, flags: dict) -> EncoderConfig:
    """Preset (or config JSON) first, then every explicit flag on top."""
    if preset_name and config_file:
        raise ConfigError("give either --preset or --config, not both")
    if config_file:
        try:
            text = Path(config_file).read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read config file {config_file}: {exc.strerror}") from None
        cfg = EncoderConfig.from_json(text)
    else:
        cfg = preset(preset_name or DEFAULT_PRESET)
    changes = {FLAG_FIELDS[k]: v for k, v in flags.items() if v is not None}
    return cfg.replace(**changes) if changes else cfg


def _shape_text(shapes: dict) -> str:
    return ", ".join(f"{name} [{', '.join(map(str, dims))}]" for name, dims in shapes.items())



def architecture_options(func):
    """The explicit-architecture flags shared by commands that build a model."""
    options = [
        click.option("--preset", "preset_name", type=click.Choice(sorted(PRESETS)), help=f"Start from a preset (default {DEFAULT_PRESET})."),
        click.option("--config", "config_file", type=click.Path(dir_okay=False), help="Start from a config JSON file."),
        click.option("--attention", type=click.Choice(ATTENTION_KINDS)),
        click.option("--norm", type=click.Choice(NORMS)),
        click.option("--norm-position", type=click.Choice(NORM_POSITIONS)),
        click.option("--activation", type=click.Choice(ACTIVATIONS)),
        click.option("--positions", type=click.Choice(POSITIONS)),
        click.option("--layers", type=click.IntRange(min=1)),
        click.option("--hidden", type=click.IntRange(min=1), help="Hidden size F."),
        click.option("--heads", type=click.IntRange(min=1)),
        click.option("--ffn", type=click.IntRange(min=1), help="Feed-forward inner size."),
        click.option("--vocab", type=click.IntRange(min=0), help="Vocabulary size; 0 = float-feature input."),
        click.option("--max-positions", type=click.IntRange(min=1)),
        click.option("--type-vocab", type=click.IntRange(min=0), help="Segment (token type) vocabulary; 0 = none."),
        click.option("--pooling", type=click.Choice(POOLINGS)),
        click.option("--normalize/--no-normalize", default=None, help="l2-normalise the sentence embedding."),
        click.option("--causal/--no-causal", default=None,
                     help="Token i attends to j <= i; linear/cosine models can then stream (Runtime.stream)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


@click.command("export")
@architecture_options
@click.option("--from", "from_path", type=click.Path(exists=True),
              help="Export trained weights: an ortformer checkpoint or a local BERT-family folder.")
@click.option("--tokenizer", type=click.Path(exists=True, dir_okay=False),
              help="tokenizer.json to ship beside the model (default: the one found with --from).")
@click.option("--no-fused-ops", is_flag=True,
              help="Standard ONNX ops only (no com.microsoft MultiHeadAttention/Gelu), for runtimes other than onnxruntime.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for random initialisation.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Destination .onnx file.")
@click.option("--opset", type=int, default=None, help="ONNX opset (default 18; see docs).")
@click.option("--dtype", type=click.Choice(["float32", "float16"]), default="float32", show_default=True,
              help="float16 weights and activations (for CUDA), gated on cosine >= 0.999.")
@click.option("--quantize", type=click.Choice(["int8"]), help="int8 dynamic quantization of the weight MatMuls, gated on cosine >= 0.99.")
@click.option("--force", is_flag=True, help="Replace an existing file.")
@click.option("--no-parity", is_flag=True, help="Skip the parity gate (explicit opt-out).")
@click.option("--keep-failed", type=click.Path(dir_okay=False), help="Keep a model that fails the gate at this path.")
@click.option("--triton-repo", type=click.Path(file_okay=False),
              help="Also write a Triton Inference Server repository entry DIR/NAME/{config.pbtxt,1/model.onnx}.")
@click.option("--triton-name", help="Model name in the Triton repository (default: the output file's stem).")
@click.option("--max-batch-size", type=click.IntRange(min=1), default=64, show_default=True,
              help="Triton max_batch_size (with --triton-repo).")
@click.option("--json", "as_json", is_flag=True, help="Print the result and parity report as JSON.")
def export_command(preset_name, config_file, from_path, tokenizer, no_fused_ops, seed, output, opset,
                   dtype, quantize, force, no_parity, keep_failed, triton_repo, triton_name, max_batch_size,
                   as_json, **flags):
    """Export an encoder to ONNX with dynamic batch/sequence axes, checked and parity-gated.

    \b
    Examples:
      ortformer export --preset tiny -o tiny.onnx
      ortformer export --attention linear --layers 4 --hidden 256 --heads 4 -o lin.onnx
      ortformer export --config my_config.json --seed 3 -o m.onnx --force --json
      ortformer export --from ./all-MiniLM-L6-v2 -o minilm.onnx
      ortformer export --preset bert-base --quantize int8 -o bert-int8.onnx
      ortformer export --preset tiny -o tiny.onnx --triton-repo models --triton-name tiny
    """
    from ..errors import require_torch

    if triton_repo:  # refuse a bad repository name before spending time on the export
        from ..scale.triton import check_name

        check_name(triton_name or Path(output).stem)
    if from_path and (preset_name or config_file or any(v is not None for v in flags.values())):
        raise ConfigError("--from takes the architecture from the checkpoint; drop --preset/--config/architecture flags")
    cfg = None if from_path else config_from_options(preset_name, config_file, flags)
    require_torch("ortformer export")
    from ..exporter import DEFAULT_OPSET, export, summary_line

    source = text_max_length = None
    subject = cfg
    if from_path:
        from ..models import load_any

        loaded = load_any(from_path)
        subject, source, text_max_length = loaded.model, loaded.source, loaded.text_max_length
        tokenizer = tokenizer or loaded.tokenizer
        cfg = loaded.model.config

    steps = iter(range(1, 100))

    def progress(message: str) -> None:
        if not as_json and message != "done":
            click.echo(f"[{next(steps)}/{4 + bool(quantize)}] {message} ...", err=True)

    result = export(subject, output, opset=opset or DEFAULT_OPSET, dtype=dtype, quantize=quantize, seed=seed,
                    parity=not no_parity,
                    force=force, keep_failed=keep_failed, progress=progress, source=source,
                    tokenizer=tokenizer, text_max_length=text_max_length,
                    fused_ops=not no_fused_ops)
    triton_entry = None
    if triton_repo:
        from ..scale.triton import write_triton_repo

        triton_entry = write_triton_repo(result.path, triton_repo, name=triton_name, max_batch_size=max_batch_size,
                                         force=force)
    summary = {
        "triton": str(triton_entry) if triton_entry else None,
        "path": str(result.path), "files": [str(f) for f in result.files], "size_bytes": result.size_bytes,
        "parameters": result.parameters, "seconds": round(result.seconds, 2), "source": result.source,
        "inputs": contract.input_shapes(cfg), "outputs": contract.output_shapes(cfg),
        "config": cfg.to_dict(), "parity": result.report,
    }
    if as_json:
        echo_json(summary)
        return
    click.echo(f"wrote {result.path} ({human_size(result.size_bytes)}, {result.parameters:,} parameters, "
               f"{cfg.attention} attention, {cfg.num_layers} layers x {cfg.hidden_size}, {quantize or dtype})")
    click.echo(f"  inputs:  {_shape_text(summary['inputs'])}")
    click.echo(f"  outputs: {_shape_text(summary['outputs'])}")
    parity_text = "skipped (--no-parity)" if result.report.get("skipped") else summary_line(result.report)
    click.echo(f"  parity:  {parity_text}")
    click.echo(f"  time:    {result.seconds:.1f} s")
    if triton_entry:
        click.echo(f"  triton:  {triton_entry}")



@click.command("check")
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("--against", type=click.Path(exists=True),
              help="Config JSON, ortformer checkpoint or BERT folder to rerun the parity grid against.")
@click.option("--seed", type=int, default=None, help="Seed for a random-init config (default: the one recorded).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def check_command(model, against, seed, as_json):
    """Re-check a model file: onnx.checker, metadata and contract, and the parity grid again.

    \b
    Examples:
      ortformer check tiny.onnx
      ortformer check minilm.onnx --against ./all-MiniLM-L6-v2
    """
    from ..errors import require_torch

    require_torch("ortformer check")
    from ..exporter import summary_line
    from ..exporter.verify import verify

    result = verify(model, against=against, seed=seed)
    if as_json:
        echo_json(result)
        return
    click.echo(f"{result['path']}: checker ok, metadata ok ({result['source']})")
    if result["parity"] is None:
        click.echo(f"  parity:  not rerun: {result['reference']}")
    else:
        click.echo(f"  parity:  {summary_line(result['parity'])} against {result['reference']}")


COMMANDS = [export_command, check_command]
