"""`ortformer export` and `ortformer check`: thin wrappers over ortformer.exporter.

torch is imported inside the commands, so `ortformer infer` works without it.
"""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import click

from ..config import format1 as config_format1
from .. import contract
from ..config import (ACTIVATIONS, ATTENTION_KINDS, DEFAULT_PRESET, DENSE_ACTIVATIONS, NORM_POSITIONS, NORMS, POOLINGS,
                      POSITION_IDS, POSITIONS, PRESETS, EncoderConfig, preset)
from ..core.errors import ConfigError
from ..contract.parity import GATES, format_report
from ..runtime.providers import VERIFY_PROVIDERS
from .common import CliError, check_output, echo_json, given_options, human_size

# CLI flag -> EncoderConfig field, for the explicit-architecture flags; a group's fields by their flat
# (format 1) names, which EncoderConfig.with_fields folds into the group
FLAG_FIELDS = {
    "attention": "attention", "norm": "norm", "norm_position": "norm_position", "activation": "activation",
    "positions": "positions", "layers": "num_layers", "hidden": "hidden_size", "heads": "num_heads",
    "ffn": "ffn_size", "vocab": "vocab_size", "max_positions": "max_positions",
    "type_vocab": "type_vocab_size", "pooling": "pooling", "normalize": "normalize_embeddings",
    "position_offset": "position_offset", "position_ids": "position_ids", "embedding_size": "embedding_size",
    "embedding_norm": "embedding_norm",
    "ffn_gated": "ffn_gated", "bias": "bias", "relative_buckets": "relative_attention_buckets",
    "relative_max_distance": "relative_attention_max_distance", "rotary_theta": "rotary_theta",
    "rotary_theta_local": "rotary_theta_local", "local_window": "local_window", "global_every": "global_every",
    "causal": "causal", "sentence_dense": "sentence_dense_size",
    "sentence_dense_activation": "sentence_dense_activation", "disentangled_buckets": "disentangled_buckets",
    "disentangled_max_distance": "disentangled_max_distance", "attention_head_size": "attention_head_size",
}


# the flags --from takes: how a Hugging Face folder's hidden states are pooled (its sentence-transformers
# modules' choice otherwise; none without them)
FROM_FLAGS = ("pooling", "normalize")


def _strict_object(pairs: list) -> dict:
    keys = [k for k, _ in pairs]
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise ConfigError(f"duplicate key(s) {duplicates} in the config JSON; give each field once")
    return dict(pairs)


def read_config_fields(config_file: str) -> dict:
    """The fields of a config JSON file: strict JSON (duplicate keys refused), the fields of
    `ortformer export --print-config`, any subset of them (checked when applied)."""
    try:
        text = Path(config_file).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {config_file}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {config_file} is not UTF-8 JSON: {exc}") from None
    try:
        data = json.loads(text, object_pairs_hook=_strict_object)
    except (ValueError, RecursionError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"config file {config_file} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {config_file} must hold a JSON object, got {type(data).__name__}")
    return data


def config_from_options(preset_name: str | None, config_file: str | None, flags: dict) -> EncoderConfig:
    """A preset (default DEFAULT_PRESET), then the config JSON's fields, then every explicit flag."""
    cfg = preset(preset_name or DEFAULT_PRESET)
    fields = read_config_fields(config_file) if config_file else {}
    if fields:
        cfg = cfg.with_fields(fields)
        if fields.get("format", 1) == 1:  # read as a model file's metadata is; say what had no effect
            for name in config_format1.dropped_when_off(fields):
                group, switch = config_format1.FLAT[name][0], config_format1.SWITCHES[config_format1.FLAT[name][0]]
                click.echo(f"warning: {config_file}: {name} has no effect while {switch} is 0 ({group} off); "
                           "dropped", err=True)
    changes = {FLAG_FIELDS[k]: v for k, v in flags.items() if v is not None}
    if changes.get("vocab_size") == 0 and "type_vocab_size" not in {**fields, **changes}:
        changes["type_vocab_size"] = 0  # float features carry no token types: --vocab 0 alone means that
    # strict: a flag of a group left off (--global-every without --local-window) is a mistake worth naming
    return cfg.with_fields({"format": 1, **changes}, strict=True) if changes else cfg


# what --print-config would ignore: the options that shape or place a written model
PRINT_CONFIG_IGNORES = ("output", "force", "no_parity", "keep_failed", "opset", "dtype", "quantize", "no_fused_ops", "padding",
                        "tokenizer", "lowercase_texts", "seed", "triton_repo", "triton_name", "max_batch_size",
                        "as_json")


