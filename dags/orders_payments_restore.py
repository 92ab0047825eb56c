"""
### Epochal: restore `orders_payments`

Trigger with the params form:

* **From** - a checkpoint id (e.g. `12`) or a savepoint URI;
* **Parallelism** - optional new Spark parallelism; key groups are redistributed, max parallelism stays
  fixed (results are identical to a run that never changed it);
* **Allow non-restored state** - restore a snapshot that has state for operators the job no longer has.

Restore uses **NO_CLAIM** semantics: the snapshot's files are copied into a new checkpoint, so later
checkpoints never delete or modify them. The restored state is then **validated** (data-quality suites);
a failed validation fails the run. Epoch runs continue from the restored checkpoint.
"""
from airflow.sdk import DAG

from pipeline.orchestration import build_restore_dag

dag: DAG = build_restore_dag("orders_payments", doc_md=__doc__, tags=["demo"])

if __name__ == "__main__":
    dag.test()
