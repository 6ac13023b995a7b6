"""Request bodies of the routes, checked field by field as TEI 1.9's (serde) types read them,
and stricter where serde lets a mistake through.

An input is a text or a list of token ids; ``inputs`` is one input or a list of them (TEI's
``Input``: a list of ints is ONE input of ids, a list of texts or id lists is a batch).
A body that is not the route's request is a 422 naming the route's own field (``input`` on
/v1/embeddings, ``inputs.sentences[2]`` on /similarity) and what is valid, and echoing at most
a short prefix of what was sent. Refused beyond serde: a key given twice in one object, a
boolean where a number belongs (``[1, true]`` is not the ids [1, 1]), NaN and Infinity, and a
text holding a lone surrogate (``"\\ud800"``), which is no UTF-8 text. Unknown fields are
ignored, as TEI does. The parsed requests are plain dataclasses the served model's operations
take (model.py), whatever the transport.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from ..core.checks import brief, is_int
from .errors import bad_request, empty
from .model import LATE_KINDS, TextOptions
from .outputs import ENCODING_FORMATS


class _Duplicate(ValueError):
    pass


def _pairs(pairs: list) -> dict:
    """json's object_pairs_hook: a dict, or _Duplicate naming the first key given twice."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _Duplicate(key)
            seen.add(key)
    return out


def _constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def parse_json(raw: bytes) -> dict:
    """The body as a JSON object; 422 for invalid JSON (NaN and Infinity included), a key given
    twice in one object, or a body that is not an object."""
    try:
        data = json.loads(raw, object_pairs_hook=_pairs, parse_constant=_constant)
    except _Duplicate as exc:
        raise bad_request(f"the request body gives the key {brief(str(exc), 40)} twice in one object; "
                          "give each field once") from None
    except (TypeError, ValueError, RecursionError) as exc:
        raise bad_request(f"the request body is not valid JSON: {brief(str(exc), 120)}") from None
    if not isinstance(data, dict):
        raise bad_request(f"the request body must be a JSON object, got {_kind(data)}")
    return data


