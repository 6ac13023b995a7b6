"""Real English sentences of mixed length, offline: the standard library's docstrings."""
from __future__ import annotations

import importlib
import inspect
import re

MODULES = ("argparse", "asyncio", "collections", "csv", "datetime", "decimal", "email", "functools",
           "http.client", "json", "logging", "os", "pathlib", "random", "re", "sqlite3", "statistics",
           "string", "subprocess", "tarfile", "textwrap", "threading", "typing", "unittest", "urllib.parse",
           "zipfile", "heapq", "shutil", "socket", "tempfile")
_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def sentences(count: int, min_words: int = 3) -> list[str]:
    """``count`` distinct sentences in a fixed order (lengths from a few words to paragraphs)."""
    seen: dict[str, None] = {}
    for name in MODULES:
        module = importlib.import_module(name)
        docs = [inspect.getdoc(module)] + [inspect.getdoc(obj) for _, obj in sorted(vars(module).items())
                                            if inspect.isfunction(obj) or inspect.isclass(obj)]
        for doc in filter(None, docs):
            for paragraph in doc.split("\n\n"):
                text = " ".join(paragraph.split())
                for sentence in _SPLIT.split(text):
                    if len(sentence.split()) >= min_words and not sentence.startswith(">>>"):
                        seen.setdefault(sentence)
                if len(text.split()) > 40:
                    seen.setdefault(text)  # whole paragraphs give the long tail of lengths
                if len(seen) >= count:
                    return list(seen)[:count]
    raise RuntimeError(f"the standard library gave only {len(seen)} sentences, {count} asked")
