"""What the routes do to model outputs before answering: Matryoshka truncation, l2
normalisation, sparse rows, classifier scores and quantized encodings (numpy only)."""
from __future__ import annotations

import base64
import json

import numpy as np

from .errors import bad_request

# encoding_format values of /v1/embeddings: OpenAI's two, and sentence-transformers' quantized ones
FLOAT_FORMATS = ("float", "base64")
QUANTIZED_FORMATS = ("int8", "uint8", "binary", "ubinary")
ENCODING_FORMATS = FLOAT_FORMATS + QUANTIZED_FORMATS


def shape_embeddings(vectors: np.ndarray, dimensions: int | None, normalize: bool) -> np.ndarray:
    """(n, S) -> (n, dimensions or S): keep the first `dimensions` features (Matryoshka), then
    x / ||x||_2 per row when `normalize` (a zero row stays zero), as sentence-transformers'
    truncate_dim followed by normalize_embeddings."""
    out = vectors[:, :dimensions] if dimensions is not None else vectors
    if normalize:
        norms = np.linalg.norm(out.astype(np.float64), axis=1, keepdims=True)
        out = (out / np.where(norms > 0, norms, 1.0)).astype(np.float32)
    return out


def pool_rows(states: list[np.ndarray], kind: str) -> np.ndarray:
    """(n, F) float32 sentence vectors from each sequence's token states (len_i, F), all kept,
    as the encoder's pool() computes them (models/encoder.py), sums in float64: mean
    sum_i x_i / n; cls x_0; last x_{n-1}; max per feature; mean_sqrt_len sum_i x_i / sqrt(n);
    weighted_mean sum_i (i + 1) x_i / sum_i (i + 1). What a model whose graph normalizes gives
    before its normalization (when it has no Dense head): `normalize: false` reads this."""
    rows = []
    for x in states:
        x64 = x.astype(np.float64)
        n = len(x)
        if kind == "cls":
            row = x64[0]
        elif kind == "last":
            row = x64[-1]
        elif kind == "max":
            row = x64.max(axis=0)
        elif kind == "weighted_mean":
            weights = np.arange(1, n + 1, dtype=np.float64)
            row = weights @ x64 / weights.sum()
        elif kind in ("mean", "mean_sqrt_len"):
            row = x64.sum(axis=0) / (np.sqrt(n) if kind == "mean_sqrt_len" else n)
        else:
            raise ValueError(f"pooling {kind!r} has no token-state form")
        rows.append(row)
    return np.stack(rows).astype(np.float32)


def sparse_rows(vectors: np.ndarray) -> list[list[dict]]:
    """(n, V) SPLADE weights -> per row [{"index": v, "value": w}] for each w != 0, v ascending
    (TEI's /embed_sparse)."""
    rows = []
    for row in vectors:
        nonzero = np.flatnonzero(row)
        rows.append([{"index": int(i), "value": float(v)} for i, v in zip(nonzero, row[nonzero])])
    return rows


def lexical_rows(weights: np.ndarray, ids: np.ndarray, skip) -> list[dict]:
    """A bge-m3 text's per-token sparse weights (n,) at its ids (n,) -> TEI's sparse row
    [{"index": id, "value": w}], id ascending: w the max over the id's positions, for w > 0 and
    ids not in ``skip`` (runtime/late.py's lexical_weights, FlagEmbedding's)."""
    from ..runtime.late import lexical_weights

    return [{"index": int(i), "value": float(v)} for i, v in sorted(lexical_weights(ids, weights, skip).items())]


