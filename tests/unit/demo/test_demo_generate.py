from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipeline.demo.generate import ORDERS_SCHEMA, PAYMENTS_SCHEMA, generate, main
from pipeline.exceptions import ConfigError
from pipeline.fileio import LocalFileIO, file_io_for, join_uri

pytestmark = pytest.mark.unit
E = 60_000_000
START = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z


def read_source(root: str, source: str) -> dict[tuple[int, int], pa.Table]:
    """{(partition, seq): table} of every readable data file."""
    fio = file_io_for(root)
    out = {}
    for fi in fio.list(join_uri(root, source)):
        rel = fi.uri[len(join_uri(root, source)) + 1:]
        part, name = rel.split("/")
        key = (int(part.split("=")[1]), int(name.split(".")[0]))
        data = fio.read_bytes(fi.uri)
        if name.endswith(".jsonl"):
            import pyarrow.json as pj

            out[key] = pj.read_json(io.BytesIO(data))
        else:
            try:
                out[key] = pq.read_table(pa.BufferReader(data))
            except pa.ArrowInvalid:
                out[key] = None
    return out


def test_generation_is_deterministic(tmp_path):
    a = generate((tmp_path / "a").as_uri(), epochs=3, partitions=2, orders_per_epoch=300, seed=7)
    b = generate((tmp_path / "b").as_uri(), epochs=3, partitions=2, orders_per_epoch=300, seed=7)
    c = generate((tmp_path / "c").as_uri(), epochs=3, partitions=2, orders_per_epoch=300, seed=8)
    assert a.rows == b.rows
    for source in ("orders", "payments"):
        ta, tb, tc = (read_source(s.root, source) for s in (a, b, c))
        assert ta.keys() == tb.keys()
        assert all(ta[k].equals(tb[k]) for k in ta)
        assert not all(ta[k].equals(tc[k]) for k in ta)


def test_append_continues_the_same_timeline(tmp_path):
    kw = dict(partitions=3, orders_per_epoch=200, seed=3, files_per_epoch=2)
    one = generate((tmp_path / "one").as_uri(), epochs=7, **kw)
    two_root = (tmp_path / "two").as_uri()
    first = generate(two_root, epochs=4, **kw)
    second = generate(two_root, epochs=3, append=True)
    assert (first.first_epoch, second.first_epoch, second.epochs_total) == (0, 4, 7)
    assert second.end == "2026-01-01T00:07:00Z"
    for source in ("orders", "payments"):
        t1, t2 = read_source(one.root, source), read_source(two_root, source)
        assert t1.keys() == t2.keys()
        assert all(t1[k].equals(t2[k]) for k in t1)
    assert one.totals["rows"] == second.totals["rows"]


def test_append_and_fresh_root_rules(tmp_path):
    root = (tmp_path / "r").as_uri()
    with pytest.raises(ConfigError, match="does not exist"):
        generate(root, epochs=1, append=True)
    generate(root, epochs=1, orders_per_epoch=10)
    with pytest.raises(ConfigError, match="already holds"):
        generate(root, epochs=1)
    with pytest.raises(ConfigError, match="partitions"):
        generate(root, epochs=1, append=True, partitions=9)
    state = json.loads(LocalFileIO().read_bytes(join_uri(root, "_generator.json")))
    assert state["epochs"] == 1 and state["config"]["orders_per_epoch"] == 10


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("gen").as_uri()
    summary = generate(root, epochs=16, partitions=4, orders_per_epoch=1500, seed=11, files_per_epoch=2)
    return summary, read_source(root, "orders"), read_source(root, "payments")


