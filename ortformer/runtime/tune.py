"""`ortformer tune`: time every engine and precision this machine can run a model in, on real
text, check each against onnxruntime float32 at its tier's gate, and pick the fastest that
meets a quality floor (written beside the model by tuned.write_choice).

Candidates (those that cannot run here are listed with the reason):

    onnxruntime float32   the file itself, provider "cpu": the reference every other is compared to
    onnxruntime int8      the file's int8 sibling (<stem>.int8.onnx, or one given), provider "cpu"
    openvino float32      the file on the OpenVINO runtime (the `openvino` extra)
    openvino bfloat16     the same in bfloat16, where the CPU has AVX512_BF16 or AMX

Timing: one warm-up pass per candidate (its outputs are the ones compared), then ``rounds``
rounds in which every candidate embeds all the texts once, in an order rotated each round so
no candidate always follows the same one; sentences/s = texts / the median of its rounds.
Quality: per text, the cosine of the candidate's output to onnxruntime float32's (min and median)
and the largest absolute difference, judged by parity.GATES[precision] as the export gate
judges a file against eager PyTorch.
"""
from __future__ import annotations

import os
import statistics
import time
import warnings
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .. import contract
from ..core.checks import check_int
from ..core.errors import InputError, ModelFileError, OrtformerError, OutputError
from ..modelfile import read_model_file
from ..contract.parity import GATES, compare, passes, row_cosines
from ..core.cpus import available_cpus
from .machine import CPU, this_cpu
from .session import Runtime
from .tuned import QUALITIES, TIERS

INT8_SIBLINGS = ("{stem}.int8.onnx", "{stem}-int8.onnx", "{stem}_int8.onnx")
SAMPLE_SENTENCES = 256  # the built-in sample (corpus.py): a few seconds a pass for MiniLM on 2 cores
# (engine, precision), in the order the table lists them
CANDIDATES = (("onnxruntime", "float32"), ("onnxruntime", "int8"), ("openvino", "float32"), ("openvino", "bfloat16"))


@dataclass
class Candidate:
    """One engine and precision; ``unavailable`` says why it cannot run here (None: it can)."""

    engine: str
    precision: str
    file: Path | None
    unavailable: str | None = None
    runtime: Runtime | None = field(default=None, repr=False)
    seconds: list[float] = field(default_factory=list)
    output: object = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return f"{self.engine} {self.precision}"


def int8_sibling(model: Path) -> Path | None:
    """The first of INT8_SIBLINGS that exists beside ``model``, or None."""
    for pattern in INT8_SIBLINGS:
        path = model.with_name(pattern.format(stem=model.stem))
        if path.is_file():
            return path
    return None


def _open(candidate: Candidate, threads: int) -> None:
    provider = "cpu" if candidate.engine == "onnxruntime" else "openvino"
    precision = "bfloat16" if candidate.precision == "bfloat16" else None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a missing tokenizer is reported by the reference, once
            candidate.runtime = Runtime(candidate.file, provider, threads=threads, precision=precision)
    except OrtformerError as exc:  # a missing extra, a CPU without the flag, a file OpenVINO cannot read
        candidate.unavailable = str(exc)


def candidates(model: Path, threads: int, int8: Path | None = None, cpu: CPU | None = None) -> list[Candidate]:
    """Every candidate, opened where it can run; model must be a float file (the reference)."""
    found = [Candidate(engine, precision, (int8 or int8_sibling(model)) if precision == "int8" else model)
             for engine, precision in CANDIDATES]
    cpu = cpu or this_cpu()
    for candidate in found:
        if candidate.precision == "int8" and candidate.file is None:
            candidate.unavailable = (f"no int8 sibling beside {model.name} ({', '.join(p.format(stem=model.stem) for p in INT8_SIBLINGS)}); "
                                     "export one with --quantize int8, or pass --int8 FILE")
        elif candidate.precision == "bfloat16" and cpu.bfloat16_missing():
            candidate.unavailable = f"bfloat16 needs AVX512_BF16 or AMX: {cpu.bfloat16_missing()}"
        else:
            _open(candidate, threads)
    reference = found[0]
    if reference.unavailable:
        raise ModelFileError(f"{model}: the float32 reference cannot open: {reference.unavailable}")
    for candidate in found[1:]:
        if candidate.runtime is None:
            continue
        if not _same_model(candidate.runtime, reference.runtime):
            candidate.unavailable = f"{candidate.file.name} is another model than {model.name} (its config differs)"
        elif candidate.precision == "int8" and contract.META_INT8 not in candidate.runtime.metadata:
            candidate.unavailable = f"{candidate.file.name} is not an int8 file (export it with --quantize int8)"
        if candidate.unavailable:
            candidate.runtime = None
    return found