def _kind(value) -> str:
    return {dict: "an object", list: "a list", str: "a text", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def _shown(value) -> str:
    """What was sent, for a message: its JSON cut to 40 characters."""
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError):
        text = type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _text(name: str, value) -> str:
    """A text: a JSON string that is valid UTF-8 (no lone surrogate)."""
    if not isinstance(value, str):
        raise bad_request(f"`{name}` must be a text, got {_kind(value)} {_shown(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise bad_request(f"`{name}` holds a lone surrogate (\\u{ord(value[exc.start]):04x} at character "
                          f"{exc.start}), which no UTF-8 text can; send valid UTF-8") from None
    return value


def _texts(name: str, value) -> list[str]:
    if not isinstance(value, list):
        raise bad_request(f"`{name}` must be a list of texts, got {_kind(value)} {_shown(value)}")
    if not value:
        raise empty(f"`{name}` cannot be empty")
    return [_text(f"{name}[{i}]", v) for i, v in enumerate(value)]


def _list(body: dict, name: str, what: str) -> list:
    """A required, non-empty list field: 422 when missing or not a list, 400 when empty."""
    value = body.get(name)
    if value is None:
        raise bad_request(f"missing field `{name}`: give {what}")
    if not isinstance(value, list):
        raise bad_request(f"`{name}` must be {what}, got {_kind(value)} {_shown(value)}")
    if not value:
        raise empty(f"`{name}` cannot be empty")
    return value


def _ids(value) -> bool:
    """A list of token ids (its first item an int: the rest is checked as an array)."""
    return isinstance(value, list) and bool(value) and is_int(value[0])


def _id_array(name: str, value: list) -> np.ndarray:
    """The ids as an int64 array; 422 for anything but ints in [0, 2^32) (TEI's u32), booleans
    included (numpy would read [1, true] as [1, 1])."""
    try:
        array = np.asarray(value)
    except (ValueError, OverflowError):  # ragged nesting
        array = None
    if array is None or array.ndim != 1 or array.dtype.kind not in "iu" or any(type(v) is bool for v in value):
        raise bad_request(f"`{name}` must be a list of token ids (ints in [0, 2^32)), got {_shown(value)}")
    if array.min() < 0 or array.max() >= 2**32:
        raise bad_request(f"`{name}` must hold token ids in [0, 2^32), got {int(array.min() if array.min() < 0 else array.max())}")
    return array.astype(np.int64, copy=False)


def _get(body: dict, name: str, kinds: tuple, default, what: str, prefix: str = ""):
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
        raise bad_request(f"`{prefix}{name}` must be {what}, got {_kind(value)} {_shown(value)}")
    return _text(prefix + name, value) if isinstance(value, str) else value


def _inputs(body: dict, name: str) -> tuple[list, bool]:
    """(inputs, single): one text or id list, or a list of them."""
    if name not in body or body[name] is None:
        raise bad_request(f"missing field `{name}`: give a text, a list of texts, or token ids")
    value = body[name]
    if isinstance(value, str):
        return [_text(name, value)], True
    if _ids(value):
        return [_id_array(name, value)], True
    if not isinstance(value, list):
        raise bad_request(f"`{name}` must be a text, a list of texts, a list of token ids or a list of them, "
                          f"got {_kind(value)} {_shown(value)}")
    if not value:
        raise empty(f"`{name}` cannot be empty")
    inputs = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            inputs.append(_text(f"{name}[{i}]", item))
        elif _ids(item):
            inputs.append(_id_array(f"{name}[{i}]", item))
        else:
            raise bad_request(f"`{name}[{i}]` must be a text or a non-empty list of token ids (ints), "
                              f"got {_kind(item)} {_shown(item)}")
    return inputs, False


def _direction(body: dict, prefix: str = "") -> str | None:
    """TEI's TruncationDirection, in any case: "left" or "right"."""
    value = body.get("truncation_direction")
    if value is None:
        return None
    if not isinstance(value, str) or value.lower() not in ("left", "right"):
        raise bad_request(f"`{prefix}truncation_direction` must be \"left\" or \"right\" (any case), "
                          f"got {_kind(value)} {_shown(value)}")
    return value.lower()


def _text_options(body: dict, prompts: bool = True, prefix: str = "", model: dict | None = None) -> TextOptions:
    """truncate, truncation_direction, prompt_name (under `prefix`: /similarity's parameters)
    and the model name (in `model`, the top-level body; default `body`)."""
    return TextOptions(truncate=_get(body, "truncate", (bool,), None, "true or false", prefix),
                       direction=_direction(body, prefix),
                       prompt_name=_get(body, "prompt_name", (str,), None, "a prompt name", prefix) if prompts else None,
                       model=_get(body if model is None else model, "model", (str,), None, "a model name"),
                       task=_get(body, "task", (str,), None, "a task name", prefix) if prompts else None)


def _flag(body: dict, name: str, default: bool) -> bool:
    return _get(body, name, (bool,), default, "true or false")


@dataclass
class EmbedRequest:
    inputs: list
    single: bool
    options: TextOptions
    normalize: bool = True
    dimensions: int | None = None
    encoding_format: str = "float"
    kind: str | None = None  # late interaction: "query" or "document" (None: document)


def _late_kind(body: dict) -> str | None:
    value = _get(body, "kind", (str,), None, '"query" or "document"')
    if value is not None and value not in LATE_KINDS:
        raise bad_request(f'`kind` must be "query" or "document" (late-interaction models), got {_shown(value)}')
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
    return EmbedRequest(inputs, single, _text_options(body), normalize=_flag(body, "normalize", True),
                        dimensions=_dimensions(body), kind=_late_kind(body))


def openai_request(body: dict) -> EmbedRequest:
    """/v1/embeddings: input, model, encoding_format, dimensions (user is checked and unused), and
    ortformer's prompt_name and task.
    Vectors are normalized, as TEI's OpenAI route does; truncation follows --auto-truncate."""
    inputs, single = _inputs(body, "input")
    encoding = _get(body, "encoding_format", (str,), "float", "a string")
    if encoding not in ENCODING_FORMATS:
        raise bad_request(f"`encoding_format` must be one of {', '.join(ENCODING_FORMATS)}, got {_shown(encoding)}")
    _get(body, "user", (str,), None, "a text")
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


PREDICT_INPUTS = "`inputs` must be a text, a pair [text, text], or a batch [[text], [text, text], ...]"


def predict_request(body: dict) -> PredictRequest:
    """TEI's PredictInput: "text", ["text", "pair"], or a batch [["text"], ["text", "pair"], ...]."""
    value = body.get("inputs")
    options = _text_options(body, prompts=False)
    raw = _flag(body, "raw_scores", False)
    if isinstance(value, str):
        return PredictRequest([_text("inputs", value)], None, True, options, raw)
    if isinstance(value, list) and value and isinstance(value[0], str):
        if len(value) > 2:
            raise bad_request(f"{PREDICT_INPUTS}; got a list of {len(value)} texts")
        texts = [_text(f"inputs[{i}]", v) for i, v in enumerate(value)]
        return PredictRequest(texts[:1], texts[1:] or None, True, options, raw)
    if not isinstance(value, list):
        raise bad_request(f"{PREDICT_INPUTS}; got {_kind(value)} {_shown(value)}")
    if not value:
        raise empty("`inputs` cannot be empty")
    for i, item in enumerate(value):
        if not isinstance(item, list) or len(item) not in (1, 2):
            raise bad_request(f"`inputs[{i}]` must be [text] or [text, text], got {_kind(item)} {_shown(item)}")
    rows = [[_text(f"inputs[{i}][{j}]", t) for j, t in enumerate(item)] for i, item in enumerate(value)]
    pairs = [r[1] if len(r) == 2 else None for r in rows]
    return PredictRequest([r[0] for r in rows], pairs if any(p is not None for p in pairs) else None, False,
                          options, raw)


@dataclass
class RerankRequest:
    query: str
    texts: list[str]
    options: TextOptions
    raw_scores: bool = False
    return_text: bool = False
    top_n: int | None = None  # the Cohere / Jina shape only: the best top_n (None: all)
    cohere: bool = False  # answered as {"results": [{index, relevance_score, document}]}


def rerank_request(body: dict) -> RerankRequest:
    """TEI's /rerank (query, texts, raw_scores, return_text), or, when the body has
    `documents`, the Cohere / Jina shape (rerank_documents_request)."""
    if "documents" in body and "texts" not in body:
        return rerank_documents_request(body)
    if body.get("query") is None:
        raise bad_request("missing field `query`: give the text the texts are ranked against")
    query = _text("query", body["query"])
    if body.get("texts") is None:
        raise bad_request("missing field `texts`: give the list of texts to rank")
    return RerankRequest(query, _texts("texts", body["texts"]), _text_options(body, prompts=False),
                         raw_scores=_flag(body, "raw_scores", False), return_text=_flag(body, "return_text", False))


def rerank_documents_request(body: dict) -> RerankRequest:
    """/v1/rerank (Cohere, Jina, vLLM): query, documents (texts, or {"text": ...} objects),
    top_n, return_documents (default true, as Jina and vLLM), model, truncate."""
    if body.get("query") is None:
        raise bad_request("missing field `query`: give the text the documents are ranked against")
    query = _text("query", body["query"])
    documents = _list(body, "documents", "a list of texts")
    texts = []
    for i, doc in enumerate(documents):
        if isinstance(doc, dict):
            if "text" not in doc:
                raise bad_request(f"`documents[{i}]` is an object without `text`; give a text or {{\"text\": ...}}")
            doc = doc["text"]
        texts.append(_text(f"documents[{i}]" + (".text" if isinstance(documents[i], dict) else ""), doc))
    top_n = _get(body, "top_n", (int,), None, "a positive int")
    if top_n is not None and top_n < 1:
        raise bad_request(f"`top_n` must be a positive int, got {top_n}")
    return RerankRequest(query, texts, _text_options(body, prompts=False), raw_scores=False,
                         return_text=_flag(body, "return_documents", True), top_n=top_n, cohere=True)


@dataclass
class SimilarityRequest:
    source: str
    sentences: list[str]
    options: TextOptions


def similarity_request(body: dict) -> SimilarityRequest:
    """TEI's /similarity: inputs {source_sentence, sentences}, parameters {truncate,
    truncation_direction, prompt_name}."""
    inputs = body.get("inputs")
    if not isinstance(inputs, dict):
        raise bad_request("`inputs` must be an object {\"source_sentence\": text, \"sentences\": [text, ...]}, "
                          f"got {_kind(inputs)} {_shown(inputs)}")
    if inputs.get("source_sentence") is None:
        raise bad_request("missing field `inputs.source_sentence`")
    source = _text("inputs.source_sentence", inputs["source_sentence"])
    if inputs.get("sentences") is None:
        raise bad_request("missing field `inputs.sentences`")
    sentences = _texts("inputs.sentences", inputs["sentences"])
    parameters = body.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise bad_request(f"`parameters` must be an object, got {_kind(parameters)} {_shown(parameters)}")
    return SimilarityRequest(source, sentences, _text_options(parameters or {}, prefix="parameters.", model=body))


@dataclass
class TokenizeRequest:
    texts: list[str]
    single: bool
    add_special_tokens: bool = True
    options: TextOptions = field(default_factory=TextOptions)


def tokenize_request(body: dict) -> TokenizeRequest:
    value = body.get("inputs")
    if value is None:
        raise bad_request("missing field `inputs`: give a text or a list of texts")
    single = isinstance(value, str)
    texts = [_text("inputs", value)] if single else _texts("inputs", value)
    return TokenizeRequest(texts, single, _flag(body, "add_special_tokens", True),
                           TextOptions(prompt_name=_get(body, "prompt_name", (str,), None, "a prompt name"),
                                       model=_get(body, "model", (str,), None, "a model name")))


@dataclass
class DecodeRequest:
    ids: list[np.ndarray]
    single: bool
    skip_special_tokens: bool = True
    model: str | None = None


def decode_request(body: dict) -> DecodeRequest:
    """TEI's /decode: ids (one list of ids, or a list of them), skip_special_tokens (default true)."""
    value = _list(body, "ids", "a list of token ids or a list of them")
    single = not isinstance(value[0], list)
    ids = [_id_array("ids", value)] if single else [
        _id_array(f"ids[{i}]", v) if isinstance(v, list) and v else _bad_ids(i, v) for i, v in enumerate(value)]
    return DecodeRequest(ids, single, _flag(body, "skip_special_tokens", True),
                         _get(body, "model", (str,), None, "a model name"))


def _bad_ids(index: int, value) -> np.ndarray:
    raise bad_request(f"`ids[{index}]` must be a non-empty list of token ids, got {_kind(value)} {_shown(value)}")
