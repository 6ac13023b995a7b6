"""Late-interaction folders: the per-token heads and text settings of ColBERT and bge-m3 layouts.

- PyLate: a sentence-transformers folder of a Transformer then Dense modules (no Pooling) that
  project every token (96 or 128 wide, no bias), and config_sentence_transformers.json's
  query_prefix / document_prefix ("[Q] " / "[D] ", tokens added to the tokenizer), query_length
  (32) / document_length (180), do_query_expansion, attend_to_expansion_tokens and skiplist_words
  (string.punctuation); vectors normalised per token.
- sentence-transformers' multi-vector layout: Dense modules and a Normalize reading
  module_input_name="token_embeddings", without markers or skiplist.
- colbert-ai: a BERT checkpoint whose config.json names the HF_ColBERT architecture, its projection
  ``linear`` (dim x hidden, no bias) among the weights, and artifact.metadata's query_token_id /
  doc_token_id ([unused0] / [unused1]), query_maxlen, doc_maxlen, mask_punctuation and
  attend_to_mask_tokens (the skiplist: the first token of each punctuation symbol).
- bge-m3: colbert_linear.pt (F -> F with bias) and sparse_linear.pt (F -> 1) beside an XLM-R
  folder, read with torch.load(weights_only=True): vectors of tokens 1.. (the CLS dropped), and
  relu(sparse_linear(x_i)) per token with the cls, eos, pad and unk ids dropped (FlagEmbedding).
"""
from __future__ import annotations

import string
from dataclasses import dataclass, field
from pathlib import Path

from ...config import TokenDense
from ...core.errors import CheckpointError
from ...contract.late import LateInteraction
from ..weights import Tensors
from .folder_layout import read_json
from .sentence_dense import DenseHead, dense_tensors

PYLATE_KEYS = ("query_prefix", "document_prefix", "query_length", "document_length", "attend_to_expansion_tokens",
               "skiplist_words", "do_query_expansion")
BGE_M3_FILES = ("colbert_linear.pt", "sparse_linear.pt")
COLBERT_AI_METADATA = "artifact.metadata"
COLBERT_AI_ARCHITECTURE = "HF_ColBERT"
# transformers' defaults of the special tokens, by role, for configs that name none (BERT's, XLM-R's)
DEFAULT_SPECIALS = {"mask_token": ("[MASK]", "<mask>"), "cls_token": ("[CLS]", "<s>"), "eos_token": ("</s>",),
                    "pad_token": ("[PAD]", "<pad>"), "unk_token": ("[UNK]", "<unk>")}
FLAG_SPARSE_SKIP = ("cls_token", "eos_token", "pad_token", "unk_token")  # FlagEmbedding's unused_tokens


@dataclass(frozen=True)
class LateSpec:
    """Late-interaction text settings as a folder names them (token texts), before the tokenizer
    makes them ids (``resolve``)."""

    query_prefix: str | None = None  # the marker token put after a query's first token, or None
    document_prefix: str | None = None
    query_length: int | None = None
    document_length: int | None = None
    expansion: bool = False  # queries are padded to query_length with the mask token
    attend_to_expansion: bool = False
    skiplist_words: tuple[str, ...] = ()
    skiplist_by_encoding: bool = False  # colbert-ai: a word's id is its first token; PyLate: the vocabulary entry
    skip_first: bool = False
    sparse_skip: tuple[str, ...] = ()  # special-token roles ("cls_token", ...) whose sparse weights are dropped
    folder: Path | None = None  # where tokenizer_config.json / special_tokens_map.json name the special tokens


@dataclass(frozen=True)
class TokenHeads:
    """What a late-interaction folder adds to the encoder: config fields, tensors, the files they came from."""

    fields: dict  # EncoderConfig fields: the token_dense group (config.TokenDense), and bge-m3's token_weights
    spec: LateSpec
    tensors: Tensors = field(default_factory=dict)
    files: tuple[Path, ...] = ()
    consumed: frozenset[str] = frozenset()  # names in the main weight file that the heads read


def st_config(folder: Path) -> dict:
    path = folder / "config_sentence_transformers.json"
    return read_json(path) if path.is_file() else {}


def is_pylate(folder: Path) -> bool:
    """A PyLate folder: its config_sentence_transformers.json says ColBERT or holds PyLate's keys."""
    config = st_config(folder)
    return config.get("model_type") == "ColBERT" or any(key in config for key in PYLATE_KEYS)


