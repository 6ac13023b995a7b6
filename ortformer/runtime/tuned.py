"""The tuned choice: which engine and precision `ortformer tune --write` measured fastest for a
model on one CPU at one thread count, recorded beside the model, and how
`Runtime(path, provider="tuned")` reads it back.

The record is ``<stem>.tuned.json`` in the model's folder (minilm.onnx: minilm.tuned.json):

    {"format": 1, "model": "minilm.onnx", "model_bytes": 90947410,
     "choices": [{"cpu": "Intel(R) Xeon(R) ...", "flags": ["amx_bf16", "avx2", ...], "threads": 2,
                  "quality": "near-lossless", "engine": "openvino", "precision": "bfloat16",
                  "file": "minilm.onnx", "file_bytes": 90947410, "file_weights": "sha256:234f...",
                  "sentences_per_s": 310.2,
                  "vs_float32": 1.93, "min_cosine": 0.99991, "measured": "2026-12-05T13:40:00Z"}]}

A choice is keyed by the CPU's identity (model name, the flags of machine.RELEVANT_FLAGS, the
thread count): one file may carry choices for several machines. A model copied to a CPU whose
identity matches none of them is refused with the command that tunes it there, never run on a
choice measured elsewhere: the fastest engine on one CPU (bfloat16 needs AVX512_BF16 or AMX,
int8's speed depends on VNNI) is not the fastest, or not even runnable, on another. A model
rewritten since (its size differs), or a chosen file whose weights differ from those measured
(file_weights: the export's ortformer.weights digest, read when the Runtime opens it), is
refused too.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from .. import contract
from ..core.checks import is_int, json_object
from ..core.errors import ModelFileError, OutputError, ProviderError
from ..core.fsutil import write_atomic
from ..modelfile import ModelFile
from .machine import CPU, this_cpu

RECORD_FORMAT = 1
RECORD_SUFFIX = ".tuned.json"
# engine -> the Runtime provider that runs it
ENGINES = {"onnxruntime": "cpu", "openvino": "openvino"}
# precision tiers, strictest first; a --quality floor admits its own tier and the stricter ones
TIERS = {"float32": "float32", "near-lossless": "bfloat16", "int8": "int8"}
QUALITIES = tuple(TIERS)
PRECISIONS = tuple(TIERS.values())
_CHOICE_KEYS = {"cpu": str, "flags": list, "threads": int, "quality": str, "engine": str, "precision": str,
                "file": str, "file_bytes": int, "file_weights": str, "sentences_per_s": float, "vs_float32": float,
                "min_cosine": float, "measured": str}


def record_path(model: str | os.PathLike) -> Path:
    """Where the tuned choices of ``model`` live: <stem>.tuned.json beside it."""
    model = Path(model)
    return model.with_name(model.stem + RECORD_SUFFIX)


def tune_hint(model: Path, threads: int) -> str:
    return f"run `ortformer tune {model} --threads {threads} --write` on this machine"


@dataclass(frozen=True)
class Tuned:
    """What Runtime(path, "tuned") opens: ``path`` (the model, or its int8 sibling) on
    ``provider`` in ``precision`` with ``threads``; ``choice`` is the record's entry."""

    path: Path
    provider: str
    precision: str
    threads: int
    choice: dict


def read_record(model: Path) -> dict:
    """The record beside ``model``, checked; ModelFileError for a file that is not one."""
    path = record_path(model)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelFileError(f"{path}: cannot read the tuned record ({exc}); rewrite it with `ortformer tune --write --force`")
    record = json_object(text, str(path), ModelFileError)
    problem = _record_problem(record)
    if problem:
        raise ModelFileError(f"{path}: not a tuned record of format {RECORD_FORMAT}: {problem}; rewrite it with "
                             "`ortformer tune --write --force`")
    return record


def _record_problem(record: dict) -> str | None:
    if record.get("format") != RECORD_FORMAT or isinstance(record.get("format"), bool):
        return f"format is {record.get('format')!r}"
    if not isinstance(record.get("model"), str) or not is_int(record.get("model_bytes")):
        return "'model' (a file name) and 'model_bytes' (an int) are required"
    if not isinstance(record.get("choices"), list):
        return "'choices' must be a list"
    for i, choice in enumerate(record["choices"]):
        if not isinstance(choice, dict) or set(choice) != set(_CHOICE_KEYS):
            return f"choice {i} must hold exactly the keys {sorted(_CHOICE_KEYS)}"
        for key, kind in _CHOICE_KEYS.items():
            value = choice[key]
            ok = is_int(value) if kind is int else (isinstance(value, (int, float)) and not isinstance(value, bool)
                                                   if kind is float else isinstance(value, kind))
            if not ok:
                return f"choice {i}: {key} must be of type {kind.__name__}, got {value!r}"
        if choice["engine"] not in ENGINES or choice["precision"] not in PRECISIONS or choice["quality"] not in TIERS:
            return (f"choice {i}: engine {choice['engine']!r}, precision {choice['precision']!r} and quality "
                    f"{choice['quality']!r} must be among {sorted(ENGINES)}, {list(PRECISIONS)} and {list(QUALITIES)}")
        if not _plain_name(choice["file"]):
            return f"choice {i}: file {choice['file']!r} must be a file name in the model's folder"
    return None


def _plain_name(name: str) -> bool:
    """A bare file name: the record never points outside the model's folder."""
    return bool(name) and name not in (".", "..") and Path(name).name == name and "/" not in name and "\\" not in name


