"""
### Epochal: `orders_payments` epochs

One run per data interval = **one checkpointed epoch** of the demo job `orders_payments`
(orders JOIN captured payments -> `paid_orders`, per-merchant totals -> `merchant_revenue`).
The schedule equals the epoch length (`PIPELINE_EPOCH_SECONDS`); the run for `[start, end)` processes
the epoch whose barrier is `end`.

| task | what it does |
|---|---|
| `trigger` | waits for the previous interval and for the epoch's data, logs barrier *n* write-ahead |
| `process` | processes epoch *n* on Spark and completes checkpoint *n* (a re-run **rewinds**) |
| `commit` | commits the sink transactions (idempotent) and emits the sink **Assets** |
| `validate` | verifies the checkpoint's files, positions and sink lineage |

* **Backfill** (`airflow backfill create --dag-id epochal_orders_payments --from-date ... --to-date ...`)
  processes intervals in order, one checkpoint each.
* **Re-run / clear** of processed intervals (`--reprocess-behavior completed`, or *Clear* in the UI)
  rewinds to the checkpoint before the earliest re-run interval and processes forward again:
  re-processed epochs replace their earlier output, never duplicate it.
* Checkpoint history: *Browse > Epochal checkpoints*. S3 settings: connection `epochal_s3` or `AWS_*`.
"""
from airflow.sdk import DAG

from pipeline.orchestration import build_epoch_dag

dag: DAG = build_epoch_dag("orders_payments", doc_md=__doc__, tags=["demo"])

if __name__ == "__main__":
    dag.test()
