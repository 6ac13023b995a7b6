"""`ortformer infer` and `ortformer info`: thin wrappers over ortformer.runtime (no torch)."""
from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import click
import numpy as np

from .. import contract
from ..parity import text_summary
from ..cost import flops_per_sequence, parameter_breakdown, parameter_count
from ..errors import InputError
from ..runtime import PROVIDERS, ProviderFallbackWarning, Runtime
from ..runtime.providers import cuda_failure_reason
from ..runtime.validate import as_array
from .common import CliError, echo_json, human_size

OUTPUTS = (contract.LAST_HIDDEN_STATE, contract.SENTENCE_EMBEDDING)


def _quiet_onnxruntime(ctx: click.Context) -> None:
    """onnxruntime logs a failed CUDA load to stderr in red; our own errors name the cause,
    so the CLI keeps its stderr to one line unless --debug."""
    if not (ctx.find_root().obj or {}).get("debug"):
        import onnxruntime

        onnxruntime.set_default_logger_severity(4)


def _model_argument(func):
    return click.argument("model", type=click.Path(exists=True, dir_okay=False))(func)


def _parse_json(text: str, what: str):
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CliError(f"{what} is not valid JSON: {exc}") from None


def _read_input(ids: str | None, input_file: str | None):
    """The whole input as a nested list or array; None when it comes from stdin."""
    if ids is not None and input_file is not None:
        raise click.UsageError("give either --ids or --input, not both")
    if ids is not None:
        return _parse_json(ids, "--ids")
    if input_file is None:
        return None
    path = Path(input_file)
    if path.suffix == ".npy":
        try:
            return np.load(path, allow_pickle=False)  # pickles can run code: never
        except (ValueError, OSError) as exc:
            raise CliError(f"--input {path} is not a readable .npy array: {exc}") from None
    if path.suffix == ".json":
        return _parse_json(path.read_text(), f"--input {path}")
    raise click.BadParameter(f"{path.name!r} must end in .json or .npy", param_hint="--input")


def _read_texts(texts: tuple[str, ...], text_file: str | None) -> list[str] | None:
    if texts and text_file:
        raise click.UsageError("give either --text or --text-file, not both")
    if text_file:
        try:
            lines = Path(text_file).read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as exc:
            raise CliError(f"--text-file {text_file} is not UTF-8 text: {exc}") from None
        return [line for line in lines if line.strip()]
    return list(texts) if texts else None


def _as_batch(data, runtime: Runtime):
    """A single sequence (ids list, or (N, F) features) becomes a batch of one."""
    depth = 1 if runtime.config.takes_ids else 2
    given = data.ndim if isinstance(data, np.ndarray) else _list_depth(data)
    if given == 0:
        raise InputError(f"the input must be a JSON array of sequences (or one sequence), got {type(data).__name__}")
    return [data] if given == depth else data


def _list_depth(data) -> int:
    """Nesting depth along the first elements: [[1, 2]] -> 2, [[]] -> 2, [] -> 1, 5 -> 0."""
    depth = 0
    while isinstance(data, list):
        depth += 1
        if not data:
            break
        data = data[0]
    return depth


def _infer_batch(runtime: Runtime, data, mask, output: str, batch_size: int, max_tokens: int | None):
    """With --mask: rectangular runs of batch_size rows. Without: runtime.embed pads and buckets."""
    if mask is None:
        return runtime.embed(list(data), batch_size=batch_size, output=output, max_tokens=max_tokens)
    key = runtime.main_input
    data, mask = as_array(key, data), as_array(contract.ATTENTION_MASK, mask)
    if mask.shape != data.shape[:2]:
        raise InputError(f"--mask has shape {mask.shape}; valid: {data.shape[:2]}, the [batch, sequence] of {key}")
    parts = [runtime.run(**{key: data[i:i + batch_size]}, attention_mask=mask[i:i + batch_size])[output]
             for i in range(0, len(data), batch_size)]
    return np.concatenate(parts)


def _write(result, fmt: str, out: str | None) -> None:
    if fmt == "json":
        text = json.dumps(_jsonable(result))
        if out:
            Path(out).write_text(text + "\n")
        else:
            click.echo(text)
        return
    if isinstance(result, list):  # per-sequence arrays of different lengths
        if len({r.shape for r in result}) > 1:
            raise CliError("sequences have different lengths, so last_hidden_state is ragged: "
                           "use --format json, or pad the input and pass --mask")
        result = np.stack(result)
    if out:
        np.save(out, result)
    else:
        np.save(sys.stdout.buffer, result)


def _jsonable(result):
    return [r.tolist() for r in result] if isinstance(result, list) else result.tolist()


@click.command("infer")
@_model_argument
@click.option("--ids", help="Token ids as JSON: one list, or a list of lists (ragged is fine without --mask).")
@click.option("--input", "input_file", type=click.Path(exists=True, dir_okay=False),
              help="Input file: .json (like --ids) or .npy (int ids (B, N), or float features (B, N, F)).")
