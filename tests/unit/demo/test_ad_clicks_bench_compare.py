"""The comparison and the file schedule of ``benchmarks/ad_clicks_bench.py`` (no Spark): what decides a
system's "correct" column and which files the Structured Streaming peer gets per epoch."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipeline.demo.ad_generate import generate_ads
from pipeline.demo.ad_oracle import expected_ad_output

pytestmark = pytest.mark.unit

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import ad_clicks_bench as bench  # noqa: E402


@pytest.fixture(scope="module")
def ads(tmp_path_factory):
    root = tmp_path_factory.mktemp("ads")
    info = generate_ads(root.as_uri(), epochs=8, partitions=2, impressions_per_epoch=120, seed=5)
    return root, info, expected_ad_output(root.as_uri(), info["last_epoch"])


def _write(df, d: Path) -> str:
    d.mkdir(parents=True)
    t = pa.Table.from_pandas(df, preserve_index=False)
    for c in ("window_start", "window_end"):
        t = t.set_column(t.schema.get_field_index(c), c, pc.cast(t[c], pa.timestamp("us", tz="UTC")))
    pq.write_table(t, d / "part-0.parquet")
    return str(d)


def test_exact_output_is_correct_and_one_changed_value_is_not(ads, tmp_path):
    _, _, exp = ads
    assert len(exp.campaign_clicks) > 2 and len(exp.campaign_impressions) > 2
    rep = bench.verify(exp, _write(exp.campaign_clicks, tmp_path / "ok" / "c"),
                       _write(exp.campaign_impressions, tmp_path / "ok" / "i"))
    assert rep["correct"], rep
    assert rep["campaign_clicks"]["rows_exact"] == len(exp.campaign_clicks)
    wrong = exp.campaign_clicks.copy()
    wrong.loc[wrong.index[0], "clicks"] += 1
    rep = bench.verify(exp, _write(wrong, tmp_path / "bad" / "c"),
                       _write(exp.campaign_impressions, tmp_path / "bad" / "i"))
    c = rep["campaign_clicks"]
    assert not rep["correct"]
    assert (c["rows_exact"], c["missing"], c["extra"]) == (len(exp.campaign_clicks) - 1, 1, 1)
    assert c["columns_agree"] == {"clicks": c["windows_both"] - 1, "clicked_impressions": c["windows_both"],
                                  "attributions": c["windows_both"]}
    assert rep["campaign_impressions"]["rows_exact"] == len(exp.campaign_impressions)
    assert "NO:" in bench._correct({"verify": rep})


def test_file_schedule_puts_every_nonempty_file_in_its_rows_epoch(ads):
    root, info, _ = ads
    sched = bench.file_epochs(str(root), 60)
    seen = set()
    for epoch, source, path in sched:
        t = pq.read_table(path)
        epochs = set(pc.divide(pc.cast(pc.cast(t["_ingest_ts"], pa.int64()), pa.int64()), 60_000_000).to_pylist())
        assert epochs == {epoch} and f"/{source}/" in path, (path, epochs, epoch)
        seen.add(path)
    nonempty = {os.path.join(d, f) for s in ("impressions", "clicks") for d, _, fs in os.walk(root / s) for f in fs
                if f.endswith(".parquet") and pq.ParquetFile(os.path.join(d, f)).metadata.num_rows}
    assert seen == nonempty and info["first_epoch"] <= min(e for e, _, _ in sched)
