"""The demo job's tooling: :mod:`pipeline.demo.generate` (deterministic data generator) and
:mod:`pipeline.demo.oracle` (independent expected results, pyarrow/pandas only).

Submodules are not imported here, so ``python -m pipeline.demo.oracle`` loads nothing of the pipeline.
"""
from __future__ import annotations

__all__: list[str] = []
