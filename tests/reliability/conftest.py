"""Fixtures of the reliability suite: exported models and the figures it reports.

Figures (inputs tried, files tried, crashes, NaNs returned, memory growth, kill
trials) are written to $ORTFORMER_RELIABILITY_FIGURES, else to
<pytest basetemp>/reliability-figures.json, and shown in the terminal summary.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support.reliability import FIGURES, Figures

from ortformer.runtime import Runtime


@pytest.fixture(scope="session")
def figures(tmp_path_factory) -> Figures:
    yield FIGURES
    target = os.environ.get("ORTFORMER_RELIABILITY_FIGURES")
    FIGURES.path = Path(target) if target else tmp_path_factory.getbasetemp() / "reliability-figures.json"
    FIGURES.path.write_text(json.dumps(FIGURES.document(), indent=2, sort_keys=True) + "\n")


def pytest_terminal_summary(terminalreporter):
    if not (FIGURES.counts or FIGURES.values):
        return
    terminalreporter.section("reliability figures")
    terminalreporter.write_line(json.dumps(FIGURES.document(), sort_keys=True))
    if FIGURES.path is not None:
        terminalreporter.write_line(f"written to {FIGURES.path}")


@pytest.fixture(scope="session")
def tokens_rt(tokens_model) -> Runtime:
    return Runtime(tokens_model, "cpu", threads=1)


@pytest.fixture(scope="session")
def features_rt(features_model) -> Runtime:
    return Runtime(features_model, "cpu", threads=1)