@click.option("--mask", help="attention_mask as JSON (B, N) of 0/1; needs a rectangular input.")
@click.option("--text", "texts", multiple=True, help="A text to embed with the model's tokenizer (repeatable).")
@click.option("--text-file", type=click.Path(exists=True, dir_okay=False), help="Texts to embed, one per line.")
@click.option("--provider", type=click.Choice(PROVIDERS), default="auto", show_default=True)
@click.option("--allow-fallback", is_flag=True, help="Run on CPU (with a warning) when --provider cuda cannot load.")
@click.option("--device-id", type=click.IntRange(min=0), default=0, show_default=True, help="CUDA device index.")
@click.option("--threads", type=click.IntRange(min=1), help="onnxruntime intra-op threads (default: one per core).")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--max-tokens", type=click.IntRange(min=1),
              help="Cap each batch at this many padded tokens (default on CPU: 256 per thread; CUDA: no cap). "
                   "Not with --mask; stdin lines run one by one.")
@click.option("--output", type=click.Choice(OUTPUTS), help="Which output (default: sentence_embedding when the model pools).")
@click.option("--format", "fmt", type=click.Choice(["json", "npy"]), help="Output format (default: npy for -o *.npy, else json).")
@click.option("-o", "--out", type=click.Path(dir_okay=False), help="Write the result to this file instead of stdout.")
@click.pass_context
def infer(ctx, model, ids, input_file, mask, texts, text_file, provider, allow_fallback, device_id, threads,
          batch_size, max_tokens, output, fmt, out):
    """Run MODEL on token ids; print the embeddings as JSON (or save .npy).

    Input comes from --ids, --input, or stdin: one JSON array of ids per line,
    each answered with one JSON line as it arrives (for streaming).

    \b
    Examples:
      ortformer infer tiny.onnx --ids '[[1, 2, 3], [4, 5]]'
      ortformer infer tiny.onnx --input batch.npy -o embeddings.npy
      ortformer infer tiny.onnx --ids '[[1, 2, 0]]' --mask '[[1, 1, 0]]' --output last_hidden_state
      printf '[1, 2, 3]\\n[4, 5]\\n' | ortformer infer tiny.onnx --provider cpu
      ortformer infer minilm.onnx --text "A first sentence." --text "Another one."
      ortformer infer minilm.onnx --text-file sentences.txt -o embeddings.npy
    """
    _quiet_onnxruntime(ctx)
    fmt = fmt or ("npy" if out and out.endswith(".npy") else "json")
    text_input = _read_texts(texts, text_file)
    if text_input is not None and (ids is not None or input_file is not None or mask is not None):
        raise click.UsageError("give text (--text/--text-file) or token ids (--ids/--input/--mask), not both")
    if max_tokens is not None and mask is not None:
        raise click.UsageError("--max-tokens regroups ragged input by length; with --mask the rows run as given, "
                               "in --batch-size chunks: drop one of the two")
    data = _read_input(ids, input_file)
    if data is None and (mask is not None or fmt == "npy"):
        raise click.UsageError("--mask and --format npy need --ids or --input (stdin is streamed line by line as JSON)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ProviderFallbackWarning)
        runtime = Runtime(model, provider, device_id=device_id, threads=threads, allow_fallback=allow_fallback)
    for warning in caught:  # one line, like errors, instead of Python's two-line warning format
        click.echo(f"warning: {warning.message}", err=True)
    output = runtime.select_output(output)
    if text_input is not None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = runtime.embed_texts(text_input, batch_size=batch_size, output=output, max_tokens=max_tokens)
        for warning in caught:
            click.echo(f"warning: {warning.message}", err=True)
        _write(result, fmt, out)
        return
    if data is not None:
        batch = _as_batch(data, runtime)
        if mask is not None:
            mask = _parse_json(mask, "--mask")
            mask = [mask] if batch is not data else mask  # a single sequence's mask, wrapped alike
        _write(_infer_batch(runtime, batch, mask, output, batch_size, max_tokens), fmt, out)
        return
    stream = open(out, "w") if out else None
    try:
        for number, line in enumerate(sys.stdin, 1):
            if not line.strip():
                continue
            sequence = _parse_json(line, f"stdin line {number}")
            try:
                (result,) = runtime.embed([sequence], output=output)
            except InputError as exc:
                raise InputError(f"stdin line {number}: {exc}") from None
            click.echo(json.dumps(result.tolist()), file=stream)  # click.echo flushes each line
    finally:
        if stream:
            stream.close()


@click.command("info")
@_model_argument
@click.option("--json", "as_json", is_flag=True, help="Print everything as one JSON object (full parity report).")
@click.option("--sequence-length", type=click.IntRange(min=1), help="Length N for the FLOP count (default min(128, max_positions)).")
@click.pass_context
def info(ctx, model, as_json, sequence_length):
    """Describe MODEL: config, inputs/outputs, parameters, FLOPs, parity, source, providers.

    \b
    Examples:
      ortformer info tiny.onnx
      ortformer info tiny.onnx --json --sequence-length 512
    """
    _quiet_onnxruntime(ctx)
    import onnxruntime

    runtime = Runtime(model, "auto")
    cfg, file = runtime.config, runtime.model_file
    n = sequence_length or min(128, cfg.max_positions)
    flops = flops_per_sequence(cfg, n)
    usable = ["cuda", "cpu"] if runtime.provider == "cuda" else ["cpu"]
    report = {
        "path": str(runtime.path),
        # every file the model consists of, as export counts them: weights side files and tokenizer
        "files": {str(p): p.stat().st_size for p in (runtime.path.resolve(), *file.external_files,
                                                      *filter(None, [runtime.tokenizer_path()]))},
        "format": runtime.metadata[contract.META_FORMAT],
        "version": file.version,
        "source": runtime.source,
        "config": cfg.to_dict(),
        "inputs": [s.to_dict() for s in file.inputs],
        "outputs": [s.to_dict() for s in file.outputs],
        "parameters": {"total": parameter_count(cfg), **parameter_breakdown(cfg)},
        "flops": {"sequence_length": n, "total": sum(flops.values()), **flops},
        "parity": runtime.parity,
        "int8": json.loads(runtime.metadata[contract.META_INT8]) if contract.META_INT8 in runtime.metadata else None,
        "providers": {
            "available": onnxruntime.get_available_providers(),
            "usable": usable,
            "cuda_unusable_reason": None if "cuda" in usable else cuda_failure_reason(0),
        },
    }
    if as_json:
        echo_json(report)
        return
    click.echo(f"model       {report['path']} ({human_size(sum(report['files'].values()))} in {len(report['files'])} file(s))")
    click.echo(f"name        {cfg.name}   ortformer {file.version}, format {report['format']}   source {runtime.source}")
    click.echo("config      " + " ".join(f"{k}={v}" for k, v in cfg.to_dict().items() if k not in ("format", "name")))
    for label, specs in (("inputs", file.inputs), ("outputs", file.outputs)):
        for i, s in enumerate(specs):
            click.echo(f"{label if i == 0 else '':<11} {s.name} {s.dtype} [{', '.join(map(str, s.shape))}]")
    click.echo(f"parameters  {report['parameters']['total']:,}")
    for part, count in parameter_breakdown(cfg).items():
        click.echo(f"  {part:<20} {count:>14,}")
    click.echo(f"flops       {report['flops']['total']:,} per sequence of {n} tokens "
               f"({', '.join(f'{k} {v:,}' for k, v in flops.items())})")
    click.echo(f"parity      {parity_summary(runtime.parity)}")
    if report["int8"] is not None:
        record = report["int8"]
        kept = record["float_matmuls"]
        click.echo(f"int8        {record['scheme']}; calibrated on {record.get('calibration', '?')}; "
                   f"{len(kept)} weight MatMul(s) kept float" + (":" if kept else ""))
        for k in kept:
            click.echo(f"              {k['node']}: {k['reason']}")
    reason = report["providers"]["cuda_unusable_reason"]
    click.echo(f"providers   usable here: {', '.join(usable)}" + (f" (cuda: {reason})" if reason else ""))
    click.echo(f"            onnxruntime {onnxruntime.__version__} offers {', '.join(report['providers']['available'])}")


@click.command("optimize")
@_model_argument
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Where to write the optimized model.")
@click.option("--force", is_flag=True, help="Replace an existing file.")
@click.pass_context
def optimize(ctx, model, output, force):
    """Apply onnxruntime's graph optimizations once, offline, for the CPU provider.

    The result is checked against MODEL on the parity grid (float32 gate); a Runtime
    opening it on CPU with the same onnxruntime skips re-optimizing at every start.

    \b
    Examples:
      ortformer optimize minilm.onnx -o minilm.opt.onnx
    """
    _quiet_onnxruntime(ctx)
    from ..runtime.optimize import optimize_offline

    check = optimize_offline(model, output, force=force)
    click.echo(f"wrote {output}: max_abs={check['max_abs']:.2e} min_cos={check['min_cosine']:.6f} "
               f"against {model} over {check['cases']} cases")


def parity_summary(report: dict) -> str:
    """One line from the exporter's parity report (keys per ortformer.exporter.parity)."""
    if report.get("skipped"):
        return f"skipped ({report.get('reason', 'no reason given')})"
    if "passed" not in report:
        return "no parity report in this file"
    verdict = "PASS" if report["passed"] else "FAIL"
    worst = "; ".join(
        f"{name} max_abs={m.get('max_abs', float('nan')):.2e} min_cos={m.get('min_cosine', float('nan')):.6f}"
        for name, m in report.get("worst", {}).items()
    )
    return (f"{verdict} over {len(report.get('cases', []))} cases ({report.get('dtype', '?')} gate on "
            f"{report.get('provider', '?')}): {worst}{text_summary(report)}")


COMMANDS = [infer, info, optimize]
