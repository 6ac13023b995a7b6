"""`ortformer infer` and `ortformer info`: thin wrappers over ortformer.runtime (no torch)."""
from __future__ import annotations

import io
import json
import re
import sys
import warnings
from pathlib import Path

import click
import numpy as np

from .. import contract
from ..config import SPLADE_POOLINGS
from ..core.checks import json_value
from ..contract.parity import GATES, format_report
from ..core.errors import InputError
from ..runtime import ProviderFallbackWarning, Runtime
from ..runtime.providers import RUNTIME_PROVIDERS
from ..core.fsutil import reserve
from ..runtime.validate import as_array
from .common import (CliError, check_output, echo_json, human_size, model_argument, quiet_onnxruntime,
                     threads_option, usage_errors, written)

OUTPUTS = (contract.LAST_HIDDEN_STATE, contract.SENTENCE_EMBEDDING, contract.LOGITS, contract.TOKEN_EMBEDDINGS,
           contract.SPARSE, contract.SENTENCE_EMBEDDING_UNNORMALIZED)


def _parse_json(text: str, what: str):
    """Ids, masks or features as JSON: numbers only (true/false would pass as 1 and 0)."""
    if re.search(r"\b(true|false)\b", text):
        raise CliError(f"{what} holds true/false; token ids, masks and features are numbers")
    return json_value(text, what, CliError)


def _read_input(ids: str | None, input_file: str | None):
    """The whole input as a nested list or array; None when it comes from stdin."""
    if ids is not None and input_file is not None:
        raise click.UsageError("give either --ids or --input, not both")
    if ids is not None:
        data = _parse_json(ids, "--ids")
        if not isinstance(data, list):
            raise CliError(f"--ids must be a JSON array of token ids or of sequences, got {type(data).__name__}")
        return data
    if input_file is None:
        return None
    return _read_array_file(Path(input_file), "--input")


def _read_array_file(path: Path, option: str):
    """A .npy array (never a pickle) or a .json nested list from ``path``."""
    if path.suffix == ".npy":
        try:
            return np.load(path, allow_pickle=False)  # pickles can run code: never
        except (ValueError, OSError) as exc:
            raise CliError(f"{option} {path} is not a readable .npy array: {exc}") from None
    if path.suffix == ".json":
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise CliError(f"{option} {path} is not UTF-8 JSON: {exc}") from None
        except OSError as exc:
            raise CliError(f"{option} {path} cannot be read: {exc.strerror or exc}") from None
        return _parse_json(text, f"{option} {path}")
    raise click.BadParameter(f"{path.name!r} must end in .json or .npy", param_hint=option)


def _read_mask(mask: str):
    """--mask: JSON text, or a .npy / .json file (as --input takes) when it names one."""
    if mask.endswith((".npy", ".json")):  # JSON text never ends so
        if not Path(mask).is_file():
            raise CliError(f"--mask {mask} is not a file; give the mask as JSON text or an existing .npy / .json file")
        return _read_array_file(Path(mask), "--mask")
    return _parse_json(mask, "--mask")


def _read_texts(texts: tuple[str, ...], text_file: str | None, what: str = "text") -> list[str] | None:
    if texts and text_file:
        raise click.UsageError(f"give either --{what} or --{what}-file, not both")
    if text_file:
        raw = sys.stdin.buffer.read() if text_file == "-" else Path(text_file).read_bytes()
        try:
            text = raw.decode("utf-8-sig")  # a byte-order mark is not part of the first text
        except UnicodeDecodeError as exc:
            raise CliError(f"--{what}-file {text_file} is not UTF-8 text: {exc}") from None
        # one row per line, blank lines included, so output rows line up with input lines;
        # only "\n" ends a line (a lone "\r", U+2028 and friends stay inside their line)
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        return [line.removesuffix("\r") for line in lines]
    return list(texts) if texts else None


def _as_batch(data, runtime: Runtime):
    """A single sequence (ids list, or (N, F) features) becomes a batch of one."""
    if isinstance(data, list) and not data:  # [] is an empty batch, as a 0-row .npy and empty stdin
        return []
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
    parts = [_run_rows(runtime, i, {key: data[i:i + batch_size], contract.ATTENTION_MASK: mask[i:i + batch_size]})[output]
             for i in range(0, len(data), batch_size)]
    return np.concatenate(parts)


