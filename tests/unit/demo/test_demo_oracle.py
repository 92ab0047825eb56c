from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipeline.demo import oracle
from pipeline.demo.generate import ORDERS_SCHEMA, PAYMENTS_SCHEMA, generate
from pipeline.fileio import file_io_for, join_uri

pytestmark = pytest.mark.unit
B = 1_767_225_600_000_000
TS = pa.timestamp("us", tz="UTC")


def _write(root: str, source: str, p: int, seq: int, rows: list[tuple], schema: pa.Schema | None = None,
           raw: bytes | None = None) -> None:
    uri = join_uri(root, source, f"partition={p}", f"{seq:08d}.parquet")
    if raw is None:
        schema = schema or (ORDERS_SCHEMA if source == "orders" else PAYMENTS_SCHEMA)
        cols = list(zip(*rows)) if rows else [[] for _ in schema]
        arrays = [pa.array(list(c), pa.int64()).cast(TS) if f.type == TS else pa.array(list(c), f.type)
                  for f, c in zip(schema, cols)]
        buf = io.BytesIO()
        pq.write_table(pa.Table.from_arrays(arrays, schema=schema), buf)
        raw = buf.getvalue()
    file_io_for(uri).write_bytes(uri, raw)


@pytest.fixture
def tiny(tmp_path) -> str:
    """A hand-made dataset whose expected output is computed by hand in the tests."""
    root = (tmp_path / "src").as_uri()
    _write(root, "orders", 0, 0, [("o1", "c1", "m1", 10.00, B + 1, B + 1),
                                  ("o2", "c2", "m1", 20.50, B + 2, B + 2),
                                  ("", "c9", "m9", 99.0, B + 3, B + 3)])          # empty key: skipped
    mismatch = pa.schema([("order_id", pa.string()), ("customer_id", pa.string()), ("amount", pa.float64()),
                          ("event_time", TS), ("_ingest_ts", TS)])
    _write(root, "orders", 0, 1, [("o4", "c4", 4.0, B + 9, B + 9)], schema=mismatch)  # no merchant_id: skipped
    _write(root, "orders", 1, 0, [("o3", "c3", "m2", 5.25, B + 3, B + 3)])
    _write(root, "orders", 1, 1, [], raw=b"PAR1 garbage PAR1")                     # unreadable: skipped
    _write(root, "payments", 0, 0, [("pay1", "o1", 10.00, "captured", B + 5, B + 5),
                                    ("pay2", "o2", 20.50, "failed", B + 6, B + 6),
                                    ("pay3", "o9", 1.00, "captured", B + 7, B + 7)])  # no such order
    _write(root, "payments", 1, 0, [("pay4", "o3", 5.25, "captured", B, B),      # before its order
                                    ("pay5", "o2", 20.50, "captured", B + 10, B + 10),
                                    ("pay6", "o4", 4.00, "captured", B + 11, B + 11),   # order was skipped
                                    ("pay7", "o3", 5.25, "captured", B + 12, None)])    # null _ingest_ts
    return root


def rows(t: pa.Table) -> list[tuple]:
    return sorted(tuple(r.values()) for r in t.to_pylist())


def test_expected_on_a_hand_computed_dataset(tiny):
    exp = oracle.expected(tiny)
    paid = exp.paid_orders.select(["order_id", "customer_id", "merchant_id", "order_amount", "payment_id",
                                   "paid_amount"])
    assert rows(paid) == [("o1", "c1", "m1", 10.0, "pay1", 10.0), ("o2", "c2", "m1", 20.5, "pay5", 20.5),
                          ("o3", "c3", "m2", 5.25, "pay4", 5.25)]
    times = {r["order_id"]: (r["order_time"], r["payment_time"]) for r in
             exp.paid_orders.select(["order_id", "order_time", "payment_time"]).cast(
                 pa.schema([("order_id", pa.string()), ("order_time", pa.int64()),
                            ("payment_time", pa.int64())])).to_pylist()}
    assert times == {"o1": (B + 1, B + 5), "o2": (B + 2, B + 10), "o3": (B + 3, B)}
    assert rows(exp.merchant_revenue) == [("m1", 2, 30.5), ("m2", 1, 5.25)]
    st = exp.stats
    assert len(st["orders"]["unreadable_files"]) == 1 and len(st["orders"]["schema_mismatch_files"]) == 1
    assert st["orders"]["bad_rows"] == 1 and st["payments"]["bad_rows"] == 1
    d = oracle.digest(exp)
    assert d["paid_orders"] == {"rows": 3, "distinct_order_ids": 3, "paid_cents": 3575}