def resolve(model: str | os.PathLike, threads: int, cpu: CPU | None = None) -> Tuned:
    """The recorded choice for this CPU at ``threads``; ProviderError (naming `ortformer tune`)
    where there is none: no record, a record made for another file size, or only choices made on
    another CPU or thread count."""
    model = Path(model)
    if not model.is_file():
        raise ModelFileError(f"{model}: no such model file")
    cpu = cpu or this_cpu()
    path = record_path(model)
    if not path.is_file():
        raise ProviderError(f"provider='tuned': {model} has no tuned choice ({path.name} is not beside it); "
                            f"{tune_hint(model, threads)}, or choose a provider (cpu, openvino)")
    record = read_record(model)
    size = model.stat().st_size
    if record["model_bytes"] != size:
        raise ProviderError(f"provider='tuned': {path.name} was measured on a {record['model_bytes']}-byte "
                            f"{record['model']}, and {model} is {size} bytes now; {tune_hint(model, threads)}")
    mine = cpu.identity(threads)
    for choice in record["choices"]:
        if {key: choice[key] for key in mine} == mine:
            return _opened(model, choice, threads)
    raise ProviderError(f"provider='tuned': {path.name} holds no choice for this CPU ({_describe(mine)}); "
                        f"{_closest(record['choices'], mine)}{tune_hint(model, threads)}")


def _opened(model: Path, choice: dict, threads: int) -> Tuned:
    target = model.with_name(choice["file"])
    if not target.is_file() or target.stat().st_size != choice["file_bytes"]:
        raise ProviderError(f"provider='tuned': the tuned choice runs {choice['file']}, which is "
                            f"{'missing' if not target.is_file() else 'another file than the one measured'} "
                            f"beside {model}; {tune_hint(model, threads)}")
    return Tuned(target, ENGINES[choice["engine"]], choice["precision"], threads, choice)


def check_opened(model_file: ModelFile, choice: dict) -> None:
    """ProviderError when the file the Runtime opened for ``choice`` holds other weights than the
    one measured (a re-export of the same size); files that record no digest are not compared."""
    found = model_file.metadata.get(contract.META_WEIGHTS, "")
    if choice["file_weights"] and found != choice["file_weights"]:
        raise ProviderError(f"provider='tuned': {model_file.path} holds other weights than the file tuned "
                            f"({contract.META_WEIGHTS} {found[:19] or 'none'}..., measured "
                            f"{choice['file_weights'][:19]}...); run `ortformer tune` on it again with --write --force")


def _describe(identity: dict) -> str:
    return f"{identity['cpu'] or 'unnamed CPU'}, flags {' '.join(identity['flags']) or 'none'}, {identity['threads']} threads"


def _closest(choices: list[dict], mine: dict) -> str:
    """What differs from the recorded choices, so the user sees why none applies."""
    same_cpu = [c for c in choices if c["cpu"] == mine["cpu"] and c["flags"] == mine["flags"]]
    if same_cpu:
        return (f"it was tuned here for {', '.join(str(c['threads']) for c in same_cpu)} thread(s) only: pass "
                f"that thread count, or ")
    if choices:
        first = choices[0]
        extra, missing = sorted(set(first["flags"]) - set(mine["flags"])), sorted(set(mine["flags"]) - set(first["flags"]))
        differs = "; ".join(filter(None, [f"flags there only: {' '.join(extra)}" if extra else "",
                                          f"flags here only: {' '.join(missing)}" if missing else ""]))
        return f"it was measured on another CPU ({first['cpu'] or 'unnamed'}{'; ' + differs if differs else ''}): "
    return "it records no choice: "


def _merged(model: Path, identity: dict, force: bool) -> dict:
    """The record to write for a choice of CPU ``identity``: the existing one's other choices
    (of the same file size) kept. OutputError where it already holds this identity, or the
    file there is not a record, unless ``force``."""
    path = record_path(model)
    record = {"format": RECORD_FORMAT, "model": model.name, "model_bytes": model.stat().st_size, "choices": []}
    if not path.exists():
        return record
    try:
        old = read_record(model)
    except ModelFileError:
        if not force:
            raise OutputError(f"{path} exists and is not a tuned record; --force replaces it") from None
        return record
    if old["model_bytes"] == record["model_bytes"]:  # choices measured on an older file are stale
        record["choices"] = [c for c in old["choices"] if {k: c[k] for k in identity} != identity]
        same = [c for c in old["choices"] if c not in record["choices"]]
        if same and not force:
            raise OutputError(f"{path} already records a choice for this CPU at {identity['threads']} thread(s) "
                              f"({same[0]['engine']} {same[0]['precision']}, {same[0]['measured']}); --force "
                              "replaces it")
    return record


def check_writable(model: str | os.PathLike, identity: dict, force: bool = False) -> None:
    """Raise write_choice's OutputError now, before anything is measured."""
    _merged(Path(model), identity, force)


def write_choice(model: str | os.PathLike, choice: dict, force: bool = False) -> Path:
    """Record ``choice`` (an entry with every key of a record's choices) beside ``model``,
    atomically; choices for other CPUs or thread counts stay. OutputError when a choice for
    the same CPU identity exists and not ``force``, or the folder cannot be written."""
    model = Path(model)
    path = record_path(model)
    record = _merged(model, {key: choice[key] for key in ("cpu", "flags", "threads")}, force)
    record["choices"].append(choice)
    problem = _record_problem(record)
    if problem:  # a bug of the caller, never written
        raise ValueError(f"refusing to write an invalid tuned record: {problem}")
    try:
        write_atomic(path, json.dumps(record, indent=2) + "\n")
    except OSError as exc:
        raise OutputError(f"{path}: cannot write the tuned record: {exc.strerror or exc}") from None
    return path
