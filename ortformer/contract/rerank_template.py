"""How an LLM yes/no reranker (Qwen3-Reranker, mxbai-rerank-v2) reads a (query, document) pair:
its prompt template, recorded in the model file (contract.META_RERANK) and applied by
``Runtime.rerank`` and serve's /rerank and /predict. Torch-free.

The text is a list of segments, each tokenized on its own (without special tokens) and the ids
joined, as the model cards build their inputs. A segment may hold the slots ``{instruction}``,
``{query}`` and ``{document}``: ``{query}`` and ``{document}`` take the texts, ``{instruction}``
takes ``instruction_format`` with the instruction (the card's default when none is given) or
nothing when the instruction is empty. When the ids pass the length limit, the segment
``truncate`` is cut at its end, as the cards truncate the pair and keep the template's tail.

The exported graph's ``logits`` (B, 1) are d = z_yes - z_no, the LM head's "yes" and "no" logits
at the last kept token; the card's score is ``score``(d): "sigmoid" = softmax over [no, yes] ->
P(yes) (Qwen3-Reranker), "logit" = d itself (mxbai-rerank-v2's z_1 - z_0).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

SLOT = re.compile(r"\{(instruction|query|document)\}")
SCORES = ("sigmoid", "logit")


@dataclass(frozen=True)
class RerankTemplate:
    segments: tuple[str, ...]
    instruction: str = ""  # the default instruction ("" = none)
    instruction_format: str = "{instruction}"  # what fills {instruction} when there is one
    truncate: int = 0  # the segment cut at its end when the ids are too long
    score: str = "sigmoid"  # score(d), d = z_yes - z_no: "sigmoid" (P(yes)) or "logit" (d)
    yes: str = "yes"  # the tokens whose logits the graph reads (for info; the graph holds their rows)
    no: str = "no"

    def __post_init__(self) -> None:
        if not (isinstance(self.segments, tuple) and self.segments and all(isinstance(s, str) for s in self.segments)):
            raise ValueError("segments must be a non-empty list of strings")
        for name in ("instruction", "instruction_format", "yes", "no"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string")
        if self.instruction_format.count("{instruction}") != 1:
            raise ValueError("instruction_format must hold the slot {instruction} once")
        slots = [m[1] for s in self.segments for m in SLOT.finditer(s)]
        if sorted(slots) != sorted(set(slots)) or not {"query", "document"} <= set(slots):
            raise ValueError(f"the segments must hold {{query}} and {{document}} once each (and {{instruction}} at "
                             f"most once); they hold {slots}")
        if isinstance(self.truncate, bool) or not isinstance(self.truncate, int) \
                or not 0 <= self.truncate < len(self.segments):
            raise ValueError(f"truncate={self.truncate!r} must be a segment index, 0..{len(self.segments) - 1}")
        if self.score not in SCORES:
            raise ValueError(f"score={self.score!r} is not one of {SCORES}")

    def to_json(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True)
        RerankTemplate.from_json(text)
        return text

    @classmethod
    def from_json(cls, text: str) -> "RerankTemplate":
        """The template of a META_RERANK value; ValueError naming the problem."""
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"not valid JSON: {exc}") from None
        names = set(cls.__dataclass_fields__)
        if not isinstance(data, dict) or not set(data) <= names or "segments" not in data:
            raise ValueError(f"must be a JSON object with \"segments\" and at most the keys {sorted(names)}")
        if not isinstance(data["segments"], list):
            raise ValueError("segments must be a non-empty list of strings")
        return cls(**{**data, "segments": tuple(data["segments"])})

    def texts(self, query: str, document: str, instruction: str | None = None) -> list[str]:
        """The segments with their slots filled (in one pass: a text holding "{document}" stays as it is)."""
        instruction = self.instruction if instruction is None else instruction
        values = {"query": query, "document": document,
                  "instruction": self.instruction_format.replace("{instruction}", instruction) if instruction else ""}
        return [SLOT.sub(lambda m: values[m[1]], segment) for segment in self.segments]

    def ids(self, tokenize: Callable[[str], list[int]], query: str, document: str, max_length: int,
            instruction: str | None = None) -> list[int]:
        """The model's input ids for one pair: each segment tokenized alone, the ``truncate`` segment cut
        at its end so the whole holds at most ``max_length`` ids; ValueError when the fixed segments
        alone are longer."""
        parts = [tokenize(text) for text in self.texts(query, document, instruction)]
        fixed = sum(len(p) for i, p in enumerate(parts) if i != self.truncate)
        if fixed >= max_length:
            raise ValueError(f"the reranker's template takes {fixed} tokens besides the text it truncates; "
                             f"max_length={max_length} leaves no room")
        parts[self.truncate] = parts[self.truncate][:max_length - fixed]
        return [i for part in parts for i in part]

    def scores(self, d: Sequence[float]) -> list[float]:
        """The card's score of each d = z_yes - z_no."""
        if self.score == "logit":
            return [float(x) for x in d]
        return [1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x)) for x in map(float, d)]
