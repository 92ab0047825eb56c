"""The driver room: what the driver process does around the Spark work of a round (Flink: the JobMaster and the
CheckpointCoordinator's side of a job) - restore, trigger, rounds until the barrier handler snapshots, finalise
and commit, follow mode, savepoints, progress. It may import :mod:`pipeline.runtime.spark` and
:mod:`pipeline.runtime.operators`; neither imports it."""
