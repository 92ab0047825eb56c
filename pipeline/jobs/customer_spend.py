"""The chain example ``customer_spend``: a second job that reads the demo job's ``paid_orders`` Delta table as a
lake source (every row the table gains, commit by commit: docs/how-to/lake-sources.md) and keeps per-customer
totals::

    orders_payments ── sink paid_orders (Delta) ── lake source paid ── aggregate(customer_id) ─> sink customer_spend

The table is found under the configured sink root (``PIPELINE_SINK_URI``/orders_payments/paid_orders), where
``orders_payments`` commits it. In Airflow its epoch DAG is scheduled on that table's Asset
(``build_epoch_dag("customer_spend", upstream=[sink_asset("orders_payments", "paid_orders")])``): each commit of
the demo job runs it for every epoch that is ready.
"""
from __future__ import annotations

import pyarrow as pa

from pipeline.config import PipelineConfig, load_config
from pipeline.fileio import join_uri
from pipeline.job import Job

__all__ = ["PAID_SCHEMA", "UPSTREAM_JOB", "UPSTREAM_TABLE", "build_job"]

UPSTREAM_JOB = "orders_payments"
UPSTREAM_TABLE = "paid_orders"
_TS = pa.timestamp("us", tz="UTC")
#: the columns of ``paid_orders`` this job reads (others are ignored); ``_ingest_ts`` is the commit time
PAID_SCHEMA = pa.schema([("order_id", pa.string()), ("customer_id", pa.string()), ("paid_amount", pa.float64()),
                         ("_ingest_ts", _TS)])


def build_job(config: PipelineConfig | None = None) -> Job:
    cfg = config or load_config()
    job = Job("customer_spend")
    paid = job.source("paid", PAID_SCHEMA, key="order_id",
                      table="delta:" + join_uri(cfg.sink_uri, UPSTREAM_JOB, UPSTREAM_TABLE))
    paid.aggregate(uid="customer_spend_agg", key="customer_id",
                   aggs={"orders": ("count", None), "spent": ("sum", "paid_amount")}
                   ).sink("customer_spend", mode="upsert", format="delta")
    return job
