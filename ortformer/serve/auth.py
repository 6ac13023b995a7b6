"""The API key: refused at start unless a client can send it, compared in constant time.

A key is sent as ``Authorization: Bearer KEY``. HTTP carries header values as bytes; clients
send a non-ASCII key as its UTF-8 bytes, and the server compares bytes with bytes
(hmac.compare_digest), never decoded text. A key that is empty, or holds a control character,
a surrogate, or whitespace at either end (which header parsing strips), could never match and
is refused when the server starts, so a misconfigured key cannot open or silently lock the
server.
"""
from __future__ import annotations

import hmac
import unicodedata
from pathlib import Path

from ..core.errors import InputError

ENV = "ORTFORMER_API_KEY"


def check_key(key: str, source: str = "api_key") -> str:
    """`key` when a client can send it in a header; InputError naming `source` otherwise."""
    if not isinstance(key, str):
        raise InputError(f"{source} must be a string, got {type(key).__name__}")
    if not key:
        raise InputError(f"{source} is empty; give a key, or none to serve without one")
    bad = next((c for c in key if unicodedata.category(c) in ("Cc", "Cs")), None)
    if bad is not None:
        raise InputError(f"{source} holds the character U+{ord(bad):04X}, which cannot be sent in an HTTP header; "
                         "use visible characters (letters, digits, punctuation; UTF-8 beyond ASCII)")
    if key != key.strip(" \t"):
        raise InputError(f"{source} starts or ends with whitespace, which HTTP strips from header values; remove it")
    return key


def read_key_file(path: str | Path) -> str:
    """The key in the file at `path`, one trailing newline removed (what `echo KEY > file`
    writes); InputError if it cannot be read, is not UTF-8, or is empty."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read the API key file {str(path)!r}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"the API key file {str(path)!r} is not UTF-8 text") from None
    text = text.removesuffix("\n").removesuffix("\r")
    return check_key(text, f"the API key in {str(path)!r}")


def bearer(key: str) -> bytes:
    """The Authorization value that carries `key`, as the bytes a client sends."""
    return b"Bearer " + key.encode("utf-8")


def matches(sent: bytes, expected: bytes) -> bool:
    """Whether the raw Authorization header `sent` is `expected`, in time independent of
    where they differ."""
    return hmac.compare_digest(sent, expected)
