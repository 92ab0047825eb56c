"""
### Epochal: take a savepoint of `orders_payments`

Trigger with the params form (*Trigger DAG w/ config*):

* **Target URI** - optional savepoint directory (`s3://...` or `file://...`); empty = the job's
  `savepoints/` directory;
* **Stop after savepoint** - stop the job (epoch runs are skipped) until it is restored, as Flink's
  stop-with-savepoint.

The savepoint is **aligned and self-contained**: it references no checkpoint-owned or shared file, and
retention never deletes it. Its location is in the `savepoint` task's log and in XCom
(`savepoint_location`). Restore it with the `epochal_orders_payments_restore` DAG.
"""
from airflow.sdk import DAG

from pipeline.orchestration import build_savepoint_dag

dag: DAG = build_savepoint_dag("orders_payments", doc_md=__doc__, tags=["demo"])

if __name__ == "__main__":
    dag.test()
