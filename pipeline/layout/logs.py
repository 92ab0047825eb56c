"""Names of the write-ahead logs under ``<job root>/barriers/`` (built by
:class:`~pipeline.layout.JobLayout`), as patterns to parse them back.

* ``barriers/epoch-<n>.json`` - the barrier log (:data:`BARRIER_LOG_NAME`: group 1 the epoch);
* ``barriers/rounds/epoch-<n>-chk-<id:012d>-r<k>.json`` - the round log (:data:`ROUND_LOG_NAME`: epoch,
  checkpoint id, round);
* ``barriers/lagged/epoch-<n>-chk-<id:012d>.json`` - the lag log (:data:`LAG_LOG_NAME`: epoch, checkpoint id).

The patterns are searched in a URI or matched against a file name (they are anchored at the end only).
"""
from __future__ import annotations

import re

__all__ = ["BARRIER_LOG_NAME", "ROUND_LOG_NAME", "LAG_LOG_NAME"]

BARRIER_LOG_NAME = re.compile(r"epoch-(\d+)\.json$")
ROUND_LOG_NAME = re.compile(r"epoch-(\d+)-chk-(\d+)-r(\d+)\.json$")
LAG_LOG_NAME = re.compile(r"epoch-(\d+)-chk-(\d+)\.json$")
