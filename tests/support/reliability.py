"""Helpers shared by the reliability tests: loop counts scaled by the Hypothesis profile,
the figures they report, and the environment of their child processes."""
from __future__ import annotations

import os
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from hypothesis import settings

SUPPORT = Path(__file__).resolve().parent  # also holds the child processes' scripts
ROOT = SUPPORT.parents[1]


class Figures:
    """Counters and measurements the tests report; merged into one JSON document."""

    def __init__(self) -> None:
        self.counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.values: dict[str, dict] = defaultdict(dict)
        self.path: Path | None = None

    def add(self, section: str, key: str, n: int = 1) -> None:
        self.counts[section][key] += n

    def set(self, section: str, key: str, value) -> None:
        self.values[section][key] = value

    def document(self) -> dict:
        sections = sorted(set(self.counts) | set(self.values))
        return {
            "profile": settings.get_current_profile_name(),
            "max_examples": settings.default.max_examples,
            "written": time.strftime("%Y-%m-%d %H:%M:%S"),
            **{s: {**dict(self.counts.get(s, {})), **self.values.get(s, {})} for s in sections},
        }


FIGURES = Figures()


def scaled(ci: int) -> int:
    """A loop or example count: `ci` under the ci profile (max_examples = 100), scaled
    with max_examples under the others (soak: 30x)."""
    return max(ci, int(ci * settings.default.max_examples / 100))


def child_env() -> dict:
    """Environment for python subprocesses that import ortformer from this checkout."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1"}


def good_request(rt) -> dict:
    """A fixed, valid request for a model (padding and a fully padded row included)."""
    rng = np.random.default_rng(1234)
    cfg = rt.config
    shape = (3, min(cfg.max_positions, 11))
    if cfg.takes_ids:
        inputs = {"input_ids": rng.integers(0, cfg.vocab_size, size=shape)}
    else:
        inputs = {"inputs_embeds": rng.standard_normal((*shape, cfg.hidden_size)).astype(np.float32)}
    mask = np.ones(shape, np.int64)
    mask[1, 7:] = 0
    mask[2, :] = 0
    inputs["attention_mask"] = mask
    if cfg.type_vocab_size:
        inputs["token_type_ids"] = rng.integers(0, cfg.type_vocab_size, size=shape)
    return inputs
