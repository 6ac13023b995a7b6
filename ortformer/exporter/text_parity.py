"""Parity on real sentences, for models exported with a tokenizer.

The gate's grid feeds uniformly random ids; a trained text model sees sentences,
whose activations are shaped differently (int8 all-MiniLM-L6-v2: per-token cosine
0.972 on the grid; against sentence-transformers on the bench's 1,000 sentences,
sentence cosine median 0.992 and minimum 0.966).
This check runs real English sentences (the standard library's docstrings,
offline) through the exported session and eager PyTorch and records the
sentence-embedding cosine (min, median) in the parity report beside the gate, so
the figure a user of embeddings compares is in the file.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np

from .. import contract
from ..core.corpus import sentences
from ..config import EncoderConfig
from ..core.errors import MissingExtraError, ModelFileError
from ..contract.parity import row_cosines
from ..runtime.batching import length_batches, pad

SENTENCES = 48
TOKENS_PER_BATCH = 2048  # bounds eager PyTorch's memory on long paragraphs


def compared_output(cfg: EncoderConfig) -> str | None:
    """The output the check compares: a classifier's per-sequence logits, else the sentence
    embedding, else a late-interaction model's token_embeddings (per kept token); None when the
    model has none of them."""
    if cfg.classifier and not cfg.classifier.per_token:
        return contract.LOGITS
    if cfg.pooling != "none":
        return contract.SENTENCE_EMBEDDING
    return contract.TOKEN_EMBEDDINGS if cfg.token_dense else None


def text_parity(session, eager: Callable[[dict], dict], cfg: EncoderConfig, tokenizer, max_length: int,
                count: int = SENTENCES, lowercase: bool = False) -> dict:
    """{"sentences", "output", "min_cosine", "median_cosine", "max_abs"} of compared_output(cfg),
    session vs eager.

    Cosine per sentence between (n, S) vectors (logits: of all sentences' logits as one vector,
    since a text's one or few scores have no direction; token_embeddings: per kept token), and the
    largest absolute difference;
    max_length truncates as embed_texts does. tokenizer: a TextEncoder (used as it is, with its own
    lowercasing) or a tokenizer.json path.
    """
    output = compared_output(cfg)
    from ..config.text import TruncationWarning, text_encoder

    # recorded, never gated: a tokenizer that cannot run here skips the check, not the export
    try:
        encoder = text_encoder(tokenizer, lowercase)
    except (MissingExtraError, ModelFileError) as exc:
        return {"skipped": True, "reason": str(exc)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TruncationWarning)  # long paragraphs are cut, as in serving
        ids, _, _ = encoder.encode(sentences(count), max_length)
    arrays = [np.asarray(i, np.int64) for i in ids]
    largest = max(int(a.max()) for a in arrays)
    if largest >= cfg.vocab_size:
        return {"skipped": True, "reason": f"the tokenizer gives ids up to {largest}, beyond the model's "
                                           f"vocab_size {cfg.vocab_size}: tokenizer and model do not belong together"}
    per_token = contract.output_shapes(cfg)[output][1] == contract.SEQUENCE_AXIS
    got_rows, want_rows = [], []  # the same order on both sides: batch by batch
    for batch in length_batches(np.array([len(a) for a in arrays]), count, TOKENS_PER_BATCH):
        padded, mask = pad([arrays[i] for i in batch])
        feeds = {contract.INPUT_IDS: padded, contract.ATTENTION_MASK: mask}
        if cfg.type_vocab_size:
            feeds[contract.TOKEN_TYPE_IDS] = np.zeros_like(mask)
        if cfg.adapters:  # the texts of the default task, the task a request that names none runs with
            feeds[contract.TASK_ID] = np.full(len(batch), cfg.adapters.tasks.index(cfg.adapters.default), np.int64)
        got, want = session.run([output], feeds)[0], eager(feeds)[output]
        keep = mask.astype(bool) if per_token else slice(None)  # per token: the kept tokens' vectors
        got_rows.append(got[keep]), want_rows.append(want[keep])
    got_all, want_all = np.concatenate(got_rows).astype(np.float64), np.concatenate(want_rows).astype(np.float64)
    max_abs = float(np.abs(got_all - want_all).max())
    if output == contract.LOGITS:  # a text's few scores have no direction: all texts' logits as one vector
        got_all, want_all = got_all.reshape(1, -1), want_all.reshape(1, -1)
    cosines = row_cosines(got_all, want_all)
    return {"sentences": len(arrays), "output": output, "min_cosine": float(cosines.min()),
            "median_cosine": float(np.median(cosines)), "max_abs": max_abs}