def pylate_spec(folder: Path) -> LateSpec:
    """PyLate's settings with its defaults (ColBERT.__init__)."""
    path = folder / "config_sentence_transformers.json"
    config = st_config(folder)
    prefixes = [config.get(key, default) for key, default in (("query_prefix", "[Q] "), ("document_prefix", "[D] "))]
    lengths = [config.get(key, default) for key, default in (("query_length", 32), ("document_length", 180))]
    flags = [config.get(key, default) for key, default in (("do_query_expansion", True),
                                                             ("attend_to_expansion_tokens", False))]
    words = config.get("skiplist_words", list(string.punctuation))
    for value in prefixes:
        if value is not None and not isinstance(value, str):
            raise CheckpointError(f"{path}: query_prefix / document_prefix must be strings, got {value!r}")
    for value in lengths:
        if isinstance(value, bool) or not isinstance(value, int) or value < 3:
            raise CheckpointError(f"{path}: query_length / document_length must be ints >= 3, got {value!r}")
    if not all(isinstance(flag, bool) for flag in flags):
        raise CheckpointError(f"{path}: do_query_expansion / attend_to_expansion_tokens must be true or false, got {flags}")
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise CheckpointError(f"{path}: skiplist_words must be a list of strings")
    expansion = flags[0]
    return LateSpec(prefixes[0] or None, prefixes[1] or None, lengths[0], lengths[1], expansion,
                    expansion and flags[1], tuple(words))


def st_token_heads(folder: Path, dense: DenseHead, hidden_size: int) -> TokenHeads:
    """The projection of a PyLate or sentence-transformers multi-vector folder (its Dense modules)."""
    tensors, files = dense_tensors(dense, hidden_size)
    fields_ = {"token_dense": TokenDense(size=dense.layers[-1].out_features, bias="sentence_dense.bias" in tensors)}
    mapped = {name.replace("sentence_dense", "token_dense"): value for name, value in tensors.items()}
    return TokenHeads(fields_, pylate_spec(folder) if is_pylate(folder) else LateSpec(), mapped, tuple(files))


def colbert_ai_heads(root: Path, hf_config: dict, raw: Tensors, what: str) -> TokenHeads | None:
    """colbert-ai's ``linear`` projection and artifact.metadata, for a config naming HF_ColBERT; else None."""
    if COLBERT_AI_ARCHITECTURE not in (hf_config.get("architectures") or []):
        return None
    weight = raw.get("linear.weight")
    hidden = hf_config.get("hidden_size")
    if weight is None or weight.ndim != 2 or weight.shape[1] != hidden or weight.shape[0] < 1:
        raise CheckpointError(f"{what}: an {COLBERT_AI_ARCHITECTURE} checkpoint holds its projection linear.weight "
                              f"(dim, {hidden}); found {None if weight is None else tuple(weight.shape)}")
    path = root / COLBERT_AI_METADATA
    meta = read_json(path) if path.is_file() else {}
    dim = meta.get("dim", weight.shape[0])
    if dim != weight.shape[0]:
        raise CheckpointError(f"{path}: dim={dim!r} but linear.weight projects to {weight.shape[0]}")
    values = {key: meta.get(key, default) for key, default in (
        ("query_token_id", "[unused0]"), ("doc_token_id", "[unused1]"), ("query_maxlen", 32), ("doc_maxlen", 220),
        ("mask_punctuation", True), ("attend_to_mask_tokens", False))}
    for key in ("query_maxlen", "doc_maxlen"):
        if isinstance(values[key], bool) or not isinstance(values[key], int) or values[key] < 3:
            raise CheckpointError(f"{path}: {key}={values[key]!r} must be an int >= 3")
    for key in ("mask_punctuation", "attend_to_mask_tokens"):
        if not isinstance(values[key], bool):
            raise CheckpointError(f"{path}: {key}={values[key]!r} must be true or false")
    for key in ("query_token_id", "doc_token_id"):
        if not isinstance(values[key], str) or not values[key]:
            raise CheckpointError(f"{path}: {key}={values[key]!r} must name a token")
    spec = LateSpec(values["query_token_id"], values["doc_token_id"], values["query_maxlen"], values["doc_maxlen"],
                    True, values["attend_to_mask_tokens"],
                    tuple(string.punctuation) if values["mask_punctuation"] else (), skiplist_by_encoding=True)
    fields_ = {"token_dense": TokenDense(size=int(weight.shape[0]), bias=False)}
    return TokenHeads(fields_, spec, {"token_dense.weight": weight}, (path,) if path.is_file() else (),
                      frozenset({"linear.weight"}))


