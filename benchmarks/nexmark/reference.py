"""DuckDB references: the exact committed output of each Nexmark query as Epochal defines it.

:func:`connect` opens an in-memory DuckDB over the generated source files with three views, ``person``,
``auction`` and ``bid``: the source columns plus

* ``_partition`` (the source partition), ``_channel`` (``<source>/<partition>``: the watermark channel of a
  record read from a source, docs/windows.md "Channels"),
* ``_epoch`` = ``floor(_ingest_ts / E)``: the record's epoch (all files exist before the run starts, so every
  partition's barriers are cut by ``_ingest_ts`` alone and no record is a late arrival of an idle partition).

Helpers the query references use:

* :func:`window_pairs`: the (record, window) pairs of an event-time window that count in a window which fired by
  the end of the input, computed from docs/windows.md: per channel the running maximum event time ``M_c(m)``,
  the watermark ``W(m) = max(W(m-1), min over active channels of M_c(m) - O)``, a record of epoch ``m`` on time for
  window ``[s, e)`` iff ``e + L > W(m-1)``, a window fired iff ``e + L <= W(last epoch)``;
* the macro ``ttl_ok(t_l, e_l, t_r, e_r)``: the join rule of docs/operators.md, a pair is emitted iff
  ``min(t_l, t_r) >= end(max(e_l, e_r)) - ttl``.
"""
from __future__ import annotations

from pathlib import Path

__all__ = ["connect", "window_pairs", "run_reference"]

_US = 1_000_000


def connect(source_dir: str | Path, epoch_seconds: int, ttl_seconds: int = 86_400):
    import duckdb
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    e_us = epoch_seconds * _US
    for name in ("person", "auction", "bid"):
        glob = f"{Path(source_dir) / name}/partition=*/*.parquet"
        con.execute(f"""CREATE VIEW {name} AS
            SELECT * EXCLUDE (partition), CAST(partition AS INTEGER) AS _partition,
                   '{name}/' || partition AS _channel,
                   CAST(floor(epoch_us(_ingest_ts) / {e_us}) AS BIGINT) AS _epoch
            FROM read_parquet('{glob}', hive_partitioning = true)""")
    side = Path(source_dir) / "side_input"
    if side.is_dir():  # q13's bounded side table
        con.execute(f"CREATE VIEW side_input AS SELECT * FROM read_parquet('{side}/*.parquet')")
    ttl_us = ttl_seconds * _US
    ok = "TRUE" if ttl_seconds == 0 else (
        f"least(epoch_us(t_l), epoch_us(t_r)) >= (greatest(e_l, e_r) + 1) * {e_us} - {ttl_us}")
    con.execute(f"CREATE MACRO ttl_ok(t_l, e_l, t_r, e_r) AS {ok}")
    return con


def _watermarked(inp: str, key: str, event_time: str, o_us: int) -> str:
    """The common CTEs of the window references: ``r`` the rows with a key and an event time (``_t`` in µs),
    the window watermark after each epoch (``wm``: the minimum over channels of each channel's running maximum, minus
    the out-of-orderness, never decreasing), its final value (``fin.w_final``) and ``rp``: each row with the
    watermark of the epoch before its own (``_w_prev``, null in the first)."""
    return f"""WITH r AS (SELECT *, epoch_us({event_time}) AS _t FROM {inp}
                 WHERE {key} IS NOT NULL AND {event_time} IS NOT NULL),
      ce AS (SELECT _channel, _epoch, max(_t) AS mx FROM r GROUP BY _channel, _epoch),
      cr AS (SELECT _channel, _epoch, max(mx) OVER (PARTITION BY _channel ORDER BY _epoch
                    ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS m FROM ce),
      ep AS (SELECT _epoch, min(m) - {o_us} AS w FROM cr GROUP BY _epoch),
      wm AS (SELECT _epoch AS wm_epoch, max(w) OVER (ORDER BY _epoch
                    ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS wmark FROM ep),
      fin AS (SELECT max(wmark) AS w_final FROM wm),
      rp AS (SELECT r.*, wm.wmark AS _w_prev FROM r ASOF LEFT JOIN wm ON r._epoch > wm.wm_epoch),"""


def window_pairs(inp: str, *, key: str, event_time: str, size: int, slide: int | None = None,
                 out_of_orderness: int = 0, lateness: int = 0) -> str:
    """A SQL relation: every column of ``inp`` (which must carry ``_channel`` and ``_epoch``) plus ``window_start``
    and ``window_end`` (timestamps) for each on-time (record, window) pair of a window that fired."""
    s_us, d_us = size * _US, (slide or size) * _US
    o_us, l_us = out_of_orderness * _US, lateness * _US
    return f"""(
      {_watermarked(inp, key, event_time, o_us)}
      pairs AS (SELECT rp.*, (_t - (((_t % {d_us}) + {d_us}) % {d_us})) - g.k * {d_us} AS _ws
                FROM rp, range(0, {s_us // d_us}) AS g(k))
      SELECT pairs.* EXCLUDE (_t, _w_prev, _ws), make_timestamp(_ws) AS window_start,
             make_timestamp(_ws + {s_us}) AS window_end
      FROM pairs, fin
      WHERE _ws + {s_us} + {l_us} > coalesce(_w_prev, -9223372036854775807)
        AND _ws + {s_us} + {l_us} <= fin.w_final
    )"""


def session_rows(inp: str, *, key: str, event_time: str, gap: int, out_of_orderness: int = 0,
                 lateness: int = 0) -> str:
    """A SQL relation: every column of ``inp`` (which must carry ``_channel`` and ``_epoch``) plus ``window_start``
    and ``window_end`` (timestamps) for each on-time record of a session window that fired: the on-time records
    (``t + lateness > W(m-1)``) numbered into sessions per key (a new one where the previous record is ``gap`` or
    more earlier); a session ``[first, last + gap)`` fired when ``last + gap + lateness <= W`` (docs/operators.md
    "Session windows")."""
    g_us, o_us, l_us = gap * _US, out_of_orderness * _US, lateness * _US
    return f"""(
      {_watermarked(inp, key, event_time, o_us)}
      ont AS (SELECT * FROM rp WHERE _t + {l_us} > coalesce(_w_prev, -9223372036854775807)),
      nb AS (SELECT *, CASE WHEN _t - lag(_t) OVER (PARTITION BY {key} ORDER BY _t) < {g_us} THEN 0 ELSE 1 END
                    AS _brk FROM ont),
      ns AS (SELECT *, sum(_brk) OVER (PARTITION BY {key} ORDER BY _t ROWS UNBOUNDED PRECEDING) AS _sid FROM nb),
      ss AS (SELECT *, min(_t) OVER (PARTITION BY {key}, _sid) AS _ws,
                    max(_t) OVER (PARTITION BY {key}, _sid) + {g_us} AS _we FROM ns)
      SELECT ss.* EXCLUDE (_t, _w_prev, _brk, _sid, _ws, _we), make_timestamp(_ws) AS window_start,
             make_timestamp(_we) AS window_end
      FROM ss, fin WHERE _we + {l_us} <= fin.w_final
    )"""


def run_reference(con, sql: str):
    """The reference's rows as an Arrow table."""
    return con.execute(sql).to_arrow_table()
