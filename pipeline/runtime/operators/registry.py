"""The plug-in point for stateful operators: which function builds the Spark side of each node type, and the
operator's traits the driver reads instead of switching on node types (:class:`OperatorTraits`).

An operator is two things:

* a **node** in :mod:`pipeline.job`: a frozen dataclass with ``uid``, ``inputs`` (the node ids it reads,
  in order), the class attribute ``STATE_NAMES`` (its state names, e.g. ``("left", "right")``) and,
  optionally, ``ttl_seconds`` (the runtime then hands its tasks the epoch's TTL cutoff
  ``ttl_cutoff_us = end(epoch) - ttl``; ``None`` uses ``PIPELINE_STATE_TTL_SECONDS``, ``0`` none);
* a **builder** registered here for the node type: ``builder(spark, job, node, resolve, io)`` returns
  ``(DataFrame, output arrow schema)``. ``resolve(node_id)`` gives the DataFrame of an input (stateless steps
  applied); ``io`` is the :class:`~pipeline.runtime.spark.dataflow.OperatorIO` (parallelism, state/output prefixes,
  parent state handles, TTL cutoff, ack prefix). The builder keys and shuffles its input
  (:func:`pipeline.keygroups.key_group_expr`, :func:`pipeline.runtime.spark.routing.shuffle_to_subtasks`) and maps
  each partition with a task that restores the subtask's key groups, calls a pure kernel
  (:mod:`pipeline.operators`), writes state/output and yields its task reports
  (:func:`pipeline.runtime.operators.task.emit_handles`).

Task reports (:class:`~pipeline.checkpoint.report.TaskReport`) are the acknowledgement. Kinds: ``STATE`` (one per
state name), ``OUTPUT``, ``CHANNEL`` (unaligned in-flight data), ``DEAD_LETTER`` (its rows counted in the
checkpoint's ``dead_letters`` under ``operator=<uid>``) and ``DROPPED`` (``count``, in the checkpoint's ``dropped``
stats per operator).
See ``docs/operators.md`` ("Adding an operator").
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipeline.exceptions import ConfigError

__all__ = ["OperatorTraits", "register_operator", "builder_for", "traits_for"]


@dataclass(frozen=True)
class OperatorTraits:
    """What the driver needs to know about an operator type, without naming it."""

    #: its records carry their own epoch (``_pepoch``): a per-row TTL rule (join, deduplicate)
    row_epochs: bool = False
    #: an unaligned checkpoint parks its in-flight input as channel state (the join, the one multi-input operator)
    parks_channels: bool = False
    #: an upsert sink it writes is merged with its earlier staged output of the same checkpoint (aggregate, writer)
    merges_upserts: bool = False
    #: ``check(job, node, config)``: refuses up front what its runtime cannot honour (ConfigError), None: nothing
    check: Callable | None = None
    #: the state backends (``PIPELINE_STATE_BACKEND``) its tasks run on: both for a task that reads and writes its
    #: state through the state-access port (:mod:`pipeline.runtime.operators.state_access`), as every built-in one
    state_backends: tuple[str, ...] = ("heap", "rocksdb")


_BUILDERS: dict[type, Callable] = {}
_TRAITS: dict[type, OperatorTraits] = {}


def register_operator(node_type: type, traits: OperatorTraits = OperatorTraits()) -> Callable[[Callable], Callable]:
    """Decorator: ``builder`` builds the Spark side of nodes of ``node_type``, which have ``traits``."""
    def deco(fn: Callable) -> Callable:
        _BUILDERS[node_type] = fn
        _TRAITS[node_type] = traits
        return fn
    return deco


def builder_for(node) -> Callable:
    """The builder registered for ``type(node)``. The built-in operators register when their modules are
    imported (:mod:`pipeline.runtime.spark.operator_plans`, which the driver imports); this module imports none of them."""
    try:
        return _BUILDERS[type(node)]
    except KeyError:
        raise ConfigError(f"no runtime registered for operator {getattr(node, 'uid', node)!r} "
                          f"({type(node).__name__})") from None


def traits_for(node) -> OperatorTraits:
    """The traits registered with ``type(node)``'s builder (:func:`register_operator`)."""
    try:
        return _TRAITS[type(node)]
    except KeyError:
        raise ConfigError(f"no runtime registered for operator {getattr(node, 'uid', node)!r} "
                          f"({type(node).__name__})") from None
