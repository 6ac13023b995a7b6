"""A served model's text side: requests' inputs turned into token-id sequences and prepared
(``Runtime.prepare``: validated once, as the request arrives, so one client's bad input is its own
422; the queue then joins prepared requests into model calls without checking them again),
/tokenize's tokens and /decode's texts.

Every method here may take long (a 2 MB text) and holds the tokenizer's lock: the served
model's operations call them on a worker thread, never on the event loop.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import contract
from ..core.errors import InputError, SequenceError
from ..runtime import PreparedBatch, Runtime
from .errors import ServeError, bad_request, cannot_serve, empty, validation

# the most tokens one /tokenize request returns: about 1 MB of English text, and ~16 MB of JSON
TOKENIZE_MAX_TOKENS = 262_144


@dataclass
class Encoded:
    """A request's inputs as the model takes them: token ids (len_i,) int64 and, for text
    pairs, their token types (None: zeros); ``batch``, once prepared, the same sequences
    validated for the request's output (what the queue runs)."""
    ids: list[np.ndarray]
    types: list[np.ndarray | None]
    # late interaction (runtime/late.py's prepare): each text's own attention (query expansion
    # tokens may be unattended) and the tokens whose vectors it keeps; None for other models
    attention: list[np.ndarray] | None = None
    keep: list[np.ndarray] | None = None
    # a model with task adapters: the task index of every input (None: the default task)
    tasks: list[int] | None = None
    batch: PreparedBatch | None = None

    @property
    def tokens(self) -> int:
        return sum(len(s) for s in self.ids)


def _tokenizer_failed(exc: Exception) -> ServeError:
    return ServeError(f"tokenization failed: {str(exc)[:200]}", "tokenizer", failure="tokenization")