def test_expected_before_positions(tiny):
    # orders p0: rows (0,0),(0,1) -> o1, o2; p1 whole seq 0 -> o3. payments p0: all of seq 0; p1: row 0 only
    pos = {"orders": {0: (0, 2), 1: (1, 0)}, "payments": {0: (1, 0), 1: (0, 1)}}
    exp = oracle.expected(tiny, pos)
    assert sorted(exp.paid_orders.column("payment_id").to_pylist()) == ["pay1", "pay4"]
    assert rows(exp.merchant_revenue) == [("m1", 1, 10.0), ("m2", 1, 5.25)]
    # partitions missing from the map are excluded
    exp = oracle.expected(tiny, {"orders": {0: (9, 0)}, "payments": {0: (9, 0)}})
    assert exp.paid_orders.column("payment_id").to_pylist() == ["pay1"]


def test_load_positions_formats():
    assert oracle.load_positions({"orders": {"0": [3, 4]}, "payments": {"1": {"seq": 5, "row": 0}}}) == {
        "orders": {0: (3, 4)}, "payments": {1: (5, 0)}}
    meta = {"checkpoint_id": 7, "positions": {"orders": {"2": {"seq": 1, "row": 2}}}}
    assert oracle.load_positions(meta) == {"orders": {2: (1, 2)}}


def test_compare_counts_missing_extra_and_duplicates(tiny):
    exp = oracle.expected(tiny)
    ok = oracle.compare(exp, {"paid_orders": exp.paid_orders, "merchant_revenue": exp.merchant_revenue})
    assert ok.ok and ok.to_dict()["correct"]
    paid = exp.paid_orders.sort_by("order_id")
    wrong = pa.concat_tables([paid.slice(1), paid.slice(1, 1)])         # o1 missing, o2 twice
    other = paid.slice(2, 1).set_column(0, "order_id", pa.array(["o77"]))  # not expected at all
    rev = exp.merchant_revenue.set_column(2, "revenue", pa.array([30.5, 5.26]))
    rep = oracle.compare(exp, pa.concat_tables([wrong, other]), rev)
    d = rep.tables["paid_orders"]
    assert (d.missing, d.extra, d.duplicates, d.duplicate_keys) == (1, 1, 1, 1)
    assert d.examples_missing[0]["order_id"] == "o1" and d.examples_extra[0]["order_id"] == "o77"
    assert d.examples_duplicate[0]["order_id"] == "o2"
    r = rep.tables["merchant_revenue"]
    assert (r.missing, r.extra) == (1, 1) and not rep.ok


def test_compare_tolerates_float_noise_but_not_cent_differences(tiny):
    exp = oracle.expected(tiny)
    rev = exp.merchant_revenue
    noisy = rev.set_column(2, "revenue", pc.add(rev.column("revenue"), 1e-9))
    assert oracle.compare(exp, exp.paid_orders, noisy).ok
    off = rev.set_column(2, "revenue", pc.add(rev.column("revenue"), 0.01))
    assert not oracle.compare(exp, exp.paid_orders, off).ok


