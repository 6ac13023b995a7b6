"""The harness's tests share the suite's helpers (tests/support, on pytest's pythonpath)."""
from pathlib import Path

import pytest
from support.text_models import export_text_model


@pytest.fixture(scope="session")
def text_model(tmp_path_factory) -> Path:
    return export_text_model(tmp_path_factory)
