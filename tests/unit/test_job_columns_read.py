"""Job.columns_read: which columns of a node's output its stateful consumers may read (column pruning)."""
import pyarrow as pa

from pipeline.job import Job
from pipeline.jobs.orders_payments import build_job

_TS = pa.timestamp("us", tz="UTC")


def _ids(job, name):
    return next(i for i, n in enumerate(job.nodes) if getattr(n, "name", None) == name or getattr(n, "uid", None) == name)


def test_demo_job_reads_only_what_it_uses():
    job = build_job()
    # the sources are selected before the join: meta columns (_source, _seq, ...) are not read
    orders = job.columns_read(_ids(job, "orders"))
    assert {"order_id", "customer_id", "merchant_id", "amount", "event_time", "_ingest_ts"} <= orders
    assert not {"_source", "_partition", "_seq", "_row"} & orders
    payments = job.columns_read(_ids(job, "payments"))
    assert {"status", "order_id", "payment_id", "amount"} <= payments and "_seq" not in payments
    # the aggregate reads the join's merchant_id and paid_amount only (plus the event-time column)
    assert job.columns_read(_ids(job, "paid_orders_join")) == {"merchant_id", "paid_amount", "_ingest_ts"}


def test_unselected_join_input_or_star_reads_everything():
    schema = pa.schema([("k", pa.string()), ("v", pa.int64()), ("_ingest_ts", _TS)])
    job = Job("j", max_parallelism=8)
    a = job.source("a", schema, key="k")
    b = job.source("b", pa.schema([("k", pa.string()), ("w", pa.int64()), ("_ingest_ts", _TS)]), key="k")
    a.join(b, on="k", uid="j1").sink("out")
    assert job.columns_read(_ids(job, "a")) is None
    job2 = Job("j2", max_parallelism=8)
    s = job2.source("a", schema, key="k")
    s.select("*").aggregate(uid="agg", key="k", aggs={"n": ("count", None)}).sink("t", mode="upsert")
    assert job2.columns_read(_ids(job2, "a")) is None


def test_filter_before_select_counts_and_after_select_names_are_not_source_columns():
    schema = pa.schema([("k", pa.string()), ("v", pa.int64()), ("_seq_note", pa.string()), ("_ingest_ts", _TS)])
    job = Job("j3", max_parallelism=8)
    s = job.source("a", schema, key="k")
    s.filter("_partition = 1").select("k", "v AS x").filter("x > 3").aggregate(
        uid="agg", key="k", aggs={"total": ("sum", "x")}).sink("t", mode="upsert")
    read = job.columns_read(_ids(job, "a"))
    assert {"_partition", "k", "v", "_ingest_ts"} <= read
    assert not {"_seq", "_row", "_source", "_seq_note"} & read
