"""
### Epochal: data quality of `orders_payments` (Great Expectations)

Trigger with the params form:

* **Checkpoint** - a checkpoint id (e.g. `12`) or a savepoint URI (`s3://.../savepoints/sp-...`); leave it
  empty to validate the newest completed checkpoint.

The run executes every expectation suite of `pipeline.quality` on that snapshot:

* **checkpoint metadata** - every referenced file exists with its size, checksum and row count; barrier
  positions never go back along the lineage; the sink commit log matches the checkpoints; nothing is
  committed twice;
* **operator state** - schema, non-null unique keys per operator and key group, every key inside the
  key-group range that owns it, value ranges, nothing past the barrier;
* **sink output** - no duplicate `order_id` in `paid_orders`; `merchant_revenue` agrees with `paid_orders`
  and with the aggregate state;
* **recovery correctness** - state and committed output equal an independent recomputation from the source
  files up to the checkpoint's barrier positions; totals and per-merchant counts are conserved.

A failed expectation fails the task; the log shows which expectation failed, on which checkpoint,
operator or table, with example rows. GX results are stored next to the checkpoint
(`<checkpoint root>/orders_payments/validation/<chk-id>/`) and a Data Docs site is built under
`EPOCHAL_DATA_DOCS_DIR`. See `docs/quality.md`.
"""
from airflow.sdk import DAG

from pipeline.orchestration import build_quality_dag

dag: DAG = build_quality_dag("orders_payments", doc_md=__doc__, tags=["demo", "great-expectations"], retries=1)

if __name__ == "__main__":
    dag.test()
