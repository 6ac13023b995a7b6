"""Request bodies of the routes, checked field by field as TEI's (serde) types read them.

An input is a text or a list of token ids; ``inputs`` is one input or a list of them (TEI's
``Input``: a list of ints is ONE input of ids, a list of texts or id lists is a batch).
A body that is not the route's request is a 422 naming the field and what is valid.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from ..checks import is_int, json_object
from .errors import bad_request, empty
from .outputs import ENCODING_FORMATS

DIRECTIONS = {"Left": "left", "Right": "right"}  # TEI's TruncationDirection, as serde spells it


def parse_json(raw: bytes) -> dict:
    return json_object(raw, "the request body", bad_request)


def _ids(value) -> bool:
    """A list of token ids (its first item an int: the rest is checked as an array)."""
    return isinstance(value, list) and bool(value) and is_int(value[0])


def _id_array(name: str, value: list) -> np.ndarray:
    """The ids as an int64 array, without a Python loop over them; 422 for anything but ints
    that fit (numpy makes a float, object or string array of those)."""
    try:
        array = np.asarray(value)
    except (ValueError, OverflowError):  # ragged nesting
        array = None
    if array is None or array.ndim != 1 or array.dtype.kind not in "iu" or (array.dtype.kind == "u" and array.max() >= 2**63):
        raise bad_request(f"`{name}` must hold token ids: ints in [0, 2^63)")
    return array.astype(np.int64, copy=False)


def _get(body: dict, name: str, kinds: tuple, default, what: str):
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
        raise bad_request(f"`{name}` must be {what}, got {json.dumps(value)[:80]}")
    return value


def _inputs(body: dict, name: str) -> tuple[list, bool]:
    """(inputs, single): one text or id list, or a list of them."""
    if name not in body:
        raise bad_request(f"missing field `{name}`: give a text, a list of texts, or token ids")
    value = body[name]
    if isinstance(value, str):
        return [value], True
    if _ids(value):
        return [_id_array(name, value)], True
    if not isinstance(value, list):
        raise bad_request(f"`{name}` must be a text, a list of texts, a list of token ids or a list of them, "
                          f"got {type(value).__name__}")
    if not value:
        raise empty(f"`{name}` cannot be empty")
    inputs = []
    for i, item in enumerate(value):
        if not (isinstance(item, str) or _ids(item)):
            raise bad_request(f"`{name}[{i}]` must be a text or a non-empty list of token ids (ints), "
                              f"got {json.dumps(item)[:80]}")
        inputs.append(item if isinstance(item, str) else _id_array(f"{name}[{i}]", item))
    return inputs, False


def _texts(body: dict, name: str) -> tuple[list[str], bool]:
    value = body.get(name)
    if isinstance(value, str):
        return [value], True
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise bad_request(f"`{name}` must be a text or a list of texts")
    if not value:
        raise empty(f"`{name}` cannot be empty")
    return value, False


def _direction(body: dict) -> str | None:
    value = body.get("truncation_direction")
    if value is None:
        return None
    if value not in DIRECTIONS:
        raise bad_request(f"`truncation_direction` must be \"Left\" or \"Right\", got {json.dumps(value)[:40]}")
    return DIRECTIONS[value]


@dataclass
class TextOptions:
    """What every tokenizing route shares."""
    truncate: bool | None = None  # None: --auto-truncate decides
    direction: str | None = None  # "left" / "right"; None: "right", as TEI's default
    prompt_name: str | None = None
    model: str | None = None
    task: str | None = None  # a model with task adapters: the adapter (None: prompt_name's task, else the default)


def _text_options(body: dict, prompts: bool = True) -> TextOptions:
    return TextOptions(truncate=_get(body, "truncate", (bool,), None, "true or false"),
                       direction=_direction(body),
                       prompt_name=_get(body, "prompt_name", (str,), None, "a prompt name") if prompts else None,
                       model=_get(body, "model", (str,), None, "a model name"),
                       task=_get(body, "task", (str,), None, "a task name") if prompts else None)


@dataclass
class EmbedRequest:
    inputs: list
    single: bool
    options: TextOptions
    normalize: bool = True
    dimensions: int | None = None
    encoding_format: str = "float"
    kind: str | None = None  # late interaction: "query" or "document" (None: document)


LATE_KINDS = ("query", "document")


def _late_kind(body: dict) -> str | None:
    value = _get(body, "kind", (str,), None, '"query" or "document"')
    if value is not None and value not in LATE_KINDS:
        raise bad_request(f'`kind` must be "query" or "document" (late-interaction models), got {json.dumps(value)[:40]}')
    return value


def _dimensions(body: dict) -> int | None:
    value = _get(body, "dimensions", (int,), None, "a positive int")
    if value is not None and value < 1:
        raise bad_request(f"`dimensions` must be a positive int, got {value}")
    return value


def embed_request(body: dict) -> EmbedRequest:
    """/embed, /embed_sparse, /embed_all (which ignore normalize and dimensions); `kind` (beyond
    TEI) says whether a late-interaction model embeds queries or documents."""
    inputs, single = _inputs(body, "inputs")
    return EmbedRequest(inputs, single, _text_options(body),
                        normalize=_get(body, "normalize", (bool,), True, "true or false"),
                        dimensions=_dimensions(body), kind=_late_kind(body))


def openai_request(body: dict) -> EmbedRequest:
    """/v1/embeddings: input, model, encoding_format, dimensions (user is accepted and unused), and
    ortformer's prompt_name and task.
    Vectors are normalized, as TEI's OpenAI route does; truncation follows --auto-truncate."""
    inputs, single = _inputs(body, "input")
    encoding = _get(body, "encoding_format", (str,), "float", "a string")
    if encoding not in ENCODING_FORMATS:
        raise bad_request(f"`encoding_format` must be one of {', '.join(ENCODING_FORMATS)}, got {encoding!r}")
    # beyond OpenAI's fields: prompt_name and task (a model with task adapters), as /embed takes them
    options = TextOptions(model=_get(body, "model", (str,), None, "a model name"),
                          prompt_name=_get(body, "prompt_name", (str,), None, "a prompt name"),
                          task=_get(body, "task", (str,), None, "a task name"))
    return EmbedRequest(inputs, single, options, normalize=True, dimensions=_dimensions(body),
                        encoding_format=encoding)


