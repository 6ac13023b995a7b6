"""The parity gate of a padding="right" file: both sides fed each row right-aligned.

Such a file takes key lengths, true of right-padded rows only; the Runtime right-aligns every
other row before the call and puts the outputs back after it (runtime/right_padding.py). The
gate runs the grid's left, random and fully padded cases through that same step, on the
onnxruntime session and on the eager model alike, so it checks what the Runtime computes; the
Runtime's step itself is checked against eager runs of each row alone
(tests/exporter/test_right_padding.py).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..runtime.right_padding import run_aligned, sequence_outputs

Named = dict[str, np.ndarray]


class RightAligned:
    """An onnxruntime session whose run() right-aligns rows first (the parts run_parity uses)."""

    def __init__(self, session, cfg):
        self.session, self._per_token = session, sequence_outputs(cfg)

    def get_outputs(self):
        return self.session.get_outputs()

    def get_providers(self):
        return self.session.get_providers()

    def run(self, names, feeds, *args):
        outputs = run_aligned(lambda f: dict(zip(names, self.session.run(names, f, *args))), feeds, self._per_token)
        return [outputs[name] for name in names]


def right_aligned(eager: Callable[[Named], Named], cfg) -> Callable[[Named], Named]:
    """eager (named numpy in, named numpy out) with each row right-aligned first."""
    per_token = sequence_outputs(cfg)
    return lambda feeds: run_aligned(eager, feeds, per_token)