def test_cli_compare_and_digest(tiny, tmp_path, capsys):
    exp = oracle.expected(tiny)
    paid_dir, rev_dir = tmp_path / "paid", tmp_path / "rev"
    paid_dir.mkdir()
    rev_dir.mkdir()
    pq.write_table(exp.paid_orders.slice(0, 2), paid_dir / "part-0.parquet")
    pq.write_table(exp.paid_orders.slice(2), paid_dir / "part-1.parquet")
    pq.write_table(exp.paid_orders, paid_dir / "_uncommitted.parquet")  # hidden: ignored
    pq.write_table(exp.merchant_revenue, rev_dir / "r.parquet")
    assert oracle.main(["--root", tiny, "compare", "--paid", str(paid_dir), "--revenue", str(rev_dir)]) == 0
    assert json.loads(capsys.readouterr().out)["correct"] is True
    pos = tmp_path / "pos.json"
    pos.write_text(json.dumps({"orders": {"0": [0, 1]}, "payments": {"0": [1, 0]}}))
    assert oracle.main(["--root", tiny, "--positions", str(pos), "compare", "--paid", str(paid_dir),
                        "--revenue", str(rev_dir)]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["correct"] is False and out["paid_orders"]["extra"] == 2
    assert oracle.main(["--root", tiny, "digest"]) == 0
    assert json.loads(capsys.readouterr().out)["merchant_revenue"]["revenue_cents"] == 3575


def test_oracle_imports_nothing_from_the_pipeline():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(oracle))
    names = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [n for n in names if n.startswith("pipeline")]


def test_reader_and_oracle_agree_on_generated_data_with_bad_records(tmp_path):
    """Plan + read every split with the pipeline's source code, join, and compare with the oracle."""
    from pipeline.checkpoint.handles import Position
    from pipeline.source import (
        dead_letter_counts,
        end_position,
        list_source_files,
        make_split_reader,
        plan_segments,
        read_split_table,
        summarize_source,
    )

    root = (tmp_path / "gen").as_uri()
    dl = (tmp_path / "dl").as_uri()
    generate(root, epochs=5, partitions=3, orders_per_epoch=400, bad_records=True, files_per_epoch=2)
    fio = file_io_for(root)
    tables, dead = {}, {}
    for source, schema in (("orders", ORDERS_SCHEMA), ("payments", PAYMENTS_SCHEMA)):
        by_p = summarize_source(list_source_files(fio, root, source))
        stops = {p: end_position(s) for p, s in by_p.items()}
        starts = {p: Position(0, 0) for p in by_p}
        splits = []
        while True:  # several capped rounds, like the runtime with a small max_records
            segs = plan_segments(by_p, starts, stops, 700, source=source)
            splits += [sp for sg in segs.values() for sp in sg.splits]
            starts = {p: sg.reached for p, sg in segs.items()}
            if all(sg.done for sg in segs.values()):
                break
        tables[source] = read_split_table(make_split_reader(schema, ["order_id"], "dead_letter", dl, "j"), splits)
        dead.update(dead_letter_counts(None, dl, "j", splits))
    assert dead == {"orders": 1 + 3 + 3, "payments": 2}
    o = tables["orders"].select(["order_id", "customer_id", "merchant_id", "amount", "event_time"]).rename_columns(
        ["order_id", "customer_id", "merchant_id", "order_amount", "order_time"])
    p = tables["payments"].filter(pc.equal(tables["payments"]["status"], "captured")).select(
        ["order_id", "payment_id", "amount", "event_time"]).rename_columns(
        ["order_id", "payment_id", "paid_amount", "payment_time"])
    paid = o.join(p, "order_id", join_type="inner").select(list(oracle.PAID_COLUMNS))
    rev = paid.group_by("merchant_id").aggregate([("paid_amount", "count"), ("paid_amount", "sum")]).rename_columns(
        ["merchant_id", "paid_orders", "revenue"])
    exp = oracle.expected(root)
    report = oracle.compare(exp, paid, rev)
    assert report.ok, report.to_dict()
    assert exp.stats["orders"]["bad_rows"] == 3 and exp.stats["payments"]["bad_rows"] == 2


def test_oracle_schemas_equal_the_jobs():
    """The oracle's own copy of the schemas (independence) equals the one definition the job and generator use."""
    from pipeline.demo import generate
    from pipeline.jobs import orders_payments as job

    assert oracle.ORDERS_SCHEMA.equals(job.ORDERS_SCHEMA) and oracle.PAYMENTS_SCHEMA.equals(job.PAYMENTS_SCHEMA)
    assert generate.ORDERS_SCHEMA is job.ORDERS_SCHEMA and generate.PAYMENTS_SCHEMA is job.PAYMENTS_SCHEMA
