from pathlib import Path

import numpy as np
import pytest
from support.exported_models import exported

from ortformer.runtime import Runtime


@pytest.fixture(scope="session")
def nopool_model(tmp_path_factory) -> Path:
    return exported("nopool", tmp_path_factory)


@pytest.fixture(scope="session")
def tokens_rt(tokens_model) -> Runtime:
    return Runtime(tokens_model, "cpu")


@pytest.fixture(scope="session")
def features_rt(features_model) -> Runtime:
    return Runtime(features_model, "cpu")


@pytest.fixture(scope="session")
def nopool_rt(nopool_model) -> Runtime:
    return Runtime(nopool_model, "cpu")


@pytest.fixture(scope="session")
def cuda_usable(tokens_model) -> bool:
    """Whether CUDA really loads here (tests of the no-CUDA behaviour skip when it does)."""
    return Runtime(tokens_model, "auto").provider == "cuda"


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


