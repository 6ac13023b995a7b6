"""Re-check a model file made earlier: `ortformer check`.

checker + metadata/contract validation always; the parity grid again when the
eager weights can be rebuilt: from ``--against`` (a config JSON or a checkpoint /
BERT folder) or, for random-init exports, from the seed recorded in the source.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import onnxruntime as ort

from .. import contract
from ..config import EncoderConfig
from ..core.errors import ConfigError, ModelFileError, ParityError, ProviderError
from ..modelfile.int8_kernels import open_session
from ..models import Encoder, Loaded, build_encoder, load_any
from ..modelfile import ModelFile, check_weights, read_model_file, tokenizer_path
from ..config.text import check_tokenizer
from .export import check_file, eager_runner
from .text_parity import compared_output, text_parity
from ..contract.parity import GATES, failed_cases, run_parity
from .right_aligned import RightAligned, right_aligned
from ..runtime.openvino_session import OpenVINOSession, int8_refused
from ..core.cpus import available_cpus
from ..runtime.providers import VERIFY_PROVIDERS

_RANDOM_INIT = re.compile(r"random-init:seed=(-?\d+)$")


def _reference(model_file: ModelFile, against, seed: int | None, **hub) -> tuple[Encoder | None, str, Loaded | None]:
    """The eager model to compare against, a sentence saying where it came from, and the
    loaded checkpoint or folder when ``against`` is one (its tokenizer, text length, prompts);
    ``hub``: the revision and cache_dir of a hub id (load_any)."""
    cfg = model_file.config
    recorded = _RANDOM_INIT.match(model_file.source)
    loaded = None
    if against is None:
        if recorded is None:
            return None, f"weights came from {model_file.source}; pass --against to rerun parity", None
        s = seed if seed is not None else int(recorded.group(1))
        return build_encoder(cfg, seed=s), f"random init, seed {s}", None
    against = Path(against)
    if against.suffix == ".json" and against.is_file() and "model_type" not in against.read_text(errors="replace"):
        if any(v is not None for v in hub.values()):
            raise ConfigError(f"{against} is a config JSON; a revision or cache folder applies to a hub id only")
        expected = EncoderConfig.from_json(against.read_text())
        s = seed if seed is not None else int(recorded.group(1)) if recorded else 0
        model, where = build_encoder(expected, seed=s), f"{against} with random init, seed {s}"
    else:
        loaded = load_any(against, **hub)
        model, where = loaded.model, f"{against} ({loaded.source})"
    # what defines the model, not what it is called: a copied folder names its model after itself, and
    # an export may cut the sentence embedding (--truncate-dim: a slice that holds no weights)
    theirs = model.config.to_dict()
    diff = {k: (v, theirs[k]) for k, v in cfg.to_dict().items()
            if k not in ("format", "name", "truncate_dim") and theirs[k] != v}
    if diff:
        raise ConfigError(f"{against} describes another model than the file; field: (file, against) = {diff}")
    if model.config != cfg:
        model.config = cfg  # the same architecture and weights: compare them under the file's name and cut
    return model, where, loaded


def _tokenizer_json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise ModelFileError(f"{path}: cannot read the tokenizer: {exc}") from None


def compare_text_setup(model_file: ModelFile, loaded: Loaded) -> list[str]:
    """What turns texts into ids differently in the file than in ``loaded`` (tokenizer,
    truncation length, lowercasing, prompts, late-interaction markers and skiplist), one sentence each; [] when they agree. Only a file that
    takes texts (it holds a tokenizer) and a source that has a tokenizer are compared; an
    ortformer checkpoint keeps a tokenizer but no text length, lowercasing or prompts, so
    against one only the tokenizer is."""
    tokenizer = tokenizer_path(model_file)
    if tokenizer is None or loaded.tokenizer is None:
        return []
    meta = model_file.metadata
    found = []
    if _tokenizer_json(tokenizer) != _tokenizer_json(Path(loaded.tokenizer)):
        found.append(f"its tokenizer {tokenizer.name} differs from {loaded.tokenizer}")
    if loaded.family == "ortformer":
        return found
    mine, theirs = model_file.text_max_length, loaded.text_max_length or model_file.config.max_sequence
    if mine != theirs:
        found.append(f"it truncates texts at {mine} tokens, the source at {theirs}")
    lowercase = model_file.text_lowercase
    if lowercase != loaded.text_lowercase:
        found.append(f"it {'lowercases' if lowercase else 'keeps'} texts before tokenizing, the source "
                     f"{'lowercases' if loaded.text_lowercase else 'keeps'} them (do_lower_case)")
    prompts = contract.parse_prompts(meta[contract.META_PROMPTS]) if contract.META_PROMPTS in meta else None
    theirs_prompts = (loaded.prompts, loaded.default_prompt) if loaded.prompts else None
    if prompts != theirs_prompts:
        found.append(f"its prompts {prompts} differ from the source's {theirs_prompts}")
    late, theirs_late = model_file.late, loaded.late()
    if late != theirs_late:
        found.append(f"its late-interaction settings {late} differ from the source's {theirs_late}")
    return found


def file_dtype(model_file: ModelFile) -> str:
    """The precision the file was exported in, as its parity report records it (float32 if absent)."""
    dtype = model_file.parity.get("dtype", "float32")
    if dtype not in GATES:
        raise ModelFileError(f"{model_file.path}: the parity report names dtype {dtype!r}; known: {', '.join(GATES)}")
    return dtype


def verify(path, against=None, seed: int | None = None, progress=None, revision: str | None = None,
           cache_dir=None, provider: str = "cpu") -> dict:
    """Return {"path", "config", "source", "checker": "ok", "weights": "ok" | "not recorded",
    "parity": report or None, "reference"}; the weights are hashed against the export's digest.
    ``against`` may be a hub id (org/name), fetched at ``revision`` into the hub cache (load_any).
    ``provider``: "cpu" (onnxruntime) or "openvino" (the OpenVINO runtime in float32, which
    meets the same gate: runtime/openvino_session.py).

    Raises ModelFileError / ExportError for an invalid file, ParityError when the
    rerun grid fails the gate.
    """
    if provider not in VERIFY_PROVIDERS:
        raise ProviderError(f"provider={provider!r} cannot rerun the parity grid; choose one of "
                            f"{', '.join(VERIFY_PROVIDERS)}")
    step = progress or (lambda message: None)
    step("reading the file and its metadata")
    model_file = read_model_file(path)
    tokenizer = tokenizer_path(model_file)
    if tokenizer is not None:  # a file that is not the model's tokenizer fails every text later
        check_tokenizer(tokenizer, model_file.config.vocab_size)
    step("onnx.checker (full)")
    check_file(model_file.path, model_file.config)
    weights = check_weights(model_file)
    if against is not None or _RANDOM_INIT.match(model_file.source):
        step("rebuilding the eager reference")
    reference, where, loaded = _reference(model_file, against, seed, revision=revision, cache_dir=cache_dir)
    if loaded is not None:
        found = compare_text_setup(model_file, loaded)
        if found:
            raise ConfigError(f"{path} reads texts otherwise than {against}: {'; '.join(found)}; "
                              f"re-export it from {against}")
    result = {"path": str(model_file.path), "config": model_file.config.to_dict(), "source": model_file.source,
              "checker": "ok", "weights": weights, "reference": where, "parity": None}
    if reference is None:
        return result
    step("parity grid against the reference")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    dtype = file_dtype(model_file)
    int8 = contract.META_INT8 in model_file.metadata
    if provider == "openvino":
        if int8:
            raise int8_refused(model_file.path)
        session = OpenVINOSession(model_file.path, available_cpus())
    else:
        session = open_session(model_file.path, options, ["CPUExecutionProvider"], int8=int8)
    eager = eager_runner(reference)
    if model_file.right_padding:  # as at export: rows right-aligned on both sides, as the Runtime feeds them
        session, eager = RightAligned(session, model_file.config), right_aligned(eager, model_file.config)
    report = run_parity(session, eager, model_file.config, dtype)
    if tokenizer is not None and compared_output(model_file.config) is not None:
        step("real sentences against the reference")  # recorded as at export, not gated
        report["text"] = text_parity(session, eager_runner(reference), model_file.config, tokenizer,
                                     model_file.text_max_length, lowercase=model_file.text_lowercase)
    result["parity"] = report
    if not report["passed"]:
        lines = failed_cases(report)
        raise ParityError(f"{path}: parity against {where} failed in {len(lines)} case(s); first: {lines[0]}", report)
    return result
