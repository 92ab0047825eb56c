"""
### Epochal: `customer_spend` epochs, on the demo job's commits

The second job of the demo chain: it reads the Delta table `paid_orders` that `orders_payments` commits, as a
**lake source** (every row the table gains, commit by commit, exactly once), and keeps per-customer totals in
`customer_spend`.

The DAG is scheduled on the Asset of `paid_orders` (data-aware scheduling), not on the clock: each commit of
`orders_payments` runs it, and the run processes every epoch that is ready. A run for an epoch already processed
finds the job up to date; it never rewinds (clear a run, or trigger one by hand, to re-process an epoch).
"""
from airflow.sdk import DAG

from pipeline.orchestration import build_epoch_dag, sink_asset

dag: DAG = build_epoch_dag("customer_spend", doc_md=__doc__, tags=["demo", "chain"],
                           upstream=[sink_asset("orders_payments", "paid_orders")])

if __name__ == "__main__":
    dag.test()