def checked_config(preset_name: str | None, config_file: str | None, flags: dict) -> EncoderConfig:
    """config_from_options, with a value or combination the flags got wrong as a usage error
    (exit 2) in the flags' own words: "--hidden 100 is not divisible by --heads 3"."""
    try:
        return config_from_options(preset_name, config_file, flags)
    except ConfigError as exc:
        if config_file is not None:
            raise  # the fields may come from the file: its own words, an error (exit 1)
        message = str(exc)
        for flag, field in sorted(FLAG_FIELDS.items(), key=lambda item: -len(item[1])):
            option = "--" + flag.replace("_", "-")
            message = re.sub(rf"\b{field}=", f"{option} ", message)
            if "_" in field:  # an identifier, never an English word ("attention")
                message = re.sub(rf"(?<![-\w]){field}\b", option, message)
        raise click.UsageError(message) from exc


def _check_opset(value: int | None) -> int | None:
    """--opset must be one the exporter traces at (checked before any output is named)."""
    if value is not None:
        from ..core.errors import require_torch

        require_torch("ortformer export")
        from ..exporter.export import SUPPORTED_OPSETS

        if value not in SUPPORTED_OPSETS:
            raise click.BadParameter(f"opset {value} is not supported; choose "
                                     f"{SUPPORTED_OPSETS.start}..{SUPPORTED_OPSETS.stop - 1}", param_hint="'--opset'")
    return value


def model_files(path) -> dict:
    """files {path: bytes} (model, weights side files, tokenizer) and inputs/outputs as
    [{name, dtype, shape}]: the shape `ortformer info --json` describes them in."""
    from ..modelfile import read_model_file, tokenizer_path

    model = read_model_file(path)
    files = (model.path.resolve(), *model.external_files, *filter(None, [tokenizer_path(model)]))
    return {"files": {str(p): p.stat().st_size for p in files},
            "inputs": [s.to_dict() for s in model.inputs], "outputs": [s.to_dict() for s in model.outputs]}


def _shape_text(shapes: dict) -> str:
    return ", ".join(f"{name} [{', '.join(map(str, dims))}]" for name, dims in shapes.items())



