"""Batch evaluation of a job: the whole dataflow as ONE Spark batch plan over a source prefix.

This is the meaning of a job that does not depend on epochs (docs/batch.md): the committed output and the
operator state after checkpoint ``n`` - whatever crashes, restores, rescales and rewinds happened - equal
this plan evaluated over the source rows before barrier ``n``. It uses plain Spark SQL / DataFrame operators
(joins, group-bys) and shares nothing with the epoch runtime's operator tasks or state
files; only the source reading (file listing, bad-record rules) is the runtime's.

Rules (``E`` = epoch length, ``end(k) = (k+1)E``, ``p(x)`` = processing epoch of row ``x``, see
:mod:`pipeline.batch.prefix`, ``t_x`` = its ``_ingest_ts``, ``c_k = end(k) - ttl`` the TTL cutoff of epoch ``k``):

* ``filter`` / ``select``: as Spark SQL; ``_ingest_ts`` is kept through selects like the runtime does.
* ``join`` (inner): a pair ``(l, r)`` with equal keys is emitted iff ``min(t_l, t_r) >= c_m`` with
  ``m = max(p(l), p(r))`` (both rows were alive when the later one arrived); no TTL: every pair.
  Outer (``how`` = left/right/full): a row with no such pair is emitted with nulls for the other side once
  it expires, i.e. by checkpoint ``n`` iff ``t_x < c_L`` (``L``: the low watermark of the inputs recorded in
  checkpoint ``n``, ``n`` when they were aligned).
  State at ``n``: the rows with ``t_x >= c_L``, minus - on a side whose partner side is declared ``unique`` -
  the rows that matched (they left state). Rows violating a ``unique`` declaration are dead-lettered by the
  runtime, which decides per round against the rows it still holds: keys with one row per unique side are computed
  as above, the keys that repeat by a per-key fold of the kernel's rule over (epoch, round) (:func:`_unique_fold`,
  :meth:`_Compiler._fold_repeats`); their number is reported (a null key is no key: never a violation, never a
  match). Jobs built with the older join (no
  ``how``/``unique``: one match per key, both rows leave state) are evaluated as ``unique="both"``.
* ``aggregate``: totals per key over all input rows (count = rows, sum, min, max; floating sums exact in
  ``decimal(38,9)``, then correctly rounded to double, like the runtime's state); an upsert sink holds them.
  A null key is one group (SQL ``GROUP BY``): its row is in the state and the sink exactly once.
* What is not modelled is listed in :attr:`BatchResult.unchecked` (never skipped silently): an append sink
  of an aggregate (a changelog whose rows depend on round boundaries), an upsert sink of a non-aggregate,
  operators fed by an aggregate, ``process`` nodes, and ``deduplicate`` fed by a join after an unaligned backlog
  drain (or in a drained lineage without round-0 logs) or fed by a process's output (see docs/batch.md).
* ``deduplicate``: per key, a fold over processing rounds (see :meth:`_Compiler._dedup`,
  :mod:`pipeline.batch.rounds`; the round is carried through selects, joins, deduplicates and final windows' fired
  rows), after an unaligned backlog drain over the consumption order (checkpoint, round) with the kernel's
  sequential rule (:func:`_sequential_fold`); state: the held keys alive at ``n``.
* ``window`` (docs/windows.md): records with a key and an event time; per (channel, epoch) the highest event
  time, folded into ``W(m)`` exactly as the page defines it (running maximum per channel, minimum over the
  channels active in ``m``, minus the out-of-orderness, never decreasing); a (record, window) pair counts iff
  ``window_end + L > W(p(x) - 1)``; records whose every window is closed are late (counted, dead-lettered by the
  runtime). ``emit="final"``: the windows with ``window_end + L <= W(m)`` for some ``m <= n`` (as ``W`` never
  decreases: ``<= W`` of the last epoch with records), aggregated over their on-time records. ``emit="update"``
  (an upsert sink keyed by the key and ``window_start``): every window with an on-time record, aggregated over
  its on-time records so far. State at ``n``: the records whose last window has not fired
  (``floor(t/D)*D + S + L > W(n)``) and the watermark table (:meth:`_Compiler._window_state`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.batch.aggregates import aggregate_frames, modelled_here, window_agg_exprs
from pipeline.batch.prefix import PEPOCH, Prefix, source_dataframe
from pipeline.batch.rounds import (
    CONSUMED,
    CONSUMED_ROUND,
    ROUND,
    RoundLog,
    consumption_task,
    emitted_round,
    fired_round,
    pair_round,
    read_round_log,
    round_task,
)
from pipeline.job import (
    AggregateNode,
    DedupNode,
    Job,
    JoinNode,
    MapNode,
    ProcessNode,
    SinkNode,
    SourceNode,
    UnionNode,
    WindowNode,
    join_key_sql,
    join_output,
)
from pipeline.operators.aggregate_functions import mask_sql, masked_aggs

__all__ = ["BatchResult", "evaluate", "join_semantics", "violation_label"]

PARKED = "__parked"   # a row an unaligned snapshot parked at the join (read, consumed by everything but the join)
INTERNAL = ("_source", "_partition", "_seq", "_row", PEPOCH, ROUND, PARKED)   # ROUND: only in multi-round lineages
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
    # keys (:meth:`_Compiler._fold_repeats`; bootstrap writes them)
    unique_dead: dict[str, object] = field(default_factory=dict)
    # label in ``counts`` -> uid of a join compiled without looking for repeated unique keys (``_Compiler.fold``): a
    # count > 0 means the plan must be compiled again with the join in ``fold`` (pipeline.quality.recovery)
    unfolded: dict[str, str] = field(default_factory=dict)

    def release(self) -> None:
        """Unpersist what the plan cached (sources read once, join outputs used twice)."""
        for df in self.cached:
            df.unpersist()
        self.cached.clear()

    def objects(self) -> dict[str, object]:
        return {**{f"sink/{t}": d for t, d in self.sinks.items()}, **self.states}


def aggregate_columns(src, op: AggregateNode, *, exact: bool) -> list:
    """The Spark aggregate expressions of ``op`` over ``src``. Sums of floating or decimal columns are exact
    (``decimal(38,9)``, as the runtime's state keeps them); ``exact=False`` casts them to double, as the
    aggregate's output shows them."""
    from pyspark.sql import functions as F
    aggs = []
    for out, fn, col in op.aggs:
        if fn == "count":
            aggs.append(F.count(F.lit(1)).alias(out))
        elif fn == "sum":
            dt = src.schema[col].dataType.typeName()
            if dt in ("double", "float") or dt.startswith("decimal"):
                total = F.sum(F.col(col).cast(EXACT_SUM))
                aggs.append((total if exact else total.cast("double")).alias(out))
            else:
                aggs.append(F.sum(F.col(col).cast("long")).alias(out))
        else:
            aggs.append((F.min if fn == "min" else F.max)(F.col(col)).alias(out))
    return aggs


def violation_label(uid: str, side: str) -> str:
    """The count label of the rows of join ``uid``'s ``side`` violating its ``unique`` declaration (``counts``,
    ``unique_dead``, ``unfolded``; the validation messages show it)."""
    return f"{uid}: {side} rows violating unique={side!r} (dead-lettered by the runtime)"


def join_semantics(op: JoinNode) -> tuple[str, str | None]:
    """``(how, unique)`` of a join node; the older join (no ``how``) behaves as inner, ``unique="both"``."""
    if not hasattr(op, "how"):
        return "inner", "both"
    return op.how or "inner", getattr(op, "unique", None)


def _visible(df):
    if not any(c in INTERNAL for c in df.columns):
        return df          # the same DataFrame: an object shared by a state and a sink is computed once
    return df.select(*[c for c in df.columns if c not in INTERNAL])


def _orderable(dt) -> bool:
    """Spark can compare values of this type (``min`` of a struct holding it)."""
    from pyspark.sql.types import ArrayType, MapType, StructType
    if isinstance(dt, MapType) or dt.typeName() == "variant":
        return False
    if isinstance(dt, ArrayType):
        return _orderable(dt.elementType)
    if isinstance(dt, StructType):
        return all(_orderable(f.dataType) for f in dt.fields)
    return True


def _nested(dt) -> bool:
    """The join kernel leaves such a column out of its order (``join.sortable``: nested types)."""
    from pyspark.sql.types import ArrayType, MapType, StructType
    return isinstance(dt, (ArrayType, MapType, StructType))


def _unparked(df):
    """A join's input without the rows the validated unaligned checkpoint parked at the join (its in-flight channel
    state, consumed by the next checkpoint: :meth:`_Compiler._source_frame`)."""
    if df is None or PARKED not in df.columns:
        return df
    return df.filter(~df[PARKED]).drop(PARKED)


def _pair_round_columns(left, right) -> tuple[bool, list]:
    """Whether both join inputs carry their round ``r(x)`` (a multi-round lineage with a deduplicate after), and
    then the pair's round column (:func:`pair_round` over the ``__l_`` / ``__r_`` columns)."""
    from pyspark.sql import functions as F
    if not (ROUND in left.columns and ROUND in right.columns):
        return False, []
    return True, [pair_round(F.col(f"__l_{PEPOCH}"), F.col(f"__l_{ROUND}"), F.col(f"__r_{PEPOCH}"),
                             F.col(f"__r_{ROUND}")).alias(ROUND)]


def _sequential_fold(key: str, order: list[str], E: int, ttl: int | None):
    """The deduplicate kernel's rule for one key, row by row in consumption order (checkpoint epoch, round, then within
    the round ``p``, ``_ingest_ts`` and the other columns, as the kernel sorts; pipeline/operators/dedup.py): with
    ``c_y = end(p(y)) - ttl``, a row with a null key or ``t < c_y`` passes and is not held; otherwise it is dropped iff
    the held row has ``t_held >= c_y``, else it passes and is held. Expiry never decides (a round's cutoff
    ``end(L) - ttl`` is at most every pending row's ``c_y``). ``__last`` marks the row held at the end."""
    def fold(pdf):
        import numpy as np
        if pdf.empty:
            return pdf
        # the rows of many keys (a bucket of them): by key, then the consumption order; the rule restarts per key
        pdf = pdf.assign(__kid=_key_ids(pdf, key)).sort_values(["__kid", CONSUMED, CONSUMED_ROUND, PEPOCH] + order,
                                                                 kind="mergesort")
        keep = np.zeros(len(pdf), dtype=bool)
        last = np.zeros(len(pdf), dtype=bool)
        t = pdf["__t"].to_numpy()
        p = pdf[PEPOCH].to_numpy()
        kid = pdf["__kid"].to_numpy()
        null_key = kid < 0
        held, at, cur = None, -1, None
        # a per-row loop, only in a lineage whose unaligned checkpoints drained a backlog (docs/batch.md)
        for i in range(len(pdf)):
            if kid[i] != cur:
                if at >= 0:
                    last[at] = True
                held, at, cur = None, -1, kid[i]
            c = (int(p[i]) + 1) * E - ttl if ttl is not None else None
            if null_key[i] or (c is not None and t[i] < c):
                keep[i] = True
            elif held is None or (c is not None and held < c):
                keep[i], held, at = True, int(t[i]), i
        if at >= 0:
            last[at] = True
        return pdf.assign(__last=last).drop(columns=["__kid"])[keep]
    return fold


def _fold_buckets(spark) -> int:
    """How many groups a per-key fold is computed in (one pandas call each): the shuffle's partitions, at least 2."""
    try:
        return max(2, int(spark.conf.get("spark.sql.shuffle.partitions", "8")))
    except (TypeError, ValueError):
        return 8


def _drop_bucket(fold):
    """``fold`` over a group of :meth:`_Compiler._dedup`'s buckets, without the bucket column ``__b``."""
    def run(pdf):
        return fold(pdf.drop(columns=["__b"]))
    return run


def _key_ids(pdf, key: str):
    """A dense id per distinct non-null key of ``pdf[key]`` (-1 for a null key), vectorised (pandas hashing)."""
    import numpy as np
    return pdf.groupby(key, sort=False, dropna=True).ngroup().to_numpy(dtype=np.int64)


def dedup_fold(key: str, order: list[str], E: int, ttl: int | None):
    """The deduplicate kernel's rule (docs/operators.md "Deduplicate") over the rows of MANY keys at once, vectorised
    with NumPy: per key in the order (``_pepoch``, round ``__round``), with ``c_m = end(m) - ttl``, a row with a null
    key or ``t < c_m`` passes and is not held; otherwise the first row of the round by ``order`` (the round's
    *leader*) passes iff no held row has ``t_held >= c_m``, and is held; the others are dropped.

    A key's first leader passes. After a passed leader with ``t``, the held row expires for every round of an epoch
    ``m >= T = floor((t + ttl) / E)`` (``t < c_m``), and only then: the next passed leader is the key's first leader of
    an epoch ``>= T`` (found with one ``searchsorted`` for every leader), and the passed leaders are the chains from
    each key's first leader - walked for all keys at once, one vectorised step per chain link (at most the number of
    epochs a key's rows span, 1 with one row per key). No Python per key or per row. Input: rows with ``__t`` (µs),
    ``_pepoch``, ``__round``; output: the passed rows, same columns."""
    def fold(pdf):
        import numpy as np
        if pdf.empty:
            return pdf
        t = pdf["__t"].to_numpy(dtype=np.int64)
        m = pdf[PEPOCH].to_numpy(dtype=np.int64)
        kid = _key_ids(pdf, key)
        live = kid >= 0
        if ttl is not None:
            live &= t >= (m + 1) * E - ttl
        keep = ~live
        idx = np.flatnonzero(live)
        if idx.size:
            cand = pdf.iloc[idx].assign(__kid=kid[idx], __pos=idx)
            cand = cand.sort_values(["__kid", PEPOCH, ROUND] + order, kind="mergesort", na_position="last")
            ck = cand["__kid"].to_numpy(np.int64)
            cm = cand[PEPOCH].to_numpy(np.int64)
            cr = cand[ROUND].to_numpy(np.int64)
            pos = cand["__pos"].to_numpy(np.int64)
            lead = np.ones(len(cand), dtype=bool)
            lead[1:] = (ck[1:] != ck[:-1]) | (cm[1:] != cm[:-1]) | (cr[1:] != cr[:-1])
            lk, lm, lpos = ck[lead], cm[lead], pos[lead]
            first = np.ones(lk.size, dtype=bool)
            first[1:] = lk[1:] != lk[:-1]
            if ttl is None:
                keep[lpos[first]] = True          # held forever: a key's first leader only
            else:
                lt = t[lpos]
                base = int(lm.min())
                span = int(lm.max()) - base + 2
                comp = lk * span + (lm - base)    # sorted: the leaders are in (key, epoch, round) order
                target = lk * span + np.clip((lt + ttl) // E - base, 0, span - 1)
                nxt = np.searchsorted(comp, target, side="left")
                ok = nxt < lk.size
                ok[ok] = lk[nxt[ok]] == lk[ok]
                nxt = np.where(ok, nxt, -1)
                passed = np.zeros(lk.size, dtype=bool)
                frontier = np.flatnonzero(first)
                while frontier.size:
                    passed[frontier] = True
                    frontier = nxt[frontier]
                    frontier = frontier[frontier >= 0]
                keep[lpos[passed]] = True
        return pdf[keep]
    return fold


FOLD_COLUMNS = ["__kind", "__lid", "__rid", "__m", "__rnd", "__matched"]
FOLD_SCHEMA = "__kind string, __lid long, __rid long, __m long, __rnd long, __matched boolean"


def _unique_fold(E: int, ttl: int | None, outer: tuple[bool, bool], unique: tuple[bool, bool], cutoff_n: int | None,
                 opaque: tuple[bool, bool] = (False, False)):
    """The join kernel's rule (pipeline/operators/join.py, docs/operators.md) for ONE key that repeats on a side
    declared unique, over both sides' rows of the key in consumption order: per round ``(p, r)`` (an aligned
    lineage: checkpoint ``p`` consumes the rows of epoch ``p``, every round with the cutoff ``c = end(p) - ttl``)
    1. held rows with ``t < c`` leave (an unmatched row of an outer side is emitted), new rows with ``t < c`` leave
    on arrival; 2. on a unique side, a live new row is a violation when a row of the key is still held, and among
    the round's live new rows all but the first by (``_ingest_ts``, ``__o``) are; 3. new left rows meet every held or new
    right row, held left rows the new right rows, a pair kept iff ``min(t_l, t_r) >= end(max(p_l, p_r)) - ttl``;
    4. paired rows are matched, and leave when the partner side is unique. After the last round, a row with
    ``t < cutoff_n`` has left (emitted when unmatched on an outer side); the others are the state.

    Input columns ``__side`` (0 left, 1 right), ``__id``, ``__t`` (µs), ``__o`` (the rank among the round's rows of
    the key and side with the same ``_ingest_ts`` by the other comparable columns: the kernel's tie-break),
    ``_pepoch``, ``__rr`` (round). Output rows (:data:`FOLD_SCHEMA`): ``pair`` (``__lid``, ``__rid``, ``__m`` = the
    pair's epoch, ``__rnd`` = its round), ``lone`` / ``state`` / ``bad`` (one row: ``__lid`` or ``__rid``;
    ``__matched`` for state), or ONE ``tie`` row when a round's first row ties with another on ``_ingest_ts`` and
    every comparable column and the side has columns the kernel does not compare (``opaque``: nested; the kernel
    then keeps the first to arrive, not derived here; rows equal in every column are interchangeable)."""
    def fold(pdf):
        out: list[tuple] = []

        def emit(kind, s, rid, matched=False, m=None, rnd=None, other=None):
            lid, rrid = (rid, other) if s == 0 else (other, rid)
            out.append((kind, lid, rrid, m, rnd, matched))

        held: list[list[list]] = [[], []]     # per side: [id, t, p, matched]
        gone: list[tuple[int, list]] = []     # rows that left by expiry (side, row)
        pdf = pdf.sort_values([PEPOCH, "__rr", "__t"], kind="mergesort")
        for (p, r), g in pdf.groupby([PEPOCH, "__rr"], sort=True):
            c = (int(p) + 1) * E - ttl if ttl is not None else None
            new: list[list[list]] = [[], []]
            for s in (0, 1):
                if c is not None:
                    gone += [(s, h) for h in held[s] if h[1] < c]
                    held[s] = [h for h in held[s] if h[1] >= c]
                rows = g[g["__side"] == s]
                for i, t, pp, o in zip(rows["__id"].to_numpy(), rows["__t"].to_numpy(), rows[PEPOCH].to_numpy(),
                                       rows["__o"].to_numpy()):
                    row = [int(i), int(t), int(pp), False, int(o)]
                    if c is not None and row[1] < c:
                        gone.append((s, row))
                    else:
                        new[s].append(row)
                if unique[s] and new[s]:
                    if held[s]:
                        bad, new[s] = new[s], []
                    else:
                        new[s].sort(key=lambda x: (x[1], x[4]))
                        if len(new[s]) > 1 and new[s][0][1] == new[s][1][1] and new[s][0][4] == new[s][1][4] \
                                and opaque[s]:
                            return _fold_frame([("tie", None, None, int(p), int(r), False)])
                        bad, new[s] = new[s][1:], new[s][:1]
                    for b in bad:
                        emit("bad", s, b[0])

            def ok(a, b):
                return ttl is None or min(a[1], b[1]) >= (max(a[2], b[2]) + 1) * E - ttl
            for ls, rs in ((new[0], held[1] + new[1]), (held[0], new[1])):
                for a in ls:
                    for b in rs:
                        if ok(a, b):
                            out.append(("pair", a[0], b[0], max(a[2], b[2]), int(r), False))
                            a[3] = b[3] = True
            for s in (0, 1):
                rows = held[s] + new[s]
                held[s] = [h for h in rows if not (h[3] and unique[1 - s])]
        for s in (0, 1):
            for h in held[s]:
                if cutoff_n is not None and h[1] < cutoff_n:
                    gone.append((s, h))
                else:
                    emit("state", s, h[0], matched=h[3])
        for s, h in gone:
            if outer[s] and not h[3]:
                emit("lone", s, h[0])
        return _fold_frame(out)
    return fold


def _fold_frame(rows: list[tuple]):
    import pandas as pd
    return pd.DataFrame(rows, columns=FOLD_COLUMNS).astype(
        {"__lid": "Int64", "__rid": "Int64", "__m": "Int64", "__rnd": "Int64", "__matched": bool})


class _Compiler:
    def __init__(self, spark, runner, job: Job, prefix: Prefix, fold: frozenset[str] | None = None) -> None:
        self.spark, self.runner, self.job, self.prefix = spark, runner, job, prefix
        # joins whose repeated unique keys are looked for at compile time (one count on the cached per-key frame,
        # :meth:`_repeated_keys`); None: every join. The others are compiled as if no key repeated, their
        # violation counts flagged in :attr:`BatchResult.unfolded` (validation: a second pass folds those whose
        # count is not 0, so the usual case - no repeat - runs ONE query, with no eager action)
        self.fold = fold
        self.frames: dict[int, object] = {}
        self.bad: dict[int, str] = {}               # node -> why its rows are not modelled
        self.result = BatchResult(prefix)
        self.default_ttl = runner.config.state_ttl_seconds
        self._round_log: RoundLog | None = None
        self._read_memo: tuple[dict[str, dict[int, tuple[int, int]]] | None] | None = None   # _read_positions

    def frame(self, nid: int):
        if nid in self.bad:
            return None
        if nid not in self.frames:
            self.frames[nid] = self._build(nid)
        return self.frames[nid]

    def _build(self, nid: int):
        node = self.job.nodes[nid]
        if isinstance(node, SourceNode):  # read once, used by every object downstream
            df = self._with_rounds(self._source_frame(node))
            return df if self._ranked_only(nid) else self._cache(df)
        if isinstance(node, MapNode):
            df = self.frame(node.parent)
            if df is None:
                self.bad[nid] = self.bad[node.parent]
                return None
            if node.kind == "filter":
                return df.filter(node.exprs[0])
            exprs = list(node.exprs)
            if "_ingest_ts" in df.columns and not any(e.strip().split()[-1] == "_ingest_ts" for e in exprs):
                exprs.append("_ingest_ts")
            exprs += [c for c in INTERNAL if c in df.columns]
            return df.selectExpr(*exprs)
        if isinstance(node, UnionNode):  # UNION ALL by column name (each row keeps its epoch, round, position)
            parts = [self.frame(p) for p in node.parents]
            bad = [self.bad[p] for p, d in zip(node.parents, parts) if d is None]
            if bad:
                self.bad[nid] = bad[0]
                return None
            df = parts[0]
            for d in parts[1:]:
                df = df.unionByName(d, allowMissingColumns=True)
            return df
        if isinstance(node, JoinNode):
            return self._join(nid, node)
        if isinstance(node, AggregateNode):
            return self._aggregate(nid, node)
        if isinstance(node, WindowNode):
            return self._window(nid, node)
        if isinstance(node, DedupNode):
            return self._dedup(nid, node)
        self.bad[nid] = f"{type(node).__name__} is not modelled by the batch evaluation"
        return None

    def _ranked_only(self, nid: int) -> bool:
        """The source's one reader is a join side declared ``unique``, whose first rows per key are computed once and
        cached (:meth:`_per_key`): caching the source too would only convert its rows twice."""
        readers: list[object] = [o for o in self.job.operators() for i in ((o.left, o.right) if isinstance(o, JoinNode)
                                                              else (o.parent,)) if self.job.chain_to(i)[0] == nid]
        readers += [s for s in self.job.sinks() if self.job.chain_to(s.parent)[0] == nid]
        if len(readers) != 1 or not isinstance(readers[0], JoinNode):
            return False
        op = readers[0]
        _, unique = join_semantics(op)
        side = "left" if self.job.chain_to(op.left)[0] == nid else "right"
        return hasattr(op, "how") and unique in (side, "both") and self.job.chain_to(op.left)[0] != \
            self.job.chain_to(op.right)[0]

    def _cache(self, df):
        """Persist ``df`` for the plan's several readers, without the columnar compression of Spark's cache
        (read by Spark when the cache is declared): building the compressed column buffers cost more CPU than
        computing the join frame again (docs/batch.md, session 10 profile); the frame is read a few times from
        memory, then released."""
        from pyspark import StorageLevel
        key = "spark.sql.inMemoryColumnarStorage.compressed"
        before = self.spark.conf.get(key, "true")
        self.spark.conf.set(key, "false")
        try:
            df = df.persist(StorageLevel.MEMORY_AND_DISK)
        finally:
            self.spark.conf.set(key, before)
        self.result.cached.append(df)
        return df

    # -- join ------------------------------------------------------------------------------------------
    def _join(self, nid: int, op: JoinNode):
        from pyspark.sql import functions as F
        E = self.prefix.epoch_us
        how, unique = join_semantics(op)
        inputs = []
        for inp in (op.left, op.right):
            df = _unparked(self.frame(inp))
            if df is None:
                self.bad[nid] = self.bad[inp]
                return None
            base, _ = self.job.chain_to(inp)
            base_node = self.job.nodes[base]
            if isinstance(base_node, AggregateNode) or (isinstance(base_node, WindowNode)
                                                         and base_node.emit == "update"):
                self.bad[nid] = f"join {op.uid} reads the changelog of {base_node.uid}"
                return None
            if op.keys:  # several key columns: keyed by one column computed from them, as the runtime does
                df = df.withColumn(op.on, F.expr(join_key_sql(op.keys)))
            inputs.append(df)
        left, right = inputs
        lcols = [c for c in left.columns if c not in INTERNAL]
        rcols = [c for c in right.columns if c not in INTERNAL]
        output = join_output(op, lcols, rcols)
        ttl_s = op.ttl_seconds if op.ttl_seconds is not None else self.default_ttl
        ttl = ttl_s * 1_000_000 if ttl_s else None
        declared = hasattr(op, "how")
        if declared and unique == "both":
            return self._join_unique(nid, op, left, right, lcols, rcols, output, ttl, how)
        fold = None
        if declared and unique in ("left", "right"):
            side = "left" if unique == "left" else "right"
            ranked = self._first_per_key(left if side == "left" else right, op, side)
            keys, nk = self._repeated_keys(op, ranked, ["__n"], op.on)
            first = ranked.drop("__n")
            if keys is not None:   # the keys that repeat are folded by the kernel's rule, the others as before
                fold = self._fold_repeats(nid, op, left, right, keys, nk, output, lcols, rcols, ttl, how, unique)
                if isinstance(fold, str):
                    self.bad[nid] = fold
                    self._drop_violations(op)
                    return None
                self._decided_violations(op, fold)
                first = ranked.filter(F.col("__n") <= 1).drop("__n")
                ks = F.broadcast(keys) if nk <= 1_000_000 else keys
                if side == "left":
                    right = right.join(ks, right[op.on] == ks["__rk"], "left_anti")
                else:
                    left = left.join(ks, left[op.on] == ks["__rk"], "left_anti")
            if side == "left":
                left = first
            else:
                right = first

        def tag(df, p):
            return df.select(*[F.col(c).alias(f"{p}{c}") for c in df.columns],
                             F.expr("unix_micros(_ingest_ts)").alias(f"{p}_t"))

        lt, rt = tag(left, "__l_"), tag(right, "__r_")
        m = F.greatest(F.col(f"__l_{PEPOCH}"), F.col(f"__r_{PEPOCH}"))
        cond = F.col(f"__l_{op.on}") == F.col(f"__r_{op.on}")
        if ttl is not None:
            cond = cond & (F.least(F.col("__l__t"), F.col("__r__t")) >= (m + 1) * F.lit(E) - F.lit(ttl))

        def pick(c: str, outer_side: str | None = None):
            if c == "_ingest_ts" and c in lcols and c in rcols:   # a pair's: the later of the two (as the runtime)
                return F.greatest(F.col(f"__l_{c}"), F.col(f"__r_{c}")).alias(c)
            if c == op.on:
                return F.coalesce(F.col(f"__l_{c}"), F.col(f"__r_{c}")).alias(c)
            return F.col(f"__l_{c}" if c in lcols else f"__r_{c}").alias(c)

        rounds, rnd = _pair_round_columns(left, right)
        pairs = lt.join(rt, cond, "inner").select(*[pick(c) for c in output], m.alias(PEPOCH), *rnd)
        out = pairs
        # state expires with the cutoff of the low watermark L of checkpoint n (n when the inputs are aligned)
        cutoff_n = self.prefix.end_us(self.prefix.ttl_epoch) - ttl if ttl is not None else None
        for side, mine, other, mcols, _ocols in (("left", lt, rt, lcols, rcols), ("right", rt, lt, rcols, lcols)):
            if how not in (side, "full") or ttl is None:
                continue
            p = "__l_" if side == "left" else "__r_"
            lonely = mine.join(other, cond, "left_anti").filter(F.col(f"{p}_t") < F.lit(cutoff_n))
            emitted_at = F.greatest(F.col(f"{p}{PEPOCH}"),
                                    F.floor((F.col(f"{p}_t") + F.lit(ttl)) / F.lit(E)).cast("long"))
            cols = []
            for c in output:
                if c == op.on or c in mcols:
                    cols.append(F.col(f"{p}{c}").alias(c))
                else:
                    cols.append(F.lit(None).cast(other.schema[f"{'__r_' if side == 'left' else '__l_'}{c}"]
                                                 .dataType).alias(c))
            rnd = [emitted_round(emitted_at, F.col(f"{p}{PEPOCH}"), F.col(f"{p}{ROUND}")).alias(ROUND)] if rounds else []
            out = out.unionByName(lonely.select(*cols, emitted_at.alias(PEPOCH), *rnd))
        # state at checkpoint n
        for name, mine, other, cols, leaves in (("left", lt, rt, lcols, unique in ("right", "both")),
                                                ("right", rt, lt, rcols, unique in ("left", "both"))):
            p = "__l_" if name == "left" else "__r_"
            st = mine if cutoff_n is None else mine.filter(F.col(f"{p}_t") >= F.lit(cutoff_n))
            if leaves:
                st = st.join(other, cond, "left_anti")
            self.result.states[f"state/{op.uid}/{name}"] = st.select(*[F.col(f"{p}{c}").alias(c) for c in cols])
            # the runtime's ``_matched`` flag: the row met a partner while both were alive (what bootstrap writes)
            # (a side whose partner side is unique keeps only unmatched rows: no second join needed)
            # (with the rows' own epochs, which the runtime keeps in join state for the per-pair TTL rule)
            sel = [F.col(f"{p}{c}").alias(c) for c in cols] + [F.col(f"{p}{PEPOCH}").alias(PEPOCH)]
            if leaves:
                flagged = st.select(*sel).withColumn("_matched", F.lit(False))
            else:
                hit = st.join(other, cond, "left_semi").select(*sel)
                flagged = hit.withColumn("_matched", F.lit(True)).unionByName(
                    st.join(other, cond, "left_anti").select(*sel).withColumn("_matched", F.lit(False)))
            self.result.matched[f"state/{op.uid}/{name}"] = flagged
        if fold is not None:
            out = self._with_fold(op, out, fold)
        consumers = sum(1 for s in self.job.sinks() if self.job.chain_to(s.parent)[0] == nid)
        for o in self.job.operators():
            ins = (o.left, o.right) if isinstance(o, JoinNode) else (o.parent,)
            consumers += sum(1 for i in ins if self.job.chain_to(i)[0] == nid)
        return self._cache(out) if consumers > 1 else out

    def _per_key(self, df, on: str, prefix: str = ""):
        """The first row per key of ``df`` (by processing epoch, ``_ingest_ts``, then position) and the number of
        rows with that key (``<prefix>_n``). One shuffle by the key and ONE sort by ``(xxhash64(key), key, order)``
        (``order``: the ordering columns, then the other comparable columns - the position makes it unique; without
        one the row's values break ties, deterministically), then ``row_number() = 1`` and ``count(*)`` over the
        key's rows in the same window pass: codegen'd sort, no per-row struct (a ``min(struct(...))`` aggregate is
        not codegen'd and cost as much again). The hash leads the sort so that the sort's 8-byte prefix tells keys
        apart (keys sharing a long common prefix would otherwise be compared in full), and a merge join on
        ``(hash, key)`` reuses the order. Columns: ``<prefix><c>`` for every column but the position columns (kept
        as ``_partition``/``_seq``/``_row`` when ``prefix`` is empty), ``<prefix>_n`` (``__n`` without prefix) and,
        with a prefix, ``<prefix>_h`` (the key's hash, for :meth:`_join_unique`)."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F
        order = [c for c in (PEPOCH, "_ingest_ts", "_partition", "_seq", "_row") if c in df.columns]
        # a map column cannot be compared: left out of the order (ties are then broken by the other columns)
        rest = [c for c in df.columns if c not in order and c not in (on, "_source")
                and _orderable(df.schema[c].dataType)]
        # a null key equals no key (SQL; the runtime never counts it as a repeat): each null-key row is its own
        # group (``__nk``, null for every keyed row)
        nk = F.when(F.col(on).isNull(), F.monotonically_increasing_id())
        by = Window.partitionBy("__h", on, "__nk").orderBy(*[F.col(c).asc_nulls_first() for c in order + rest])
        whole = by.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
        # shuffled by (hash, key): the window needs no other shuffle (null keys stay together; ``__nk`` only splits
        # them into groups), and a join on (hash, key) finds both sides co-partitioned on all its keys
        g = (df.withColumn("__h", F.xxhash64(F.col(on))).withColumn("__nk", nk).repartition("__h", on)
             .withColumn("__rn", F.row_number().over(by)).withColumn("__n", F.count(F.lit(1)).over(whole))
             .filter(F.col("__rn") == 1))
        drop = ("_source",) if not prefix else ("_source", "_partition", "_seq", "_row")
        return g.select(*[F.col(c).alias(f"{prefix}{c}") for c in df.columns if c not in drop],
                        F.col("__n").alias(f"{prefix}_n" if prefix else "__n"),
                        *([F.col("__h").alias(f"{prefix}_h")] if prefix else []))

    def _violations(self, op: JoinNode, side: str, df, n: str) -> None:
        """Report the rows violating ``unique=side``: ``n - 1`` per key with ``n`` rows (one row each, counted)."""
        from pyspark.sql import functions as F
        label = violation_label(op.uid, side)
        self.result.counts[label] = \
            df.filter(F.col(n) > 1).select(F.explode(F.sequence(F.lit(2), F.col(n))).alias("__v"))

    def _first_per_key(self, df, op: JoinNode, side: str):
        """One side declared unique, the other not: its first row per key with the key's row count ``__n`` (cached:
        the join, both state sides and the violation count read it)."""
        ranked = self._cache(self._per_key(df, op.on))
        self._violations(op, side, ranked, "__n")
        return ranked

    def _join_unique(self, nid: int, op: JoinNode, left, right, lcols: list[str], rcols: list[str], output: list[str],
                     ttl: int | None, how: str):
        """``unique="both"``: at most one row per key and side, so the whole join is ONE full outer merge join of
        the two sides' first rows per key (``J``, cached: every object reads it), each key flagged ``__ok`` when
        its pair passes the TTL rule. Output = the ``__ok`` rows (+ the expired lonely rows of an outer side);
        state of a side = its row when alive and not matched (a matched row left state on both sides); the
        violation counts = ``n - 1`` per key. No anti-join, no second pass over the sources."""
        from pyspark.sql import functions as F
        E = self.prefix.epoch_us
        L, R = self._per_key(left, op.on, "__l_"), self._per_key(right, op.on, "__r_")
        lp, rp = F.col("__l__n").isNotNull(), F.col("__r__n").isNotNull()
        lt, rt = F.expr("unix_micros(`__l__ingest_ts`)"), F.expr("unix_micros(`__r__ingest_ts`)")
        m = F.greatest(F.col(f"__l_{PEPOCH}"), F.col(f"__r_{PEPOCH}"))
        ok = lp & rp
        if ttl is not None:
            ok = ok & (F.least(lt, rt) >= (m + 1) * F.lit(E) - F.lit(ttl))
        # cached narrow: the key once (``__k``), presence from the counts, ``t`` recomputed where it is read
        lk, rk = f"__l_{op.on}", f"__r_{op.on}"
        # on (hash, key): the merge join reuses the order the per-key frames come in (hash first)
        J = L.join(R, (F.col("__l__h") == F.col("__r__h")) & (F.col(lk) == F.col(rk)), "full")
        J = self._cache(J.select(F.coalesce(F.col(lk), F.col(rk)).alias("__k"),
                                 *[c for c in J.columns if c not in (lk, rk, "__l__h", "__r__h")], ok.alias("__ok")))
        self._violations(op, "left", J, "__l__n")
        self._violations(op, "right", J, "__r__n")
        keys, nk = self._repeated_keys(op, J, ["__l__n", "__r__n"], "__k")
        fold = None
        if keys is not None:   # the keys that repeat are folded by the kernel's rule, the others as before
            fold = self._fold_repeats(nid, op, left, right, keys, nk, output, lcols, rcols, ttl, how, "both")
            if isinstance(fold, str):
                self.bad[nid] = fold
                self._drop_violations(op)
                return None
            self._decided_violations(op, fold)
            J = J.filter((F.coalesce(F.col("__l__n"), F.lit(1)) <= 1) & (F.coalesce(F.col("__r__n"), F.lit(1)) <= 1))

        def col(p: str, c: str):
            return F.col("__k") if c == op.on else lt if c == "_t" and p == "__l_" else rt if c == "_t" \
                else F.col(f"{p}{c}")

        def pick(c: str):
            if c == op.on:
                return F.col("__k").alias(c)
            if c == "_ingest_ts" and c in lcols and c in rcols:   # a pair's: the later of the two (as the runtime)
                return F.greatest(F.col(f"__l_{c}"), F.col(f"__r_{c}")).alias(c)
            return F.col(f"__l_{c}" if c in lcols else f"__r_{c}").alias(c)

        rounds, rnd = _pair_round_columns(left, right)
        out = J.filter(F.col("__ok")).select(*[pick(c) for c in output], m.alias(PEPOCH), *rnd)
        cutoff_n = self.prefix.end_us(self.prefix.ttl_epoch) - ttl if ttl is not None else None
        for side, p, q, present, mcols in (("left", "__l_", "__r_", lp, lcols), ("right", "__r_", "__l_", rp, rcols)):
            alone = J.filter(present & ~F.col("__ok"))
            if how in (side, "full") and cutoff_n is not None:
                emitted_at = F.greatest(col(p, PEPOCH), F.floor((col(p, "_t") + F.lit(ttl)) / F.lit(E)).cast("long"))
                cols = [col(p, c).alias(c) if c == op.on or c in mcols
                        else F.lit(None).cast(J.schema[f"{q}{c}"].dataType).alias(c) for c in output]
                er = [emitted_round(emitted_at, col(p, PEPOCH), col(p, ROUND)).alias(ROUND)] if rounds else []
                out = out.unionByName(alone.filter(col(p, "_t") < F.lit(cutoff_n))
                                      .select(*cols, emitted_at.alias(PEPOCH), *er))
            st = alone if cutoff_n is None else alone.filter(col(p, "_t") >= F.lit(cutoff_n))
            self.result.states[f"state/{op.uid}/{side}"] = st.select(*[col(p, c).alias(c) for c in mcols])
            # the runtime's ``_matched`` flag: matched rows left state (the partner side is unique)
            self.result.matched[f"state/{op.uid}/{side}"] = st.select(
                *[col(p, c).alias(c) for c in mcols], col(p, PEPOCH).alias(PEPOCH)
            ).withColumn("_matched", F.lit(False))
        return out if fold is None else self._with_fold(op, out, fold)

    def _with_fold(self, op: JoinNode, out, fold: dict):
        """``out`` and the join's state objects with the rows of the folded repeated keys added."""
        for side in ("left", "right"):
            obj = f"state/{op.uid}/{side}"
            st: Any = self.result.states[obj]
            flagged: Any = self.result.matched[obj]
            self.result.states[obj] = st.unionByName(fold[f"state/{side}"])
            self.result.matched[obj] = flagged.unionByName(fold[f"matched/{side}"])
        return out.unionByName(fold["out"])

    # -- join: keys repeated on a side declared unique -----------------------------------------------------
    def _repeated_keys(self, op: JoinNode, frame, counts: list[str], key: str):
        """The keys with more than one row on a side declared unique (``counts``: the per-key row counts of
        :meth:`_per_key`, on the cached per-key frame): ``(DataFrame of __rk, how many)``, or ``(None, 0)`` when
        no key repeats - the usual case, decided by ONE count on the cached frame, and then the join is computed
        as before."""
        from pyspark.sql import functions as F
        if self.fold is not None and op.uid not in self.fold:
            for side in ("left", "right"):
                label = violation_label(op.uid, side)
                if label in self.result.counts:
                    self.result.unfolded[label] = op.uid
            return None, 0
        cond = None
        for n in counts:
            c = F.coalesce(F.col(n), F.lit(1)) > 1
            cond = c if cond is None else cond | c
        keys = frame.filter(cond).select(F.col(key).alias("__rk"))
        n = keys.count()
        return (self._cache(keys), n) if n else (None, 0)

    def _fold_unmodelled(self, op: JoinNode, sides) -> str | None:
        """Why the kernel's per-round choice for repeated unique keys cannot be derived in this lineage, or None.
        The fold (:func:`_unique_fold`) needs every row consumed by the checkpoint of its own epoch ``p(x)``, in
        the round ``r(x)`` the round log gives, every round of checkpoint ``m`` expiring with ``end(m) - ttl``:
        aligned exactly-once checkpoints."""
        n = self.prefix.epoch
        head = f"join {op.uid} has keys repeated on a side declared unique, and "
        if str(self.runner.config.checkpoint_mode) != "exactly_once":
            return head + ("the lineage runs at-least-once (a checkpoint may read rows of a later epoch ahead): "
                           "the round and cutoff in which the runtime met each row are not derived")
        mds = [cp.metadata for cp in self.runner.coordinator.store.list() if cp.metadata.epoch <= n]
        odd = sorted({md.checkpoint_id for md in mds if md.alignment != "aligned"
                      or int(md.extra.get("low_epoch", md.epoch)) < md.epoch})
        if odd or self.prefix.ttl_epoch != n or self.runner.config.unaligned:
            return head + (f"the lineage took unaligned checkpoints ({', '.join(f'chk-{i}' for i in odd[:3]) or 'config'}"
                           "): rows parked at the join or drained from a backlog are consumed by a later checkpoint "
                           "than their own epoch's, with that checkpoint's low-watermark cutoff, recorded only in "
                           "checkpoint metadata retention deletes; the runtime's per-round choice is not derived")
        multi = self._rounds().multi_round_epochs
        missing = sorted({md.epoch for md in mds if md.stats and md.stats.rounds > 1 and md.epoch not in multi})
        if missing:
            return head + (f"the checkpoints of epochs {missing[:5]} took several rounds but the round log "
                           "(barriers/rounds/) has no entry for them: which round met each row is not derived")
        if multi:
            for df in sides:
                if ROUND not in df.columns and not {"_source", "_partition", "_seq", "_row"} <= set(df.columns):
                    return head + (f"epochs {list(multi)[:5]} took several rounds and a side's rows come from an "
                                   "operator whose round is not carried: which round met each row is not derived")
        return None

    def _fold_repeats(self, nid: int, op: JoinNode, left, right, keys, nkeys: int, output: list[str], lcols: list[str],
                      rcols: list[str], ttl: int | None, how: str, unique: str | None):
        """The join's objects for the keys repeated on a unique side (``keys``), by the kernel's per-round rule
        (:func:`_unique_fold`, grouped pandas over just those keys' rows of both sides): ``{"out": pairs + lonely
        rows, "state/<side>": rows, "matched/<side>": rows with ``_matched``, "bad/<side>": violating rows (input
        columns and ``_pepoch``)}``, or a string: why the choice is not derived (then the join and everything it
        feeds are not checked)."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import LongType, StructField, StructType
        why = self._fold_unmodelled(op, (left, right))
        if why is not None:
            return why
        E = self.prefix.epoch_us
        ks = F.broadcast(keys) if nkeys <= 1_000_000 else keys
        from pyspark.sql import Window
        multi = self._rounds().multi_round_epochs
        rows, opaque = [], []
        for df in (left, right):
            d = df.join(ks, df[op.on] == ks["__rk"], "left_semi")
            if ROUND in d.columns:
                d = d.withColumn("__rr", F.col(ROUND))
            elif multi:
                d = d.mapInArrow(round_task(self._rounds()),
                                 StructType([*d.schema.fields, StructField(ROUND, LongType())]))
                d = d.withColumnRenamed(ROUND, "__rr")
            else:
                d = d.withColumn("__rr", F.lit(0).cast("long"))
            # the kernel's order among a round's rows with equal ``_ingest_ts``: the other comparable columns in column
            # order (join._duplicates; Spark orders strings by bytes and NaN above numbers, below nulls, as Arrow);
            # ``__o`` ranks them, equal only for rows equal in every one of them
            by = [c for c in d.columns if c not in INTERNAL and c not in (op.on, "_ingest_ts", "__rr")]
            cmp = [c for c in by if _orderable(d.schema[c].dataType) and not _nested(d.schema[c].dataType)]
            opaque.append(len(cmp) < len(by))
            w = Window.partitionBy(op.on, PEPOCH, "__rr", "_ingest_ts").orderBy(
                *([F.col(c).asc_nulls_last() for c in cmp] or [F.lit(0)]))
            d = d.withColumn("__o", F.dense_rank().over(w).cast("long"))
            rows.append(self._cache(d.withColumn("__id", F.monotonically_increasing_id())))
        lr, rr = rows
        narrow = lambda d, s: d.select(F.col(op.on).alias("__k"), F.lit(s).alias("__side"), "__id",   # noqa: E731
                                        F.expr("unix_micros(_ingest_ts)").alias("__t"), "__o", PEPOCH, "__rr")
        cutoff_n = self.prefix.end_us(self.prefix.ttl_epoch) - ttl if ttl is not None else None
        fold = _unique_fold(E, ttl, (how in ("left", "full"), how in ("right", "full")),
                            (unique in ("left", "both"), unique in ("right", "both")), cutoff_n, (opaque[0], opaque[1]))
        res = self._cache(narrow(lr, 0).unionByName(narrow(rr, 1)).groupBy("__k").applyInPandas(fold, FOLD_SCHEMA))
        ties = res.filter(F.col("__kind") == "tie").select("__m", "__rnd").take(3)
        if ties:
            return (f"join {op.uid} has keys repeated on a side declared unique whose first row in a round is decided "
                    f"by a tie on _ingest_ts and every comparable column (epoch, round: "
                    f"{[(int(t[0]), int(t[1])) for t in ties]}): the rows differ only in nested columns, which the "
                    "runtime does not compare either (it then keeps the first to arrive, which depends on the subtasks' "
                    "order), so which row it kept is not derived")
        lt = lr.select(*[F.col(c).alias(f"__l_{c}") for c in lr.columns])
        rt = rr.select(*[F.col(c).alias(f"__r_{c}") for c in rr.columns])
        rounds = ROUND in left.columns and ROUND in right.columns

        def pick(c: str):
            if c == "_ingest_ts" and c in lcols and c in rcols:
                return F.greatest(F.col(f"__l_{c}"), F.col(f"__r_{c}")).alias(c)
            if c == op.on:
                return F.col(f"__l_{c}").alias(c)
            return F.col(f"__l_{c}" if c in lcols else f"__r_{c}").alias(c)

        pairs = (res.filter(F.col("__kind") == "pair").join(lt, F.col("__lid") == F.col("__l___id"))
                 .join(rt, F.col("__rid") == F.col("__r___id")))
        got = {"out": pairs.select(*[pick(c) for c in output], F.col("__m").alias(PEPOCH),
                                   *([F.col("__rnd").alias(ROUND)] if rounds else []))}
        for side, p, q, t, other, mcols, idc in (("left", "__l_", "__r_", lt, rt, lcols, "__lid"),
                                                 ("right", "__r_", "__l_", rt, lt, rcols, "__rid")):
            mine = res.filter(F.col(idc).isNotNull() & (F.col("__kind") != "pair")).join(
                t, F.col(idc) == F.col(f"{p}__id"))
            kind = F.col("__kind")
            if how in (side, "full") and ttl is not None:
                tt = F.expr(f"unix_micros(`{p}_ingest_ts`)")
                emitted_at = F.greatest(F.col(f"{p}{PEPOCH}"), F.floor((tt + F.lit(ttl)) / F.lit(E)).cast("long"))
                cols = [F.col(f"{p}{c}").alias(c) if c == op.on or c in mcols
                        else F.lit(None).cast(other.schema[f"{q}{c}"].dataType).alias(c) for c in output]
                er = [emitted_round(emitted_at, F.col(f"{p}{PEPOCH}"), F.col(f"{p}{ROUND}")).alias(ROUND)] \
                    if rounds else []
                got["out"] = got["out"].unionByName(mine.filter(kind == "lone").select(
                    *cols, emitted_at.alias(PEPOCH), *er))
            st = mine.filter(kind == "state")
            got[f"state/{side}"] = st.select(*[F.col(f"{p}{c}").alias(c) for c in mcols])
            got[f"matched/{side}"] = st.select(*[F.col(f"{p}{c}").alias(c) for c in mcols],
                                               F.col(f"{p}{PEPOCH}").alias(PEPOCH), F.col("__matched").alias("_matched"))
            got[f"bad/{side}"] = mine.filter(kind == "bad").select(*[F.col(f"{p}{c}").alias(c) for c in mcols],
                                                                   F.col(f"{p}{PEPOCH}").alias(PEPOCH))
        return got

    def _decided_violations(self, op: JoinNode, got: dict) -> None:
        """The violation counts (and the dead-lettered rows, for bootstrap) of a join whose repeated keys the fold
        decided: every violation is the fold's (a key with one row per unique side has none)."""
        _, unique = join_semantics(op)
        for side in ("left", "right"):
            if unique not in (side, "both"):
                continue
            label = violation_label(op.uid, side)
            self.result.counts[label] = got[f"bad/{side}"]
            self.result.unique_dead[label] = got[f"bad/{side}"]

    def _drop_violations(self, op: JoinNode) -> None:
        """A join whose repeated keys are not derived: no count (its objects are not checked)."""
        for side in ("left", "right"):
            label = violation_label(op.uid, side)
            self.result.counts.pop(label, None)

    # -- aggregate -------------------------------------------------------------------------------------
    def _aggregate(self, nid: int, op: AggregateNode):
        src = self.frame(op.parent)
        if src is None:
            self.bad[nid] = self.bad[op.parent]
            return None
        base, _ = self.job.chain_to(op.parent)
        base_node = self.job.nodes[base]
        if isinstance(base_node, AggregateNode) or (isinstance(base_node, WindowNode) and base_node.emit == "update"):
            self.bad[nid] = f"aggregate {op.uid} reads the changelog of {base_node.uid}"
            return None
        if modelled_here(op):  # avg, count_distinct, FILTER: state columns and output (pipeline/batch/aggregates.py)
            state, totals = aggregate_frames(src, op)
            self.result.states[f"state/{op.uid}/agg"] = state
            return totals
        totals = src.groupBy(op.key).agg(*aggregate_columns(src, op, exact=False))
        self.result.states[f"state/{op.uid}/agg"] = totals
        return totals

    # -- deduplicate -------------------------------------------------------------------------------------
    def _dedup(self, nid: int, op: DedupNode):
        """docs/operators.md "Deduplicate", per key as a fold over processing rounds (grouped pandas in Spark):
        with ``c_m = end(m) - ttl``, in the order (``p``, round ``r``) a row with ``t < c_m`` or a null key passes
        and is not held; otherwise the first row of the round (``_ingest_ts``, then the other columns) passes iff
        no held row has ``t_held >= c_m``, and is held; the others are dropped. ``r`` is 0 unless the epoch's
        checkpoint took several rounds (:mod:`pipeline.batch.rounds`). State at ``n``: the held rows (key and
        ``_ingest_ts``) still alive at ``n``."""
        src = self.frame(op.parent)
        if src is None:
            self.bad[nid] = self._process_reason(op, op.parent) or self.bad[op.parent]
            return None
        base, _ = self.job.chain_to(op.parent)
        base_node = self.job.nodes[base]
        if isinstance(base_node, AggregateNode) or (isinstance(base_node, WindowNode) and base_node.emit == "update"):
            self.bad[nid] = f"deduplicate {op.uid} reads the changelog of {getattr(base_node, 'uid', base)}"
            return None
        n = self.prefix.epoch
        drains = [cp.metadata for cp in self.runner.coordinator.store.list() if cp.metadata.epoch <= n
                  and int(cp.metadata.extra.get("low_epoch", cp.metadata.epoch)) < cp.metadata.epoch]
        if drains:
            # a backlog drained by later (unaligned) checkpoints: rows of several epochs meet in one round, and the
            # dedup follows the consumption order (checkpoint, round), which the round log records since session 11
            why = self._drain_unmodelled(op, drains)
            if why is not None:
                self.bad[nid] = why
                return None
            src = self._drain_input(op, src)
        rounds = self._rounds()
        multi = rounds.multi_round_epochs
        missing = sorted({cp.metadata.epoch for cp in self.runner.coordinator.store.list()
                          if cp.metadata.epoch <= n and cp.metadata.stats and cp.metadata.stats.rounds > 1
                          and cp.metadata.epoch not in multi})
        if missing:
            self.bad[nid] = (f"deduplicate {op.uid}: checkpoints of epochs {missing} took several rounds but the round "
                             "log (barriers/rounds/) has no entry for them (written before the round log existed): "
                             "the first row per key is decided per round")
            return None
        if multi and ROUND not in src.columns:
            # the sources carry r(x) (:meth:`_with_rounds`), selects, joins, deduplicates and final windows pass
            # it on (a process's output is not computed at all: :meth:`_process_reason`); a safety net
            self.bad[nid] = (f"deduplicate {op.uid}: epochs {list(multi)} took several rounds, and the round in which "
                             f"{getattr(self.job.nodes[base], 'uid', base)} emitted a row is not modelled (rows of "
                             "sources, selects, joins, deduplicates and final windows carry their round; this "
                             "operator's do not)")
            return None
        from pyspark.sql import functions as F
        carried = ROUND in src.columns    # a deduplicate after this one needs r(x) too
        if not multi:
            src = src.withColumn(ROUND, F.lit(0).cast("long"))
        ttl_s = op.ttl_seconds if op.ttl_seconds is not None else self.default_ttl
        ttl = ttl_s * 1_000_000 if ttl_s else None
        E = self.prefix.epoch_us
        key = op.key
        # the runtime's order: _ingest_ts, then the other (sortable) columns in column order
        order = ["_ingest_ts"] + [c for c in src.columns if c not in (key, "_ingest_ts", ROUND, CONSUMED, CONSUMED_ROUND)
                                  and c not in INTERNAL
                                  and src.schema[c].dataType.typeName() not in ("array", "map", "struct")]
        src = src.withColumn("__t", F.expr("unix_micros(_ingest_ts)"))   # µs, whatever pandas makes of timestamps
        schema = src.schema

        drained = CONSUMED in src.columns
        if drained:   # the kernel's sequential rule over the consumption order (docs/batch.md "deduplicate")
            src = src.withColumn("__last", F.lit(False))
            schema = src.schema
            fold = _sequential_fold(key, order, E, ttl)
        else:
            fold = dedup_fold(key, order, E, ttl)
        # ONE pandas call per bucket of keys (a hash of the key), never one per key: with one key per row a call per
        # key cost ~1 ms of Python each (docs/quality.md "Cost model")
        buckets = _fold_buckets(self.spark)
        out = (src.withColumn("__b", F.pmod(F.xxhash64(F.col(key)), F.lit(buckets)))
               .groupBy("__b").applyInPandas(_drop_bucket(fold), schema=schema))
        # read by its state object and by what it feeds (a window's watermark pass, a join, a sink): folded once
        out = self._cache(out)
        out = out if carried and multi else out.drop(ROUND)
        if drained:
            out = out.drop(CONSUMED, CONSUMED_ROUND)
        # held keys at n: a kept row with a key that was held when it passed (alive in its own epoch) and is still
        # alive at n (the cutoff of the low watermark L); at most one per key (a later row passes only once the
        # held one expired, and the cutoffs only grow)
        held = out.filter(F.col(key).isNotNull())
        if drained:   # the kernel holds the last passed row of a key (replacing the one before)
            held = held.filter(F.col("__last"))
            out = out.drop("__last")
        if ttl is not None:
            held = held.filter((F.col("__t") >= (F.col(PEPOCH) + 1) * F.lit(E) - F.lit(ttl))
                               & (F.col("__t") >= F.lit(self.prefix.end_us(self.prefix.ttl_epoch) - ttl)))
        self.result.states[f"state/{op.uid}/keys"] = held.select(key, "_ingest_ts")
        return out.drop("__t", PARKED)   # its output reaches a join in the round it passed: never parked

    def _drain_unmodelled(self, op: DedupNode, drains: list) -> str | None:
        """Why a deduplicate in a lineage whose unaligned checkpoints drained a backlog cannot be checked, or None
        when it can: fed by a source through stateless steps (it consumes a row in the round that reads it, parked
        or not), every drain and every later checkpoint with its round 0 logged."""
        base, _ = self.job.chain_to(op.parent)
        node = self.job.nodes[base]
        if not isinstance(node, SourceNode):
            return (self._drain_reason(op, drains) + f". It is fed by {getattr(node, 'uid', base)}, not by a source: "
                    "rows in flight at a join (parked by an unaligned snapshot, written as channel state) reach it in "
                    "a later checkpoint than the one that read them, and which rows were parked is recorded only in "
                    "the checkpoint's channel state, which retention deletes")
        zero = self._rounds().zero
        epochs = sorted({int(md.epoch) for md in drains})
        first = min([m for m in zero if m <= self.prefix.epoch] + epochs)
        unlogged = sorted(m for m in {*self.prefix.log, self.prefix.epoch, *epochs} if first <= m <= self.prefix.epoch
                          and m not in zero)
        if unlogged:
            return (self._drain_reason(op, drains) + f". The checkpoints of epochs {unlogged[:5]}"
                    + (f" and {len(unlogged) - 5} more" if len(unlogged) > 5 else "")
                    + " have no logged round 0 (barriers/rounds/epoch-<m>-chk-<id>-r0.json, written since session 11)")
        return None

    def _read_positions(self) -> dict[str, dict[int, tuple[int, int]]] | None:
        """Where the validated checkpoint had read each partition to (``positions``, with an in-flight range's start
        instead: what a restore resumes reading at), when that is not the prefix's end: an unaligned snapshot parks
        the rows its backlogged channels read in the snapshot round, which the join has not consumed (they are its
        channel state) but an operator reading the source directly has."""
        if self._read_memo is not None:   # one LIST of the store per plan, whatever the number of sources
            return self._read_memo[0]
        cid = self.prefix.checkpoint_id
        md = None if cid is None else next((cp.metadata for cp in self.runner.coordinator.store.list()
                                            if cp.checkpoint_id == cid), None)
        self._read_memo = (None,)
        if md is None or not md.channel_state:
            return None
        out = {s: {int(p): (int(pos.seq), int(pos.row)) for p, pos in parts.items()} for s, parts in md.positions.items()}
        for c in md.channel_state:
            if c.file is None and c.source is not None and c.partition is not None and c.start is not None:
                out.setdefault(c.source, {})[int(c.partition)] = (int(c.start.seq), int(c.start.row))
        read = {s: {p: min(pos, self.prefix.barriers.get(s, {}).get(p, pos)) for p, pos in parts.items()}
                for s, parts in out.items()}
        self._read_memo = (read,)
        return read

    def _drain_input(self, op: DedupNode, src):
        """The deduplicate's input in a drained lineage (its source's rows up to the read positions, the parked ones
        included: :meth:`_source_frame`) with the consumption epoch and round of every row
        (:func:`consumption_task`)."""
        from pyspark.sql.types import LongType, StructField, StructType
        return src.mapInArrow(consumption_task(self._rounds()), StructType(
            [*src.schema.fields, StructField(CONSUMED, LongType()), StructField(CONSUMED_ROUND, LongType())]))

    def _source_frame(self, node: SourceNode):
        """A source's prefix. When the validated unaligned checkpoint parked rows of this source (read in its snapshot
        round on a backlogged channel: ``[positions, range start)``), they are read too and flagged :data:`PARKED`:
        every operator reading the source directly consumed them (they are in its state and output), only the join
        did not (they are its in-flight channel state, consumed by the next checkpoint), so :func:`_unparked` drops
        them from a join's inputs. Otherwise the prefix as it is (``Prefix.stops``)."""
        read = (self._read_positions() or {}).get(node.name, {})
        cut = self.prefix.stops(node.name)
        parked = {p: c for p, c in cut.items() if read.get(p, c) > c}
        if not parked:
            return source_dataframe(self.spark, self.runner, self.job, node, self.prefix)
        import dataclasses

        from pyspark.sql import functions as F
        stops = {s: dict(self.prefix.stops(s)) for s in self.prefix.barriers}
        stops[node.name] = {p: read.get(p, c) for p, c in cut.items()}
        df = source_dataframe(self.spark, self.runner, self.job, node, dataclasses.replace(self.prefix, consumed=stops))
        flag = F.lit(False)
        for p, (seq, row) in parked.items():
            flag = flag | ((F.col("_partition") == F.lit(p))
                           & ((F.col("_seq") > F.lit(seq)) | ((F.col("_seq") == F.lit(seq)) & (F.col("_row") >= F.lit(row)))))
        return df.withColumn(PARKED, flag)

    def _process_reason(self, op: DedupNode, parent: int) -> str | None:
        """Why a deduplicate fed (through joins, windows, deduplicates) by a ``process`` is not checked against the
        batch evaluation, or None when no process feeds it."""
        seen: set[int] = set()
        todo, found = [parent], None
        while todo and found is None:
            base = self.job.chain_to(todo.pop())[0]
            node = self.job.nodes[base]
            if base in seen or isinstance(node, SourceNode):
                continue
            seen.add(base)
            if isinstance(node, ProcessNode):
                found = node
            elif isinstance(node, JoinNode):
                todo += [node.left, node.right]
            elif isinstance(node, (AggregateNode, DedupNode, WindowNode)):
                todo.append(node.parent)
        if found is None:
            return None
        multi = self._rounds().multi_round_epochs
        rounds = (f" Epochs {list(multi)} took several rounds: even the round in which a row reaches it is unknown, "
                  "since process output rows do not correspond to input rows (one call may emit rows for any of its "
                  "keys, or none)." if multi else "")
        return (f"deduplicate {op.uid} is fed by process {found.uid}, whose output the batch evaluation does not "
                "compute: it is defined only by the user's function, called once per subtask and round with that "
                "round's rows of the subtask's key groups (docs/process.md), so it depends on round boundaries and "
                f"parallelism and has no batch meaning.{rounds} Checked by replay of the validated epoch instead "
                "(docs/batch.md \"process: determinism under replay\")")

    @staticmethod
    def _drain_reason(op: DedupNode, drains: list) -> str:
        """Why a deduplicate after an unaligned backlog drain is not checked (docs/batch.md "deduplicate")."""
        which = ", ".join(f"chk-{md.checkpoint_id} (epoch {md.epoch}, low epoch {md.extra.get('low_epoch')})"
                          for md in sorted(drains, key=lambda md: md.checkpoint_id)[:3])
        more = f" and {len(drains) - 3} more" if len(drains) > 3 else ""
        return (f"deduplicate {op.uid}: unaligned checkpoint(s) {which}{more} consumed rows of earlier epochs (a "
                "backlog the barrier overtook). The runtime keeps the first row of a key in processing order, i.e. "
                "by the checkpoint and round that read it; such a checkpoint's first round starts where the previous "
                "one stopped reading, not at a barrier, and that position is recorded only in checkpoint metadata "
                "that retention deletes, so the batch plan cannot reproduce the order. Its held keys, its output and "
                "everything fed by it are not compared; the rest of the job is")

    def _rounds_if_needed(self) -> RoundLog | None:
        """The round log when the lineage has multi-round checkpoints and the job a deduplicate (the one operator
        whose result depends on round boundaries); None otherwise."""
        if not any(isinstance(o, DedupNode) for o in self.job.operators()) and not any(
                s.mode == "upsert" and self.job.operator_sink(s.parent) is not s for s in self.job.sinks()):
            return None
        rounds = self._rounds()
        return rounds if rounds.multi_round_epochs else None

    def _with_rounds(self, df):
        """A source's rows with their round ``r(x)`` (:data:`ROUND`) when the lineage has multi-round checkpoints and
        the job a deduplicate (:meth:`_rounds_if_needed`); ``df`` otherwise."""
        rounds = self._rounds_if_needed()
        if rounds is None:
            return df
        from pyspark.sql.types import LongType, StructField, StructType
        return df.mapInArrow(round_task(rounds), StructType([*df.schema.fields, StructField(ROUND, LongType())]))

    def _rounds(self) -> RoundLog:
        """The round log of the validated lineage (read once per plan)."""
        if self._round_log is None:
            self._round_log = read_round_log(self.runner.ckpt_fio, self.runner.job_root, upto_epoch=self.prefix.epoch,
                                             upto_id=self.prefix.checkpoint_id)
        return self._round_log

    # -- window ------------------------------------------------------------------------------------------
    def _window(self, nid: int, op: WindowNode):
        """docs/windows.md as one batch query. The watermark is a function of (channel, epoch) maxima only: that
        small table (channels x epochs) is computed by Spark and folded on the driver into ``W(m)``; records,
        lateness, firing and the aggregates stay in Spark."""
        from pyspark.sql import functions as F
        src = self.frame(op.parent)
        if src is None:
            self.bad[nid] = self.bad[op.parent]
            return None
        base, _ = self.job.chain_to(op.parent)
        base_node = self.job.nodes[base]
        if isinstance(base_node, AggregateNode):
            self.bad[nid] = f"window {op.uid} reads the changelog of aggregate {base_node.uid}"
            return None
        SEC = 1_000_000
        S, D = op.size_seconds * SEC, op.slide_seconds * SEC
        O, L = op.max_out_of_orderness_seconds * SEC, op.allowed_lateness_seconds * SEC
        channel = (F.concat(F.col("_source"), F.lit("/"), F.col("_partition").cast("string"))
                   if isinstance(base_node, SourceNode) else F.lit(f"op:{getattr(base_node, 'uid', base)}"))
        recs = (src.filter(F.col(op.key).isNotNull() & F.col(op.event_time).isNotNull())
                .withColumn("__t", F.expr(f"unix_micros(`{op.event_time}`)")).withColumn("__ch", channel))
        if op.filters:  # the state keeps a filtered aggregate's masked input (docs/operators.md "Aggregate")
            recs = recs.selectExpr("*", *[f"{sql} AS `{name}`" for name, sql in mask_sql(op.aggs, op.filters)])
        # records with no key or no event time are dead-lettered too (docs/windows.md): counted, compared with disk
        self.result.counts[f"{op.uid}: records without a key or an event time (dead-lettered by the runtime)"] = \
            src.filter(F.col(op.key).isNull() | F.col(op.event_time).isNull())
        # W(m) for every epoch with records: M_c(m) = running max per channel, min over the active channels
        maxima = sorted((int(r[0]), str(r[1]), int(r[2])) for r in recs.groupBy(PEPOCH, "__ch")
                        .agg(F.max("__t")).collect())
        seen: dict[str, int] = {}
        w_prev: dict[int, int | None] = {}     # epoch m -> W(m-1)
        w_after: dict[int, int | None] = {}    # epoch m -> W(m)
        w: int | None = None
        for m in sorted({e for e, _, _ in maxima}):
            w_prev[m] = w
            active = [(c, t) for e, c, t in maxima if e == m]
            for c, t in active:
                seen[c] = max(seen.get(c, t), t)
            cand = min(seen[c] for c, _ in active) - O
            w = cand if w is None else max(w, cand)
            w_after[m] = w
        self._window_state(op, recs, w, seen)
        if not w_prev:
            wm = self.spark.createDataFrame([], f"{PEPOCH} long, __wprev long")
        else:
            wm = self.spark.createDataFrame([(m, w_prev[m]) for m in w_prev], f"{PEPOCH} long, __wprev long")
        # (record, window) pairs on time: window end + L > W(m-1) of the record's epoch
        k = S // D
        pairs = (recs.join(F.broadcast(wm), PEPOCH, "left")
                 .withColumn("__last", F.floor(F.col("__t") / F.lit(D)).cast("long") * F.lit(D))
                 .withColumn("__ws", F.explode(F.sequence(F.col("__last") - F.lit((k - 1) * D), F.col("__last"),
                                                          F.lit(D))))
                 .filter(F.col("__wprev").isNull() | (F.col("__ws") + F.lit(S + L) > F.col("__wprev"))))
        late = recs.join(F.broadcast(wm), PEPOCH, "left").filter(
            F.col("__wprev").isNotNull()
            & (F.floor(F.col("__t") / F.lit(D)).cast("long") * F.lit(D) + F.lit(S + L) <= F.col("__wprev")))
        self.result.counts[f"{op.uid}: late records (dead-lettered by the runtime)"] = late
        aggs = []
        for out, fn, col in (() if op.filters else op.aggs):   # FILTER: pipeline/batch/aggregates.py
            if fn == "count":
                aggs.append(F.count(F.lit(1)).alias(out))
            elif fn == "count_distinct":
                aggs.append(F.countDistinct(F.col(col)).cast("long").alias(out))
            elif fn in ("sum", "avg"):
                dt = src.schema[col].dataType.typeName()
                floating = dt in ("double", "float") or dt.startswith("decimal")
                total = F.sum(F.col(col).cast(EXACT_SUM)) if floating else F.sum(F.col(col).cast("long"))
                if fn == "sum":
                    aggs.append((total.cast("double") if floating else total).alias(out))
                else:
                    aggs.append((total.cast("double") / F.count(F.col(col)).cast("double")).alias(out))
            else:
                aggs.append((F.min if fn == "min" else F.max)(F.col(col)).alias(out))
        by_window = pairs.groupBy(op.key, "__ws").agg(*(window_agg_exprs(src, op) if op.filters else aggs))
        names = [out for out, _, _ in op.aggs]
        out = by_window.select(op.key, F.expr("timestamp_micros(__ws)").alias("window_start"),
                               F.expr(f"timestamp_micros(__ws + {S})").alias("window_end"), *names,
                               F.col("__ws"))
        if op.emit == "final":
            # fires at the first epoch m <= n with end + L <= W(m): emitted once, with its on-time records
            marks: list[int] = [x for m, x in w_after.items() if m <= self.prefix.epoch and x is not None]
            top = max(marks, default=None)
            out = out if top is None else out.filter(F.col("__ws") + F.lit(S + L) <= F.lit(top))
            if top is None:
                out = out.limit(0)
            if self._flows_on(nid):
                return self._window_flow(out, w_after, S + L)
        return out.drop("__ws")

    def _flows_on(self, nid: int) -> bool:
        """An operator reads node ``nid``'s output (through stateless steps), not only a sink."""
        return any(self.job.chain_to(i)[0] == nid for o in self.job.operators()
                   for i in ((o.left, o.right) if isinstance(o, JoinNode) else (o.parent,)))

    def _window_flow(self, out, w_after: dict[int, int | None], reach: int):
        """The fired windows as rows flowing on to another operator (docs/windows.md "Chaining and modes"): each
        with its firing epoch ``f(w) = min {m : window_end + L <= W(m)}`` as ``_pepoch``, ``_ingest_ts`` =
        ``end(f) - 1 µs`` (the runtime's) after the output columns and, in a lineage whose deduplicate needs rounds,
        the round it fired in: the last round of checkpoint ``f`` (:func:`fired_round`). ``W`` never decreases, so
        ``f`` is the epoch at whose step ``W`` first reaches ``window_end + L``: one broadcast interval table of
        the watermark's steps (lo, hi] (a handful of rows), whatever the number of windows."""
        from pyspark.sql import functions as F
        E = self.prefix.epoch_us
        log = self._rounds_if_needed()
        steps: list[tuple[int, int, int, int]] = []
        prev: int | None = None
        for m in sorted(w_after):
            w = w_after[m]
            if m > self.prefix.epoch or w is None or (prev is not None and w <= prev):
                continue
            steps.append((-(2 ** 62) if prev is None else prev, w, m, fired_round(log, m) if log else 0))
            prev = w
        table = self.spark.createDataFrame(steps, "__lo long, __hi long, __f long, __fr long")
        thr = F.col("__ws") + F.lit(reach)
        fired = out.join(F.broadcast(table), (thr > F.col("__lo")) & (thr <= F.col("__hi")), "inner")
        cols = [c for c in out.columns if c != "__ws"]
        rnd = [F.col("__fr").alias(ROUND)] if log else []
        return fired.select(*cols, F.expr(f"timestamp_micros((__f + 1) * {E} - 1)").alias("_ingest_ts"),
                            F.col("__f").alias(PEPOCH), *rnd)

    def _window_state(self, op: WindowNode, recs, w_n: int | None, channel_max: dict[str, int]) -> None:
        """docs/windows.md "State after checkpoint n": ``win`` = the on-time records of epochs ``<= n`` whose last
        window has not fired, i.e. ``floor(t/D)*D + S + L > W(n)`` (a record judged on time against ``W(p-1)`` is
        implied: ``W`` never decreases) - key, event time (µs), the aggregated columns, the processing epoch;
        ``wm`` = the watermark table: ``("", W(n))`` and one row ``(channel, M_c(n))`` per channel seen."""
        from pyspark.sql import functions as F
        SEC = 1_000_000
        S, D, L = op.size_seconds * SEC, op.slide_seconds * SEC, op.allowed_lateness_seconds * SEC
        inputs: list[str] = []
        for _out, fn, col in masked_aggs(op.aggs, op.filters):
            if fn != "count" and col is not None and col not in inputs and col != op.key:
                inputs.append(col)
        held = recs if w_n is None else recs.filter(
            F.floor(F.col("__t") / F.lit(D)).cast("long") * F.lit(D) + F.lit(S + L) > F.lit(w_n))
        self.result.states[f"state/{op.uid}/win"] = held.select(
            op.key, F.col("__t").alias(WINDOW_EVENT_US), *inputs, F.col(PEPOCH).alias(WINDOW_EPOCH))
        rows = [(WATERMARK_ROW, w_n)] + sorted(channel_max.items())
        self.result.states[f"state/{op.uid}/wm"] = self.spark.createDataFrame(
            rows, "channel string, max_event_us long")

    # -- all ---------------------------------------------------------------------------------------------
    def compile(self) -> BatchResult:
        self.result.frames = self.frames
        for op in self.job.operators():
            nid = self.job.node_id(op)
            if self.frame(nid) is None:
                for name in self.job.state_names(op.uid):
                    self.result.unchecked[f"state/{op.uid}/{name}"] = self.bad[nid]
        for s in self.job.sinks():
            obj = f"sink/{s.table}"
            parent = self.job.nodes[s.parent]
            df = self.frame(s.parent)
            if df is None:
                self.result.unchecked[obj] = self.bad[s.parent]
            elif self.job.operator_sink(s.parent) is not s:  # a sink writer's (pipeline.runtime.sink_writer)
                why = self._writer_sink(s, df)
                if why is not None:
                    self.result.unchecked[obj] = why
            elif isinstance(parent, AggregateNode) and s.mode == "append":
                self.result.unchecked[obj] = ("append sink of an aggregate: a changelog whose rows depend on round "
                                              "boundaries (its upsert view is checked through the aggregate state)")
            elif s.mode == "upsert" and not isinstance(parent, (AggregateNode, WindowNode)):
                self.result.unchecked[obj] = "upsert sink of a non-aggregate: 'newest row per key' is not modelled"
            else:
                if isinstance(parent, WindowNode) and "_ingest_ts" in df.columns:
                    df = df.drop("_ingest_ts")   # only rows flowing on carry it (:meth:`_window_flow`), not the sink's
                self.result.sinks[s.table] = _visible(df)
        for n in self.job.nodes:
            if not isinstance(n, (SourceNode, MapNode, UnionNode, JoinNode, AggregateNode, WindowNode, DedupNode,
                                  SinkNode)):
                self.result.messages.append(f"not checked: {type(n).__name__} nodes are not modelled yet")
        return self.result


    def _writer_sink(self, s: SinkNode, df) -> str | None:
        """The batch meaning of a sink written by a sink writer (stateless steps after sources, unions or an
        operator): its rows (append), or per key the last row in the writer's order (upsert: processing epoch,
        round, ``_ingest_ts``, source position, then the other columns; pipeline.runtime.sink_writer). Returns why
        it is not modelled, or None when :attr:`BatchResult.sinks` holds it."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F
        bases = [self.job.nodes[b] for b in self.job.bases(s.parent)]
        updating = [b for b in bases if isinstance(b, AggregateNode) or (isinstance(b, WindowNode) and b.emit == "update")]
        shown = self.job.ingest_shown(s.parent)
        cols = [c for c in df.columns if c not in INTERNAL and (c != "_ingest_ts" or shown)]
        if s.mode == "append":
            if updating:
                return ("append sink of an updating stream (a running aggregate or an update window): a changelog "
                        "whose rows depend on round boundaries")
            self.result.sinks[s.table] = df.select(*cols)
            return None
        if updating:
            _base, maps = self.job.chain_to(s.parent)
            if len(bases) != 1 or any(m.kind == "filter" for m in maps):
                return ("upsert sink of an updating stream behind a filter or a union: which updates pass depends on "
                        "round boundaries")
            self.result.sinks[s.table] = df.select(*cols)   # the latest totals, mapped
            return None
        if not all(isinstance(b, SourceNode) for b in bases):
            return "upsert sink of an operator's append stream: 'newest row per key' is not modelled"
        order = [c for c in (PEPOCH, ROUND, "_ingest_ts", "_source", "_partition", "_seq", "_row") if c in df.columns]
        rest = [c for c in cols if c not in order and c not in s.key and _orderable(df.schema[c].dataType)]
        w = Window.partitionBy(*[F.col(k) for k in s.key]).orderBy(*[F.col(c).desc() for c in order + rest])
        self.result.sinks[s.table] = (df.withColumn("__last", F.row_number().over(w)).filter("__last = 1")
                                      .select(*cols))
        return None


def evaluate(runner, job: Job, prefix: Prefix, spark=None, fold: frozenset[str] | None = None) -> BatchResult:
    """Compile ``job`` into one Spark batch plan over ``prefix`` (lazy but for one count per ``unique`` join that
    ``fold`` names, None: all; see :attr:`_Compiler.fold`)."""
    return _Compiler(spark if spark is not None else runner.spark, runner, job, prefix, fold).compile()
