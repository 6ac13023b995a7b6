"""Text to token ids with a Hugging Face ``tokenizer.json`` (torch-free).

Needs the optional ``tokenizers`` package (``pip install '.[text]'`` in a clone); it is
imported when a TextEncoder is made, so importing this module never fails.
"""
from __future__ import annotations

import json
import threading
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path

from ..core.checks import check_int
from ..core.errors import InputError, ModelFileError, require


class TruncationWarning(UserWarning):
    """Some texts were longer than max_length tokens and lost their tail."""


def _tokenizers():
    return require("text input", "text", "tokenizers")


def check_texts(texts) -> list[str]:
    """``texts`` (a list, tuple, generator, numpy array ... of str) as a list of str, or
    InputError naming the entries that are not strings."""
    if isinstance(texts, (str, bytes)):
        raise InputError(f"texts must be a list of str, got {type(texts).__name__}; wrap one text as [text]")
    if not isinstance(texts, Iterable) or isinstance(texts, Mapping):
        raise InputError(f"texts must be a list of str (or another iterable of them), got {type(texts).__name__}")
    texts = [str(t) if isinstance(t, str) else t for t in texts]  # numpy's str_ too, as plain str
    bad = [f"texts[{i}] is {type(t).__name__}" for i, t in enumerate(texts) if not isinstance(t, str)]
    if bad:
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise InputError(f"every text must be a str: {', '.join(bad[:5])}{more}")
    for i, text in enumerate(texts):
        try:
            text.encode("utf-8")  # a lone surrogate (e.g. undecodable bytes on a command line) cannot be tokenized
        except UnicodeEncodeError as exc:
            raise InputError(f"texts[{i}] is not valid Unicode: {exc.reason} at character {exc.start} "
                             f"({text[exc.start]!r}); valid: text that encodes as UTF-8") from None
    return list(texts)


def _lowercase_first(tokenizer, normalizers) -> None:
    """sentence-transformers' do_lower_case: a Lowercase step before the tokenizer's own
    normalizer (none added when it has one). Inside the tokenizer, not str.lower on the text:
    special tokens typed in a text ("[SEP]") are matched before normalizing and stay special,
    and the Unicode rules are the tokenizer's (a final capital sigma becomes σ, not ς)."""
    current = tokenizer.normalizer
    steps = list(current) if isinstance(current, normalizers.Sequence) else [current] if current is not None else []
    if not any(isinstance(step, normalizers.Lowercase) for step in steps):
        tokenizer.normalizer = normalizers.Sequence([normalizers.Lowercase(), *steps])


def _why_not_a_tokenizer(path: Path, exc: Exception) -> str:
    """The tokenizers library reports a valid JSON file that is no tokenizer as a JSON syntax
    error (its parser expects its own fields); say which of the two it is."""
    try:
        json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return str(exc)  # unreadable or not JSON: the library's message says where
    return (f"the file is JSON but not a tokenizer.json as the tokenizers library writes it "
            f"(tokenizers: {exc}); give the model's tokenizer.json")


