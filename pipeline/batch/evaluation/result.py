"""The result of a batch plan (:class:`BatchResult`) and the plan's internal columns: what every rule module of
:mod:`pipeline.batch.evaluation` reads or fills."""
from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.batch.evaluation.prefix import PEPOCH, Prefix
from pipeline.batch.evaluation.rounds import ROUND

PARKED = "__parked"   # a row an unaligned snapshot parked at the join (read, consumed by everything but the join)
WM_CHANNELS = "_wm_channel"   # a join's rows' watermark channel sets, when a window reads them (wm_channels)
INTERNAL = ("_source", "_partition", "_seq", "_row", PEPOCH, ROUND, PARKED, WM_CHANNELS)   # ROUND: multi-round only
# the window state's documented columns (docs/windows.md "State after checkpoint n"): event time in µs, the epoch
# the record was processed in, and the watermark table's operator row (channel "")
WINDOW_EVENT_US, WINDOW_EPOCH, WATERMARK_ROW = "_event_us", "_epoch", ""
EXACT_SUM = "decimal(38,9)"


@dataclass
class BatchResult:
    """Lazy Spark DataFrames of every object the batch plan models, and what it does not model."""

    prefix: Prefix
    sinks: dict[str, object] = field(default_factory=dict)       # table -> DataFrame
    states: dict[str, object] = field(default_factory=dict)      # "state/<uid>/<name>" -> DataFrame
    unchecked: dict[str, str] = field(default_factory=dict)      # object -> why it is not modelled
    messages: list[str] = field(default_factory=list)
    counts: dict[str, object] = field(default_factory=dict)      # lazily counted figures (DataFrames)
    cached: list = field(default_factory=list)                   # persisted DataFrames (see release())
    matched: dict[str, object] = field(default_factory=dict)     # join states with the ``_matched`` flag
    frames: dict[int, object] = field(default_factory=dict)      # node id -> DataFrame (with internal columns)
    # label in ``counts`` -> the rows a join dead-letters, when the kernel's per-round rule decided repeated unique
    # keys (:func:`~pipeline.batch.evaluation.join_repeats.fold_repeats`; bootstrap writes them)
    unique_dead: dict[str, object] = field(default_factory=dict)
    # operator uid -> the rows an interval or temporal join dead-letters, in its runtime's Parquet columns + _pepoch
    dead_rows: dict[str, object] = field(default_factory=dict)
    # label in ``counts`` -> uid of a join compiled without looking for repeated unique keys (``PlanContext.fold``): a
    # count > 0 means the plan must be compiled again with the join in ``fold`` (pipeline.quality.recovery)
    unfolded: dict[str, str] = field(default_factory=dict)

    def release(self) -> None:
        """Unpersist what the plan cached (sources read once, join outputs used twice)."""
        for df in self.cached:
            df.unpersist()
        self.cached.clear()

    def objects(self) -> dict[str, object]:
        return {**{f"sink/{t}": d for t, d in self.sinks.items()}, **self.states}



def visible(df):
    if not any(c in INTERNAL for c in df.columns):
        return df          # the same DataFrame: an object shared by a state and a sink is computed once
    return df.select(*[c for c in df.columns if c not in INTERNAL])


def orderable(dt) -> bool:
    """Spark can compare values of this type (``min`` of a struct holding it)."""
    from pyspark.sql.types import ArrayType, MapType, StructType
    if isinstance(dt, MapType) or dt.typeName() == "variant":
        return False
    if isinstance(dt, ArrayType):
        return orderable(dt.elementType)
    if isinstance(dt, StructType):
        return all(orderable(f.dataType) for f in dt.fields)
    return True


def nested(dt) -> bool:
    """The join kernel leaves such a column out of its order (``join.sortable``: nested types)."""
    from pyspark.sql.types import ArrayType, MapType, StructType
    return isinstance(dt, (ArrayType, MapType, StructType))
