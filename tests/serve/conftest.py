"""Fixtures of the serve tests: the tiny models (exported on first use, once per session)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from serve_support import Models  # noqa: E402


@pytest.fixture(scope="session")
def runtimes(tmp_path_factory) -> Models:
    return Models(tmp_path_factory.mktemp("serve_models"))