class TextEncoder:
    """A tokenizer.json loaded with ``tokenizers.Tokenizer.from_file``.

    The file's own padding and truncation settings are switched off: ``encode``
    truncates to the max_length it is given; Runtime.embed pads and batches by length.
    Safe to share between threads.
    """

    def __init__(self, path, lowercase: bool = False):
        tokenizers = _tokenizers()
        self.path = Path(path)
        self.lowercase = lowercase
        try:
            self._tokenizer = tokenizers.Tokenizer.from_file(str(self.path))
        except Exception as exc:  # missing file, bad JSON, unknown model type: all surface as Exception
            raise ModelFileError(f"cannot load tokenizer {self.path}: {_why_not_a_tokenizer(self.path, exc)}") from None
        if lowercase:
            _lowercase_first(self._tokenizer, tokenizers.normalizers)
        padding = self._tokenizer.padding or {}
        pad_token = self._tokenizer.token_to_id("[PAD]")
        self.pad_id: int = padding.get("pad_id", pad_token if pad_token is not None else 0)
        # which end a long text loses: the file's own truncation direction (a tokenizer_config.json's
        # truncation_side "left" is written there on import), else the right, as transformers' default
        self.truncation_side: str = str((self._tokenizer.truncation or {}).get("direction", "right")).lower()
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        # [CLS] ... [SEP] for BERT: what the post-processor adds to every single text
        self.num_special_tokens: int = self._tokenizer.num_special_tokens_to_add(is_pair=False)
        self.num_pair_special_tokens: int = self._tokenizer.num_special_tokens_to_add(is_pair=True)
        self._lock = threading.Lock()  # truncation is tokenizer state: set it and encode as one step

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def vocabulary(self) -> dict[str, int]:
        """token -> id, added tokens included."""
        return self._tokenizer.get_vocab(with_added_tokens=True)

    def added_tokens(self) -> list:
        """The tokenizer's added tokens (tokenizers.AddedToken), special or not."""
        return list(self._tokenizer.get_added_tokens_decoder().values())

    def plain_ids(self, text: str) -> list[int]:
        """The ids of one text without special tokens or truncation."""
        with self._lock:
            self._tokenizer.no_truncation()
            return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode(self, texts: list[str], max_length: int,
               pairs: list[str] | None = None) -> tuple[list[list[int]], list[list[int]], int]:
        """(ids, type_ids, n_truncated) for each text, at most ``max_length`` tokens each.

        pairs: a second text per text (a cross-encoder's query and passage), joined by the
        tokenizer's pair template (BERT: ``[CLS] a [SEP] b [SEP]``, types 0 then 1).
        Truncation goes through the tokenizer's truncation API, so the special
        tokens survive (BERT: ``[CLS] first max_length-2 tokens [SEP]``; pairs: the longer
        of the two is cut first). When any text is truncated a TruncationWarning says how many.
        """
        ids, types, truncated = self.encode_rows(texts, max_length, pairs)
        n_truncated = sum(truncated)
        if n_truncated:
            warnings.warn(
                f"{n_truncated} of {len(ids)} text(s) were longer than max_length={max_length} tokens "
                "and were truncated", TruncationWarning, stacklevel=2,
            )
        return ids, types, n_truncated

    def encode_rows(self, texts: list[str], max_length: int, pairs: list[str] | None = None,
                    direction: str | None = None) -> tuple[list[list[int]], list[list[int]], list[bool]]:
        """``encode`` without the warning: (ids, type_ids, truncated) with one flag per text,
        True where the text was longer than ``max_length`` tokens and lost its ``direction``
        end ("left" or "right"; None = the tokenizer's own side, ``truncation_side``)."""
        texts = check_texts(texts)
        direction = self.truncation_side if direction is None else direction
        if direction not in ("left", "right"):
            raise InputError(f"direction={direction!r} is not valid; choose 'left' or 'right'")
        special = self.num_special_tokens if pairs is None else self.num_pair_special_tokens
        if pairs is not None:
            pairs = check_texts(pairs)
            if len(pairs) != len(texts):
                raise InputError(f"pairs must hold one text per text: got {len(pairs)} pair(s) for {len(texts)} text(s)")
        max_length = check_int("max_length", max_length, low=special + 1,
                               why=f" (the tokenizer adds {special} special tokens: "
                                   "a shorter length leaves no room for text)")
        if not texts:
            return [], [], []
        with self._lock:
            # stride 0: overflowing holds the cut part
            self._tokenizer.enable_truncation(int(max_length), direction=direction)
            encodings = self._tokenizer.encode_batch(texts if pairs is None else list(zip(texts, pairs)))
        return [e.ids for e in encodings], [e.type_ids for e in encodings], [bool(e.overflowing) for e in encodings]

    def tokens(self, texts: list[str], add_special_tokens: bool = True) -> list[list[tuple[int, str, bool, int, int]]]:
        """Each text's tokens, untruncated, as (id, token, special, start, stop): start and stop
        are character offsets into the text (what a special token covers is meaningless)."""
        texts = check_texts(texts)
        if not texts:
            return []
        with self._lock:
            self._tokenizer.no_truncation()
            encodings = self._tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)
        return [[(i, token, bool(special), start, stop)
                 for i, token, special, (start, stop) in zip(e.ids, e.tokens, e.special_tokens_mask, e.offsets)]
                for e in encodings]

    def decode(self, ids: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        """Each id list back to its text (the tokenizer's decoder; special tokens dropped when
        ``skip_special_tokens``). Ids must be in [0, vocab_size)."""
        rows = [list(map(int, row)) for row in ids]
        with self._lock:  # enable_truncation (under the lock) borrows the tokenizer mutably
            return self._tokenizer.decode_batch(rows, skip_special_tokens=skip_special_tokens)


def text_encoder(tokenizer, lowercase: bool = False) -> TextEncoder:
    """``tokenizer`` as it is when already a TextEncoder (built once, handed on), else loaded."""
    return tokenizer if isinstance(tokenizer, TextEncoder) else TextEncoder(tokenizer, lowercase)


def check_tokenizer(path, vocab_size: int) -> TextEncoder:
    """``path`` (or a TextEncoder already loaded) as a tokenizer.json whose ids fit a model of
    ``vocab_size`` tokens; returns the TextEncoder.

    Raises ModelFileError when the file is not a tokenizer, when the model takes float
    features (vocab_size 0), or when its vocabulary itself reaches past vocab_size (another
    model's tokenizer: most texts would fail, long after export). Added tokens past it (a
    tokenizer grown without resizing the embeddings, which transformers runs as long as no
    text holds them) are warned about: a text holding one is refused at run time."""
    encoder = text_encoder(path)
    path = encoder.path
    if vocab_size < 1:
        raise ModelFileError(f"tokenizer {path}: the model takes float features (vocab_size=0), not token ids")
    beyond = {token: i for token, i in encoder.vocabulary().items() if i >= vocab_size}
    added = {t.content for t in encoder.added_tokens()}
    if any(token not in added for token in beyond):
        raise ModelFileError(f"tokenizer {path} has {encoder.vocab_size} tokens, more than the model's "
                             f"vocab_size={vocab_size}: its ids would index past the embedding table; "
                             "give the tokenizer the model was trained with")
    if beyond:
        shown = ", ".join(f"{t!r}={i}" for t, i in sorted(beyond.items(), key=lambda item: item[1])[:3])
        warnings.warn(f"tokenizer {path} adds {len(beyond)} token(s) past the model's vocab_size={vocab_size} "
                      f"({shown}{', ...' if len(beyond) > 3 else ''}): a text holding one is refused; "
                      "other texts embed as usual", stacklevel=2)
    return encoder
