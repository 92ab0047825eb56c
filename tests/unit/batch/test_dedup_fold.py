"""The batch plan's vectorised deduplicate fold (``plan.dedup_fold``: many keys per pandas call) equals the kernel's
rule applied key by key, round by round (the reference below: the per-key fold the plan used before), on random
rows: one key per row, few hot keys, many epochs and rounds, null keys, ties on ``_ingest_ts``, with and without TTL.
Pure pandas, no Spark."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipeline.batch.evaluation.dedup import dedup_fold
from pipeline.batch.evaluation.prefix import PEPOCH
from pipeline.batch.evaluation.rounds import ROUND

pytestmark = pytest.mark.unit

E = 60_000_000


def reference(pdf: pd.DataFrame, key: str, order: list[str], ttl: int | None) -> pd.DataFrame:
    """The rule for one key at a time (docs/operators.md "Deduplicate")."""
    out = []
    groups = [g for _, g in pdf.groupby(key, dropna=False, sort=False)]
    for g in groups:
        held = None
        for (m, _r), rg in g.groupby([PEPOCH, ROUND], sort=True):
            c = (int(m) + 1) * E - ttl if ttl is not None else None
            null_key = rg[key].isna()
            live = ~null_key if c is None else (~null_key & (rg["__t"] >= c))
            out.append(rg[~live])
            if held is not None and c is not None and held < c:
                held = None
            cand = rg[live].sort_values(order, kind="mergesort")
            if len(cand) and held is None:
                out.append(cand.iloc[:1])
                held = int(cand["__t"].iloc[0])
    return pd.concat(out) if out else pdf.iloc[:0]


def rows(seed: int, n: int, keys: int, epochs: int, rounds: int, nulls: float) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    m = rng.integers(0, epochs, n)
    t = m * E + rng.integers(0, E, n) - rng.integers(0, 3, n) * E   # some rows are older than their epoch
    k = np.asarray([f"k{x}" for x in rng.integers(0, keys, n)], dtype=object)
    k[rng.random(n) < nulls] = None
    return pd.DataFrame({"k": k, "v": rng.integers(0, 5, n), "__t": t.astype(np.int64),
                         "_ingest_ts": pd.to_datetime(t, unit="us", utc=True), PEPOCH: m.astype(np.int64),
                         ROUND: rng.integers(0, rounds, n).astype(np.int64)})


def canon(df: pd.DataFrame) -> list[tuple]:
    return sorted(map(tuple, df[["k", "v", "__t", PEPOCH, ROUND]].astype(str).to_numpy().tolist()))


@pytest.mark.parametrize("ttl_s", [None, 30, 150])
@pytest.mark.parametrize("shape", [
    dict(n=300, keys=300, epochs=24, rounds=1, nulls=0.0),         # one key per row (mostly)
    dict(n=600, keys=3, epochs=40, rounds=3, nulls=0.05),          # few hot keys, many epochs and rounds
    dict(n=300, keys=30, epochs=200, rounds=2, nulls=0.02),        # many epochs
    dict(n=300, keys=20, epochs=5, rounds=4, nulls=0.3),           # ties on _ingest_ts broken by v
])
def test_vectorised_fold_equals_per_key_rule(shape, ttl_s):
    for seed in range(3):
        pdf = rows(seed, **shape)
        if seed == 2:   # many exact ties on _ingest_ts
            pdf["__t"] = (pdf["__t"] // E) * E + E - 1
            pdf["_ingest_ts"] = pd.to_datetime(pdf["__t"], unit="us", utc=True)
        ttl = None if ttl_s is None else ttl_s * 1_000_000
        order = ["_ingest_ts", "v"]
        got = dedup_fold("k", order, E, ttl)(pdf.sample(frac=1.0, random_state=seed))
        assert canon(got) == canon(reference(pdf, "k", order, ttl))
        assert list(got.columns) == list(pdf.columns)


def test_empty_and_all_null():
    pdf = rows(1, 50, 5, 3, 1, 1.0)
    assert len(dedup_fold("k", ["_ingest_ts"], E, 60_000_000)(pdf)) == 50
    assert dedup_fold("k", ["_ingest_ts"], E, None)(pdf.iloc[:0]).empty