def _run_rows(runtime: Runtime, start: int, feeds: dict, out=None) -> dict:
    """runtime.run on the rows from ``start`` of a larger input, its errors naming rows of that input."""
    try:
        return runtime.run(**feeds, out=out)
    except InputError as exc:
        rows = len(next(iter(feeds.values())))
        shifted = re.sub(r"\b(input_ids|inputs_embeds|attention_mask|token_type_ids)\[(\d+)",
                         lambda m: f"{m[1]}[{int(m[2]) + start}", str(exc))
        raise InputError(f"{shifted} (checked in rows {start}..{start + rows - 1} of the input)") from None


def _rectangular(batch, runtime: Runtime) -> bool:
    rank = 2 if runtime.config.takes_ids else 3
    return isinstance(batch, np.ndarray) and batch.ndim == rank


def _infer_to_memmap(runtime: Runtime, data: np.ndarray, mask, batch_size: int, dest: Path) -> None:
    """last_hidden_state written through a memmap of the .npy file, batch by batch: a long
    sequence's output (1 GiB at 1M x 256) never sits in memory twice. Atomic: a temporary
    file beside dest, renamed over it when complete."""
    mask = None if mask is None else as_array(contract.ATTENTION_MASK, mask)
    if mask is not None and mask.shape != data.shape[:2]:
        raise InputError(f"--mask has shape {mask.shape}; valid: {data.shape[:2]}, the [batch, sequence] of {runtime.main_input}")
    with written(dest, "-o/--output") as tmp:
        result = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32,
                                           shape=(*data.shape[:2], runtime.config.hidden_size))
        reserve(tmp)  # a full disk is an error line now, not a SIGBUS mid-run
        for i in range(0, len(data), batch_size):
            rows = slice(i, i + batch_size)
            feeds = {runtime.main_input: data[rows], **({} if mask is None else {contract.ATTENTION_MASK: mask[rows]})}
            _run_rows(runtime, i, feeds, out=result[rows])
        result.flush()
        del result


def _sparse_row(row) -> dict:
    """A vector's non-zero entries, or a text's {token id: weight}: {"indices": [i, ...], "values": [v_i, ...]}."""
    if isinstance(row, dict):  # a late-interaction model's lexical weights, by token id
        indices = sorted(row)
        return {"indices": indices, "values": [row[i] for i in indices]}
    indices = np.flatnonzero(row)
    return {"indices": indices.tolist(), "values": row[indices].tolist()}


def _write(result, fmt: str, out: Path | None, width: int, sparse: bool = False) -> None:
    if fmt == "json":
        text = json.dumps([_sparse_row(row) for row in result] if sparse else _jsonable(result))
        if out:
            with written(out, "-o/--output") as tmp:
                tmp.write_text(text + "\n")
        else:
            click.echo(text)
        return
    if isinstance(result, list) and not result:  # no sequences: (0, 0, F) token states
        result = np.empty((0, 0, width), np.float32)
    if isinstance(result, list):  # per-sequence arrays of different lengths
        if len({r.shape for r in result}) > 1:
            raise CliError("sequences have different lengths, so a per-token output is ragged: "
                           "use --format json (one list per sequence); with --ids or --input, "
                           "padding the ids and passing --mask also works")
        result = np.stack(result)
    if out:
        with written(out, "-o/--output") as tmp, open(tmp, "wb") as handle:
            np.save(handle, result)  # to a handle: np.save(path) would append ".npy" to the name
    else:  # through bytes: np.save to a real file calls tofile, whose failure on a closed pipe
        buffer = io.BytesIO()  # is a bare OSError, not the BrokenPipeError the CLI leaves quietly on
        np.save(buffer, result)
        sys.stdout.buffer.write(buffer.getbuffer())


def _width(runtime: Runtime, output: str) -> int:
    """The last axis of ``output``: hidden_size, sentence_size, the number of labels or token_dense.size
    (sparse: one weight per token, 1)."""
    width = contract.output_shapes(runtime.config)[output][-1]
    return 1 if width == contract.SEQUENCE_AXIS else width


def _jsonable(result):
    return [r.tolist() for r in result] if isinstance(result, list) else result.tolist()