def bge_m3_heads(folder: Path, hidden_size: int) -> TokenHeads | None:
    """bge-m3's colbert_linear and sparse_linear beside the folder; None when neither is there."""
    paths = [folder / name for name in BGE_M3_FILES]
    found = [p.is_file() for p in paths]
    if not any(found):
        return None
    if not all(found):
        missing = [p.name for p, ok in zip(paths, found) if not ok]
        raise CheckpointError(f"{folder}: a bge-m3 folder holds both {' and '.join(BGE_M3_FILES)}; {missing} missing")
    import torch

    tensors = {}
    for path, target, rows in zip(paths, ("token_dense", "token_weight"), (None, 1)):
        try:  # a pickle: weights_only refuses anything but tensors and containers of them
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise CheckpointError(f"{path}: not a state dict torch.load(weights_only=True) reads: {exc}") from None
        if not isinstance(state, dict) or set(state) != {"weight", "bias"}:
            keys = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise CheckpointError(f"{path}: must hold a Linear's weight and bias, found {keys}")
        weight, bias = state["weight"], state["bias"]
        out = weight.shape[0] if weight.ndim == 2 else -1
        if (weight.ndim != 2 or weight.shape[1] != hidden_size or out < 1 or (rows and out != rows)
                or tuple(bias.shape) != (out,)):
            raise CheckpointError(f"{path}: weight {tuple(weight.shape)} and bias {tuple(bias.shape)} must be "
                                  f"({rows or 'D'}, {hidden_size}) and ({rows or 'D'},)")
        tensors[f"{target}.weight"], tensors[f"{target}.bias"] = weight.float(), bias.float()
    fields_ = {"token_dense": TokenDense(size=int(tensors["token_dense.weight"].shape[0]), bias=True),
               "token_weights": True}
    return TokenHeads(fields_, LateSpec(skip_first=True, sparse_skip=FLAG_SPARSE_SKIP), tensors, tuple(paths))


def resolve(spec: LateSpec, tokenizer: Path | None, vocab_size: int) -> LateInteraction:
    """The settings as token ids of ``tokenizer``, as transformers' convert_tokens_to_ids reads them
    (an added token such as PyLate's "[Q] " by its text; a word missing from the vocabulary: the unk id)."""
    needs_ids = spec.query_prefix or spec.document_prefix or spec.expansion or spec.skiplist_words or spec.sparse_skip
    if not needs_ids:
        return LateInteraction(skip_first=spec.skip_first)
    if tokenizer is None:
        raise CheckpointError("late interaction needs the folder's tokenizer (tokenizer.json) to find its marker, "
                              "expansion, skiplist and special token ids; give the folder one")
    from ...config.text import TextEncoder
    from .tokenizer_settings import read_settings

    encoder = TextEncoder(tokenizer)
    vocab = encoder.vocabulary()
    roles = read_settings(spec.folder or Path(tokenizer).parent, {role: None for role in DEFAULT_SPECIALS}, ())
    # a role the configs do not name: the tokenizer class's default (BERT's [MASK], XLM-R's <mask>, ...)
    ids = {role: next((vocab[t] for t in ([roles[role]] if roles[role] else DEFAULT_SPECIALS[role]) if t in vocab), None)
           for role in DEFAULT_SPECIALS}
    unk = ids.get("unk_token")

    def marker(text: str | None, what: str) -> int | None:
        if text is None:
            return None
        if text not in vocab:
            raise CheckpointError(f"{tokenizer}: the {what} {text!r} is not a token of the tokenizer; a ColBERT "
                                  "folder's tokenizer holds its marker tokens")
        return vocab[text]

    def word_id(word: str) -> int | None:
        if spec.skiplist_by_encoding:  # colbert-ai: tokenizer.encode(word, add_special_tokens=False)[0]
            found = encoder.plain_ids(word)
            return found[0] if found else None
        return vocab.get(word, unk)

    expansion = None
    if spec.expansion:
        expansion = next((ids[r] for r in ("mask_token", "eos_token", "pad_token") if ids.get(r) is not None), None)
        if expansion is None:
            raise CheckpointError(f"{tokenizer}: query expansion pads with the mask token (else eos, else pad); "
                                  "the tokenizer names none of them")
    skiplist = sorted({i for i in map(word_id, spec.skiplist_words) if i is not None})
    sparse_skip = sorted({ids[r] for r in spec.sparse_skip if ids.get(r) is not None})
    late = LateInteraction(marker(spec.query_prefix, "query marker"), marker(spec.document_prefix, "document marker"),
                           spec.query_length, spec.document_length, expansion, spec.attend_to_expansion,
                           tuple(skiplist), spec.skip_first, tuple(sparse_skip))
    beyond = [i for i in late.ids() if i >= vocab_size]
    if beyond:
        raise CheckpointError(f"{tokenizer}: late-interaction token ids {beyond[:5]} are past the model's "
                              f"vocab_size={vocab_size}")
    return late