class TextSide:
    """The tokenizer and input rules of a served model (``name``, ``runtime``)."""

    def __init__(self, name: str, runtime: Runtime):
        self.name = name
        self.runtime = runtime
        self.max_input_length: int = runtime.text_max_length
        self.encoder = None
        if runtime.tokenizer_path() is not None:
            from ..config.text import TextEncoder

            self.encoder = TextEncoder(runtime.tokenizer_path(), runtime.text_lowercase)

    def _encoder(self):
        if self.encoder is None:
            why = self.runtime.text_problem or "the model names no tokenizer in its metadata"
            raise cannot_serve(self.name, "text inputs", f"{why}; send token ids instead")
        return self.encoder

    def prompt(self, name: str | None) -> str:
        """The prompt text for `name` (None: the model's default prompt), or 422 (TEI's
        validation) naming the valid ones."""
        if name not in (None, "") and name not in self.runtime.prompts:
            valid = ", ".join(repr(p) for p in sorted(self.runtime.prompts)) or "none (the model records no prompts)"
            raise validation(f"`prompt_name` {name[:40]!r} is not a prompt of model {self.name!r}; valid: {valid}")
        return self.runtime.prompt_text(name)

    def task(self, task: str | None, prompt_name: str | None) -> tuple[int | None, str | None]:
        """(task index or None, prompt name) of a request, by Runtime.task_and_prompt's rule (a task's
        own prompt, a prompt_name that names a task picks it); 422 naming the valid tasks."""
        try:
            task, prompt_name = self.runtime.task_and_prompt(task, prompt_name)
        except InputError:  # its message names the file's path, which a client is not told
            raise validation(f"`task` {task[:40]!r} selects a task adapter; model {self.name!r} has none") from None
        if task is None:
            return None, prompt_name
        tasks = self.runtime.config.adapters.tasks
        if task not in tasks:
            raise validation(f"`task` {task[:40]!r} is not a task of model {self.name!r}; valid: "
                             + ", ".join(repr(t) for t in tasks))
        return tasks.index(task), prompt_name

    def encode(self, inputs: list, output: str, *, truncate: bool, direction: str | None = None,
               prompt_name: str | None = None, pairs: list[str | None] | None = None, task: str | None = None) -> Encoded:
        """Texts (with their pairs, if any) and token-id lists as sequences of at most
        max_input_length tokens, prepared for `output`: longer ones are cut at `direction`'s end
        ("left" / "right"; None: the tokenizer's own side) when `truncate`, else refused (422, TEI's
        validation); ids the model does not take are a 422 naming the input (``prepared``)."""
        given_texts = {i for i, x in enumerate(inputs) if isinstance(x, str)}
        if self.runtime.rerank_template is not None:  # an LLM reranker: each (query, document) is one prompt
            inputs, pairs = self._rerank_prompts(inputs, pairs), None
        task_index, prompt_name = self.task(task, prompt_name)
        limit = self.max_input_length
        ids: list = [None] * len(inputs)
        types: list = [None] * len(inputs)
        texts = [i for i, x in enumerate(inputs) if isinstance(x, str)]
        if any(inputs[i] == "" for i in texts) or any(p == "" for p in pairs or ()):
            raise empty("`inputs` cannot be empty: an input is an empty text")
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
                    raise _tokenizer_failed(exc) from None
                if any(cut) and not truncate:
                    self._too_long(group[cut.index(True)])
                for i, row, row_type in zip(group, rows, row_types):
                    ids[i] = np.asarray(row, np.int64)
                    types[i] = np.asarray(row_type, np.int64) if second is not None and with_types else None
        for i, x in enumerate(inputs):
            if not isinstance(x, str):
                ids[i] = self._cut_ids(i, x, truncate, direction)
        encoded = Encoded(ids, types, tasks=None if task_index is None else [task_index] * len(inputs))
        return self.prepared(encoded, output, given_texts)

    def prepared(self, encoded: Encoded, output: str, texts: set[int] = frozenset()) -> Encoded:
        """`encoded` with its ``batch``: its sequences validated once for `output`
        (``Runtime.prepare``). An input the model does not take is this request's own 422:
        "validation" for the token ids a client sent, "tokenizer" for the ids of a text (an index in
        `texts`): the tokenizer gave a token the model never learned."""
        types = encoded.types
        # a request mixing pairs and single texts: the singles' type ids are prepare's default, zeros
        types = None if all(t is None for t in types) else [np.zeros_like(s) if t is None else t
                                                             for s, t in zip(encoded.ids, types)]
        try:
            encoded.batch = self.runtime.prepare(encoded.ids, output, token_types=types, attention=encoded.attention,
                                                 task=encoded.tasks)
        except SequenceError as exc:
            if exc.index in texts:
                # e.g. an added token the model never learned
                raise ServeError(f"input {exc.index}: the tokenizer gave model {self.name!r} ids it does not take: "
                                 f"{exc.detail}", "tokenizer", failure="tokenization") from None
            raise bad_request(f"input {exc.index} of model {self.name!r}: {exc.detail}") from None
        except InputError as exc:
            raise validation(f"model {self.name!r} does not take this request: {str(exc)[:300]}") from None
        return encoded

    def _rerank_prompts(self, inputs: list, pairs: list | None) -> list:
        """Each text input and its pair as the LLM reranker's templated prompt ids (token-id inputs
        pass as they are); 422 for a text without a pair."""
        pairs = pairs or [None] * len(inputs)
        if any(isinstance(x, str) and p is None for x, p in zip(inputs, pairs)):
            raise validation(f"model {self.name!r} is an LLM reranker: it scores [query, document] pairs "
                             "(/rerank, /v1/rerank, or /predict with pairs)")
        try:
            return [np.asarray(self.runtime.rerank_ids(x, [p], max_length=self.max_input_length)[0], dtype=np.int64)
                    if isinstance(x, str) else x for x, p in zip(inputs, pairs)]
        except InputError as exc:
            raise validation(str(exc)[:200]) from None

    def encode_late(self, inputs: list, kind: str, output: str) -> Encoded:
        """Texts as a late-interaction model reads them (runtime/late.py's prepare), prepared for
        `output`: the query or document marker, a query expanded to the query length, a document
        cut to its length, the vectors a text keeps. Lengths are the model's own, so `truncate`
        does not apply."""
        from ..contract.late import LateInteraction
        from ..runtime.late import prepare

        if not all(isinstance(x, str) for x in inputs):
            raise validation(f"model {self.name!r} is a late-interaction model: its inputs are texts, not token ids")
        if any(x == "" for x in inputs):
            raise empty("`inputs` cannot be empty: an input is an empty text")
        try:
            ids, attention, keep = prepare(self._encoder(), inputs, self.runtime.late or LateInteraction(), kind,
                                           self.max_input_length, self.runtime.config.max_sequence)
        except InputError as exc:
            raise _tokenizer_failed(exc) from None
        return self.prepared(Encoded(ids, [None] * len(ids), attention, keep), output, set(range(len(ids))))

    def _too_long(self, index: int):
        raise validation(f"input {index} is longer than the model's max_input_length={self.max_input_length} tokens; "
                         "send \"truncate\": true, or start the server with --auto-truncate")

    def _cut_ids(self, index: int, ids: np.ndarray, truncate: bool, direction: str | None) -> np.ndarray:
        """Token ids (int64, as requests.py parsed them) as given, no special tokens added, cut
        like a text (``prepared`` then checks them against the model)."""
        if len(ids) > self.max_input_length:
            if not truncate:
                self._too_long(index)
            ids = ids[-self.max_input_length:] if direction == "left" else ids[:self.max_input_length]
        return ids

    def tokens(self, texts: list[str], add_special_tokens: bool, prompt_name: str | None) -> list[list[dict]]:
        """TEI's /tokenize: per text [{id, text, special, start, stop}]; a special token's text
        is the token itself and its start / stop null, another's the characters it covers.
        422 when the texts hold more than TOKENIZE_MAX_TOKENS tokens in all (the answer's bound)."""
        prefix = self.prompt(prompt_name)
        encoder = self._encoder()
        texts = [prefix + t for t in texts]
        try:
            tokenized = encoder.tokens(texts, add_special_tokens)
        except (InputError, ValueError, TypeError) as exc:
            raise _tokenizer_failed(exc) from None
        total = sum(len(t) for t in tokenized)
        if total > TOKENIZE_MAX_TOKENS:
            raise validation(f"the texts hold {total} tokens, more than /tokenize returns in one answer "
                             f"({TOKENIZE_MAX_TOKENS}); send less text per request", failure="batch_size")
        out = []
        for text, tokens in zip(texts, tokenized):
            out.append([{"id": i, "text": token, "special": True, "start": None, "stop": None} if special else
                        {"id": i, "text": text[start:stop], "special": False, "start": start, "stop": stop}
                        for i, token, special, start, stop in tokens])
        return out

    def decode_ids(self, ids: list[np.ndarray], skip_special_tokens: bool) -> list[str]:
        """TEI's /decode: each id list's text. Ids past the tokenizer's vocabulary are a 422."""
        encoder = self._encoder()
        size = encoder.vocab_size
        for i, row in enumerate(ids):
            if len(row) and int(row.max()) >= size:
                raise bad_request(f"`ids` {'' if len(ids) == 1 else f'[{i}] '}holds token id {int(row.max())}, "
                                  f"past the tokenizer's vocabulary of {size}")
        try:
            return encoder.decode(ids, skip_special_tokens)
        except Exception as exc:  # tokenizers raises its own exception types
            raise _tokenizer_failed(exc) from None
