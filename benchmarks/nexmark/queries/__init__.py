"""The Nexmark queries q0-q22 (Flink Nexmark numbering, SQL texts in ``nexmark/nexmark``,
``nexmark-flink/src/main/resources/queries/``), one module each.

Every module ``qN`` has:

* ``job() -> pipeline.Job``: the query written with the public job API as a user would write it, sinking into the
  table ``SINK``. A query that needs an operator Epochal does not have yet raises :class:`NotExpressible` naming
  what is missing (the runner reports "not expressible yet: <what>", never "skipped");
* ``reference() -> str``: a DuckDB query over the generated events (views ``person``, ``auction``, ``bid`` of
  :mod:`benchmarks.nexmark.reference`) computing the exact committed output of the query *as Epochal defines it*
  (epochs of ``_ingest_ts``, windows on ``date_time`` with the watermark rules of docs/windows.md, join TTL of
  docs/operators.md), with the columns of ``SINK``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from benchmarks.nexmark.generator import SCHEMAS

if TYPE_CHECKING:
    from pipeline import Job, Stream

__all__ = ["NotExpressible", "QUERIES", "WATERMARK_DELAY_SECONDS", "source"]

QUERIES = tuple(f"q{i}" for i in range(23))
# Nexmark's DDL: WATERMARK FOR dateTime AS dateTime - INTERVAL '4' SECOND
WATERMARK_DELAY_SECONDS = 4


class NotExpressible(Exception):
    """The query needs an operator (or a shape) the job API does not offer yet; the message says which."""

    def __init__(self, missing: str) -> None:
        super().__init__(missing)
        self.missing = missing


def source(job: Job, name: str) -> Stream:
    """The Nexmark source ``person``, ``auction`` or ``bid`` (schemas: :mod:`benchmarks.nexmark.generator`)."""
    return job.source(name, SCHEMAS[name])
