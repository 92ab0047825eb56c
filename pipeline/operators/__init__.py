"""Operator kernels: pure, vectorised pyarrow functions of one subtask's state and one round's input.

They know nothing of Spark, files or checkpoints; the Spark tasks in :mod:`pipeline.runtime.operators`
restore state, call a kernel and write what it returns. That keeps each operator's semantics in one small
module that property tests can check against a brute-force model (``tests/unit/operators``).
"""