def test_layout_schemas_and_ingest_order(dataset):
    summary, orders, payments = dataset
    assert summary.files == {"orders": 16 * 4 * 2, "payments": 16 * 4 * 2}
    for files, schema in ((orders, ORDERS_SCHEMA), (payments, PAYMENTS_SCHEMA)):
        for p in range(4):
            seqs = sorted(s for (q, s) in files if q == p)
            assert seqs == list(range(32))  # seq counts files per partition
            last = -1
            for seq in seqs:
                t = files[(p, seq)]
                assert t.schema == schema
                ts = t.column("_ingest_ts").cast(pa.int64()).to_numpy()
                assert (np.diff(ts) >= 0).all() and (len(ts) == 0 or ts[0] >= last)
                epoch, k = divmod(seq, 2)
                lo = START + epoch * E + k * E // 2
                assert ((ts >= lo) & (ts < lo + E // 2)).all()  # the file's slice of its epoch
                if len(ts):
                    last = ts[-1]


def test_orders_and_payments_invariants(dataset):
    summary, orders, payments = dataset
    o = pa.concat_tables(orders.values())
    p = pa.concat_tables(payments.values())
    assert o.num_rows == 16 * 1500 == summary.rows["orders"]
    assert pc.count_distinct(o["order_id"]).as_py() == o.num_rows
    assert pc.count_distinct(p["payment_id"]).as_py() == p.num_rows
    assert pc.min(o["amount"]).as_py() >= 1.0
    assert np.allclose(np.round(o["amount"].to_numpy() * 100), o["amount"].to_numpy() * 100)
    pdf = p.to_pandas()
    cap = pdf[pdf.status == "captured"]
    assert cap.order_id.is_unique  # at most one captured payment per order
    assert set(pdf.status) == {"captured", "failed"}
    odf = o.to_pandas().set_index("order_id")
    # orders from early epochs have had time to get their payment: about 85 % are paid
    early = odf[odf._ingest_ts < odf._ingest_ts.min() + pd_timedelta(3)]
    paid_rate = early.index.isin(cap.order_id).mean()
    assert 0.80 < paid_rate < 0.90
    m = cap.merge(odf, left_on="order_id", right_index=True, suffixes=("_p", "_o"))
    assert (m.amount_p == m.amount_o).all()
    lag = (m._ingest_ts_p - m._ingest_ts_o).dt.total_seconds()
    assert (lag < 0).mean() > 0.03  # payments before their order
    assert (lag > 2 * 60).mean() > 0.1  # several epochs later
    assert lag.max() <= 13 * 60
    payment_part = {pid: q for (q, _s), t in payments.items() for pid in t.column("payment_id").to_pylist()}
    order_part = {oid: q for (q, _s), t in orders.items() for oid in t.column("order_id").to_pylist()}
    assert np.mean([payment_part[r.payment_id] != order_part[r.order_id] for r in m.itertuples()]) > 0.5
    failed = pdf[pdf.status == "failed"].merge(cap, on="order_id", suffixes=("_f", "_c"))
    assert len(failed) > 0 and (failed._ingest_ts_f < failed._ingest_ts_c).all()  # failed first
    # zipf-ish merchants: the top merchant is far more frequent than the median one
    counts = o.to_pandas().merchant_id.value_counts()
    assert counts.iloc[0] > 10 * counts.median()


def pd_timedelta(minutes: int):
    import pandas as pd

    return pd.Timedelta(minutes=minutes)


def test_bad_records_are_where_documented(tmp_path):
    root = (tmp_path / "bad").as_uri()
    s = generate(root, epochs=2, partitions=3, orders_per_epoch=50, bad_records=True)
    bad = s.bad_records
    assert bad["unreadable_file"] == join_uri(root, "orders/partition=0/00000001.parquet")
    assert bad["schema_mismatch_file"] == join_uri(root, "orders/partition=1/00000001.parquet")
    orders = read_source(root, "orders")
    assert orders[(0, 1)] is None  # not Parquet
    mismatch = orders[(1, 1)]
    assert "merchant_id" not in mismatch.column_names and mismatch.num_rows == 3
    assert [(q, s_) for (q, s_) in orders if q == 0] == [(0, 0), (0, 1), (0, 2)]  # epoch 1 moved to seq 2
    o2 = orders[(2, 0)]
    ids = o2.column("order_id")
    assert ids.null_count == 2 and pc.sum(pc.equal(ids, "")).as_py() == 1
    p0 = read_source(root, "payments")[(0, 0)]
    assert p0.column("order_id").null_count == 1 and pc.sum(pc.equal(p0.column("order_id"), "")).as_py() == 1
    ts = o2.column("_ingest_ts").cast(pa.int64()).to_numpy()
    assert (np.diff(ts) >= 0).all()


def test_jsonl_format(tmp_path):
    root = (tmp_path / "j").as_uri()
    generate(root, epochs=2, partitions=2, orders_per_epoch=40, file_format="jsonl")
    orders = read_source(root, "orders")
    assert len(orders) == 4 and sum(t.num_rows for t in orders.values()) == 80
    line = LocalFileIO().read_bytes(join_uri(root, "orders/partition=0/00000000.jsonl")).splitlines()[0]
    rec = json.loads(line)
    assert rec["_ingest_ts"].startswith("2026-01-01T00:00:") and rec["_ingest_ts"].endswith("Z")


def test_generate_on_s3(s3_root):
    s = generate(s3_root, epochs=2, partitions=2, orders_per_epoch=30)
    assert s.files == {"orders": 4, "payments": 4}
    assert file_io_for(s3_root).exists(join_uri(s3_root, "_generator.json"))


def test_cli_prints_a_json_summary(tmp_path, capsys):
    root = (tmp_path / "cli").as_uri()
    assert main(["--root", root, "--epochs", "2", "--partitions", "2", "--orders", "100"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rows"]["orders"] == 100 and out["epochs_total"] == 2
    assert main(["--root", root, "--epochs", "1", "--append"]) == 0
    assert json.loads(capsys.readouterr().out)["first_epoch"] == 2
    assert main(["--root", root, "--epochs", "1"]) == 2  # not append on an existing root: usage error
