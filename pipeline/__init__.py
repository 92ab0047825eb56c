"""Epochal: Flink-style exactly-once checkpoints, savepoints and recovery for Airflow + Spark + S3.

Streaming runs as scheduled *epochs*: each round processes the bounded segment of every source partition
between barrier n-1 and barrier n on Spark, snapshots keyed operator state to S3 (or a local directory),
and commits sink output with two-phase commit. The small public API::

    from pipeline import Job, JobRunner, load_config
    job = Job("my_job")            # sources, select/filter, join, aggregate, sinks (see pipeline.job)
    JobRunner(job, load_config()).run(epochs=3)
"""
from __future__ import annotations

from pipeline.config import PipelineConfig, load_config
from pipeline.exceptions import EpochalError
from pipeline.job import Job, Stream
from pipeline.quality.validator import QualityValidator
from pipeline.runtime.driver.validation import set_default_validator

# the runtime validates through a port (imports go one way); the Great Expectations suites are the default
set_default_validator(QualityValidator())

__all__ = ["Job", "Stream", "JobRunner", "PipelineConfig", "load_config", "EpochalError", "__version__"]

__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "JobRunner":
        from pipeline.runtime.driver.runner import JobRunner  # lazily: keeps `import pipeline` free of Spark
        return JobRunner
    raise AttributeError(name)
