"""Export an encoder to a checked, self-describing ONNX file that passed the parity gate."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import onnxruntime as ort
import torch

from .. import contract
from ..core.checks import check_int
from .._version import __version__
from ..config import EncoderConfig
from ..contract import cost
from ..contract.cost import parameter_count
from ..core.errors import ExportError, ModelFileError, ParityError
from ..modelfile.int8_kernels import open_session
from ..modelfile import check_graph_io, file_weights_digest
from ..models import Encoder, MultiHeadAttention, build_encoder
from ..models.layers import LayerNorm32, RMSNorm
from ..contract import parity as parity_mod
from .dynamo import export_program
from .chunked import chunked_gate, chunked_payload
from .atomic import StagedModel, check_destination, set_metadata, stage_model
from .fused_ops import translations
from .int8 import ROW_QUANTIZE_OPSET
from .precision import DTYPES, QUANTIZATIONS, Float16Encoder, quantize_int8
from .text_parity import compared_output, text_parity
from .right_aligned import RightAligned, right_aligned
from ..config.text import TextEncoder, check_tokenizer
from .settings import DEFAULT_OPSET, GateOptions, GraphOptions, Provenance, TextSettings, grouped  # noqa: F401  (DEFAULT_OPSET: re-exported)

# Opset 18 is the lowest the dynamo exporter emits and what onnxruntime's graph
# optimizer and quantizer handle best: SDPA decomposes into MatMul/Softmax that ORT
# fuses, while opset 23 turns it into the `Attention` op whose CPU kernel rejects a
# (B, 1, 1, N) key mask and which the int8 quantizer rewrites into a broken node.
SUPPORTED_OPSETS = range(18, 23)


@dataclass
class ExportResult:
    path: Path
    config: EncoderConfig
    report: dict
    source: str
    parameters: int
    seconds: float
    files: list[Path] = field(default_factory=list)

    @property
    def size_bytes(self) -> int:
        return sum(f.stat().st_size for f in self.files)


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 over the state dict's names, dtypes, shapes and bytes, in name order."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def eager_runner(model: Encoder) -> Callable[[dict], dict]:
    """Named numpy inputs -> named numpy outputs through the eager model."""
    names = contract.input_names(model.config)

    def run(inputs: dict) -> dict:
        with torch.inference_mode():
            outputs = model(*(torch.from_numpy(inputs[n]) for n in names))
        return {k: v.float().numpy() for k, v in outputs.items()}

    return run


def _resolve(model_or_config, seed: int) -> tuple[Encoder, str]:
    if isinstance(model_or_config, EncoderConfig):
        return build_encoder(model_or_config, seed=seed), f"random-init:seed={seed}"
    if isinstance(model_or_config, Encoder):
        return model_or_config.eval(), f"weights-sha256:{weights_digest(model_or_config)}"
    raise ExportError(
        f"export() takes an EncoderConfig or an ortformer Encoder, got {type(model_or_config).__name__}"
    )


@contextlib.contextmanager
def _attention_fusion(model: Encoder, fused: bool, half_norms: bool = False):
    """Temporarily choose fused (contrib op) or standard-ONNX softmax attention, and with
    half_norms float16 LayerNormalization / SimplifiedLayerNormalization nodes for the LayerNorms
    and RMSNorms (models/layers.half_layer_norm, half_rms_norm)."""
    modules = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    norms = [m for m in model.modules() if isinstance(m, (LayerNorm32, RMSNorm))]
    before = [m.fused for m in modules]
    for m in modules:
        m.fused = fused and m.can_fuse  # bidirectional, uncapped softmax: the fused kernel's
    for m in norms:
        m.fused = fused and half_norms
    try:
        yield
    finally:
        for m, value in zip(modules, before):
            m.fused = value
        for m in norms:
            del m.fused  # back to the class's False


def _trace_to_onnx(model: Encoder, opset: int, fused_ops: bool = True, padding: str = "any") -> onnx.ModelProto:
    """torch.onnx.export (dynamo) with `batch` and `sequence` dynamic on every input; padding="right":
    the fused attention takes key lengths (fused_ops.translations)."""
    cfg = model.config
    b, n = parity_mod.example_shape(cfg)
    rng = np.random.default_rng(0)
    example = parity_mod.make_inputs(cfg, parity_mod.Case(b, n, "none"), rng)
    names = contract.input_names(cfg)
    args = tuple(torch.from_numpy(example[name]) for name in names)
    batch = torch.export.Dim(contract.BATCH_AXIS, min=1)
    sequence = torch.export.Dim(contract.SEQUENCE_AXIS, min=1, max=cfg.max_sequence)
    dynamic = tuple({0: batch} if name == contract.TASK_ID else {0: batch, 1: sequence} for name in names)
    return export_program(
        model, args, what="torch.onnx.export", input_names=names, output_names=contract.output_names(cfg),
        opset_version=opset, dynamic_shapes=dynamic, external_data=False,
        custom_translation_table=translations(padding) if fused_ops else None,
    )


def check_file(path: Path, cfg: EncoderConfig) -> None:
    """onnx.checker (full, by path: it runs shape inference too), then the graph's inputs and
    outputs against the contract with the model-file reader's own check."""
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as exc:
        raise ExportError(f"onnx.checker rejected the exported model: {exc}") from exc
    try:
        check_graph_io(path, onnx.load(str(path), load_external_data=False).graph, cfg, optional=False)
    except ModelFileError as exc:  # the exporter wrote it: its own failure, not the file's
        raise ExportError(f"the exported graph breaks the contract: {exc}") from None


