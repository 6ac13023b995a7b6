"""What the routes do to model outputs before answering: Matryoshka truncation, l2
normalisation, sparse rows, classifier scores and quantized encodings (numpy only)."""
from __future__ import annotations

import base64

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
