"""The typed job API: sources, map/filter, a two-input stream-stream join, keyed aggregation, sinks.

A job is a small dataflow graph. Stateless steps (``filter``/``select``) are Spark SQL expressions and run
inside Spark's optimiser; stateful operators (``join``, ``aggregate``) own keyed state in key groups and
are executed by the epoch runtime, which snapshots their state at every checkpoint. Example::

    job = Job("orders_payments", max_parallelism=128)
    orders = job.source("orders", ORDERS_SCHEMA, key="order_id")
    payments = job.source("payments", PAYMENTS_SCHEMA, key="order_id")
    captured = payments.filter("status = 'captured'").select(
        "order_id", "payment_id", "amount AS paid_amount", "event_time AS payment_time")
    paid = orders.select("order_id", "customer_id", "merchant_id", "amount AS order_amount",
                         "event_time AS order_time").join(captured, on="order_id", uid="paid-join")
    paid.sink("paid_orders")
    paid.aggregate(uid="revenue", key="merchant_id", aggs={"paid_orders": ("count", None),
                   "revenue": ("sum", "paid_amount")}).sink("merchant_revenue", mode="upsert")

Every record carries ``_ingest_ts`` (used for state TTL) through stateless steps automatically.

Over 400 lines: the user API is one surface (Job, Stream and the nodes they build): split, it would split what a
user reads.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal, TypeGuard

import pyarrow as pa

from pipeline.exceptions import ConfigError
from pipeline.operators.aggregate_functions import FUNCTIONS as _AGG_FUNCTIONS
from pipeline.operators.aggregate_functions import parse_aggs
from pipeline.operators.join import JoinType, Uniqueness
from pipeline.operators.lookup import LOOKUP_HOWS, SideTable
from pipeline.sink.table_format import TableFormat
from pipeline.source.lake_commits import IngestTime, LakeTable

__all__ = ["Job", "Stream", "SourceNode", "MapNode", "UnionNode", "JoinNode", "AggregateNode", "DedupNode", "WindowNode",
           "RankNode", "ProcessNode", "SinkNode", "LookupJoinNode", "IntervalJoinNode", "TemporalJoinNode", "TimedJoinNode",
           "OverAggregateNode",
           "is_operator", "emits_updates",
           "AGG_FUNCTIONS", "WINDOW_AGG_FUNCTIONS", "JOIN_TYPES", "INTERNAL_COLUMNS", "JOIN_KEY", "join_key_sql",
           "RANK_KEY", "rank_key_sql",
           "join_output"]

AGG_FUNCTIONS = _AGG_FUNCTIONS   # count, sum, min, max, avg, count_distinct (pipeline/operators/aggregate_functions.py)
WINDOW_AGG_FUNCTIONS = AGG_FUNCTIONS
JOIN_TYPES = tuple(t.value for t in JoinType)  # the public API's strings for ``how``
_UNIQUENESS = (None,) + tuple(u.value for u in Uniqueness)
INTERNAL_COLUMNS = ("_ingest_ts",)
#: the column a join on several keys is keyed by (state and routing): see :func:`join_key_sql`
JOIN_KEY = "__join_key"
#: the column a top-N on several key columns is keyed by (state and routing): :func:`rank_key_sql`
RANK_KEY = "__rank_key"
_UID = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]{0,63}$")


@dataclass(frozen=True, slots=True)
class SourceNode:
    name: str
    schema: pa.Schema
    key: str | None  # records with a null/empty key are bad input (dead letter / fail)
    format: Literal["auto", "parquet", "jsonl"] = "auto"
    table: LakeTable | None = None        # a lake table read as the source (pipeline/source/lake.py)
    ingest_time: IngestTime = "commit"    # a lake source's _ingest_ts: the commit time, or the table's column


@dataclass(frozen=True, slots=True)
class MapNode:
    parent: int
    kind: Literal["filter", "select"]
    exprs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class UnionNode:
    """``Stream.union``: the rows of every parent stream, as one stream (SQL ``UNION ALL``; stateless). The parents
    have the same columns (names and types; matched by name). Each row keeps its own event time, ``_ingest_ts`` and
    source position, so barriers, alignment and watermark channels are those of its inputs (docs/operators.md)."""

    parents: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LookupJoinNode:
    """``Stream.lookup_join``: each row joined with a bounded side table, as of the version pinned for the epoch
    that processes it (Flink's lookup join ``FOR SYSTEM_TIME AS OF``; docs/operators.md "Lookup join"). Keyed
    state: none (stateless, like ``union``: no shuffle); its ``uid`` names the record of the pinned versions."""

    uid: str
    parent: int
    table: SideTable
    stream_key: str
    table_key: str
    how: Literal["inner", "left"]
    columns: tuple[str, ...]   # the side table's columns in the output (empty: every column but its key)

    @property
    def parents(self) -> tuple[int, ...]:
        return (self.parent,)


@dataclass(frozen=True, slots=True)
class JoinNode:
    """Stream-stream equi-join: every pair of rows with equal keys, once, while the older is within the TTL
    (see ``docs/operators.md``). Each side is held in keyed state until TTL expiry (or, with ``unique``,
    until matched)."""

    uid: str
    left: int
    right: int
    on: str
    ttl_seconds: int | None  # None: job default (PIPELINE_STATE_TTL_SECONDS)
    output: tuple[str, ...] | None  # column order of the joined rows; None: key, left, right
    how: JoinType = JoinType.INNER           # inner | left | right | full (a string is coerced)
    unique: Uniqueness = Uniqueness.NONE     # none | left | right | both: sides whose keys are declared unique
    keys: tuple[str, ...] = ()               # join keys of several columns (then ``on`` is JOIN_KEY, see join_key_sql)

    def __post_init__(self) -> None:  # coerced once: the rest of the package sees the enums
        object.__setattr__(self, "how", JoinType(self.how))
        object.__setattr__(self, "unique", Uniqueness(self.unique or Uniqueness.NONE))

    STATE_NAMES: ClassVar[tuple[str, ...]] = ("left", "right")

    @property
    def inputs(self) -> tuple[int, ...]:
        return (self.left, self.right)


@dataclass(frozen=True, slots=True)
class AggregateNode:
    """Keyed running aggregation; emits the new totals of every key that changed (an upsert stream)."""

    uid: str
    parent: int
    key: str
    aggs: tuple[tuple[str, str, str | None], ...]  # (output column, function, input column)
    filters: tuple[tuple[str, str], ...] = ()       # (output column, SQL condition): FILTER (WHERE ...)

    STATE_NAMES: ClassVar[tuple[str, ...]] = ("agg",)

    @property
    def inputs(self) -> tuple[int, ...]:
        return (self.parent,)


@dataclass(frozen=True, slots=True)
class DedupNode:
    """Passes the first row per key while an earlier kept row of that key is within the TTL."""

    uid: str
    parent: int
    key: str
    ttl_seconds: int | None  # None: job default (PIPELINE_STATE_TTL_SECONDS); 0: keys held for ever

    STATE_NAMES: ClassVar[tuple[str, ...]] = ("keys",)

    @property
    def inputs(self) -> tuple[int, ...]:
        return (self.parent,)


@dataclass(frozen=True, slots=True)
class RankNode:
    """Top-N per key (``Stream.top_n``) and keep-last deduplication (``Stream.keep_last``, N = 1): the first ``n``
    rows per key in a total order, as an updating stream keyed by (key, rank); semantics: docs/operators.md
    "Top-N"."""

    uid: str
    parent: int
    key: str                                  # the state / routing key: a column, or RANK_KEY for several
    keys: tuple[str, ...]                     # the partition columns as the user named them
    order_by: tuple[tuple[str, bool], ...]    # (column, descending)
    n: int
    rank_column: str | None                   # None: no rank column (n == 1 only)

    STATE_NAMES: ClassVar[tuple[str, ...]] = ("rank",)

    @property
    def inputs(self) -> tuple[int, ...]:
        return (self.parent,)

    @property
    def sink_key(self) -> tuple[str, ...]:
        """The key of the upsert stream: the partition columns, then the rank column when there is one."""
        return self.keys + ((self.rank_column,) if self.rank_column else ())


@dataclass(frozen=True, slots=True)
class WindowNode:
    """Keyed event-time windows with a watermark (exact semantics: docs/windows.md)."""

    uid: str
    parent: int
    key: str
    event_time: str
    size_seconds: int
    slide_seconds: int
    max_out_of_orderness_seconds: int
    allowed_lateness_seconds: int
    aggs: tuple[tuple[str, str, str | None], ...]  # (output column, function, input column)
    emit: Literal["final", "update"]
    filters: tuple[tuple[str, str], ...] = ()       # (output column, SQL condition): FILTER (WHERE ...)
    gap_seconds: int = 0                             # > 0: session windows (size and slide 0)

    STATE_NAMES: ClassVar[tuple[str, ...]] = ("win", "wm")

    @property
    def inputs(self) -> tuple[int, ...]:
        return (self.parent,)


@dataclass(frozen=True, slots=True)
class IntervalJoinNode:
    """``Stream.interval_join``: every pair of rows of the two streams with equal ``on`` and
    ``left_time + lower <= right_time <= left_time + upper`` (Flink's interval join; inner or outer), each side held
    in state until the watermark (the minimum over both inputs' channels) passes its last possible partner, when an
    outer side's unmatched row is emitted with nulls (docs/operators.md "Interval join")."""

    uid: str
    left: int
    right: int
    on: str
    left_time: str
    right_time: str
    lower_seconds: int
    upper_seconds: int
    max_out_of_orderness_seconds: int = 0
    how: Literal["inner", "left", "right", "full"] = "inner"

    STATE_NAMES: ClassVar[tuple[str, ...]] = ("left", "right", "wm")

    @property
    def inputs(self) -> tuple[int, ...]:
        return (self.left, self.right)


@dataclass(frozen=True, slots=True)
class TemporalJoinNode:
    """``Stream.temporal_join``: each row of the probe stream (left) joined with the row of the versioned stream
    (right) valid at its event time: the greatest ``version_time <= time`` of its key (Flink's event-time temporal
    join, ``FOR SYSTEM_TIME AS OF``), emitted once the watermark passes its time; a version behind the watermark
    is a late version, dead-lettered (docs/operators.md "Temporal join")."""

    uid: str
    left: int
    right: int
    on: str
    time: str
    version_time: str
    how: Literal["inner", "left"] = "inner"
    max_out_of_orderness_seconds: int = 0

    STATE_NAMES: ClassVar[tuple[str, ...]] = ("left", "right", "wm")

    @property
    def inputs(self) -> tuple[int, ...]:
        return (self.left, self.right)


TimedJoinNode = IntervalJoinNode | TemporalJoinNode    # the two-input event-time joins (one runtime, one batch rule)


@dataclass(frozen=True, slots=True)
class OverAggregateNode:
    """``Stream.over_aggregate``: per ``key``, ordered by ``event_time``, each row with aggregates over its frame
    (``ROWS BETWEEN rows PRECEDING AND CURRENT ROW`` or ``RANGE BETWEEN range_seconds PRECEDING AND CURRENT ROW``),
    emitted when the watermark passes its time (Flink's event-time OVER window; docs/operators.md "Over
    aggregate")."""

    uid: str
    parent: int
    key: str
    event_time: str
    aggs: tuple[tuple[str, str, str | None], ...]  # (output column, function, input column)
    rows: int | None                                # ROWS ... PRECEDING (None: a RANGE frame)
    range_seconds: int | None                       # RANGE ... PRECEDING (None: a ROWS frame)
    max_out_of_orderness_seconds: int = 0
    updating: bool = False   # its input is a running aggregate's or a top-N's updating stream (a retract changelog)

    STATE_NAMES: ClassVar[tuple[str, ...]] = ("rows", "wm")

    @property
    def inputs(self) -> tuple[int, ...]:
        return (self.parent,)


@dataclass(frozen=True, slots=True, eq=False)
class ProcessNode:
    """User-defined keyed stateful logic, vectorised over Arrow (contract: docs/process.md)."""

    uid: str
    parent: int
    key: str
    fn: Callable[[pa.Table, pa.Table], tuple[pa.Table, pa.Table]]
    state_schema: pa.Schema
    output_schema: pa.Schema
    ttl_seconds: int | None

    STATE_NAMES: ClassVar[tuple[str, ...]] = ("proc",)

    @property
    def inputs(self) -> tuple[int, ...]:
        return (self.parent,)


@dataclass(frozen=True, slots=True)
class SinkNode:
    table: str
    parent: int
    mode: Literal["append", "upsert"]
    key: tuple[str, ...]
    format: str | None = None  # "iceberg" | "delta" | "epochal"; None: PIPELINE_SINK_FORMAT or the default
    partition_by: tuple[str, ...] = ()  # partition columns (Hive-style directories; Delta/Iceberg partitions)


Node = (SourceNode | MapNode | UnionNode | LookupJoinNode | JoinNode | AggregateNode | DedupNode | WindowNode | RankNode
        | ProcessNode | SinkNode | IntervalJoinNode | TemporalJoinNode | OverAggregateNode)
StatefulNode = (JoinNode | AggregateNode | DedupNode | WindowNode | RankNode | ProcessNode | IntervalJoinNode
                | TemporalJoinNode | OverAggregateNode)


def is_operator(node) -> bool:
    """A stateful operator node: has a uid, ``inputs`` and ``STATE_NAMES`` (see
    :mod:`pipeline.runtime.operators.registry`)."""
    return hasattr(type(node), "STATE_NAMES")


def emits_updates(node: object) -> TypeGuard[AggregateNode | RankNode | WindowNode | OverAggregateNode]:
    """The node's output is an updating stream (a running aggregate, a top-N, a window with ``emit="update"``):
    rows that replace earlier rows of the same key, not rows of their own."""
    return isinstance(node, (AggregateNode, RankNode)) or (isinstance(node, WindowNode) and node.emit == "update") or (
        isinstance(node, OverAggregateNode) and node.updating)


@dataclass(frozen=True, slots=True)
class Stream:
    """A handle on a node of the job graph; methods add nodes downstream."""

    job: Job
    node: int

    def filter(self, condition: str) -> Stream:
        """Rows for which the Spark SQL boolean expression ``condition`` holds (e.g. ``"amount > 100"``). Stateless;
        runs inside Spark's optimiser."""
        return self.job._add(MapNode(self.node, "filter", (condition,)))

    def select(self, *exprs: str) -> Stream:
        """A projection: Spark SQL expressions, ``AS`` for names (``"amount AS paid_amount"``). Stateless;
        ``_ingest_ts`` is carried through automatically."""
        if not exprs:
            raise ConfigError("select() needs at least one expression")
        return self.job._add(MapNode(self.node, "select", tuple(exprs)))

    def union(self, *others: Stream) -> Stream:
        """The rows of this stream and of ``others`` as one stream (SQL ``UNION ALL``). Every stream must have the
        same columns (names and types, matched by name); a difference is a configuration error naming it. Stateless:
        no ``uid``. Barriers, alignment and watermarks: docs/operators.md ("union")."""
        if not others:
            raise ConfigError("union() needs at least one other stream")
        for o in others:
            if not isinstance(o, Stream) or o.job is not self.job:
                raise ConfigError("union(): every stream must be a Stream of the same job")
        parents = (self.node,) + tuple(o.node for o in others)
        if len(set(parents)) != len(parents):
            raise ConfigError("union(): a stream is listed twice (union a stream with itself through a select)")
        self.job.check_union_schemas(parents)
        return self.job._add(UnionNode(parents))

    def join(self, other: Stream, *, on: str | Sequence[str], uid: str, how: str = "inner",
             unique: str | None = None, ttl_seconds: int | None = None,
             output: Sequence[str] | None = None) -> Stream:
        """Stream-stream equi-join on column ``on`` (or on several columns: ``on=["id", "window_start"]``; a row with
        a null in any key column matches nothing, as in SQL). ``how``: inner, left, right, full (an unmatched outer row is
        emitted with nulls when it expires from state). ``unique``: None, "left", "right" or "both" declares
        keys unique on that side, so matched rows of the other side leave state; a violating row goes to the
        dead-letter location (or fails the epoch, ``PIPELINE_BAD_RECORDS=fail``). An input that is an updating stream
        (a running aggregate, a top-N) makes it a retracting join: inner only, its pairs taken back as that input
        changes (docs/operators.md "Updating streams")."""
        if other.job is not self.job:
            raise ConfigError("cannot join streams of different jobs")
        if how not in JOIN_TYPES:
            raise ConfigError(f"join {uid!r}: how={how!r}; use one of {JOIN_TYPES}")
        if unique not in _UNIQUENESS:
            raise ConfigError(f"join {uid!r}: unique={unique!r}; use None, 'left', 'right' or 'both'")
        if ttl_seconds is not None and ttl_seconds < 0:
            raise ConfigError(f"join {uid!r}: ttl_seconds must be >= 0 (0: no expiry)")
        cols = (on,) if isinstance(on, str) else tuple(on)
        if not cols or not all(isinstance(c, str) and c for c in cols) or len(set(cols)) != len(cols):
            raise ConfigError(f"join {uid!r}: on={on!r}; name one key column or a list of distinct columns")
        if JOIN_KEY in cols or "_ingest_ts" in cols:
            raise ConfigError(f"join {uid!r}: {JOIN_KEY!r} and '_ingest_ts' cannot be join keys")
        key, keys = (cols[0], ()) if len(cols) == 1 else (JOIN_KEY, cols)
        if output is not None and JOIN_KEY in output:
            raise ConfigError(f"join {uid!r}: output cannot name the internal key column {JOIN_KEY!r}")
        return self.job._add(JoinNode(self.job._uid(uid), self.node, other.node, key, ttl_seconds,
                                      tuple(output) if output else None, JoinType(how),
                                      Uniqueness(unique or "none"), keys))

    def interval_join(self, other: Stream, *, uid: str, on: str, left_time: str, right_time: str,
                      lower_seconds: int, upper_seconds: int, max_out_of_orderness_seconds: int = 0,
                      how: Literal["inner", "left", "right", "full"] = "inner") -> Stream:
        """Flink's interval join: every pair of a row ``l`` of this stream and a row ``r`` of ``other``
        with equal ``on`` and ``l.left_time + lower_seconds <= r.right_time <= l.left_time + upper_seconds``
        (bounds may be negative). Output: ``on``, this stream's other columns, then ``other``'s (names must differ;
        ``_ingest_ts`` is not output). Rows behind the watermark (the minimum over both inputs' channels, less
        ``max_out_of_orderness_seconds``) and rows with a null key or time are dead letters, counted; state is
        released by the watermark. ``how`` left, right or full: a row of an outer side that paired with nothing is
        emitted once, with nulls for the other side's columns, when the watermark releases it (no on-time row can
        pair with it any more) (docs/operators.md "Interval join").

        Over 8 parameters: Flink's interval join arguments (key, two times, two bounds, out-of-orderness, join type),
        all keywords."""
        where = f"interval_join {uid!r}"
        if how not in ("inner", "left", "right", "full"):
            raise ConfigError(f"{where}: how={how!r}; use 'inner', 'left', 'right' or 'full'")
        self._timed_join_checks(where, other, on, (left_time, right_time), max_out_of_orderness_seconds)
        for name, v in (("lower_seconds", lower_seconds), ("upper_seconds", upper_seconds)):
            if not isinstance(v, int) or isinstance(v, bool):
                raise ConfigError(f"{where}: {name} must be a whole number of seconds (may be negative), got {v!r}")
        if lower_seconds > upper_seconds:
            raise ConfigError(f"{where}: lower_seconds ({lower_seconds}) is above upper_seconds ({upper_seconds})")
        return self.job._add(IntervalJoinNode(self.job._uid(uid), self.node, other.node, on, left_time, right_time,
                                              lower_seconds, upper_seconds, max_out_of_orderness_seconds, how))

    def temporal_join(self, versions: Stream, *, uid: str, on: str, time: str, version_time: str,
                      how: Literal["inner", "left"] = "inner", max_out_of_orderness_seconds: int = 0) -> Stream:
        """Flink's event-time temporal join (``FOR SYSTEM_TIME AS OF time``): each row of this stream joined with
        the row of ``versions`` valid at its ``time``, i.e. the one of its key ``on`` with the greatest
        ``version_time <= time`` (ties: the later ``_ingest_ts``, then the other columns). A row is emitted once
        the watermark (both inputs' channels, less ``max_out_of_orderness_seconds``) passes its time; ``how="left"``
        emits a row without a version with nulls. Output: this stream's columns, then the version's other columns
        (not ``on``, not ``_ingest_ts``). Late rows, late versions (behind the watermark when they arrive: never
        applied), null keys and times are dead letters, counted (docs/operators.md "Temporal join")."""
        where = f"temporal_join {uid!r}"
        self._timed_join_checks(where, versions, on, (time, version_time), max_out_of_orderness_seconds)
        if how not in ("inner", "left"):
            raise ConfigError(f"{where}: how={how!r}; use 'inner' or 'left'")
        return self.job._add(TemporalJoinNode(self.job._uid(uid), self.node, versions.node, on, time, version_time,
                                              how, max_out_of_orderness_seconds))

    def _timed_join_checks(self, where: str, other: Stream, on: str, times: tuple[str, str], ooo: int) -> None:
        if not isinstance(other, Stream) or other.job is not self.job:
            raise ConfigError(f"{where}: the other stream must be a Stream of the same job")
        if other.node == self.node:
            raise ConfigError(f"{where}: both inputs are the same stream (join it with a select of itself)")
        for name, c in (("on", on), ("left time", times[0]), ("right time", times[1])):
            if not isinstance(c, str) or not c or c.startswith("_"):
                raise ConfigError(f"{where}: {name}={c!r}; name a user column")
        if on in times:
            raise ConfigError(f"{where}: the key {on!r} cannot be an event-time column")
        if not isinstance(ooo, int) or isinstance(ooo, bool) or ooo < 0:
            raise ConfigError(f"{where}: max_out_of_orderness_seconds must be a non-negative whole number, got {ooo!r}")
        for side, nid in (("left", self.node), ("right", other.node)):
            upd = [n for n in (self.job.nodes[b] for b in self.job.bases(nid)) if emits_updates(n)]
            if upd:
                raise ConfigError(f"{where}: the {side} input is the updating stream of {upd[0].uid!r} (each update "
                                  "would be a row of its own); join an append stream")
        schemas = []
        for side, nid, t in (("left", self.node, times[0]), ("right", other.node, times[1])):
            sch = self.job.static_schema(nid)
            schemas.append(sch)
            if sch is None:
                continue
            missing = [c for c in (on, t) if c not in sch.names]
            if missing:
                raise ConfigError(f"{where}: the {side} input lacks columns {missing} (has {sch.names})")
            if not pa.types.is_timestamp(sch.field(t).type):
                raise ConfigError(f"{where}: the {side} time column {t!r} must be a timestamp, is {sch.field(t).type}")
        if schemas[0] is not None and schemas[1] is not None:   # the output's names (the runtime checks them too)
            skip = {on, "_ingest_ts"}
            clash = sorted((set(schemas[0].names) - skip) & (set(schemas[1].names) - skip))
            if clash:
                raise ConfigError(f"{where}: both inputs have the columns {clash}; rename them on one side with "
                                  f"select() (e.g. select('{clash[0]} AS right_{clash[0]}', ...))")

    def lookup_join(self, *, uid: str, table: str, on: str | tuple[str, str], how: str = "inner",
                    columns: Sequence[str] | None = None) -> Stream:
        """Join each row with a bounded side table ``table`` (``"parquet:<uri>"``, ``"delta:<uri>"`` or
        ``"iceberg:<uri>"``; a URI without a scheme is relative to the source root) on ``on`` (a column of both,
        or ``(stream column, table column)``). Each epoch joins the table version pinned when the epoch is first
        processed (recorded, so a replay joins the same version). ``how``: inner or left; a null key matches
        nothing. ``columns``: the table's columns to add (default: all but its key). Rules: docs/operators.md
        "Lookup join"."""
        where = f"lookup_join {uid!r}"
        uid = self.job._uid(uid)
        if uid in self.job.lookup_uids():
            raise ConfigError(f"operator uid {uid!r} used twice in job {self.job.name!r}")
        side = SideTable.parse(table, where)
        pair = (on, on) if isinstance(on, str) else tuple(on)
        if len(pair) != 2 or not all(isinstance(c, str) and c and not c.startswith("_") for c in pair):
            raise ConfigError(f"{where}: on={on!r}; name a column of both, or (stream column, table column)")
        if how not in LOOKUP_HOWS:
            raise ConfigError(f"{where}: how={how!r}; use one of {LOOKUP_HOWS}")
        cols = tuple(columns or ())
        if isinstance(columns, str) or len(set(cols)) != len(cols) or pair[1] in cols or any(
                not isinstance(c, str) or not c or c.startswith("_") for c in cols):
            raise ConfigError(f"{where}: columns={columns!r}; name distinct columns of the table other than its key")
        return self.job._add(LookupJoinNode(uid, self.node, side, pair[0], pair[1], how,  # type: ignore[arg-type]
                                            cols))

    def deduplicate(self, *, uid: str, key: str, ttl_seconds: int | None = None) -> Stream:
        """The first row per ``key`` passes; a later row is dropped (and counted) while the kept row is held,
        i.e. within ``ttl_seconds`` of ``_ingest_ts`` (see ``docs/operators.md``)."""
        if ttl_seconds is not None and ttl_seconds < 0:
            raise ConfigError(f"deduplicate {uid!r}: ttl_seconds must be >= 0 (0: no expiry)")
        return self.job._add(DedupNode(self.job._uid(uid), self.node, key, ttl_seconds))

    def top_n(self, *, uid: str, key: str | Sequence[str], order_by: str | Sequence[str], n: int,
              rank_column: str | None = "rank_number") -> Stream:
        """The first ``n`` rows per ``key`` (a column or several) in the order ``order_by`` (``"price DESC"``,
        ``["price DESC", "date_time"]``): SQL's ``ROW_NUMBER() OVER (PARTITION BY key ORDER BY ...) <= n``, as an
        updating stream keyed by (key, ``rank_column``): sink it with ``mode="upsert"``. Ties are broken by
        ``_ingest_ts`` (later first), then the other columns; nulls sort last; a null key is one group
        (docs/operators.md "Top-N")."""
        uid = self.job._uid(uid)
        keys = (key,) if isinstance(key, str) else tuple(key)
        if not keys or not all(isinstance(c, str) and c for c in keys) or len(set(keys)) != len(keys):
            raise ConfigError(f"top_n {uid!r}: key={key!r}; name one column or a list of distinct columns")
        if RANK_KEY in keys or "_ingest_ts" in keys:
            raise ConfigError(f"top_n {uid!r}: {RANK_KEY!r} and '_ingest_ts' cannot be keys")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ConfigError(f"top_n {uid!r}: n must be a whole number >= 1, got {n!r}")
        if rank_column is None and n != 1:
            raise ConfigError(f"top_n {uid!r}: rank_column=None only with n=1 (the rank is part of the upsert key)")
        if rank_column is not None and (not _UID.match(rank_column) or rank_column in keys):
            raise ConfigError(f"top_n {uid!r}: rank_column={rank_column!r} is not a valid new column name")
        order = _parse_order(f"top_n {uid!r}", order_by)
        if any(c in keys for c, _ in order):
            raise ConfigError(f"top_n {uid!r}: order_by names a key column")
        return self.job._add(RankNode(uid, self.node, keys[0] if len(keys) == 1 else RANK_KEY, keys, order, n,
                                      rank_column))

    def keep_last(self, *, uid: str, key: str | Sequence[str], order_by: str | Sequence[str]) -> Stream:
        """Keep-last deduplication: the latest row per ``key`` by ``order_by`` (an event-time column, ascending:
        the row with the greatest value wins; ties: the later arrival), as an updating stream keyed by ``key``
        (Flink's ``ROW_NUMBER() OVER (PARTITION BY key ORDER BY time DESC) = 1``). ``top_n`` with ``n=1``, the
        order reversed and no rank column (docs/operators.md "Top-N")."""
        order = _parse_order(f"keep_last {uid!r}", order_by)
        flipped = [f"`{c}` {'ASC' if desc else 'DESC'}" for c, desc in order]
        return self.top_n(uid=uid, key=key, order_by=flipped, n=1, rank_column=None)

    def aggregate(self, *, uid: str, key: str, aggs: Mapping[str, tuple]) -> Stream:
        """Running keyed aggregate: ``aggs`` maps an output column to ``(function, input column)`` or
        ``(function, input column, where)`` with function ``count`` (input ``None``), ``sum``, ``min``, ``max``,
        ``avg`` or ``count_distinct``; ``where`` (a Spark SQL condition) is SQL's ``FILTER (WHERE ...)``. Emits
        the new totals of every key that changed in an epoch (an upsert stream: sink it with ``mode="upsert"``). A
        null key is one group, as in SQL (docs/operators.md "Aggregate"). Over another running aggregate's output
        (an updating stream, retract semantics): each upstream update replaces the earlier row of its upstream
        key; ``count``/``sum``/``avg`` only (docs/operators.md "Updating streams")."""
        spec, filters = parse_aggs(f"aggregate {uid!r}", aggs, AGG_FUNCTIONS)
        return self.job._add(AggregateNode(self.job._uid(uid), self.node, key, spec, filters))

    def window(self, *, uid: str, key: str, event_time: str, size_seconds: int, slide_seconds: int | None = None,
               max_out_of_orderness_seconds: int = 0, allowed_lateness_seconds: int = 0,
               aggs: Mapping[str, tuple[str, str | None]], emit: Literal["final", "update"] = "final") -> Stream:
        """Tumbling (``slide_seconds`` None) or sliding event-time windows per ``key``; output columns: the key,
        ``window_start``, ``window_end``, then ``aggs`` (count, sum, min, max, avg, count_distinct). Watermark,
        lateness and firing: docs/windows.md.

        Over 8 parameters: the window's definition as SQL and Flink spell it (size, slide, out-of-orderness,
        lateness, aggregates, emit), all keywords."""
        uid = self.job._uid(uid)
        slide = size_seconds if slide_seconds is None else slide_seconds
        for name, v in (("size_seconds", size_seconds), ("slide_seconds", slide),
                        ("max_out_of_orderness_seconds", max_out_of_orderness_seconds),
                        ("allowed_lateness_seconds", allowed_lateness_seconds)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"window {uid!r}: {name} must be a non-negative whole number of seconds, got {v!r}")
        if size_seconds <= 0 or slide <= 0 or slide > size_seconds or size_seconds % slide:
            raise ConfigError(f"window {uid!r}: size_seconds ({size_seconds}) must be a positive multiple of "
                              f"slide_seconds ({slide})")
        if emit not in ("final", "update"):
            raise ConfigError(f"window {uid!r}: emit must be 'final' or 'update', got {emit!r}")
        spec, filters = parse_aggs(f"window {uid!r}", aggs, WINDOW_AGG_FUNCTIONS)
        for out, _fn, _col in spec:
            if out in (key, "window_start", "window_end"):
                raise ConfigError(f"window {uid!r}: aggregate name {out!r} clashes with an output column")
        self._event_time_input_checks(f"window {uid!r}", key, event_time, spec)
        return self.job._add(WindowNode(uid, self.node, key, event_time, size_seconds, slide,
                                        max_out_of_orderness_seconds, allowed_lateness_seconds, spec, emit,
                                        filters))

    def _event_time_input_checks(self, where: str, key: str, event_time: str, spec) -> pa.Schema | None:
        """Refuse, when the job is built, an operator keyed on an event time (a window, a session window, an over
        aggregate) whose input cannot have its columns: the key, event time and aggregated columns against the
        input's schema when the graph decides it (returned, else None); ``_ingest_ts`` as the event time of a
        join's rows (a pair has two arrival times, and a join's output carries neither unless ``output=`` names
        it)."""
        base = self.job.nodes[self.job.chain_to(self.node)[0]]
        if event_time == "_ingest_ts" and type(base) is JoinNode and "_ingest_ts" not in (base.output or ()):
            raise ConfigError(f"{where}: event_time '_ingest_ts' is not a column of join {base.uid!r}'s rows (a "
                              "pair has two arrival times); window on an event-time column of one side")
        sch = self.job.static_schema(self.node)
        if sch is None:
            return None
        missing = [c for c in dict.fromkeys((key, event_time, *(c for _, _, c in spec if c))) if c not in sch.names]
        if missing:
            raise ConfigError(f"{where}: the input lacks columns {missing} (has {sch.names})")
        if not pa.types.is_timestamp(sch.field(event_time).type):
            raise ConfigError(f"{where}: event_time {event_time!r} must be a timestamp, is {sch.field(event_time).type}")
        return sch

    def session_window(self, *, uid: str, key: str, event_time: str, gap_seconds: int,
                       max_out_of_orderness_seconds: int = 0, allowed_lateness_seconds: int = 0,
                       aggs: Mapping[str, tuple[str, str | None]], emit: Literal["final"] = "final") -> Stream:
        """Event-time session windows per ``key`` (Flink's): a session closes when the watermark passes its last
        record + ``gap_seconds``; a record bridging two sessions merges them. Output columns as :meth:`window`
        (``window_start``: first record, ``window_end``: last record + gap); ``emit="final"`` only
        (docs/operators.md "Session windows")."""
        uid = self.job._uid(uid)
        for name, v in (("gap_seconds", gap_seconds), ("max_out_of_orderness_seconds", max_out_of_orderness_seconds),
                        ("allowed_lateness_seconds", allowed_lateness_seconds)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0 or (name == "gap_seconds" and v == 0):
                raise ConfigError(f"session window {uid!r}: {name} must be a whole number of seconds "
                                  f"(gap_seconds > 0), got {v!r}")
        if emit != "final":
            raise ConfigError(f"session window {uid!r}: emit must be 'final', got {emit!r} (a session's "
                              "window_start moves when a record merges it with an earlier one, so an update "
                              "stream keyed by (key, window_start) would leave stale rows)")
        spec, filters = parse_aggs(f"session window {uid!r}", aggs, WINDOW_AGG_FUNCTIONS)
        for out, _fn, _col in spec:
            if out in (key, "window_start", "window_end"):
                raise ConfigError(f"session window {uid!r}: aggregate name {out!r} clashes with an output column")
        self._event_time_input_checks(f"session window {uid!r}", key, event_time, spec)
        return self.job._add(WindowNode(uid, self.node, key, event_time, 0, 0, max_out_of_orderness_seconds,
                                        allowed_lateness_seconds, spec, "final", filters, gap_seconds))

    def over_aggregate(self, *, uid: str, key: str, event_time: str, aggs: Mapping[str, tuple[str, str | None]],
                       rows_preceding: int | None = None, range_preceding_seconds: int | None = None,
                       max_out_of_orderness_seconds: int = 0) -> Stream:
        """Flink's event-time OVER aggregate: every row, once the watermark passes its ``event_time``, with
        ``aggs`` (count, sum, avg, min, max) over its frame in its ``key``'s rows ordered by time (ties: the other
        columns ascending, nulls last): ``rows_preceding=N`` is ``ROWS BETWEEN N PRECEDING AND CURRENT ROW``,
        ``range_preceding_seconds=S`` is ``RANGE BETWEEN INTERVAL S SECONDS PRECEDING AND CURRENT ROW`` (give one).
        Output: the input's columns (not ``_ingest_ts``), then ``aggs``; an append stream. Late rows and rows with
        a null key or time are dead letters, counted (docs/operators.md "Over aggregate")."""
        uid = self.job._uid(uid)
        where = f"over_aggregate {uid!r}"
        if (rows_preceding is None) == (range_preceding_seconds is None):
            raise ConfigError(f"{where}: give exactly one of rows_preceding or range_preceding_seconds")
        for name, v in (("rows_preceding", rows_preceding), ("range_preceding_seconds", range_preceding_seconds),
                        ("max_out_of_orderness_seconds", max_out_of_orderness_seconds)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise ConfigError(f"{where}: {name} must be a non-negative whole number, got {v!r}")
        for name, c in (("key", key), ("event_time", event_time)):
            if not isinstance(c, str) or not c or c.startswith("_"):
                raise ConfigError(f"{where}: {name}={c!r}; name a user column")
        spec, filters = parse_aggs(where, aggs, ("count", "sum", "avg", "min", "max"))
        if filters:
            raise ConfigError(f"{where}: filtered aggregates (FILTER (WHERE ...)) are not supported over a frame")
        upd = [n for n in (self.job.nodes[b] for b in self.job.bases(self.node)) if emits_updates(n)]
        other = [n for n in upd if not isinstance(n, (AggregateNode, RankNode))]
        if other:
            raise ConfigError(f"{where}: its input is the updating stream of {other[0].uid!r}, which emits no "
                              "retractions; an over aggregate reads an append stream, or a running aggregate's or a "
                              "top-N's updating stream")
        sch = self._event_time_input_checks(where, key, event_time, spec)
        if sch is not None:
            clash = [o for o, _, _ in spec if o in sch.names]
            if clash:
                raise ConfigError(f"{where}: aggregate names {clash} are input columns")
        return self.job._add(OverAggregateNode(uid, self.node, key, event_time, spec, rows_preceding,
                                               range_preceding_seconds, max_out_of_orderness_seconds, bool(upd)))

    def process(self, *, uid: str, key: str, fn: Callable[[pa.Table, pa.Table], tuple[pa.Table, pa.Table]],
                state_schema: pa.Schema, output_schema: pa.Schema, ttl_seconds: int | None = None) -> Stream:
        """User-defined keyed stateful logic: ``fn(rows, state) -> (new_state, output)`` over Arrow tables, called
        per subtask and round with the rows of this round and the state of their keys (docs/process.md)."""
        uid = self.job._uid(uid)
        if not callable(fn):
            raise ConfigError(f"process {uid!r}: fn must be callable")
        if not isinstance(state_schema, pa.Schema) or not isinstance(output_schema, pa.Schema):
            raise ConfigError(f"process {uid!r}: state_schema and output_schema must be pyarrow schemas")
        if key not in state_schema.names:
            raise ConfigError(f"process {uid!r}: state_schema must contain the key column {key!r}")
        reserved = [n for n in list(state_schema.names) + list(output_schema.names) if n in ("_kg", "_touched_us")]
        if reserved:
            raise ConfigError(f"process {uid!r}: schemas must not use reserved columns {reserved}")
        if ttl_seconds is not None and (not isinstance(ttl_seconds, int) or ttl_seconds <= 0):
            raise ConfigError(f"process {uid!r}: ttl_seconds must be a positive whole number or None")
        return self.job._add(ProcessNode(uid, self.node, key, fn, state_schema, output_schema, ttl_seconds))

    def sink(self, table: str, *, mode: Literal["append", "upsert"] = "append",
             key: Sequence[str] | None = None, format: str | None = None,
             partition_by: Sequence[str] | None = None) -> Stream:
        """Two-phase-commit sink. ``format``: ``"iceberg"``, ``"delta"`` or ``"epochal"`` (see
        ``docs/table-formats.md``); ``PIPELINE_SINK_FORMAT`` overrides it. ``partition_by``: columns whose values
        partition the table (string, integer, boolean or date columns; Hive-style ``col=value`` directories, Delta
        partition columns, Iceberg identity partitions)."""
        if mode not in ("append", "upsert"):
            raise ConfigError(f"sink {table!r}: mode must be append or upsert")
        parts = tuple(partition_by or ())
        if isinstance(partition_by, str) or len(set(parts)) != len(parts) or not all(
                isinstance(c, str) and c and not c.startswith("_") for c in parts):
            raise ConfigError(f"sink {table!r}: partition_by={partition_by!r}; name distinct columns of the stream "
                              "(not internal ones)")
        parent = self.job.nodes[self.node]
        if mode == "upsert" and not key:
            if isinstance(parent, AggregateNode):
                key = (parent.key,)
            elif isinstance(parent, WindowNode):
                key = (parent.key, "window_start")
            elif isinstance(parent, RankNode):
                key = parent.sink_key
            else:
                raise ConfigError(f"sink {table!r}: upsert needs key=")
        if not _UID.match(table) or table in self.job.sink_tables():
            raise ConfigError(f"sink table name {table!r} is invalid or used twice")
        if format is not None:
            format = TableFormat.parse(format, f"sink {table!r} format").value
        return self.job._add(SinkNode(table, self.node, mode, tuple(key or ()), format, parts))


@dataclass(eq=False)
class Job:
    """A job definition: name, max parallelism (fixed at creation) and the dataflow graph."""

    name: str
    max_parallelism: int = 128
    nodes: list[Node] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not _UID.match(self.name):
            raise ConfigError(f"job name {self.name!r}: letters, digits, '_' and '-' only")

    def _add(self, node: Node) -> Stream:
        self.nodes.append(node)
        return Stream(self, len(self.nodes) - 1)

    def _uid(self, uid: str) -> str:
        if not _UID.match(uid):
            raise ConfigError(f"operator uid {uid!r}: letters, digits, '_' and '-' only")
        if uid in self.operator_uids() or uid in self.lookup_uids():
            raise ConfigError(f"operator uid {uid!r} used twice in job {self.name!r}")
        return uid

    def source(self, name: str, schema: pa.Schema, *, key: str | None = None,
               format: Literal["auto", "parquet", "jsonl"] = "auto", table: str | None = None,
               ingest_time: IngestTime = "commit") -> Stream:
        """A source log ``<source root>/<name>/partition=<p>/<seq:08d>.parquet`` (or ``.jsonl``), or a lake table.

        A row whose ``key`` is null or empty, or that does not fit the schema, is bad input: dead-lettered (or the
        epoch fails, ``PIPELINE_BAD_RECORDS=fail``).

        Args:
            name: the source's name: its folder under the source root, and its name in checkpoints and dead letters.
            schema: the declared columns; must contain ``_ingest_ts`` (UTC timestamp, non-decreasing within a
                partition).
            key: the column whose null or empty values are bad input (None: none).
            format: ``"auto"`` (by file extension), ``"parquet"`` or ``"jsonl"``; a file log only.
            table: read a lake table instead of a file log, commit by commit: ``"delta:<uri>"``,
                ``"iceberg:<uri>"`` or ``"iceberg:<catalog>.<namespace>.<table>"`` (a relative URI is under the
                source root). Compactions are skipped, deletes and overwrites stop the job, a restore of the table
                is followed (how-to "Read a Delta or Iceberg table as a source").
            ingest_time: a lake source's ``_ingest_ts``: ``"commit"`` (the commit time, default) or ``"column"``
                (the table's own ``_ingest_ts`` column)."""
        if "_ingest_ts" not in schema.names:
            raise ConfigError(f"source {name!r}: schema must contain _ingest_ts")
        lake = LakeTable.parse(table, f"source {name!r}") if table is not None else None
        if ingest_time not in ("commit", "column"):
            raise ConfigError(f"source {name!r}: ingest_time={ingest_time!r}; use 'commit' or 'column'")
        if lake is None and ingest_time != "commit":
            raise ConfigError(f"source {name!r}: ingest_time applies to a lake source (table=...) only")
        if lake is not None and format != "auto":
            raise ConfigError(f"source {name!r}: format applies to a file log, not to table={table!r}")
        if key is not None and key not in schema.names:
            raise ConfigError(f"source {name!r}: key {key!r} is not in the schema")
        if name in self.source_names():
            raise ConfigError(f"source {name!r} defined twice")
        return self._add(SourceNode(name, schema, key, format, lake, ingest_time))

    # --- introspection used by the runtime -------------------------------------------------------
    def source_names(self) -> list[str]:
        return [n.name for n in self.nodes if isinstance(n, SourceNode)]

    def sources(self) -> list[SourceNode]:
        return [n for n in self.nodes if isinstance(n, SourceNode)]

    def operators(self) -> list[StatefulNode]:
        """Stateful operators in topological order (node order is topological by construction)."""
        return [n for n in self.nodes if is_operator(n)]  # type: ignore[misc]

    def operator_uids(self) -> list[str]:
        return [n.uid for n in self.operators()]

    def lookup_uids(self) -> list[str]:
        return [n.uid for n in self.nodes if isinstance(n, LookupJoinNode)]

    def sinks(self) -> list[SinkNode]:
        return [n for n in self.nodes if isinstance(n, SinkNode)]

    def sink_tables(self) -> list[str]:
        return [n.table for n in self.sinks()]

    def node_id(self, node: Node) -> int:
        return next(i for i, n in enumerate(self.nodes) if n is node)

    def chain_to(self, node_id: int) -> tuple[int, list[MapNode]]:
        """Walk up through map nodes: (id of the nearest source/operator ancestor, maps in order)."""
        maps: list[MapNode] = []
        cur = node_id
        while isinstance(self.nodes[cur], MapNode):
            maps.append(self.nodes[cur])  # type: ignore[arg-type]
            cur = self.nodes[cur].parent  # type: ignore[union-attr]
        return cur, list(reversed(maps))

    def operator_sink(self, node_id: int) -> SinkNode | None:
        """The sink that operator ``node_id``'s own tasks write: the first unpartitioned sink reading it directly
        (None: not an operator, or no such sink). Every other sink is written by a sink writer (pipeline.runtime.operators.sink_writer)."""
        if not is_operator(self.nodes[node_id]):
            return None
        node = self.nodes[node_id]
        if self.retracting_join(node) or (isinstance(node, OverAggregateNode) and node.updating):
            return None   # a changelog: its sinks are written by sink writers (rows and deletes)
        return next((s for s in self.sinks() if s.parent == node_id and not s.partition_by), None)

    def feeds_watermark(self, node_id: int) -> bool:
        """Whether an operator with a watermark (window, interval/temporal join, over aggregate) reads node
        ``node_id``'s rows through stateless steps and operators that forward watermark channels (a keep-first
        deduplicate, a join not over an updating stream): :func:`pipeline.windows.channels.needs_channels`."""
        for op in self.operators():
            if not any(node_id in self.bases(i) for i in op.inputs):
                continue
            if isinstance(op, (WindowNode, IntervalJoinNode, TemporalJoinNode, OverAggregateNode)):
                return True
            forwards = (isinstance(op, DedupNode) and getattr(op, "keep", "first") == "first") or (
                isinstance(op, JoinNode) and not self.retracting_join(op))
            if forwards and self.feeds_watermark(self.node_id(op)):
                return True
        return False

    def retracting_join(self, node: object) -> bool:
        """``node`` is a join reading an updating stream: a running aggregate's, a top-N's or a retracting join's
        output (docs/operators.md "Updating streams"; the rules: :mod:`pipeline.updating_streams`)."""
        if not isinstance(node, JoinNode):
            return False
        return any(isinstance(self.nodes[b], (AggregateNode, RankNode)) or self.retracting_join(self.nodes[b])
                   for b in self.bases(node.left) | self.bases(node.right))

    def bases(self, node_id: int) -> frozenset[int]:
        """The sources and operators whose rows reach node ``node_id`` through stateless steps (maps, unions)."""
        base, _maps = self.chain_to(node_id)
        node = self.nodes[base]
        if isinstance(node, (UnionNode, LookupJoinNode)):
            return frozenset().union(*(self.bases(p) for p in node.parents))
        return frozenset((base,))

    def ingest_shown(self, node_id: int) -> bool:
        """Whether a sink reading node ``node_id`` (not an operator) shows ``_ingest_ts``: the runtime carries it
        through every select for event-time bookkeeping, but a select that does not name it hides it from the
        sink; a source shows it (it is in the source schema); an operator shows what its output has."""
        node = self.nodes[node_id]
        if isinstance(node, MapNode):
            if node.kind == "select":
                return any(_output_name(e) == "_ingest_ts" for e in node.exprs)
            return self.ingest_shown(node.parent)
        if isinstance(node, UnionNode):
            return all(self.ingest_shown(p) for p in node.parents)
        if isinstance(node, LookupJoinNode):
            return self.ingest_shown(node.parent)
        return True

    def static_schema(self, node_id: int) -> pa.Schema | None:
        """The schema of node ``node_id``'s rows when the job graph alone decides it (sources, filters, unions and
        selects of plain columns of a known schema), else None (Spark decides it when the plan is built)."""
        node = self.nodes[node_id]
        if isinstance(node, SourceNode):
            return node.schema
        if isinstance(node, UnionNode):
            return self.static_schema(node.parents[0])
        if isinstance(node, MapNode):
            parent = self.static_schema(node.parent)
            if parent is None or node.kind == "filter":
                return parent
            fields = []
            for e in node.exprs:
                m = _PLAIN_SELECT.match(e)
                if m is None or m.group(1) not in parent.names:
                    return None
                fields.append(parent.field(m.group(1)).with_name(m.group(2) or m.group(1)))
            if "_ingest_ts" in parent.names and "_ingest_ts" not in [f.name for f in fields]:
                fields.append(parent.field("_ingest_ts"))
            return pa.schema(fields)
        return None

    def check_union_schemas(self, parents: Sequence[int]) -> None:
        """Refuse a union whose inputs' schemas differ, where the job graph alone decides them (the rest is checked
        when the plan is built, before the first checkpoint is claimed)."""
        known = [(p, self.static_schema(p)) for p in parents]
        known = [(p, s) for p, s in known if s is not None]
        for p, s in known[1:]:
            diff = schema_difference(known[0][1], s)  # type: ignore[arg-type]
            if diff:
                raise ConfigError(f"union of node {known[0][0]} and node {p}: the schemas differ: {diff}")

    def columns_read(self, node_id: int) -> frozenset[str] | None:
        """Columns of node ``node_id``'s output that its stateful consumers may read (lower-cased), or None
        for "possibly all of them". Conservative: a column counts as read when its name appears as a word
        in any filter or select expression up to the first select, or when it is the key or an input of a
        consumer aggregate; a join reading the rows unselected, or a ``*``, reads them all."""
        import re
        read: set[str] = {"_ingest_ts"}  # carried through every select (event-time bookkeeping)
        for n in self.nodes:  # a union, or a sink its operator does not write, reads the rows whole
            ins = n.parents if isinstance(n, (UnionNode, LookupJoinNode)) else (n.parent,) if isinstance(
                n, SinkNode) else ()
            for i in ins:
                if self.chain_to(i)[0] == node_id and (isinstance(n, (UnionNode, LookupJoinNode))
                                                       or self.operator_sink(i) is not n):
                    return None
        for op in self.operators():
            for i in op.inputs:
                base, maps = self.chain_to(i)
                if base != node_id:
                    continue
                if isinstance(op, (WindowNode, DedupNode, IntervalJoinNode, TemporalJoinNode, OverAggregateNode)) or (
                        isinstance(op, JoinNode) and self.feeds_watermark(self.node_id(op))):  # the wm's channel is
                    read.update(("_source", "_partition"))  # the row's source partition (a deduplicate or a join
                    #                                         forwards it to a window)
                selected = False
                for m in maps:
                    text = " ".join(m.exprs)
                    if "*" in text:
                        return None
                    read.update(w.lower() for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))
                    if m.kind == "select":
                        selected = True
                        break
                if selected:
                    continue
                if not isinstance(op, (AggregateNode, WindowNode)):
                    return None
                read.add(op.key.lower())
                read.update(c.lower() for _, _, c in op.aggs if c)
                for _out, cond in op.filters:  # a filtered aggregate reads its condition's columns
                    read.update(w.lower() for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", cond))
                if isinstance(op, WindowNode):
                    read.add(op.event_time.lower())
        return frozenset(read)

    def operator(self, uid: str) -> StatefulNode:
        for op in self.operators():
            if op.uid == uid:
                return op
        raise ConfigError(f"job {self.name!r} has no operator {uid!r} (has {self.operator_uids()})")

    def state_names(self, uid: str) -> tuple[str, ...]:
        return type(self.operator(uid)).STATE_NAMES


_PLAIN_SELECT = re.compile(r"^\s*`?([A-Za-z_][A-Za-z0-9_]*)`?(?:\s+(?:AS\s+)?`?([A-Za-z_][A-Za-z0-9_]*)`?)?\s*$",
                           re.IGNORECASE)


def _output_name(expr: str) -> str:
    """The output column name of a select expression as far as the text tells (``a AS b`` -> b, ``t.a`` -> a)."""
    return expr.strip().split()[-1].strip("`").split(".")[-1]


def schema_difference(a: pa.Schema, b: pa.Schema) -> str:
    """A one-line description of how two schemas differ (by column name and type; order is ignored), '' if not."""
    ta = {f.name: f.type for f in a}
    tb = {f.name: f.type for f in b}
    parts = []
    only_a, only_b = [n for n in ta if n not in tb], [n for n in tb if n not in ta]
    if only_a:
        parts.append(f"only the first has {only_a}")
    if only_b:
        parts.append(f"only the second has {only_b}")
    for n in ta:
        if n in tb and ta[n] != tb[n]:
            parts.append(f"column {n!r} is {ta[n]} in the first, {tb[n]} in the second")
    return "; ".join(parts)


def join_key_sql(keys: Sequence[str]) -> str:
    """The Spark SQL expression of a join's key on several columns: the JSON of the key columns as a struct (one
    string, equal exactly when every key value is equal), null when any key column is null (SQL: no match)."""
    cols = ", ".join(f"`{k}`" for k in keys)
    nulls = " OR ".join(f"`{k}` IS NULL" for k in keys)
    return f"CASE WHEN {nulls} THEN NULL ELSE to_json(struct({cols})) END"


def rank_key_sql(keys: Sequence[str]) -> str:
    """The Spark SQL expression of a top-N's key on several columns: the JSON of the key columns as a struct with
    nulls written (one string, equal exactly when every key value is equal, nulls included: a null is a value of
    the group, as in SQL's ``PARTITION BY``)."""
    cols = ", ".join(f"`{k}`" for k in keys)
    return f"to_json(struct({cols}), map('ignoreNullFields', 'false'))"


_ORDER_TERM = re.compile(r"^\s*`?([A-Za-z_][A-Za-z0-9_]*)`?(?:\s+(ASC|DESC))?\s*$", re.IGNORECASE)


def _parse_order(what: str, order_by: str | Sequence[str]) -> tuple[tuple[str, bool], ...]:
    """``"a DESC"`` / ``["a DESC", "b"]`` -> ((column, descending), ...)."""
    terms = [order_by] if isinstance(order_by, str) else list(order_by)
    out: list[tuple[str, bool]] = []
    for t in terms:
        m = _ORDER_TERM.match(t) if isinstance(t, str) else None
        if m is None:
            raise ConfigError(f"{what}: order_by term {t!r}; write a column, optionally ASC or DESC")
        out.append((m.group(1), (m.group(2) or "ASC").upper() == "DESC"))
    if not out or len({c for c, _ in out}) != len(out) or any(c in ("_ingest_ts", RANK_KEY) for c, _ in out):
        raise ConfigError(f"{what}: order_by={order_by!r}; name distinct user columns (at least one)")
    return tuple(out)


def join_output(op: JoinNode, lcols: Sequence[str], rcols: Sequence[str]) -> list[str]:
    """A join's output columns: ``op.output``, else the key column(s), the left's other columns, the right's other
    columns (``_ingest_ts`` and the internal key column of a join on several keys excluded)."""
    if op.output:
        return list(op.output)
    keys = list(op.keys) if op.keys else [op.on]
    skip = set(keys) | {op.on, "_ingest_ts", JOIN_KEY}
    out = keys + [c for c in lcols if c not in skip]
    return out + [c for c in rcols if c not in skip and c not in out]