def scores(logits: np.ndarray, raw: bool) -> np.ndarray:
    """(n, L) logits -> TEI's scores: raw, else sigmoid(x) for one label and softmax over the
    labels (max-subtracted) for more."""
    logits = logits.astype(np.float64)
    if raw:
        return logits
    if logits.shape[1] == 1:
        return 1.0 / (1.0 + np.exp(-logits))
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def quantize(vectors: np.ndarray, precision: str) -> np.ndarray:
    """sentence-transformers' ``quantize_embeddings(vectors, precision)`` without calibration:

    - int8 / uint8: per dimension d, ranges [lo_d, hi_d] = min / max of d over the request's
      own vectors (what sentence-transformers does when no calibration embeddings or ranges
      are given); step_d = (hi_d - lo_d) / 255 (1 where that is 0); q = clip(floor((x - lo_d) /
      step_d), 0, 255), minus 128 for int8. So a vector's codes depend on the other inputs of
      its request, and one input alone has no range: refused, as sentence-transformers does.
    - binary / ubinary: the bits x > 0 packed 8 per byte, most significant first
      (np.packbits), as uint8 (ubinary) or minus 128 as int8 (binary): (n, ceil(S / 8)).
    """
    if precision in ("binary", "ubinary"):
        packed = np.packbits(vectors > 0, axis=-1)
        return packed if precision == "ubinary" else (packed.astype(np.int16) - 128).astype(np.int8)
    check_quantizable(precision, len(vectors))
    lo, hi = vectors.min(axis=0).astype(np.float32), vectors.max(axis=0).astype(np.float32)
    steps = (hi - lo) / 255
    steps = np.where(steps == 0, 1, steps)
    codes = np.clip(np.floor((vectors - lo) / steps), 0, 255)
    return codes.astype(np.uint8) if precision == "uint8" else (codes - 128).astype(np.int8)


def check_quantizable(precision: str, count: int) -> None:
    """int8 and uint8 take their ranges from the request's vectors: one has none (422)."""
    if precision in ("int8", "uint8") and count < 2:
        raise bad_request(f"encoding_format={precision!r} computes its ranges from the request's own embeddings "
                          "(sentence-transformers' quantize_embeddings without calibration), so it needs at least "
                          "2 inputs; send more inputs, or use 'float', 'base64', 'binary' or 'ubinary'")


def encode_rows(vectors: np.ndarray, encoding_format: str) -> list:
    """One JSON value per row: a list of floats, base64 of the little-endian float32 bytes
    (OpenAI's and TEI's "base64"), or a list of ints for a quantized format."""
    if encoding_format == "float":
        return vectors.tolist()
    if encoding_format == "base64":
        little = vectors.astype("<f4", copy=False)
        return [base64.b64encode(row.tobytes()).decode("ascii") for row in little]
    return quantize(vectors, encoding_format).tolist()


# json_bytes encodes lists of scalars or flat objects this many items per json.dumps call
JSON_SLICE = 4096


def json_bytes(value) -> bytes:
    """``value`` (dicts, lists, numpy arrays and scalars) as compact ASCII JSON, encoded in
    pieces: an array row by row, a long list JSON_SLICE items at a time. json's C encoder holds
    the GIL for a whole call, so one call over a 60 MB answer would stall every other thread
    (the event loop included) for seconds; between pieces the GIL is handed over as usual."""
    out: list[str] = []
    _emit(value, out)
    return "".join(out).encode("ascii")


def _plain(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _dumps(value) -> str:
    return json.dumps(value, separators=(",", ":"), default=_plain)


def _nested(value) -> bool:
    """Whether encoding `value` in one call could be large: it holds lists or arrays."""
    if isinstance(value, dict):
        return any(isinstance(v, (list, tuple, dict, np.ndarray)) for v in value.values())
    return isinstance(value, (list, tuple, np.ndarray))


def _emit(value, out: list[str]) -> None:
    if isinstance(value, np.ndarray):
        if value.ndim <= 1:
            out.append(_dumps(value.tolist()))
            return
        value = list(value)  # (n, ...) -> its n rows
    if isinstance(value, dict):
        out.append("{")
        for i, (key, item) in enumerate(value.items()):
            out.append(("," if i else "") + _dumps(str(key)) + ":")
            _emit(item, out)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        if value and _nested(value[0]):
            for i, item in enumerate(value):
                if i:
                    out.append(",")
                _emit(item, out)
        else:  # scalars or flat objects (tokens): a slice per call
            out.append(",".join(_dumps(list(value[i:i + JSON_SLICE]))[1:-1] for i in range(0, len(value), JSON_SLICE)))
        out.append("]")
    else:
        out.append(_dumps(value))