def _name_groups(names) -> str:
    """'decoder.* (30), lm_head.weight': names grouped by their first part."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(name.split(".", 1)[0], []).append(name)
    return ", ".join(f"{head}.* ({len(members)})" if len(members) > 1 else members[0]
                     for head, members in groups.items())


def architecture_options(func):
    """The explicit-architecture flags shared by commands that build a model."""
    options = [
        click.option("--preset", "preset_name", type=click.Choice(sorted(PRESETS)), help=f"Start from a preset (default {DEFAULT_PRESET})."),
        click.option("--config", "config_file", type=click.Path(dir_okay=False),
                     help="A config JSON file: any fields of --print-config, applied over the preset "
                          "(strict JSON: duplicate keys are refused)."),
        click.option("--attention", type=click.Choice(ATTENTION_KINDS)),
        click.option("--norm", type=click.Choice(NORMS)),
        click.option("--norm-position", type=click.Choice(NORM_POSITIONS)),
        click.option("--activation", type=click.Choice(ACTIVATIONS)),
        click.option("--positions", type=click.Choice(POSITIONS)),
        click.option("--layers", type=click.IntRange(min=1)),
        click.option("--hidden", type=click.IntRange(min=1), help="Hidden size F."),
        click.option("--heads", type=click.IntRange(min=1)),
        click.option("--ffn", type=click.IntRange(min=1), help="Feed-forward inner size."),
        click.option("--vocab", type=click.IntRange(min=0),
                     help="Vocabulary size; 0 = float-feature input (and no token types, unless --type-vocab says)."),
        click.option("--max-positions", type=click.IntRange(min=1)),
        click.option("--type-vocab", type=click.IntRange(min=0), help="Segment (token type) vocabulary; 0 = none."),
        click.option("--pooling", type=click.Choice(POOLINGS)),
        click.option("--normalize/--no-normalize", default=None, help="l2-normalise the sentence embedding."),
        click.option("--position-offset", type=click.IntRange(min=0),
                     help="Position table row of the first token (RoBERTa: padding_idx + 1)."),
        click.option("--position-ids", type=click.Choice(POSITION_IDS),
                     help="index: the token's index; kept: kept tokens before it (padding skipped, RoBERTa)."),
        click.option("--embedding-size", type=click.IntRange(min=0),
                     help="Embedding width, projected to --hidden by a Linear (ELECTRA); 0 = hidden."),
        click.option("--embedding-norm/--no-embedding-norm", default=None,
                     help="Pre-norm: normalise the embeddings, no norm before block 0's attention (ModernBERT)."),
        click.option("--ffn-gated/--no-ffn-gated", default=None,
                     help="Gated feed-forward W2(act(a) * g): GeGLU with --activation gelu, SwiGLU with silu."),
        click.option("--bias/--no-bias", default=None, help="Biases in every Linear and LayerNorm (ModernBERT has none)."),
        click.option("--rotary-theta", type=float,
                     help="Rotary base theta with --positions rotary (default 10000)."),
        click.option("--rotary-theta-local", type=float,
                     help="Rotary theta of the local layers (ModernBERT: 10000 against 160000 global); 0 = --rotary-theta."),
        click.option("--local-window", type=click.IntRange(min=0),
                     help="Sliding-window attention: local layers see keys with |i - j| <= W // 2 (causal: i - W // 2 <= j <= i); "
                          "0 = off. Softmax only."),
        click.option("--global-every", type=click.IntRange(min=1),
                     help="With --local-window: layer l is global when l mod K == 0 (ModernBERT: 3)."),
        click.option("--relative-buckets", type=click.IntRange(min=0),
                     help="MPNet/T5 relative position bias with this many buckets (e.g. 32); 0 = off. Softmax only."),
        click.option("--relative-max-distance", type=click.IntRange(min=1),
                     help="Distance where relative buckets stop growing (default 128)."),
        click.option("--attention-head-size", type=click.IntRange(min=0),
                     help="Head size D when heads need not split --hidden (attention works in heads x D); 0 = hidden / heads."),
        click.option("--disentangled-buckets", type=click.IntRange(min=0),
                     help="DeBERTa's disentangled relative attention with this many log buckets (e.g. 256); 0 = off. "
                          "Softmax only."),
        click.option("--disentangled-max-distance", type=click.IntRange(min=0),
                     help="Distance where the disentangled buckets stop growing (default 512); 0 = plain "
                          "distances clamped at the bucket count (DeBERTa v1)."),
        click.option("--sentence-dense", type=click.IntRange(min=0),
                     help="A Dense head of this width on the pooled vector, act(W p + b) (LaBSE, distiluse); 0 = none."),
        click.option("--sentence-dense-activation", type=click.Choice(DENSE_ACTIVATIONS),
                     help="Activation of the --sentence-dense head (default identity)."),
        click.option("--causal/--no-causal", default=None,
                     help="Token i attends to j <= i; linear/cosine models can then stream (Runtime.stream)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


FROM_HELP = ("Export trained weights: an ortformer checkpoint, a local Hugging Face folder, or a Hugging Face hub id "
             "(org/name, fetched into the hub cache: --revision, --cache-dir, HF_HUB_OFFLINE)")


def hub_options(target: str):
    """--revision and --cache-dir, for a hub id given to ``target`` (--from, --against)."""
    def apply(func):
        func = click.option("--cache-dir", type=click.Path(file_okay=False),
                            help=f"Hub cache folder for a hub id given to {target} (default: HF_HUB_CACHE, "
                                 "else HF_HOME/hub, else ~/.cache/huggingface/hub).")(func)
        return click.option("--revision", help=f"Branch, tag or commit of a hub id given to {target} "
                                               "(default: main).")(func)
    return apply


def check_hub_options(value, revision, cache_dir, target: str) -> None:
    given = [name for name, v in (("--revision", revision), ("--cache-dir", cache_dir)) if v is not None]
    if given and not value:
        raise click.UsageError(f"{' and '.join(given)} apply to a hub id given to {target}; give {target} org/name")


class FromOption(click.Option):
    """--from, whose help lists the model_types ortformer imports (models/hf/family.py's torch-free
    MAIN_MODEL_TYPES), read when the help is shown."""

    def get_help_record(self, ctx):
        from ..models.hf.family import model_types

        self.help = f"{FROM_HELP} (config.json model_type: {', '.join(model_types())})."
        return super().get_help_record(ctx)


@click.command("export")
@architecture_options
@click.option("--from", "from_path", cls=FromOption, type=click.Path(), help=FROM_HELP + ".")
@hub_options("--from")
@click.option("--tokenizer", type=click.Path(exists=True, dir_okay=False),
              help="tokenizer.json to ship beside the model (default: the one found with --from).")
@click.option("--truncate-dim", type=click.IntRange(min=1),
              help="Keep the first K features of sentence_embedding (Matryoshka models), after normalisation, "
                   "as sentence-transformers' truncate_dim.")
@click.option("--lowercase-texts/--no-lowercase-texts", default=None,
              help="Lowercase texts before tokenizing, or not (default: the --from folder's do_lower_case, else off).")
@click.option("--no-fused-ops", is_flag=True,
              help="Standard ONNX ops only (no com.microsoft MultiHeadAttention/Gelu), for runtimes other than onnxruntime.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for random initialisation.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Destination .onnx file (required to export).")
@click.option("--print-config", is_flag=True,
              help="Print the config JSON the flags describe (every field, the --config format) and exit.")
@click.option("--opset", type=int, default=None, callback=lambda ctx, param, value: _check_opset(value),
              help="ONNX opset of the trace (default 18); --quantize int8 traces at 21 or higher (per-row QuantizeLinear).")
@click.option("--dtype", type=click.Choice(["float32", "float16"]), default="float32", show_default=True,
              help=f"float16 weights and activations (for CUDA), gated on cosine >= {GATES['float16']['min_cosine']}.")
@click.option("--quantize", type=click.Choice(["int8"]), help=f"int8 weight MatMuls with per-row (per-token) dynamic scales, so a row never depends on its batch; "
                   f"gated on cosine >= {GATES['int8']['min_cosine']}.")
@click.option("--padding", type=click.Choice(["any", "right"]), default="any", show_default=True,
              help="right: the fused attention takes one key length per row, the mask form onnxruntime's fused "
                   "CUDA kernels accept (docs/gpu.md); the Runtime right-aligns left-padded rows itself.")
@click.option("--force", is_flag=True, help="Replace an existing file.")
@click.option("--no-parity", is_flag=True, help="Skip the parity gate (explicit opt-out).")
@click.option("--keep-failed", type=click.Path(dir_okay=False), help="Keep a model that fails the gate at this path.")
@click.option("--triton-repo", type=click.Path(file_okay=False),
              help="Deprecated: run `ortformer triton-repo MODEL --repo DIR` after the export. Also write a Triton "
                   "Inference Server repository entry DIR/NAME/{config.pbtxt,1/model.onnx}.")
@click.option("--triton-name", help="Deprecated (triton-repo's --name): model name in the Triton repository "
                                    "(default: the output file's stem).")
@click.option("--max-batch-size", type=click.IntRange(min=1),
              help="Deprecated (triton-repo's --max-batch-size): Triton max_batch_size (with --triton-repo; default 64).")
@click.option("--json", "as_json", is_flag=True, help="Print the result and parity report as JSON.")
@click.pass_context
def export_command(ctx, preset_name, config_file, from_path, revision, cache_dir, tokenizer, truncate_dim, lowercase_texts,
                   no_fused_ops, seed, output, print_config,
                   opset, dtype, quantize, padding, force, no_parity, keep_failed, triton_repo, triton_name, max_batch_size,
                   as_json, **flags):
    """Export an encoder to ONNX with dynamic batch/sequence axes, checked and parity-gated.

    \b
    Examples:
      ortformer export --preset tiny -o tiny.onnx
      ortformer export --attention linear --layers 2 --hidden 128 --heads 4 -o lin.onnx
      ortformer export --preset tiny --print-config > my_config.json
      ortformer export --preset tiny --ffn-gated --activation silu --no-bias -o swiglu.onnx
      ortformer export --config my_config.json --seed 3 -o m.onnx --force --json
      ortformer export --from ./all-MiniLM-L6-v2 -o minilm.onnx
      ortformer export --from sentence-transformers/all-MiniLM-L6-v2 -o minilm.onnx
      ortformer export --preset bert-base --quantize int8 -o bert-int8.onnx
    """
    from ..core.errors import require_torch

    check_hub_options(from_path, revision, cache_dir, "--from")
    if from_path:
        given = [f"--{'no-' if value is False else ''}{flag.replace('_', '-')}" for flag, value in flags.items()
                 if value is not None and flag not in FROM_FLAGS]
        given += [name for name, value in (("--preset", preset_name), ("--config", config_file)) if value]
        if given:
            raise click.UsageError(f"--from takes the architecture from the checkpoint; drop {', '.join(given)} "
                                   "(--pooling and --normalize apply to a Hugging Face folder)")
    if print_config:
        if from_path:
            raise click.UsageError("--print-config describes the flags' config; --from takes it from the checkpoint")
        ignored = given_options(ctx, PRINT_CONFIG_IGNORES)
        if ignored:
            raise click.UsageError(f"--print-config prints the config and writes no model; drop {', '.join(ignored)}")
        printed = checked_config(preset_name, config_file, flags)
        echo_json((printed.replace(truncate_dim=truncate_dim) if truncate_dim is not None else printed).to_dict())
        return
    if not output:
        raise click.UsageError("Missing option '-o' / '--output'.")
    if Path(output).suffix != ".onnx":
        raise click.BadParameter(f"{output} must end in .onnx (e.g. model.onnx)", param_hint="'-o' / '--output'")
    for flag, value in (("--triton-name", triton_name), ("--max-batch-size", max_batch_size)):
        if value is not None and not triton_repo:
            raise click.UsageError(f"{flag} only applies with --triton-repo")
    if quantize and no_fused_ops:
        raise click.UsageError(f"--quantize {quantize} writes onnxruntime's MatMulIntegerToFloat (com.microsoft); "
                               "--no-fused-ops promises standard ONNX ops only: drop one of the two")
    if padding == "right" and (no_fused_ops or quantize):
        raise click.UsageError(f"--padding right gives key lengths to onnxruntime's fused CUDA attention; "
                               f"{'--no-fused-ops has none' if no_fused_ops else '--quantize files run on the CPU only'}: "
                               "drop one of the two")
    if quantize and dtype != "float32":
        raise click.UsageError(f"--quantize {quantize} quantizes a float32 export; drop --dtype {dtype} "
                               f"(or --quantize for a {dtype} model)")
    if no_parity and keep_failed:
        raise click.UsageError("--keep-failed keeps a model that fails the parity gate, and --no-parity skips the "
                               "gate: drop one of the two")
    if triton_repo:
        click.echo(f"warning: export --triton-repo is deprecated and will be removed: run `ortformer triton-repo "
                   f"{output} --repo {triton_repo}` (--name, --max-batch-size) after the export", err=True)
    # every option is checked before an existing output is named: a mistake is reported first
    cfg = None if from_path else checked_config(preset_name, config_file, flags)
    max_batch_size = 64 if max_batch_size is None else max_batch_size
    inputs = [config_file, tokenizer, from_path]
    check_output(output, force=force, option="-o/--output", inputs=inputs)
    if keep_failed:
        check_output(keep_failed, force=force, option="--keep-failed", inputs=[*inputs, output])
    if triton_repo:  # refuse a bad repository name or an existing entry before spending time on the export
        from ..scale.triton import check_name

        check_output(triton_repo, force=force, option="--triton-repo", folder=True)
        entry = Path(triton_repo) / check_name(triton_name or Path(output).stem)
        if (entry.exists() or entry.is_symlink()) and not force:
            raise CliError(f"{entry} already exists; pass --force to replace it")
    require_torch("ortformer export")
    from ..exporter import DEFAULT_OPSET, GateOptions, GraphOptions, TextSettings, export, export_steps

    dropped, text_note, provenance = (), None, None
    if not from_path and truncate_dim is not None:
        cfg = cfg.replace(truncate_dim=truncate_dim)
    subject, text = cfg, TextSettings(tokenizer)
    if from_path:
        from ..models import load_any
        from ..models.hf.folder_layout import missing_tokenizer_note

        loaded = load_any(from_path, pooling=flags.get("pooling"), normalize=flags.get("normalize"),
                          revision=revision, cache_dir=cache_dir, truncate_dim=truncate_dim)
        subject, cfg, dropped = loaded.model, loaded.config, loaded.dropped
        provenance = loaded.export_options(text=False)["provenance"]
        text = loaded.text_settings(tokenizer=tokenizer or loaded.tokenizer)
        text_note = None if text.tokenizer else missing_tokenizer_note(loaded.folder or loaded.fetched or from_path)
    if lowercase_texts is not None:
        if lowercase_texts and text.tokenizer is None:
            raise click.UsageError("--lowercase-texts applies to texts; give --tokenizer (or --from a folder with one)")
        text = dataclasses.replace(text, lowercase=lowercase_texts)

    steps = iter(range(1, 100))
    total = len(export_steps(quantize=quantize, parity=not no_parity))

    def progress(message: str) -> None:
        if not as_json and message != "done":
            click.echo(f"[{next(steps)}/{total}] {message} ...", err=True)

    result = export(subject, output, seed=seed, force=force, progress=progress, text=text, provenance=provenance,
                    graph=GraphOptions(opset or DEFAULT_OPSET, dtype, quantize, fused_ops=not no_fused_ops,
                                       padding=padding),
                    gate=GateOptions(parity=not no_parity, keep_failed=keep_failed))
    triton_entry = None
    if triton_repo:
        from ..scale.triton import write_triton_repo

        triton_entry = write_triton_repo(result.path, triton_repo, name=triton_name, max_batch_size=max_batch_size,
                                         force=force)
    written = model_files(result.path)
    summary = {
        "triton": str(triton_entry) if triton_entry else None,
        "path": str(result.path), "files": written["files"], "size_bytes": result.size_bytes,
        "parameters": result.parameters, "seconds": round(result.seconds, 2), "source": result.source,
        "inputs": written["inputs"], "outputs": written["outputs"],
        "config": cfg.to_dict(), "parity": result.report,
        "dropped": list(dropped),  # imported tensors an encoder does not use (task heads, decoders)
        "text_note": text_note,  # why a folder with an older-format tokenizer exports for token ids only
    }
    if as_json:
        echo_json(summary)
        return
    click.echo(f"wrote {result.path} ({human_size(result.size_bytes)}, {result.parameters:,} parameters, "
               f"{cfg.attention} attention, {cfg.num_layers} layer{'s' if cfg.num_layers != 1 else ''} x {cfg.hidden_size}, {quantize or dtype})")
    click.echo(f"  inputs:  {_shape_text(contract.input_shapes(cfg))}")
    click.echo(f"  outputs: {_shape_text(contract.output_shapes(cfg))}")
    click.echo(f"  files:   {', '.join(Path(f).name for f in summary['files'])}")
    if dropped:
        click.echo(f"  dropped: {len(dropped)} tensor(s) an encoder does not use: {_name_groups(dropped)}")
    if text_note:
        click.echo(f"  text:    none: {text_note}")
    parity_text = "skipped (--no-parity)" if result.report.get("skipped") else format_report(result.report)
    click.echo(f"  parity:  {parity_text}")
    click.echo(f"  time:    {result.seconds:.1f} s")
    if triton_entry:
        click.echo(f"  triton:  {triton_entry}")



@click.command("check")
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("--against", type=click.Path(),
              help="Config JSON, ortformer checkpoint, Hugging Face folder or hub id (org/name) to rerun the "
                   "parity grid against.")
@hub_options("--against")
@click.option("--seed", type=int, default=None, help="Seed for a random-init config (default: the one recorded).")
@click.option("--provider", type=click.Choice(VERIFY_PROVIDERS), default="cpu", show_default=True,
              help="Run the grid on onnxruntime's CPU provider or on the OpenVINO runtime (float32).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def check_command(model, against, revision, cache_dir, seed, provider, as_json):
    """Re-check a model file: onnx.checker, metadata and contract, and the parity grid again.

    With --against a folder or checkpoint that has a tokenizer, the file must also read texts
    as it does (same tokenizer, truncation length, lowercasing and prompts), and a file that takes texts
    reruns the real-sentence check.

    \b
    Examples:
      ortformer check tiny.onnx
      ortformer check minilm.onnx --against ./all-MiniLM-L6-v2
      ortformer check tiny.onnx --provider openvino
    """
    from ..core.errors import require_torch

    check_hub_options(against, revision, cache_dir, "--against")
    require_torch("ortformer check")
    from ..exporter.verify import verify

    steps = iter(range(1, 100))

    def progress(message: str) -> None:
        if not as_json:
            click.echo(f"[{next(steps)}] {message} ...", err=True)

    result = verify(model, against=against, seed=seed, progress=progress, revision=revision, cache_dir=cache_dir,
                    provider=provider)
    if as_json:
        echo_json(result)
        return
    click.echo(f"{result['path']}: checker ok, metadata ok ({result['source']})")
    click.echo(f"  weights: {'match the recorded digest' if result['weights'] == 'ok' else 'no digest recorded'}")
    if result["parity"] is None:
        click.echo(f"  parity:  not rerun: {result['reference']}")
    else:
        click.echo(f"  parity:  {format_report(result['parity'])} against {result['reference']}")


COMMANDS = [export_command, check_command]
