"""Fixtures of the serve tests: the tiny models (exported on first use, once per test run)."""
import os

import pytest

from support.serve import Models


@pytest.fixture(scope="session")
def runtimes(tmp_path_factory) -> Models:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        return Models(tmp_path_factory.mktemp("serve_models"))
    # xdist: the workers' temp folders share a parent; one folder per run, so no run reuses another's files
    return Models(tmp_path_factory.getbasetemp().parent / f"serve_models_{run}")
