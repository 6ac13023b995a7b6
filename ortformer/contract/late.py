"""How texts become late-interaction vectors and sparse weights: the ``ortformer.late_interaction``
metadata (torch-free), written at export from the folder's settings and read by the runtime.

A ColBERT query (PyLate, colbert-ai) is ``[CLS] [Q] tokens [SEP]`` truncated to query_length and
padded to it with the expansion token ([MASK]), which the other tokens attend to only with
attend_to_expansion; every one of its query_length vectors is kept. A document is
``[CLS] [D] tokens [SEP]`` truncated to document_length; its padding and the skiplist's ids
(punctuation) are dropped. bge-m3 has no markers and drops its first token's vector (the CLS);
its sparse weights drop the ids of sparse_skip (cls, eos, pad, unk).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

from ..core.checks import is_int, json_object


@dataclass(frozen=True)
class LateInteraction:
    query_marker: int | None = None  # id put after a query's first token (PyLate's "[Q] ", colbert-ai's [unused0])
    document_marker: int | None = None  # the same for documents ("[D] ", [unused1])
    query_length: int | None = None  # a query's tokens, marker included: truncated to it, padded to it on expansion
    document_length: int | None = None  # a document's tokens, marker included (None: the text length)
    expansion_id: int | None = None  # the id queries are padded with ([MASK]); None: no query expansion
    attend_to_expansion: bool = False  # the expansion tokens are attended to (attention mask 1)
    skiplist: tuple[int, ...] = ()  # document ids whose vectors are dropped (punctuation)
    skip_first: bool = False  # drop every text's first vector (bge-m3: the CLS)
    sparse_skip: tuple[int, ...] = ()  # ids whose sparse weights are dropped (bge-m3: cls, eos, pad, unk)

    def __post_init__(self) -> None:
        for name in ("query_marker", "document_marker", "expansion_id"):
            _check_id(name, getattr(self, name), none_ok=True)
        for name in ("query_length", "document_length"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or value < 3):
                raise ValueError(f"{name}={value!r} must be null or an int >= 3 (a first token, a marker, a last one)")
        for name in ("attend_to_expansion", "skip_first"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be true or false")
        for name in ("skiplist", "sparse_skip"):
            value = getattr(self, name)
            if not isinstance(value, (list, tuple)):
                raise ValueError(f"{name} must be a list of token ids, got {type(value).__name__}")
            for item in value:
                _check_id(name, item)
            object.__setattr__(self, name, tuple(value))
        if self.expansion_id is not None and self.query_length is None:
            raise ValueError("expansion_id pads queries to query_length: set query_length too, or expansion_id null")
        if self.attend_to_expansion and self.expansion_id is None:
            raise ValueError("attend_to_expansion needs expansion_id (the token queries are padded with)")

    def ids(self) -> list[int]:
        """Every token id named, to check against the model's vocabulary."""
        named = [self.query_marker, self.document_marker, self.expansion_id]
        return [i for i in named if i is not None] + list(self.skiplist) + list(self.sparse_skip)

    def to_json(self) -> str:
        return json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "LateInteraction":
        """The settings of a META_LATE value; ValueError naming the problem."""
        data = json_object(text, "the value")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown key(s) {unknown}; valid: {', '.join(sorted(known))}")
        return cls(**data)


def _check_id(name: str, value, none_ok: bool = False) -> None:
    if value is None and none_ok:
        return
    if not is_int(value) or value < 0:
        raise ValueError(f"{name}: {value!r} is not a token id (an int >= 0)")