def _same_model(a: Runtime, b: Runtime) -> bool:
    """The same architecture and text setup (the name may differ: an int8 export names its own)."""
    mine, theirs = a.config.to_dict(), b.config.to_dict()
    mine.pop("name"), theirs.pop("name")
    return mine == theirs and a.text_max_length == b.text_max_length and a.text_lowercase == b.text_lowercase


def _as_rows(output) -> np.ndarray:
    """embed_texts' result as (M, F) rows: an (n, S) array as it is, per-token lists concatenated."""
    if isinstance(output, np.ndarray):
        return output
    return np.concatenate([np.asarray(rows) for rows in output])


def quality(got, want, output: str) -> dict:
    """{"min_cosine", "median_cosine", "max_abs", "max_rel", "finite"} of ``got`` against ``want``."""
    got_rows, want_rows = _as_rows(got), _as_rows(want)
    metrics = compare(output, got_rows, want_rows, np.ones((len(got_rows), 1), np.int64))
    cosines = row_cosines(got_rows, want_rows) if output != contract.LOGITS else np.array([metrics["min_cosine"]])
    metrics["median_cosine"] = float(np.median(cosines)) if metrics["finite"] else -1.0
    return metrics


def read_texts(path: str | os.PathLike) -> list[str]:
    """One text per non-empty line of a UTF-8 file; InputError when it holds none."""
    try:
        texts = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"--texts {path}: cannot read it as UTF-8 text: {exc}") from None
    texts = [t for t in texts if t]
    if not texts:
        raise InputError(f"--texts {path} holds no text (one text per line)")
    return texts


def tune(model: str | os.PathLike, texts: Sequence[str] | None = None, quality_floor: str = "float32",
         threads: int | None = None, int8: str | os.PathLike | None = None, rounds: int = 3,
         cpu: CPU | None = None, progress: Callable[[str], None] | None = None) -> dict:
    """Measure every candidate on ``texts`` (default: SAMPLE_SENTENCES of corpus.py) and choose.

    Returns {"model", "threads", "cpu", "quality", "texts", "rounds", "load", "candidates": [...],
    "choice": the chosen candidate's row}; each candidate row holds "engine", "precision", "file",
    "available" and either "unavailable" (why) or "sentences_per_s", "vs_float32", "min_cosine",
    "median_cosine", "max_abs", "gate" (the GATES row's name), "passes", "eligible".
    """
    step = progress or (lambda message: None)
    if quality_floor not in TIERS:
        raise InputError(f"quality={quality_floor!r}; choose one of {', '.join(QUALITIES)}")
    check_int("rounds", rounds, high=100)
    model = Path(model)
    threads = check_int("threads", threads) if threads is not None else available_cpus()
    file = read_model_file(model)
    if contract.META_INT8 in file.metadata:
        raise InputError(f"{model} is an int8 file; tune takes the float32 file (the reference the others are "
                         "compared to) and finds its int8 sibling, or give it with --int8")
    if texts is None:
        from ..core.corpus import sentences

        texts = sentences(SAMPLE_SENTENCES)
    texts = list(texts)
    if not texts or not all(isinstance(t, str) and t for t in texts):
        raise InputError("texts must be a non-empty list of non-empty strings")
    cpu = cpu or this_cpu()
    step(f"opening {len(CANDIDATES)} candidates at {threads} thread(s)")
    found = candidates(model, threads, Path(int8) if int8 is not None else None, cpu)
    live = [c for c in found if c.runtime is not None]
    reference = found[0]
    output = reference.runtime.select_output(None)
    for candidate in live:  # warm-up, and the outputs compared
        step(f"warm-up: {candidate.name}")
        candidate.output = candidate.runtime.embed_texts(texts, output=output)
    load_before = _load()
    for r in range(rounds):
        step(f"round {r + 1}/{rounds}")
        for candidate in live[r % len(live):] + live[:r % len(live)]:
            start = time.perf_counter()
            candidate.runtime.embed_texts(texts, output=output)
            candidate.seconds.append(time.perf_counter() - start)
    load_after = _load()
    rows = [_row(c, reference, output, quality_floor, len(texts)) for c in found]
    choice = fastest_within(rows, quality_floor)
    choice["chosen"] = True
    return {"model": str(model), "threads": threads, "cpu": cpu.identity(threads), "quality": quality_floor,
            "texts": len(texts), "rounds": rounds, "output": output,
            "load": {"before": load_before, "after": load_after}, "candidates": rows, "choice": choice}


