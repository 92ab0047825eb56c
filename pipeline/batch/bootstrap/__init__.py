"""Bootstrap: a new job's state and committed output as of barrier n, from ONE Spark batch job, as a savepoint.

Flink's State Processor API bootstrap, made automatic: instead of replaying the history epoch by epoch,
:func:`~pipeline.batch.bootstrap.savepoint.bootstrap` evaluates the job's batch plan (:mod:`pipeline.batch.evaluation`) over the source prefix up to
barrier ``n`` and writes the result in exactly the format the runtime restores:

* per operator and state name, one Parquet file per subtask with the ``_kg`` column, written by the Spark task
  that owns the key-group range (:func:`pipeline.state.backend.write_table`), its handle (uri, rows, bytes,
  sha256, key-group range) being the task's acknowledgement;
* the batch output of every sink table staged under ``data/txn-<id>/`` and committed after ``_metadata``
  (two-phase commit; Iceberg / Delta tables get the same commit as from an epoch);
* ``_metadata`` (kind ``savepoint``) with barrier ``n`` as positions and barriers, and the source inventory.

Windows: ``win`` (the on-time records of epochs ``<= n`` whose last window has not fired, with ``_epoch``) is
keyed like any state; ``wm`` (the watermark table ``("", W(n))`` + ``(channel, M_c(n))``) is operator-wide and
written as the runtime writes it: one file on subtask 0's handle, empty handles for the others
(``savepoint._write_operator_wide``). A window or join reading an ``emit="final"`` window's rows gets them with their
firing epoch (``pipeline.batch.evaluation.window._window_flow``).

Dead letters: the bad records of the epochs ``<= n`` (source records, join ``unique`` violations, window late and
null records) are written where an epoch-by-epoch run leaves them (:mod:`pipeline.batch.bootstrap.dead_letters`)
and counted in the savepoint's stats.

``epochal restore --from <savepoint>`` then makes it the job's restore point and ``epochal run`` continues with
epoch ``n + 1``, exactly-once.

Protocol (docs/batch.md "Bootstrap"):

1. Validate, no side effect yet: the job is new (no completed checkpoint, no sink commit), every operator's
   state and every sink is derivable exactly (``process`` user functions, operators other than aggregates reading an
   ``emit="update"`` window's changelog, changelog sinks are refused with
   :class:`~pipeline.exceptions.BootstrapRefusedError` naming the operator, why, and what to do instead), the
   savepoint target lies under ``PIPELINE_SAVEPOINT_PREFIXES`` and holds no ``_metadata``, the parallelism fits,
   barrier ``n`` is complete (no partition lags) and not before the first epoch with data; under
   ``PIPELINE_BAD_RECORDS=fail`` no bad record lies before barrier ``n``.
2. Log barrier ``n`` in the write-ahead barrier log (the epochs after it are cut from there).
3. Trigger a savepoint (claims the id, pending manifest).
4. One Spark job per state / sink object writes the files; their task reports are the acknowledgements. Then the
   dead letters of the epochs ``<= n``.
5. Complete: ``_metadata`` last (conditional PUT), then commit the sinks. Any failure aborts the pending
   savepoint (only the files it wrote are deleted).
"""
