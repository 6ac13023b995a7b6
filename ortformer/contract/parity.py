"""The parity gate: the ONNX file in onnxruntime against eager PyTorch, on a grid of
shapes and paddings that differ from the export example.

Metrics, per output, over kept tokens (last_hidden_state, token_embeddings) or non-empty rows
(sentence_embedding; sparse: each row's kept tokens' weights as one vector):
- max_abs = max |ort - eager|
- max_rel = max over vectors of max |ort_i - eager_i| / max |eager_i|   (each vector's error
  relative to its own scale)
- min_cosine = min over vectors of cos(ort_i, eager_i); a classifier's logits are one
  vector per case (a row of one or a few scores has no direction of its own)
Gates use rtol = 0 (no per-element relative bound, which near-zero elements would break): a
bound on max_abs and a cosine floor per dtype. Past the absolute bound, a gate with a max_rel
passes when every vector is within max_rel of its own scale instead: float32 rounding grows with
the magnitude of the values, so a correct graph whose outputs reach a few hundred differs from
eager by more than 1e-4 (a T5 whose residual stream reached 311 gave 1.6e-4, as far from a float64
run as PyTorch's own float32 was), while a graph error is off by far more than 1e-5 of a vector's
scale. Per vector, so one large token does not loosen the bound on the others.

This module is numpy + onnxruntime only; the eager side is any callable that
maps named numpy inputs to named numpy outputs.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from .. import contract
from ..config import EncoderConfig

GATES = {
    # the export gate, by the file's precision, against the float32 eager model
    "float32": {"max_abs": 1e-4, "max_rel": 1e-5, "min_cosine": 0.99999},
    # reduced precision is judged by direction against the float32 eager output
    "float16": {"max_abs": None, "min_cosine": 0.999},
    "int8": {"max_abs": None, "min_cosine": 0.99},
    # a float32 file computed in bfloat16 (OpenVINO's CPU plugin, Runtime(precision="bfloat16")),
    # against the same file in float32. bfloat16 keeps float32's exponent (nothing overflows that
    # float32 holds, unlike float16's 65,504) but 8 significant bits against float16's 11: each
    # MatMul input rounds by up to 2^-9 (0.2%) relative, accumulated in float32, so the errors
    # of a dot product mostly cancel. Measured on all-MiniLM-L6-v2: per-token cosine 0.99971 on
    # the grid's random ids, sentence cosine 0.99996 (median 0.99999) on 1,000 real sentences.
    # The floor is float16's: a tier of its own for what the hardware offers, not a looser one.
    "bfloat16": {"max_abs": None, "min_cosine": 0.999},
    # an offline-optimized file against its original with the same rewrites done at session start
    # (the save must be faithful); against the original with none, the file's own dtype gate applies
    "optimized": {"max_abs": 1e-4, "max_rel": 1e-5, "min_cosine": 0.99999},
    # the same file on CUDA against CPU: cuBLAS/cuDNN sum in another order (and TF32 may be on)
    "cuda": {"max_abs": 1e-3, "max_rel": 1e-4, "min_cosine": 0.9999},
}
EXAMPLE_BATCH = 3  # the grid's batches are 1, 2 and 5, so no grid shape equals the example's
LONGEST_GRID_SEQUENCE = 512  # cap for huge position tables; keeps the gate to seconds

Named = dict[str, np.ndarray]


@dataclass(frozen=True)
class Case:
    batch: int
    sequence: int
    padding: str


def example_shape(cfg: EncoderConfig) -> tuple[int, int]:
    """Shape traced by the exporter: dims >= 2, as torch.export specialises 0 and 1."""
    return EXAMPLE_BATCH, min(cfg.max_sequence, 7)


def grid(cfg: EncoderConfig) -> list[Case]:
    """Sequences 1, 2, an odd length, a mid length and the longest the model takes (capped)."""
    longest = min(cfg.max_sequence, LONGEST_GRID_SEQUENCE)
    odd = min(13, longest) if min(13, longest) % 2 else min(13, longest) - 1
    sequences = sorted({1, 2, max(odd, 1), max(longest // 2, 1), longest} - {0})
    cases = []
    for n in sequences:
        if n > cfg.max_sequence:
            continue
        cases += [Case(1, n, "none"), Case(2, n, "right"), Case(2, n, "left"),
                  Case(5 if n <= 128 else 2, n, "random+empty")]
    return cases


def make_mask(case: Case, rng: np.random.Generator) -> np.ndarray:
    """int64 (B, N) mask, 1 = keep; every row keeps >= 1 token except the 'empty' row."""
    b, n = case.batch, case.sequence
    lengths = rng.integers(1, n + 1, size=b)
    positions = np.arange(n)[None, :]
    if case.padding == "none":
        return np.ones((b, n), np.int64)
    if case.padding == "right":
        return (positions < lengths[:, None]).astype(np.int64)
    if case.padding == "left":
        return (positions >= n - lengths[:, None]).astype(np.int64)
    mask = (rng.random((b, n)) < 0.6).astype(np.int64)
    mask[np.arange(b), rng.integers(0, n, size=b)] = 1  # at least one kept token per row
    mask[-1] = 0  # one fully padded row
    return mask


def make_inputs(cfg: EncoderConfig, case: Case, rng: np.random.Generator) -> Named:
    b, n = case.batch, case.sequence
    if cfg.takes_ids:
        inputs = {contract.INPUT_IDS: rng.integers(0, cfg.vocab_size, size=(b, n), dtype=np.int64)}
    else:
        inputs = {contract.INPUTS_EMBEDS: rng.standard_normal((b, n, cfg.hidden_size)).astype(np.float32)}
    inputs[contract.ATTENTION_MASK] = make_mask(case, rng)
    if cfg.type_vocab_size:
        inputs[contract.TOKEN_TYPE_IDS] = rng.integers(0, cfg.type_vocab_size, size=(b, n), dtype=np.int64)
    if cfg.adapters:  # each row its own task
        inputs[contract.TASK_ID] = rng.integers(0, len(cfg.adapters.tasks), size=(b,), dtype=np.int64)
    return inputs


def compare(name: str, got: np.ndarray, want: np.ndarray, mask: np.ndarray) -> dict:
    """Metrics over kept tokens (3-D outputs) or rows with a kept token (2-D); a classifier's
    logits are compared as one vector (their rows are a handful of scores)."""
    if not np.isfinite(got).all():
        return {"max_abs": float("inf"), "max_rel": float("inf"), "min_cosine": -1.0, "finite": False}
    if name == contract.SPARSE:  # one weight per token (B, N): a row's kept tokens as its vector
        got, want = got * mask, want * mask
    keep = mask.astype(bool) if got.ndim == 3 else mask.astype(bool).any(axis=1)
    got_v, want_v = got[keep].astype(np.float64), want[keep].astype(np.float64)  # (M, F)
    if name == contract.LOGITS:
        # a classifier's few logits per row (one, for a reranker) have no direction of their
        # own: a row's cosine would be the sign of a score. One vector per case instead.
        got_v, want_v = got_v.reshape(1, -1), want_v.reshape(1, -1)
    if got_v.size == 0:
        return {"max_abs": 0.0, "max_rel": 0.0, "min_cosine": 1.0, "finite": True}
    errors, scales = np.abs(got_v - want_v).max(axis=1), np.abs(want_v).max(axis=1)  # (M,) each
    relative = np.where(scales > 0, errors / np.where(scales > 0, scales, 1.0), errors)  # a zero vector: its error
    return {"max_abs": float(errors.max()), "max_rel": float(relative.max()),
            "min_cosine": float(row_cosines(got_v, want_v).min()), "finite": True}


def row_cosines(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """cos(got_i, want_i) per row of two (M, F) arrays, in float64; 1 where a row is zero."""
    got, want = got.astype(np.float64), want.astype(np.float64)
    dot = (got * want).sum(axis=1)
    norms = np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1)
    return np.where(norms > 0, dot / np.where(norms > 0, norms, 1.0), 1.0)


def passes(metrics: dict, gate: dict) -> bool:
    """Whether compare()'s metrics of one comparison are within a GATES row: max_abs within the
    gate's, or (where the gate has a max_rel) every vector within max_rel of its own scale; and
    min_cosine at least the floor."""
    if not metrics["finite"]:
        return False
    if gate["max_abs"] is not None and metrics["max_abs"] > gate["max_abs"]:
        relative = gate.get("max_rel")  # past max_abs: every vector within max_rel of its own scale
        if relative is None or not metrics.get("max_rel", float("inf")) <= relative:
            return False
    return metrics["min_cosine"] >= gate["min_cosine"]


def fold_worst(worst: dict[str, dict], name: str, metrics: dict) -> None:
    """Fold one comparison into the worst case so far of output ``name`` (in place):
    the largest max_abs and max_rel, the smallest min_cosine, finite only if all were."""
    w = worst.setdefault(name, {"max_abs": 0.0, "max_rel": 0.0, "min_cosine": 1.0, "finite": True})
    w["max_abs"] = max(w["max_abs"], metrics["max_abs"])
    w["max_rel"] = max(w["max_rel"], metrics["max_rel"])
    w["min_cosine"] = min(w["min_cosine"], metrics["min_cosine"])
    w["finite"] = w["finite"] and metrics["finite"]


def run_parity(session, eager: Callable[[Named], Named], cfg: EncoderConfig,
               dtype: str = "float32", seed: int = 0) -> dict:
    """Run every grid case through ``session`` (onnxruntime) and ``eager``; return the report."""
    gate = GATES[dtype]
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    cases, worst = [], {}
    for case in grid(cfg):
        inputs = make_inputs(cfg, case, rng)
        names = [o.name for o in session.get_outputs()]
        got = dict(zip(names, session.run(names, inputs)))
        want = eager(inputs)
        outputs = {}
        for name in [n for n in contract.output_names(cfg) if n in got]:  # an older file: without the optional ones
            m = compare(name, got[name], want[name], inputs[contract.ATTENTION_MASK])
            m["passed"] = passes(m, gate)
            outputs[name] = m
            fold_worst(worst, name, m)
        cases.append({**asdict(case), "outputs": outputs})
    for name, metrics in worst.items():  # per case: a worst max_abs and a worst max_rel may come from two cases
        metrics["passed"] = all(c["outputs"][name]["passed"] for c in cases)
    return {
        "dtype": dtype,
        "gate": gate,
        "provider": session.get_providers()[0],
        "export_example": list(example_shape(cfg)),
        "cases": cases,
        "worst": worst,
        "passed": all(m["passed"] for m in worst.values()),
        "seconds": round(time.perf_counter() - start, 3),
    }


def failed_cases(report: dict) -> list[str]:
    """One line per failed (case, output): what a ParityError message shows."""
    lines = []
    chunked = report.get("chunked") if isinstance(report.get("chunked"), dict) else {}
    tagged = [("", c) for c in report["cases"]] + [(f"chunked (chunk_size={chunked.get('chunk_size')}) ", c)
                                                   for c in chunked.get("cases", [])]
    for tag, case in tagged:
        for name, m in case["outputs"].items():
            if not m["passed"]:
                lines.append(f"{tag}batch={case['batch']} sequence={case['sequence']} padding={case['padding']} "
                             f"{name}: max_abs={m['max_abs']:.3g} max_rel={_number(m, 'max_rel'):.3g} "
                             f"min_cosine={m['min_cosine']:.6f}")
    return lines


def format_report(report: dict) -> str:
    """One line from a parity report, as export, check and info print it. Reports read
    back from a file may be written by hand: missing numbers print as nan, never crash."""
    if report.get("skipped"):
        return f"skipped ({report.get('reason', 'no reason given')})"
    if "passed" not in report:
        return "no parity report in this file"
    worst = report.get("worst")
    worst = "; ".join(
        f"{name} max_abs={_number(m, 'max_abs'):.2e} max_rel={_number(m, 'max_rel'):.2e} "
        f"min_cos={_number(m, 'min_cosine'):.6f}"
        for name, m in (worst.items() if isinstance(worst, dict) else []) if isinstance(m, dict)
    )
    verdict = "PASS" if report["passed"] is True else "FAIL"
    cases = report.get("cases")
    return (f"{verdict} over {len(cases) if isinstance(cases, list) else '?'} cases ({report.get('dtype', '?')} gate on "
            f"{report.get('provider', '?')}): {worst}{text_summary(report)}")


def _number(metrics: dict, key: str) -> float:
    value = metrics.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else float("nan")


def text_summary(report: dict) -> str:
    """'; real text (48 sentences, not gated): ...' when the report has the tokenizer check."""
    text = report.get("text")
    numbers = [text.get(key) for key in ("min_cosine", "median_cosine")] if isinstance(text, dict) else []
    if len(numbers) != 2 or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in numbers):
        return ""  # no text check, or a report written by hand: say nothing rather than guess
    output = {contract.LOGITS: "logits", contract.TOKEN_EMBEDDINGS: "token"}.get(text.get("output"), "sentence")
    return (f"; real text ({text.get('sentences', '?')} sentences, not gated): "
            f"{output} min_cos={numbers[0]:.6f} median={numbers[1]:.6f}")
