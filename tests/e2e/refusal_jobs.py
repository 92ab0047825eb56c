"""Jobs the refusal tests load with ``--job refusal_jobs:<function>``: shapes refused when the job is loaded."""
import pyarrow as pa

from pipeline.job import Job

TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema([("k", pa.string()), ("et", TS), ("_ingest_ts", TS)])


def update_window_append_sink() -> Job:
    """An ``emit="update"`` window into an append sink: refused (the updates need an upsert sink)."""
    job = Job("refused_update_append")
    job.source("events", SCHEMA).window(uid="w", key="k", event_time="et", size_seconds=10,
                                        aggs={"c": ("count", None)}, emit="update").sink("out")
    return job
