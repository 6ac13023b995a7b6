"""Fixtures of the serve tests: tiny models exported once per session, and their Runtimes."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from serve_support import model_files_in, runtimes_of  # noqa: E402


@pytest.fixture(scope="session")
def model_files(tmp_path_factory):
    return model_files_in(tmp_path_factory)


@pytest.fixture(scope="session")
def runtimes(model_files):
    return runtimes_of(model_files)
