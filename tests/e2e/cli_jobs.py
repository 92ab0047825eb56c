"""Jobs of the CLI message tests (not the demo job): loaded with ``--job cli_jobs:<function>``."""
from pipeline.job import Job
from pipeline.jobs.orders_payments import ORDERS_SCHEMA


def customer_totals() -> Job:
    job = Job("customer_totals", max_parallelism=16)
    orders = job.source("orders", ORDERS_SCHEMA, key="order_id")
    orders.aggregate(uid="customer_totals_agg", key="customer_id",
                     aggs={"orders": ("count", None), "spent": ("sum", "amount")}).sink("customer_totals", mode="upsert")
    return job