def export_steps(*, quantize: str | None = None, parity: bool = True) -> list[str]:
    """The progress messages export() sends, in order, for these arguments (export() walks
    this list, so a caller counting steps, e.g. the CLI's [n/total], cannot drift from it)."""
    return ["tracing with torch.onnx.export (dynamo)", "writing",
            *(["int8 quantization (per-row scales, calibrated)"] if quantize == "int8" else []),
            "onnx.checker (full)", *(["parity gate against eager PyTorch"] if parity else [])]


def export(model_or_config, path, *, graph: GraphOptions | None = None, text: TextSettings | None = None,
           provenance: Provenance | None = None, gate: GateOptions | None = None, seed: int = 0,
           force: bool = False, progress: Callable[[str], None] | None = None, **flat) -> ExportResult:
    """Export to ``path`` atomically; raise ParityError (and leave nothing at path) on a failed gate.

    model_or_config: an ortformer Encoder (``load_any(...).model``), or an EncoderConfig built
    with random weights from ``seed``. graph: opset, dtype / quantize, fused ops, chunk stages
    (GraphOptions); text: tokenizer, truncation length, lowercasing, prompts, late-interaction
    settings, an LLM reranker's template (TextSettings; ``Loaded.export_options()`` gives an import's); provenance: source,
    family, labels (Provenance); gate: parity on or off, reference model, where to keep a failed
    file (GateOptions): exporter/settings.py documents each field. force: replace existing files.
    progress: called with each of ``export_steps(...)`` in turn, then "done".
    flat: the keywords of older calls (dtype=, tokenizer=, source=, parity=, ...; settings.FLAT_KEYWORDS),
    each set over its group.
    """
    groups = grouped({"graph": graph, "text": text, "provenance": provenance, "gate": gate}, flat)
    graph, text, provenance, gate = groups["graph"], groups["text"], groups["provenance"], groups["gate"]
    opset, dtype, quantize, fused_ops = graph.opset, graph.dtype, graph.quantize, graph.fused_ops
    tokenizer, text_max_length = text.tokenizer, text.max_length
    report_progress = progress or (lambda message: None)
    plan = iter(export_steps(quantize=quantize, parity=gate.parity))

    def step() -> None:
        report_progress(next(plan))
    start = time.perf_counter()
    if opset not in SUPPORTED_OPSETS:
        raise ExportError(f"opset {opset} is not supported; choose {SUPPORTED_OPSETS.start}..{SUPPORTED_OPSETS.stop - 1}")
    if dtype not in DTYPES:
        raise ExportError(f"dtype {dtype!r} is not supported; choose one of {', '.join(DTYPES)}")
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ExportError(f"quantize={quantize!r} is not supported; choose one of {', '.join(QUANTIZATIONS)}")
    if quantize is not None and dtype != "float32":
        raise ExportError(f"quantize={quantize!r} quantizes a float32 export; got dtype={dtype!r} "
                          f"(use dtype='float32' with quantize, or dtype={dtype!r} alone)")
    if quantize is not None and not fused_ops:
        raise ExportError(f"quantize={quantize!r} writes onnxruntime's MatMulIntegerToFloat (com.microsoft); "
                          "fused_ops=False promises standard ONNX ops only: drop one of the two")
    _check_padding(graph)
    precision = graph.precision
    if isinstance(model_or_config, EncoderConfig):  # before torch allocates the weights
        cfg = model_or_config
        cost.check_fits(cost.parameter_bytes(cfg), f"exporting a {cfg.num_layers}-layer encoder of width "
                        f"{cfg.hidden_size} ({parameter_count(cfg):,} parameters)",
                        "choose fewer layers or a smaller hidden size, ffn size, vocab_size or max_positions")
    model, default_source = _resolve(model_or_config, seed)
    cfg = model.config
    if graph.padding == "right" and not any(m.can_fuse for m in model.modules() if isinstance(m, MultiHeadAttention)):
        raise ExportError("padding='right' gives key lengths to the fused softmax attention, and this model has "
                          f"none (attention={cfg.attention!r}, causal={cfg.causal}); export it with padding='any'")
    if cfg.max_sequence < 2:
        raise ExportError("max_positions - position_offset must be >= 2 to export a dynamic sequence axis")
    dest = Path(path)
    if dest.suffix != ".onnx":
        raise ExportError(f"output path {dest} must end in .onnx")
    check_destination(dest.absolute(), force)  # refuse before spending a trace; checked again at commit

    source = provenance.source or default_source
    # optional keys first, required ones after: protobuf has no end marker, so a file cut
    # between two fields still parses; cut anywhere before the last required key, it is
    # refused as incomplete instead of loading without its optional metadata
    meta = {}
    tokenizer_name = f"{dest.stem}.tokenizer.json"
    encoder = None  # the one TextEncoder of this export: checked here, then calibration and text parity
    if tokenizer is not None:
        if not Path(tokenizer).is_file():
            raise ExportError(f"tokenizer {tokenizer} is not a file; give a tokenizer.json path")
        try:
            encoder = check_tokenizer(TextEncoder(tokenizer, text.lowercase), cfg.vocab_size)
        except ModelFileError as exc:
            raise ExportError(str(exc)) from None
        # the side file is part of the output: replaced only with force, like the model
        check_destination(dest.absolute().parent / tokenizer_name, force)
        meta[contract.META_TOKENIZER] = tokenizer_name
    if text_max_length is not None:
        check_int("text_max_length", text_max_length, high=cfg.max_sequence, error=ExportError)
        meta[contract.META_TEXT_MAX_LENGTH] = str(text_max_length)
    if text.lowercase and tokenizer is not None:  # without a tokenizer the file takes no texts
        meta[contract.META_TEXT_LOWERCASE] = "true"
    family, labels, late = provenance.family, provenance.labels, text.late
    if family is not None:
        meta[contract.META_FAMILY] = str(family)
    if labels:
        if len(labels) != cfg.num_labels:
            raise ExportError(f"labels names {len(labels)} label(s) but the model's classifier has "
                              f"classifier.labels={cfg.num_labels}")
        try:
            meta[contract.META_LABELS] = contract.labels_json(labels)
        except ValueError as exc:
            raise ExportError(f"labels: {exc}") from None
    if late is not None:
        if not (cfg.token_dense or cfg.token_weights):
            raise ExportError("late-interaction settings need a per-token head (token_dense or token_weights)")
        beyond = [i for i in late.ids() if not 0 <= i < cfg.vocab_size]
        if beyond:
            raise ExportError(f"late-interaction settings name token ids {beyond[:5]} outside the vocabulary "
                              f"(vocab_size={cfg.vocab_size})")
        meta[contract.META_LATE] = late.to_json()
    if text.rerank is not None:
        problem = contract.rerank_problem(cfg)
        if problem:
            raise ExportError(f"a reranker's template needs {problem}")
        meta[contract.META_RERANK] = text.rerank.to_json()
    if text.prompts or text.default_prompt is not None:
        try:
            meta[contract.META_PROMPTS] = contract.prompts_json(dict(text.prompts or {}), text.default_prompt)
        except ValueError as exc:
            raise ExportError(f"prompts: {exc}") from None

    step()  # tracing
    with _attention_fusion(model, fused_ops, half_norms=dtype == "float16"):
        # an int8 file needs opset 21 (blocked QuantizeLinear): traced there, not converted
        # afterwards (onnx's version converter holds several copies of the weights at once)
        traced_opset = max(opset, ROW_QUANTIZE_OPSET) if quantize == "int8" else opset
        traced = Float16Encoder(model) if dtype == "float16" else model
        proto = _trace_to_onnx(traced, traced_opset, fused_ops, padding=graph.padding)
    meta.update({
        contract.META_FORMAT: contract.FORMAT,
        contract.META_VERSION: __version__,
        contract.META_CONFIG: cfg.to_json(),
        contract.META_SOURCE: source,
        contract.META_PARITY: json.dumps({"skipped": True, "reason": "the export did not reach the gate",
                                          "dtype": precision}),
    })
    if graph.padding == "right":
        meta[contract.META_PADDING] = "right"
    if graph.chunked and precision == "float32":  # part of the tracing step: more graphs of the same model
        payload = chunked_payload(model, proto, opset)
        if payload is not None:
            meta[contract.META_CHUNKED] = payload
    set_metadata(proto, meta)
    step()  # writing
    staged = stage_model(proto, dest, force)
    del proto
    try:
        if tokenizer is not None:
            staged.add_side_file(Path(tokenizer), tokenizer_name)
        if quantize == "int8":
            step()  # int8 quantization
            quantized = staged.path.with_name("int8.onnx")
            record = quantize_int8(staged.path, quantized, cfg, encoder)
            os.replace(quantized, staged.path)
            staged.rewrite_metadata({contract.META_INT8: json.dumps(record)})
        # the weights as they will ship (after int8), for `ortformer check` to compare against later
        staged.rewrite_metadata({contract.META_WEIGHTS: file_weights_digest(staged.path)})
        step()  # onnx.checker
        check_file(staged.path, cfg)
        if gate.parity:
            step()  # the parity gate
            report = _gate(staged, gate.reference or model, cfg, precision, gate.keep_failed,
                           encoder=encoder, text_max_length=text_max_length, right_padding=graph.padding == "right")
        else:
            report = {"skipped": True, "reason": "parity disabled by the caller", "dtype": precision}
        staged.rewrite_metadata({contract.META_PARITY: json.dumps(report)})
        files = staged.commit(force)
    finally:
        staged.discard()
    report_progress("done")
    return ExportResult(dest, cfg, report, source, parameter_count(cfg), time.perf_counter() - start, files)