@dataclass
class PredictRequest:
    texts: list[str]
    pairs: list[str | None] | None  # each input's second text (None: a single text); None: no pairs at all
    single: bool
    options: TextOptions
    raw_scores: bool = False


def predict_request(body: dict) -> PredictRequest:
    """TEI's PredictInput: "text", ["text", "pair"], or a batch [["text"], ["text", "pair"], ...]."""
    value = body.get("inputs")
    options = _text_options(body, prompts=False)
    raw = _get(body, "raw_scores", (bool,), False, "true or false")
    if isinstance(value, str):
        return PredictRequest([value], None, True, options, raw)
    if isinstance(value, list) and len(value) in (1, 2) and all(isinstance(v, str) for v in value):
        return PredictRequest([value[0]], value[1:] or None, True, options, raw)
    if not isinstance(value, list) or not all(isinstance(v, list) and len(v) in (1, 2)
                                               and all(isinstance(t, str) for t in v) for v in value):
        raise bad_request("`inputs` must be a text, a pair [text, text], or a batch [[text], [text, text], ...]")
    if not value:
        raise empty("`inputs` cannot be empty")
    pairs = [v[1] if len(v) == 2 else None for v in value]
    return PredictRequest([v[0] for v in value], pairs if any(p is not None for p in pairs) else None, False,
                          options, raw)


@dataclass
class RerankRequest:
    query: str
    texts: list[str]
    options: TextOptions
    raw_scores: bool = False
    return_text: bool = False


def rerank_request(body: dict) -> RerankRequest:
    query = body.get("query")
    if not isinstance(query, str):
        raise bad_request("`query` must be a text")
    texts = body.get("texts")
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise bad_request("`texts` must be a list of texts")
    if not texts:
        raise empty("`texts` cannot be empty")
    return RerankRequest(query, texts, _text_options(body, prompts=False),
                         raw_scores=_get(body, "raw_scores", (bool,), False, "true or false"),
                         return_text=_get(body, "return_text", (bool,), False, "true or false"))


@dataclass
class TokenizeRequest:
    texts: list[str]
    single: bool
    add_special_tokens: bool = True
    options: TextOptions = field(default_factory=TextOptions)


def tokenize_request(body: dict) -> TokenizeRequest:
    texts, single = _texts(body, "inputs")
    return TokenizeRequest(texts, single, _get(body, "add_special_tokens", (bool,), True, "true or false"),
                           _text_options(body))
