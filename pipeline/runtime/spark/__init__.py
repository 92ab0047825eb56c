"""The Spark room: sessions and their JVM, the executors' worker daemon, routing records to subtasks, the Spark
plan of one round's dataflow and of each operator (:mod:`.operator_plans`), the executors' S3 request counting and
the read side. It may import :mod:`pipeline.runtime.operators` (the task functions it maps partitions with), never
:mod:`pipeline.runtime.driver`."""