def _check_padding(graph: GraphOptions) -> None:
    if graph.padding not in contract.PADDINGS:
        raise ExportError(f"padding={graph.padding!r} is not supported; choose one of {', '.join(contract.PADDINGS)}")
    if graph.padding == "right" and not graph.fused_ops:
        raise ExportError("padding='right' changes what the fused attention (com.microsoft MultiHeadAttention) "
                          "is given; fused_ops=False has none: drop one of the two")
    if graph.padding == "right" and graph.quantize is not None:
        raise ExportError(f"padding='right' is for the CUDA kernels; quantize={graph.quantize!r} files run on the "
                          "CPU provider only: drop one of the two")


def _gate(staged: StagedModel, reference: Encoder, cfg: EncoderConfig, dtype: str, keep_failed,
          encoder=None, text_max_length: int | None = None, right_padding: bool = False) -> dict:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = open_session(staged.path, options, ["CPUExecutionProvider"], int8=dtype == "int8")
    except Exception as exc:
        raise ExportError(f"onnxruntime cannot load the exported model: {exc}") from exc
    eager = eager_runner(reference)
    if right_padding:  # both sides see each row right-aligned, as the Runtime feeds the file
        session, eager = RightAligned(session, cfg), right_aligned(eager, cfg)
    report = parity_mod.run_parity(session, eager, cfg, dtype)
    del session
    if contract.META_CHUNKED in {p.key for p in onnx.load(str(staged.path), load_external_data=False).metadata_props}:
        report["chunked"] = chunked_gate(staged.path, eager_runner(reference), cfg, dtype)
        report["passed"] = report["passed"] and report["chunked"]["passed"]
    if encoder is not None and compared_output(cfg) is not None:
        # recorded beside the gate, not gated: the grid is the gate every model shares
        session = open_session(staged.path, options, ["CPUExecutionProvider"], int8=dtype == "int8")
        report["text"] = text_parity(session, eager_runner(reference), cfg, encoder,  # texts are right-padded
                                     text_max_length or cfg.max_sequence)
        del session
    if not report["passed"]:
        if keep_failed:  # the kept file says it failed, and where
            staged.rewrite_metadata({contract.META_PARITY: json.dumps(report)})
        kept = f"; the failed model was kept at {staged.keep_as(Path(keep_failed))}" if keep_failed else ""
        lines = parity_mod.failed_cases(report)
        raise ParityError(
            f"parity gate failed in {len(lines)} case(s); first: {lines[0]}{kept}", report
        )
    return report
