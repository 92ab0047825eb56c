"""The driver's part of the lookup join (docs/operators.md "Lookup join"): refuse up front what it cannot honour
(:func:`check_lookup_joins`: a missing or unreadable side table, checkpoint modes in which a checkpoint reads past
its barrier), and pin each epoch's side-table version before the epoch's Spark round reads a row
(:func:`lookup_values`: the round values of :mod:`pipeline.runtime.spark.lookup_plan`, from the per-epoch record
of :mod:`pipeline.lookup.pins`)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipeline.barriers.events import CheckpointingMode
from pipeline.config import PipelineConfig
from pipeline.exceptions import ConfigError
from pipeline.job import Job, LookupJoinNode
from pipeline.lookup.pins import pin_epoch
from pipeline.lookup.tables import pin_current
from pipeline.runtime.spark.lookup_plan import lookup_key

__all__ = ["lookup_nodes", "check_lookup_joins", "lookup_values"]


def lookup_nodes(job: Job) -> list[LookupJoinNode]:
    return [n for n in job.nodes if isinstance(n, LookupJoinNode)]


def check_lookup_joins(job: Job, config: PipelineConfig) -> None:
    """Before any side effect: every side table opens (ConfigError naming it), and checkpoints are aligned
    exactly-once (a checkpoint then processes exactly its epoch's rows, so "the epoch's version" is one version)."""
    nodes = lookup_nodes(job)
    if not nodes:
        return
    if config.unaligned or config.checkpoint_mode == CheckpointingMode.AT_LEAST_ONCE:
        what = ("PIPELINE_UNALIGNED=true" if config.unaligned
                else f"PIPELINE_CHECKPOINT_MODE={config.checkpoint_mode}")
        raise ConfigError(f"job {job.name!r}: lookup join {nodes[0].uid!r} needs aligned exactly-once checkpoints "
                          f"({what} lets a checkpoint read rows of the next epoch, which has its own table version)")
    for n in nodes:
        try:
            pin_current(n.table.resolved(config.source_uri))
        except ConfigError as e:
            raise ConfigError(f"job {job.name!r}, lookup join {n.uid!r} (table={n.table.spec!r}): {e}") from None


def lookup_values(ctx: Any, epochs: Sequence[int]) -> dict[str, dict]:
    """The round values of every lookup join: ``{lookup_key(uid): {"epochs": {epoch: pin}}}``, each pin the recorded
    one of its epoch or, the first time the epoch is processed, the current version, recorded now."""
    out: dict[str, dict] = {}
    for n in lookup_nodes(ctx.job):
        table = n.table.resolved(ctx.config.source_uri)
        out[lookup_key(n.uid)] = {"epochs": {str(e): pin_epoch(ctx.ckpt_fio, ctx.job_root, n.uid, e, table)
                                             for e in epochs}}
    return out
