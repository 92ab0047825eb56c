"""Round parameters: what changes from one round to the next, handed to the tasks as Spark local properties.

The Spark plan of a round (source reads -> stateless steps -> shuffles -> operator tasks) has the same
shape every round; only values change: the splits to read, the parent checkpoint's state handles, the
staging prefixes, the TTL cutoff. Building and analysing a fresh plan per round costs hundreds of
milliseconds of driver and JVM time, so the runner builds it once per shape
(:meth:`pipeline.runtime.driver.runner.JobRunner._round_plan`) and passes the values as *local properties* of the
driver thread. Spark ships a job's local properties with each of its tasks; the Python task reads its
own with :func:`task_params` when it starts.

Keys: ``epochal.src.<source>`` (JSON list of split dicts) and ``epochal.op.<uid>`` (JSON object of the
operator's per-round fields, see :func:`operator_params`).

**Tagged rounds** (several epochs in one Spark round, ``PIPELINE_MAX_EPOCHS_PER_ROUND``): every record carries
the epoch (checkpoint) it belongs to in the column :data:`EPOCH_TAG`, each split dict its ``tag``, and the
operator's property is ``{"epochs": [{"checkpoint_id", "epoch", "params"}, ...]}`` in ascending epoch order
(:func:`epoch_entries`): the task runs its one-epoch body once per entry (:mod:`pipeline.runtime.operators`).

**Spark Connect** has no SparkContext and no local properties. A one-epoch round puts its values into the task
specs of a plan built for that round (:mod:`pipeline.runtime.driver.spark_plan`). A tagged round builds its plan under
:class:`EmbeddedParams`: every task function created meanwhile captures its operator's value
(:func:`embedded_params`, the same decoded JSON a local property would give) and travels with it by value.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from pipeline.checkpoint.handles import FileHandle, StateHandle

__all__ = ["source_key", "operator_key", "operator_params", "apply_params", "task_params", "RoundProperties",
           "EPOCH_TAG", "TAGGED_KEY", "epoch_entries", "EmbeddedParams", "embedded_params"]

_PREFIX = "epochal."

#: tagged rounds: the column holding the epoch (checkpoint) a record belongs to
EPOCH_TAG = "_epoch"
#: tagged rounds: the key of an operator's property listing its per-epoch values
TAGGED_KEY = "epochs"

#: fields of the operator task specs that change every round (everything else is fixed by the plan)
ROUND_FIELDS = ("checkpoint", "parent_handles", "state_prefix", "output_prefix", "output_name", "file_tag",
                "ttl_cutoff_us", "ack_prefix", "replay_handles", "channel_prefix", "prior_output", "epoch",
                "barrier_us", "complete", "replayed", "snapshot")


def source_key(source: str) -> str:
    return f"{_PREFIX}src.{source}"


def operator_key(uid: str) -> str:
    return f"{_PREFIX}op.{uid}"


def operator_params(io) -> dict:
    """The per-round fields of an :class:`~pipeline.runtime.spark.dataflow.OperatorIO` as a JSON-able dict: the state
    handles with the checkpoint's own codec (``StateHandle.to_dict``, as in ``_metadata``), files as
    ``FileHandle.to_dict``; :func:`apply_params` decodes them back into the same values."""
    out = {f: getattr(io, f) for f in ROUND_FIELDS}
    out["parent_handles"] = {n: [h.to_dict() for h in hs] for n, hs in (io.parent_handles or {}).items()}
    out["replay_handles"] = {n: [f.to_dict() for f in fs] for n, fs in (io.replay_handles or {}).items()}
    out["prior_output"] = [[s, f.to_dict()] for s, f in io.prior_output or ()]
    return out


def _decoded(name: str, value: Any) -> Any:
    if name == "parent_handles":
        return {n: tuple(StateHandle.from_dict(h) for h in hs) for n, hs in (value or {}).items()}
    if name == "replay_handles":
        return {n: tuple(FileHandle.from_dict(f) for f in fs) for n, fs in (value or {}).items()}
    if name == "prior_output":
        return tuple((int(s), FileHandle.from_dict(f)) for s, f in value or ())
    return value


def apply_params(spec, params: Mapping[str, Any] | None):
    """``spec`` (a frozen task spec) with this round's values (decoded from :func:`operator_params`); fields the
    spec lacks are ignored."""
    if not params:
        return spec
    names = {f.name for f in dataclasses.fields(spec)}
    changes = {k: _decoded(k, v) for k, v in params.items() if k in names}
    return dataclasses.replace(spec, **changes)


def epoch_entries(params: Any) -> list[dict] | None:
    """The per-epoch entries of a tagged round's operator property, None for a one-epoch round."""
    if isinstance(params, Mapping) and TAGGED_KEY in params:
        return list(params[TAGGED_KEY])
    return None


def task_params(key: str) -> Any:
    """Executor side: the decoded local property ``key`` of the running task (None outside a task or when
    the job was submitted without it)."""
    from pyspark import TaskContext
    ctx = TaskContext.get()
    raw = ctx.getLocalProperty(key) if ctx is not None else None
    return json.loads(raw) if raw else None


class RoundProperties:
    """Context manager setting the local properties of one round on the driver thread (and clearing them)."""

    def __init__(self, spark, values: Mapping[str, Any]):
        self._sc = spark.sparkContext
        self._values = _encoded(values)

    def __enter__(self) -> RoundProperties:
        for k, v in self._values.items():
            self._sc.setLocalProperty(k, v)
        return self

    def __exit__(self, *exc) -> None:
        for k in self._values:
            self._sc.setLocalProperty(k, None)  # type: ignore[arg-type]


#: driver side: the round values of the plan being built under EmbeddedParams (Spark Connect)
_EMBEDDING: list[dict[str, Any]] = []


def _encoded(values: Mapping[str, Any]) -> dict[str, str]:
    return {k: json.dumps(v, separators=(",", ":"), default=str) for k, v in values.items()}


def embedded_params(key: str) -> Any:
    """Driver side, while a plan is built under :class:`EmbeddedParams`: the value of ``key`` decoded as
    :func:`task_params` would decode the local property; None otherwise."""
    if not _EMBEDDING:
        return None
    raw = _EMBEDDING[-1].get(key)
    return json.loads(raw) if raw else None


class EmbeddedParams:
    """Context manager for building a plan whose task functions carry this round's values (Spark Connect)."""

    def __init__(self, values: Mapping[str, Any]):
        self._values = _encoded(values)

    def __enter__(self) -> EmbeddedParams:
        _EMBEDDING.append(dict(self._values))
        return self

    def __exit__(self, *exc) -> None:
        _EMBEDDING.pop()
