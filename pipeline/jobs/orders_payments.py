"""The demo job ``orders_payments`` (see README): orders JOIN captured payments -> ``paid_orders``
(append) and per-merchant totals -> ``merchant_revenue`` (upsert of the latest totals)."""
from __future__ import annotations

import pyarrow as pa

from pipeline.job import Job

__all__ = ["ORDERS_SCHEMA", "PAYMENTS_SCHEMA", "PAID_ORDERS_COLUMNS", "build_job"]

_TS = pa.timestamp("us", tz="UTC")
ORDERS_SCHEMA = pa.schema([("order_id", pa.string()), ("customer_id", pa.string()),
                           ("merchant_id", pa.string()), ("amount", pa.float64()),
                           ("event_time", _TS), ("_ingest_ts", _TS)])
PAYMENTS_SCHEMA = pa.schema([("payment_id", pa.string()), ("order_id", pa.string()),
                             ("amount", pa.float64()), ("status", pa.string()),
                             ("event_time", _TS), ("_ingest_ts", _TS)])
PAID_ORDERS_COLUMNS = ("order_id", "customer_id", "merchant_id", "order_amount", "payment_id",
                       "paid_amount", "order_time", "payment_time")


def build_job(max_parallelism: int = 128) -> Job:
    job = Job("orders_payments", max_parallelism=max_parallelism)
    orders = job.source("orders", ORDERS_SCHEMA, key="order_id")
    payments = job.source("payments", PAYMENTS_SCHEMA, key="order_id")
    order_side = orders.select("order_id", "customer_id", "merchant_id", "amount AS order_amount",
                               "event_time AS order_time")
    captured = payments.filter("status = 'captured'").select(
        "order_id", "payment_id", "amount AS paid_amount", "event_time AS payment_time")
    # declared: order_id is unique among orders, and each order has at most one captured payment, so matched
    # rows may leave state (a violation is dead-lettered, never double counted)
    paid = order_side.join(captured, on="order_id", uid="paid_orders_join", unique="both",
                           output=PAID_ORDERS_COLUMNS)
    # Delta Lake tables (any engine reads them; docs/table-formats.md says why Delta);
    # PIPELINE_SINK_FORMAT=iceberg or =epochal overrides it
    paid.sink("paid_orders", format="delta")
    paid.aggregate(uid="merchant_revenue_agg", key="merchant_id",
                   aggs={"paid_orders": ("count", None), "revenue": ("sum", "paid_amount")}
                   ).sink("merchant_revenue", mode="upsert", format="delta")
    return job
