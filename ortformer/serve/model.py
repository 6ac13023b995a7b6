"""One served model: its Runtime, its tokenizer, what it can answer, and requests turned
into validated token-id sequences (the queue then batches them into Runtime.embed calls)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import contract
from ..errors import InputError, ModelFileError
from ..runtime import Runtime
from .errors import ServeError, bad_request, cannot_serve, validation


@dataclass
class Encoded:
    """A request's inputs as the model takes them: token ids (len_i,) int64 and, for text
    pairs, their token types (None: zeros)."""
    ids: list[np.ndarray]
    types: list[np.ndarray | None]
    # late interaction (runtime/late.py's prepare): each text's own attention (query expansion
    # tokens may be unattended) and the tokens whose vectors it keeps; None for other models
    attention: list[np.ndarray] | None = None
    keep: list[np.ndarray] | None = None
    # a model with task adapters: the task index of every input (None: the default task)
    tasks: list[int] | None = None

    @property
    def tokens(self) -> int:
        return sum(len(s) for s in self.ids)


def _kind(runtime: Runtime) -> str:
    """TEI's model_type, from the outputs: "sparse" (SPLADE), "classifier" / "reranker" (a
    per-sequence head with several labels / one), "embedding" (pools), else "tokens"."""
    cfg = runtime.config
    if cfg.sparse:
        return "sparse"
    if contract.LOGITS in runtime.output_names and not cfg.per_token_logits:
        return "reranker" if cfg.num_labels == 1 else "classifier"
    return "embedding" if runtime.pools else "tokens"


class ServedModel:
    """A Runtime behind the routes. ``name`` is what requests and metrics call it."""

    def __init__(self, name: str, runtime: Runtime):
        if not runtime.config.takes_ids:
            raise ModelFileError(f"{runtime.path} takes float features (vocab_size=0); serve needs a token-id "
                                 "model with a tokenizer")
        self.name = name
        self.runtime = runtime
        self.kind = _kind(runtime)
        self.max_input_length: int = runtime.text_max_length
        self.encoder = None
        if runtime.tokenizer_path() is not None:
            from ..text import TextEncoder

            self.encoder = TextEncoder(runtime.tokenizer_path(), runtime.text_lowercase)
        # ColBERT / bge-m3: per-token vectors or lexical weights, read through runtime/late.py
        self.late_interaction = bool({contract.TOKEN_EMBEDDINGS, contract.SPARSE} & set(runtime.output_names))
        self.labels = runtime.labels or [f"LABEL_{i}" for i in range(runtime.config.num_labels)]

    # what each route needs of the model ------------------------------------------------------

    def require(self, route: str) -> str:
        """The output `route` reads, or 424 when this model has none to give."""
        kind = self.kind
        if kind in ("classifier", "reranker") and route.startswith(("/embed", "/v1")):
            raise cannot_serve(self.name, route, f"it is a {kind}, not an embedding model; use /predict"
                               + (" or /rerank" if kind == "reranker" else ""))
        if route == "/v1/embeddings" and kind == "sparse":  # it normalizes, which TEI refuses for SPLADE
            raise cannot_serve(self.name, route, "it is a SPLADE model; use /embed_sparse")
        if route in ("/embed", "/v1/embeddings"):
            if not self.runtime.pools:
                raise cannot_serve(self.name, route, "it gives no pooled sentence_embedding; use /embed_all")
            return contract.SENTENCE_EMBEDDING
        if route == "/embed_sparse" and contract.SPARSE in self.runtime.output_names:
            return contract.SPARSE  # bge-m3's lexical weights
        if route == "/embed_all" and contract.TOKEN_EMBEDDINGS in self.runtime.output_names:
            return contract.TOKEN_EMBEDDINGS  # ColBERT's vectors: projected, normalised, skiplist applied
        if route == "/embed_sparse":
            if kind != "sparse":
                raise cannot_serve(self.name, route, "it is not an embedding model with SPLADE pooling")
            return contract.SENTENCE_EMBEDDING
        if route == "/embed_all":
            if kind == "sparse":  # as TEI: a SPLADE model's token states are not its output
                raise cannot_serve(self.name, route, "it is a SPLADE model; use /embed_sparse")
            return contract.LAST_HIDDEN_STATE
        if route == "/predict":
            if kind not in ("classifier", "reranker"):
                raise cannot_serve(self.name, route, "it is not a sequence classifier (no per-sequence logits)")
            return contract.LOGITS
        if route == "/rerank":
            if kind != "reranker":
                raise cannot_serve(self.name, route, "it is not a re-ranker (a classifier with one label)")
            return contract.LOGITS
        raise ValueError(route)

    def info_type(self) -> dict:
        """TEI's Info.model_type."""
        if self.kind in ("classifier", "reranker"):
            id2label = {str(i): label for i, label in enumerate(self.labels)}
            return {self.kind: {"id2label": id2label, "label2id": {v: int(k) for k, v in id2label.items()}}}
        return {"embedding": {"pooling": self.runtime.config.pooling}}

    @property
    def dtype(self) -> str:
        return "int8" if contract.META_INT8 in self.runtime.metadata else str(self.runtime.parity.get("dtype", "float32"))

    # requests -> sequences ---------------------------------------------------------------------

    def _encoder(self):
        if self.encoder is None:
            why = self.runtime.text_problem or "the model names no tokenizer in its metadata"
            raise cannot_serve(self.name, "text inputs", f"{why}; send token ids instead")
        return self.encoder

    def prompt(self, name: str | None) -> str:
        """The prompt text for `name` (None: the model's default prompt), or 413 (TEI's
        validation) naming the valid ones."""
        if name not in (None, "") and name not in self.runtime.prompts:
            valid = ", ".join(repr(p) for p in sorted(self.runtime.prompts)) or "none (the model records no prompts)"
            raise validation(f"prompt_name={name!r} is not a prompt of model {self.name!r}; valid: {valid}")
        return self.runtime.prompt_text(name)

    def task(self, task: str | None, prompt_name: str | None) -> tuple[int | None, str | None]:
        """(task index or None, prompt name) of a request: Runtime.embed_texts' rule (a task's own prompt,
        a prompt_name that names a task picks it); 413 naming the valid tasks."""
        adapters = self.runtime.config.adapters
        if adapters is None:
            if task is not None:
                raise validation(f"task={task!r} selects a task adapter; model {self.name!r} has none")
            return None, prompt_name
        if task is None and prompt_name in adapters.tasks:
            task = prompt_name
        if task is not None and task not in adapters.tasks:
            raise validation(f"task={task!r} is not a task of model {self.name!r}; valid: "
                             + ", ".join(repr(t) for t in adapters.tasks))
        if task is not None and prompt_name is None and task in self.runtime.prompts:
            prompt_name = task
        return (None if task is None else adapters.tasks.index(task)), prompt_name

    def encode(self, inputs: list, *, truncate: bool, direction: str | None = None, prompt_name: str | None = None,
               pairs: list[str | None] | None = None, task: str | None = None) -> Encoded:
        """Texts (with their pairs, if any) and token-id lists as sequences of at most
        max_input_length tokens: longer ones are cut at `direction`'s end ("left" / "right";
        None: the tokenizer's own side) when `truncate`, else refused (413, TEI's validation)."""
        limit = self.max_input_length
        task_index, prompt_name = self.task(task, prompt_name)
        ids: list = [None] * len(inputs)
        types: list = [None] * len(inputs)
        texts = [i for i, x in enumerate(inputs) if isinstance(x, str)]
        if any(inputs[i] == "" for i in texts):
            raise validation("`inputs` cannot be empty: an input is an empty text")
        if texts:
            encoder = self._encoder()
            prefix = self.prompt(prompt_name) if pairs is None else ""
            with_types = contract.TOKEN_TYPE_IDS in self.runtime.input_names
            groups = [[i for i in texts if pairs is None or pairs[i] is None]]
            if pairs is not None:
                groups.append([i for i in texts if pairs[i] is not None])
            for group in filter(None, groups):
                second = None if pairs is None or pairs[group[0]] is None else [pairs[i] for i in group]
                try:
                    rows, row_types, cut = encoder.encode_rows([prefix + inputs[i] for i in group], limit, second,
                                                               direction or encoder.truncation_side)
                except InputError as exc:
                    raise ServeError(f"tokenization failed: {exc}", "tokenizer", failure="tokenization") from None
                if any(cut) and not truncate:
                    self._too_long(group[cut.index(True)])
                for i, row, row_type in zip(group, rows, row_types):
                    ids[i] = np.asarray(row, np.int64)
                    types[i] = np.asarray(row_type, np.int64) if second is not None and with_types else None
                    if ids[i].max() >= self.runtime.config.vocab_size:  # an added token the model never learned
                        raise ServeError(f"input {i} holds a token (id {int(ids[i].max())}) past the model's "
                                         f"vocabulary of {self.runtime.config.vocab_size}", "tokenizer",
                                         failure="tokenization")
        for i, x in enumerate(inputs):
            if not isinstance(x, str):
                ids[i] = self._checked_ids(i, x, truncate, direction)
        return Encoded(ids, types, tasks=None if task_index is None else [task_index] * len(inputs))

    def encode_late(self, inputs: list, kind: str) -> Encoded:
        """Texts as a late-interaction model reads them (runtime/late.py's prepare): the query or
        document marker, a query expanded to the query length, a document cut to its length, the
        vectors a text keeps. Lengths are the model's own, so `truncate` does not apply."""
        from ..late import LateInteraction
        from ..runtime.late import prepare

        if not all(isinstance(x, str) for x in inputs):
            raise validation(f"model {self.name!r} is a late-interaction model: its inputs are texts, not token ids")
        if any(x == "" for x in inputs):
            raise validation("`inputs` cannot be empty: an input is an empty text")
        try:
            ids, attention, keep = prepare(self._encoder(), inputs, self.runtime.late or LateInteraction(), kind,
                                           self.max_input_length, self.runtime.config.max_sequence)
        except InputError as exc:
            raise ServeError(f"tokenization failed: {exc}", "tokenizer", failure="tokenization") from None
        return Encoded(ids, [None] * len(ids), attention, keep)

    def _too_long(self, index: int):
        raise validation(f"input {index} is longer than the model's max_input_length={self.max_input_length} tokens; "
                         "send \"truncate\": true, or start the server with --auto-truncate")

    def _checked_ids(self, index: int, ids: np.ndarray, truncate: bool, direction: str | None) -> np.ndarray:
        """Token ids (int64, as requests.py parsed them) as given, no special tokens added:
        in [0, vocab_size), cut like a text."""
        vocab = self.runtime.config.vocab_size
        if ids.min() < 0 or ids.max() >= vocab:
            raise bad_request(f"input {index}: token ids must be in [0, {vocab}) for model {self.name!r}")
        if len(ids) > self.max_input_length:
            if not truncate:
                self._too_long(index)
            ids = ids[-self.max_input_length:] if direction == "left" else ids[:self.max_input_length]
        return ids

    def tokens(self, texts: list[str], add_special_tokens: bool, prompt_name: str | None) -> list[list[dict]]:
        """TEI's /tokenize: per text [{id, text, special, start, stop}]; a special token's text
        is the token itself and its start / stop null, another's the characters it covers."""
        prefix = self.prompt(prompt_name)
        encoder = self._encoder()
        texts = [prefix + t for t in texts]
        out = []
        for text, tokens in zip(texts, encoder.tokens(texts, add_special_tokens)):
            out.append([{"id": i, "text": token, "special": True, "start": None, "stop": None} if special else
                        {"id": i, "text": text[start:stop], "special": False, "start": start, "stop": stop}
                        for i, token, special, start, stop in tokens])
        return out
