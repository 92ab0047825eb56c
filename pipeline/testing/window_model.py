"""A brute-force, per-record model of docs/windows.md (plain Python, no pyarrow, shares no code with the
window kernels): the reference the property tests and the Spark window tests compare against.

Records are dicts with ``rid``, ``channel``, ``k`` (key), ``et`` (event time, whole seconds), ``v`` (float or
None), ``n`` (int or None), ``u`` (str or None). The aggregates are those of the tests:
``cnt=count, total=sum(v), lo=min(n), hi=max(v), mean=avg(v), users=count_distinct(u), nsum=sum(n)``.
"""
from __future__ import annotations

from decimal import Decimal

__all__ = ["model", "agg_row"]


def model(epochs, size, slide, ooo, lateness, emit):
    """``epochs``: list of lists of record dicts (seconds). Returns per-epoch (output rows, late rids,
    state rids, watermark)."""
    wm = None
    chan_max: dict[str, int] = {}
    alive: list[dict] = []      # on-time records in state
    fired: set = set()
    results = []
    for m, recs in enumerate(epochs):
        prev = wm
        good = [r for r in recs if r["k"] is not None and r["et"] is not None]
        active: dict[str, int] = {}  # channel -> its max event time in this epoch
        for r in good:
            active[r["channel"]] = max(active.get(r["channel"], r["et"]), r["et"])
        for c, t in active.items():
            chan_max[c] = max(chan_max.get(c, t), t)
        if active:
            cand = min(chan_max[c] for c in active) - ooo
            wm = cand if wm is None else max(wm, cand)

        def windows(t):
            s = (t // slide) * slide
            out = []
            while s + size > t:
                out.append(s)
                s -= slide
            return out

        def closed(s, w):
            return w is not None and s + size + lateness <= w
        late = []
        for r in good:
            if all(closed(s, prev) for s in windows(r["et"])):
                late.append(r["rid"])
            else:
                alive.append({**r, "epoch": m})
        # window -> records (on time pairs only)
        wins: dict = {}
        for r in alive:
            for s in windows(r["et"]):
                if not closed(s, prev) and (r["k"], s) not in fired:
                    wins.setdefault((r["k"], s), []).append(r)
        out = []
        for (k, s), rs in wins.items():
            fires = closed(s, wm)
            if emit == "final" and not fires:
                continue
            if emit == "update" and not any(r["epoch"] == m for r in rs):
                continue
            out.append(agg_row(k, s, size, rs))
        for (k, s) in wins:
            if closed(s, wm):
                fired.add((k, s))
        alive = [r for r in alive if not all(closed(s, wm) for s in windows(r["et"]))]
        results.append((sorted(out), sorted(late), sorted(r["rid"] for r in alive), wm))
    return results


def agg_row(k, s, size, rs):
    vs = [Decimal(r["v"]) for r in rs if r["v"] is not None]
    ns = [r["n"] for r in rs if r["n"] is not None]
    return (k, s, s + size, len(rs), float(sum(vs)) if vs else None, min(ns) if ns else None,
            max(float(v) for v in vs) if vs else None, float(sum(vs)) / len(vs) if vs else None,
            len({r["u"] for r in rs if r["u"] is not None}), sum(ns) if ns else None)
