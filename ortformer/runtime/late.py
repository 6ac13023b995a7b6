"""Late interaction at run time (numpy only): texts to ColBERT / bge-m3 token vectors and sparse
weights as the file's late.LateInteraction says, and MaxSim scoring.

A query (kind="query") is [first] [Q] tokens... truncated to query_length tokens and, with query
expansion, padded to it with the expansion id ([MASK]), attended to only with attend_to_expansion;
all its vectors are kept. A document is [first] [D] tokens... truncated to document_length; its
vectors at skiplist ids are dropped. skip_first drops every text's first vector (bge-m3's CLS).
Sparse weights: per text, w_t = max over the positions i holding id t of sparse_i, for w_t > 0
and t not in sparse_skip (FlagEmbedding's lexical weights).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .. import contract
from ..core.checks import check_int
from ..core.errors import InputError
from ..contract.late import LateInteraction

KINDS = ("query", "document")


def prepare(encoder, texts: list[str], late: LateInteraction, kind: str, default_length: int,
            max_sequence: int, max_length: int | None = None) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """(ids, attention, keep) per text: int64 ids (n_i,), int64 attention (n_i,), bool keep (n_i,).
    max_length: the tokens of a text, marker included, instead of the file's query / document length
    (PyLate's query_length / document_length arguments: a query is then expanded to it)."""
    query = kind == "query"
    marker = late.query_marker if query else late.document_marker
    length = max_length or (late.query_length if query else late.document_length) or default_length
    extra = int(marker is not None)
    check_int("max_length", length, low=encoder.num_special_tokens + extra + 1, high=max_sequence,
              why=" (the tokenizer's special tokens and the marker take their places; max_sequence is the longest "
                  "the model takes)")
    encoded, _, _ = encoder.encode(texts, length - extra)
    expand = query and late.expansion_id is not None
    skip = np.array(late.skiplist, np.int64)
    ids, attention, keep = [], [], []
    for row in encoded:  # per text: whole-array operations on its tokens
        tokens = np.asarray(row, np.int64)
        if marker is not None:
            tokens = np.insert(tokens, min(1, len(tokens)), marker)
        attend = np.ones(len(tokens), np.int64)
        if expand and len(tokens) < length:
            pads = length - len(tokens)
            tokens = np.concatenate([tokens, np.full(pads, late.expansion_id, np.int64)])
            attend = np.concatenate([attend, np.full(pads, int(late.attend_to_expansion), np.int64)])
        kept = np.ones(len(tokens), bool)
        if not query and skip.size:
            kept &= ~np.isin(tokens, skip)
        if late.skip_first:
            kept[:1] = False
        ids.append(tokens), attention.append(attend), keep.append(kept)
    return ids, attention, keep


def lexical_weights(ids: np.ndarray, weights: np.ndarray, skip: Sequence[int]) -> dict[int, float]:
    """{token id: max weight over its positions} for weights > 0 and ids not in ``skip``."""
    unique, inverse = np.unique(ids, return_inverse=True)
    best = np.zeros(len(unique), np.float32)
    np.maximum.at(best, inverse, weights.astype(np.float32))  # relu'd weights: 0 is the floor
    chosen = (best > 0) & ~np.isin(unique, np.asarray(skip, np.int64))
    return dict(zip(unique[chosen].tolist(), best[chosen].tolist()))


def embed_late(runtime, texts, kind: str, outputs: list[str], batch_size: int = 32,
               max_tokens: int | None = None, max_length: int | None = None) -> dict:
    """The per-text results of ``outputs`` (token_embeddings: (n_kept, D) float32 arrays; sparse:
    {id: weight} dicts; a pooled output (sentence_embedding, logits): one (n, S) array) for ``kind`` texts."""
    if kind not in KINDS:
        raise InputError(f"kind={kind!r} is not valid; choose one of {', '.join(map(repr, KINDS))}")
    missing = [name for name in outputs if name not in runtime.output_names]
    if missing:
        raise InputError(f"output(s) {missing} are not among this model's outputs {runtime.output_names}: "
                         "late interaction needs a file exported from a ColBERT or bge-m3 folder")
    late = runtime.late or LateInteraction()
    encoder = runtime._text_encoder_checked()
    from ..config.text import check_texts

    texts = check_texts(texts)
    ids, attention, keep = prepare(encoder, texts, late, kind, runtime.text_max_length, runtime.config.max_sequence,
                                   max_length)
    result = runtime.embed_outputs(ids, outputs, batch_size, max_tokens, attention=attention)
    if contract.TOKEN_EMBEDDINGS in result:
        result[contract.TOKEN_EMBEDDINGS] = [vectors[kept] for vectors, kept in zip(result[contract.TOKEN_EMBEDDINGS], keep)]
    if contract.SPARSE in result:
        result[contract.SPARSE] = [lexical_weights(i, w, late.sparse_skip) for i, w in zip(ids, result[contract.SPARSE])]
    return result  # the rest as embed gives them: pooled (n, S), last_hidden_state (n_i, F) per text


def embed_all(runtime, texts, kind: str, batch_size: int, max_tokens: int | None, max_length: int | None = None) -> dict:
    """sentence_embedding (n, S), token_embeddings and sparse, those the model has, from one run per batch."""
    names = [n for n in (contract.SENTENCE_EMBEDDING, contract.TOKEN_EMBEDDINGS, contract.SPARSE)
             if n in runtime.output_names]
    return embed_late(runtime, texts, kind, names, batch_size, max_tokens, max_length)


def maxsim(query, documents) -> np.ndarray:
    """ColBERT's score of each document: s_d = sum_i max_j q_i . d_j, q (n_q, D), d (n_d, D) -> (n_docs,)
    float32. All documents at once: one (sum n_d, n_q) product, then each document's max per query
    token (np.maximum.reduceat over its rows)."""
    q = _matrix("query", query)
    docs = [_matrix(f"documents[{i}]", d, q.shape[1]) for i, d in enumerate(documents)]
    if not docs:
        return np.zeros(0, np.float32)
    lengths = np.array([len(d) for d in docs])
    if (lengths == 0).any():
        raise InputError(f"documents {np.flatnonzero(lengths == 0)[:5].tolist()} hold no vectors; a document needs "
                         "at least one to be scored")
    sims = np.concatenate(docs) @ q.T  # (sum n_d, n_q)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return np.maximum.reduceat(sims, starts, axis=0).sum(axis=1).astype(np.float32)  # (n_docs,)


def _matrix(what: str, value, width: int | None = None) -> np.ndarray:
    array = np.asarray(value, dtype=np.float32) if not isinstance(value, np.ndarray) else value.astype(np.float32, copy=False)
    if array.ndim != 2 or (width is not None and array.shape[1] != width):
        want = f"(n, {width})" if width is not None else "(n, D)"
        raise InputError(f"{what} has shape {array.shape}; expected token vectors {want}")
    if not np.isfinite(array).all():
        raise InputError(f"{what} holds NaN or inf")
    return array
