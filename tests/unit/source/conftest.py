from __future__ import annotations

import pytest

from pipeline.source.summary import clear_summary_cache


@pytest.fixture(autouse=True)
def _fresh_summary_cache():
    clear_summary_cache()
    yield
    clear_summary_cache()