@click.command("infer")
@model_argument
@click.option("--ids", help="Token ids as JSON: one list, or a list of lists (ragged is fine without --mask).")
@click.option("--input", "input_file", type=click.Path(exists=True, dir_okay=False),
              help="Input file: .json (like --ids) or .npy (int ids (B, N), or float features (B, N, F)).")
@click.option("--mask", help="attention_mask (B, N) of 0/1, as JSON text or a .npy / .json file; "
                              "needs a rectangular input.")
@click.option("--text", "texts", multiple=True, help="A text to embed with the model's tokenizer (repeatable).")
@click.option("--text-file", type=click.Path(exists=True, dir_okay=False, allow_dash=True),
              help="Texts to embed, one per line (- reads them from stdin).")
@click.option("--pair", "pairs", multiple=True,
              help="A second text for each --text, joined by the tokenizer's pair template (a cross-encoder's "
                   "passage for its query); repeatable, one per --text.")
@click.option("--pair-file", type=click.Path(exists=True, dir_okay=False, allow_dash=True),
              help="Second texts, one per line, paired with --text-file's lines.")
@click.option("--kind", type=click.Choice(["query", "document"]),
              help="Texts as late-interaction queries or documents (ColBERT's markers, query expansion, skiplist); "
                   "for --tensor token_embeddings and sparse, default document.")
@click.option("--prompt-name", help="A prompt recorded in the model (see `ortformer info`) to prepend to each text; "
                                    "default: the model's default prompt; '' for none.")
@click.option("--provider", type=click.Choice(RUNTIME_PROVIDERS), default="auto", show_default=True,
              help="openvino: the OpenVINO runtime in float32 (the openvino extra); tuned: what "
                   "`ortformer tune --write` recorded for this CPU.")
@click.option("--allow-fallback", is_flag=True, help="Run on CPU (with a warning) when --provider cuda cannot load.")
@click.option("--device-id", type=click.IntRange(min=0), default=0, show_default=True, help="CUDA device index.")
@threads_option("onnxruntime intra-op threads (default: one per core).")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--max-tokens", type=click.IntRange(min=1),
              help="Cap each batch at this many padded tokens (default on CPU: 256 per thread; CUDA: no cap). "
                   "Not with --mask; stdin lines run one by one.")
@click.option("--tensor", type=click.Choice(OUTPUTS),
              help="Which output tensor (default: logits for a classifier, else sentence_embedding when "
                   "the model pools, else last_hidden_state; token_embeddings: a late-interaction model's "
                   "vectors per kept token; sparse: its weights, per text {token id: weight} as with --sparse; "
                   "sentence_embedding_unnormalized: a normalizing model's vector before the normalization).")
@click.option("--format", "fmt", type=click.Choice(["json", "npy"]), help="Output format (default: npy for -o *.npy, else json).")
@click.option("--sparse", is_flag=True, help='JSON rows as {"indices": [...], "values": [...]}, the non-zero entries '
              "of each vector: a SPLADE model's term weights (token id -> weight) without its zeros.")
@click.option("-o", "--output", "out", type=click.Path(dir_okay=False),
              help="Write the result to this file instead of stdout (atomically, once the run succeeded).")
