"""The Spark runtime of Epochal, in three rooms by where the code runs (imports go one way, see
``tests/unit/test_import_rules.py``):

* :mod:`pipeline.runtime.driver` - the driver's protocol: the job runner, rounds, checkpoint finalisation,
  follow mode, savepoints, progress, restore guard, epoch planning, and the round's Spark plan as the driver
  deploys it;
* :mod:`pipeline.runtime.spark` - the Spark side the driver builds on: sessions, JVM logs, the worker daemon,
  routing (partition ``i`` = subtask ``i``), the dataflow of a round and each operator's Spark plan, the
  executors' request counting, the read side (export);
* :mod:`pipeline.runtime.operators` - what runs inside the executors' tasks: one module per operator over one
  shared task skeleton, the operator registry, the state-access port and its backends, round parameters, task
  reports and dead letters.

``operators`` imports neither ``driver`` nor ``spark``; ``spark`` does not import ``driver``.
"""
