import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
PYTHON = sys.executable


@pytest.fixture
def root() -> str:
    return ROOT