def _load() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the OS has none): the figures' context."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _row(candidate: Candidate, reference: Candidate, output: str, floor: str, count: int) -> dict:
    row = {"engine": candidate.engine, "precision": candidate.precision,
           "file": candidate.file.name if candidate.file else None, "path": str(candidate.file) if candidate.file else None,
           "available": candidate.runtime is not None}
    if candidate.runtime is None:
        row["unavailable"] = candidate.unavailable
        return row
    median = statistics.median(candidate.seconds)
    metrics = quality(candidate.output, reference.output, output)
    ok = passes(metrics, GATES[candidate.precision])
    row.update({"file_bytes": candidate.file.stat().st_size,
                "file_weights": candidate.runtime.metadata.get(contract.META_WEIGHTS, ""), "seconds": [round(s, 4) for s in candidate.seconds],
                "sentences_per_s": round(count / median, 2),
                "vs_float32": round(statistics.median(reference.seconds) / median, 3),
                "min_cosine": metrics["min_cosine"], "median_cosine": metrics["median_cosine"],
                "max_abs": metrics["max_abs"], "gate": candidate.precision, "passes": ok, "chosen": False})
    row["eligible"] = within(row, floor)
    return row


def within(row: dict, floor: str) -> bool:
    """Whether a measured candidate row meets ``floor``: it passed its own precision's gate and
    that precision is the floor's tier or a stricter one (float32 > bfloat16 > int8)."""
    allowed = list(TIERS.values())[: list(TIERS).index(floor) + 1]
    return bool(row.get("passes")) and row["precision"] in allowed


def fastest_within(rows: list[dict], floor: str) -> dict | None:
    """The fastest of tune()'s candidate rows that meets ``floor`` (None when none does; the float32
    reference always meets every floor, so tune() itself always has a choice)."""
    eligible = [row for row in rows if within(row, floor)]
    return max(eligible, key=lambda row: row["sentences_per_s"]) if eligible else None


def choice_entry(result: dict) -> dict:
    """The record entry (tuned.write_choice) for tune()'s result; OutputError when the chosen
    file is not beside the model (a record names files in the model's folder only)."""
    row = result["choice"]
    if Path(row["path"]).resolve().parent != Path(result["model"]).resolve().parent:
        raise OutputError(f"the fastest choice runs {row['path']}, which is not beside {result['model']}: a tuned "
                          f"record names files in the model's folder only; copy it there (e.g. as "
                          f"{Path(result['model']).stem}.int8.onnx) and tune again")
    return {**result["cpu"], "quality": result["quality"], "engine": row["engine"], "precision": row["precision"],
            "file": row["file"], "file_bytes": row["file_bytes"], "file_weights": row["file_weights"],
            "sentences_per_s": row["sentences_per_s"],
            "vs_float32": row["vs_float32"], "min_cosine": row["min_cosine"],
            "measured": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