@click.option("--force", is_flag=True, help="Replace an existing output file.")
@click.pass_context
@usage_errors(prompt_name="--prompt-name")
def infer(ctx, model, ids, input_file, mask, texts, text_file, pairs, pair_file, kind, prompt_name, provider,
          allow_fallback, device_id, threads, batch_size, max_tokens, tensor, fmt, sparse, out, force):
    """Run MODEL on token ids; print the embeddings as JSON (or save .npy).

    Input comes from --ids, --input, or stdin: one JSON array of ids per line,
    each answered with one JSON line as it arrives (for streaming).

    \b
    Examples:
      ortformer infer tiny.onnx --ids '[[1, 2, 3], [4, 5]]'
      ortformer infer tiny.onnx --input batch.npy -o embeddings.npy
      ortformer infer tiny.onnx --ids '[[1, 2, 0]]' --mask '[[1, 1, 0]]' --tensor last_hidden_state
      printf '[1, 2, 3]\\n[4, 5]\\n' | ortformer infer tiny.onnx --provider cpu
      ortformer infer minilm.onnx --text "A first sentence." --text "Another one."
      ortformer infer minilm.onnx --text-file sentences.txt -o embeddings.npy
      ortformer infer reranker.onnx --text "a query" --pair "a passage" --pair "another passage" --text "a query"
      ortformer infer colbert.onnx --text "a query" --kind query --tensor token_embeddings
    """
    quiet_onnxruntime(ctx)
    if out in OUTPUTS:
        raise click.UsageError(f"-o/--output names the output file; pick the output tensor with --tensor {out}")
    if out is not None:
        out = check_output(out, force=force, option="-o/--output", inputs=[model, input_file, text_file, pair_file])
    if out is not None and (fmt, out.suffix) in (("json", ".npy"), ("npy", ".json")):
        raise click.UsageError(f"--format {fmt} does not fit -o {out}: name the file .{fmt}, or drop --format "
                               f"(the suffix picks it)")
    fmt_from_suffix = fmt is None and out is not None and out.suffix == ".npy"
    fmt = fmt or ("npy" if fmt_from_suffix else "json")
    if fmt == "npy" and out is None and sys.stdout.isatty():
        raise click.UsageError("--format npy writes binary: give -o FILE.npy, or redirect stdout to a file or pipe")
    if text_file == "-" and pair_file == "-":
        raise click.UsageError("--text-file and --pair-file cannot both read stdin (-)")
    text_input = _read_texts(texts, text_file)
    pair_input = _read_texts(pairs, pair_file, "pair")
    if pair_input is not None and (text_input is None or len(pair_input) != len(text_input)):
        raise click.UsageError(f"--pair / --pair-file give a second text for each text: got "
                               f"{len(pair_input)} pair(s) for {len(text_input or [])} text(s)")
    if text_input is not None and (ids is not None or input_file is not None or mask is not None):
        raise click.UsageError("give text (--text/--text-file) or token ids (--ids/--input/--mask), not both")
    if kind is not None and text_input is None:
        raise click.UsageError("--kind says how texts are read; give --text or --text-file too")
    if prompt_name is not None and text_input is None:
        raise click.UsageError("--prompt-name prepends a prompt to text; give --text or --text-file too")
    if max_tokens is not None and mask is not None:
        raise click.UsageError("--max-tokens regroups ragged input by length; with --mask the rows run as given, "
                               "in --batch-size chunks: drop one of the two")
    data = _read_input(ids, input_file)
    if ids is None and input_file is None and text_input is None and (mask is not None or fmt == "npy"):
        npy = f"-o {out} (NumPy)" if fmt_from_suffix else "--format npy"
        raise click.UsageError(f"--mask and {npy} need --ids or --input (stdin is streamed line by line as JSON)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ProviderFallbackWarning)
        runtime = Runtime(model, provider, device_id=device_id, threads=threads, allow_fallback=allow_fallback)
    for warning in caught:  # one line, like errors, instead of Python's two-line warning format
        click.echo(f"warning: {warning.message}", err=True)
    if out is not None:  # the model's side files are inputs too
        check_output(out, force=force, option="-o/--output",
                     inputs=[*runtime.model_file.external_files, runtime.tokenizer_path()])
    output = runtime.select_output(tensor)
    per_sequence = contract.output_shapes(runtime.config)[output][1] != contract.SEQUENCE_AXIS
    lexical = text_input is not None and output == contract.SPARSE  # {token id: weight} per text
    if sparse and (fmt != "json" or not (per_sequence or lexical)):
        raise click.UsageError(f"--sparse writes JSON rows of one vector each (sentence_embedding, a per-sequence "
                               f"logits, or a text's sparse weights), not --format {fmt} of {output}")
    if lexical and fmt != "json":
        raise click.UsageError("--tensor sparse of texts gives {token id: weight} per text: use --format json")
    if kind is not None and output not in (contract.TOKEN_EMBEDDINGS, contract.SPARSE):
        raise click.UsageError(f"--kind reads texts for late interaction: use it with --tensor token_embeddings "
                               f"or sparse, not {output}")
    if text_input is not None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = runtime.embed_texts(text_input, batch_size=batch_size, output=output, max_tokens=max_tokens,
                                         prompt_name=prompt_name, pairs=pair_input, kind=kind)
        for warning in caught:
            click.echo(f"warning: {warning.message}", err=True)
        _write(result, fmt, out, _width(runtime, output), sparse or lexical)
        return
    if ids is not None or input_file is not None:
        batch = _as_batch(data, runtime)
        if mask is not None:
            mask = _read_mask(mask)
            mask = [mask] if batch is not data else mask  # a single sequence's mask, wrapped alike
        if out and fmt == "npy" and output == contract.LAST_HIDDEN_STATE and _rectangular(batch, runtime):
            _infer_to_memmap(runtime, batch, mask, batch_size, out)
        else:
            _write(_infer_batch(runtime, batch, mask, output, batch_size, max_tokens), fmt, out,
                   _width(runtime, output), sparse)
        return
    if out is None:
        _stream(runtime, output, None, sparse)
        return
    # the file appears (or is replaced) only when every line succeeded
    with written(out, "-o/--output") as tmp, open(tmp, "w") as stream:
        _stream(runtime, output, stream, sparse)


def _stream(runtime: Runtime, output: str, stream, sparse: bool = False) -> None:
    """One JSON line out per JSON line in from stdin; blank lines are skipped."""
    for number, line in enumerate(sys.stdin, 1):
        if not line.strip():
            continue
        sequence = _parse_json(line, f"stdin line {number}")
        try:
            (result,) = runtime.embed([sequence], output=output)
        except InputError as exc:
            raise InputError(f"stdin line {number}: {exc}") from None
        click.echo(json.dumps(_sparse_row(result) if sparse else result.tolist()), file=stream)  # flushed each line


def config_line(config: dict) -> str:
    """A format-2 config dict on one line: fields as k=v, a group that is on as group(k=v, ...),
    the groups that are off left out."""
    parts = []
    for key, value in config.items():
        if key in ("format", "name") or value is None:
            continue
        if isinstance(value, dict):
            parts.append(f"{key}(" + ", ".join(f"{k}={v}" for k, v in value.items()) + ")")
        else:
            parts.append(f"{key}={value}")
    return " ".join(parts)


@click.command("info")
@model_argument
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
    quiet_onnxruntime(ctx)
    import onnxruntime

    from ..runtime.describe import describe

    report = describe(model, sequence_length)
    if as_json:
        echo_json(report)
        return
    config = report["config"]
    click.echo(f"model       {report['path']} ({human_size(sum(report['files'].values()))} in {len(report['files'])} file(s))")
    click.echo(f"name        {config['name']}   ortformer {report['version']}, file format {report['format']}   source {report['source']}")
    click.echo("config      " + config_line(config))
    for label in ("inputs", "outputs"):
        for i, s in enumerate(report[label]):
            click.echo(f"{label if i == 0 else '':<11} {s['name']} {s['dtype']} [{', '.join(map(str, s['shape']))}]")
    if report.get("family"):
        click.echo(f"family      {report['family']} (imported from Hugging Face)")
    optimized = report.get("optimized")
    if optimized:
        current = "" if optimized.get("onnxruntime") == onnxruntime.__version__ else \
            f"; this is onnxruntime {onnxruntime.__version__}, so sessions rewrite it again"
        click.echo(f"optimized   offline for {optimized.get('provider')} with onnxruntime "
                   f"{optimized.get('onnxruntime')}{current}")
    text = report.get("text")
    if text and text.get("unavailable"):
        click.echo(f"text        unavailable (token ids still work): {text['unavailable']}")
    elif text:
        lowered = ", lowercased first" if text["lowercase"] else ""
        kept = ", keeping the end" if text.get("truncation_side") == "left" else ""
        click.echo(f"text        {text['tokenizer']}, truncated at {text['max_length']} tokens{kept}{lowered}")
    if report.get("labels"):
        head = config.get("classifier") or {}
        cfg_labels = head.get("labels", 0)
        per = "per token" if head.get("per_token") else "per sequence"
        click.echo(f"labels      {cfg_labels} ({per}, the logits output): " + ", ".join(
            f"{i}={name}" for i, name in enumerate(report["labels"][:20])) + (" ..." if cfg_labels > 20 else ""))
    elif config.get("pooling") in SPLADE_POOLINGS:  # a masked-LM head: its logits are the vocabulary, not labels
        click.echo(f"logits      per token over the {config['vocab_size']:,}-entry vocabulary (the masked-LM head "
                   "SPLADE pools)")
    prompts = report.get("prompts") or {}
    named = sorted((prompts.get("prompts") or {}).items())
    if named:  # every prompt on its own line, under a count, so a second one is not read as the first's text
        click.echo(f"prompts     {len(named)} (prompt_name=, --prompt-name)")
    for prompt, text in named:
        default = " (default)" if prompt == prompts.get("default") else ""
        click.echo(f"{'':<11}   {prompt}{default}: {text!r}")
    rerank = report.get("rerank_template")
    if rerank:  # an LLM reranker: what Runtime.rerank and /rerank build around each pair
        score = "sigmoid(d) = P(yes)" if rerank["score"] == "sigmoid" else "d"
        click.echo(f"rerank      logits d = z[{rerank['yes']!r}] - z[{rerank['no']!r}] at the last token; score {score}; "
                   f"default instruction {rerank['instruction']!r}; template {''.join(rerank['segments'])!r}")
    late = report.get("late_interaction")
    if late:  # lists (skiplist, special ids) by count: punctuation runs to 32 ids
        click.echo("late        " + " ".join(f"{k}=[{len(v)} ids]" if isinstance(v, list) else f"{k}={v}"
                                          for k, v in late.items()))
    parts = {k: v for k, v in report["parameters"].items() if k != "total"}
    width = max(map(len, parts), default=0)
    click.echo(f"parameters  {report['parameters']['total']:,}")
    for part, count in parts.items():
        click.echo(f"  {part:<{width}} {count:>14,}")
    flops = {k: v for k, v in report["flops"].items() if k not in ("sequence_length", "total")}
    n = report["flops"]["sequence_length"]
    beyond = (f"; the model takes at most {report['max_sequence']}"
              if config["positions"] == "learned" and n > report["max_sequence"] else "")
    click.echo(f"flops       {report['flops']['total']:,} per sequence of {n} tokens{beyond} "
               f"({', '.join(f'{k} {v:,}' for k, v in flops.items())})")
    click.echo(f"parity      {format_report(report['parity'])}")
    if report.get("int8") is not None:
        record = report["int8"]
        kept = record["float_matmuls"]
        click.echo(f"int8        {record['scheme']}; calibrated on {record.get('calibration', '?')}; "
                   f"{len(kept)} weight MatMul(s) kept float" + (":" if kept else ""))
        for k in kept:
            where = f"{k['module']} ({k['node']})" if k.get("module") else k["node"]
            click.echo(f"              {where}: {k['reason']}")
        if record.get("kernel"):
            click.echo(f"            kernel on this CPU: {record['kernel']}")
    usable, reason = report["providers"]["usable"], report["providers"]["cuda_unusable_reason"]
    click.echo(f"providers   usable here: {', '.join(usable)}" + (f" (cuda: {reason})" if reason else ""))
    click.echo(f"            onnxruntime {onnxruntime.__version__} offers {', '.join(report['providers']['available'])}")


_OPTIMIZE_HELP = """Apply onnxruntime's graph optimizations once, offline, for the CPU provider.

    The result is checked against MODEL on the parity grid (max_abs <= {max_abs}, or every
    vector within {max_rel} of its scale; cosine >= {min_cosine}); a Runtime opening it on CPU with the same onnxruntime
    skips re-optimizing at every start.

    \b
    Examples:
      ortformer optimize minilm.onnx -o minilm.opt.onnx
    """


@click.command("optimize", help=_OPTIMIZE_HELP.format(**GATES["optimized"]))  # the gate read from its table
@model_argument
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Where to write the optimized model.")
@click.option("--force", is_flag=True, help="Replace an existing file.")
@click.pass_context
def optimize(ctx, model, output, force):
    quiet_onnxruntime(ctx)
    from ..runtime.optimize import optimize_offline

    check_output(output, force=force, option="-o/--output", inputs=[model])
    click.echo("optimizing and checking on the parity grid ...", err=True)
    try:
        check = optimize_offline(model, output, force=force)
    except OSError as exc:
        raise CliError(f"-o/--output {output}: cannot write: {exc.strerror or exc}") from None
    click.echo(f"wrote {output}: max_abs={check['max_abs']:.2e} min_cos={check['min_cosine']:.6f} "
               f"against {model} over {check['cases']} cases")


COMMANDS = [infer, info, optimize]
