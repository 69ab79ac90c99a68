"""pytest setup: the in-tree build is on PYTHONPATH (ctest and `make test` set it)."""

import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(0)
