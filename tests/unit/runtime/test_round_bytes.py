"""The per-task byte budget of a tagged round (pipeline.runtime.spark.round_bytes), without Spark: how many waiting epochs a
round takes, the first round without a figure, the first figure sampled from a Parquet file, the figure measured by a read task and recorded in a checkpoint's
``_metadata``, and read back from storage by a new process. The Spark side (a catch-up split into rounds by bytes) is
tests/integration/test_tagged_round_bytes.py."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.accumulators import Accumulator

from pipeline.checkpoint.metadata import CheckpointMetadata
from pipeline.checkpoint.recovery_fields import BYTES_PER_ROW_KEY
from pipeline.checkpoint.store import CompletedCheckpointStore
from pipeline.config import load_config
from pipeline.fileio import LocalFileIO, join_uri
from pipeline.runtime.driver.cursor import Cursor, cursor_from_metadata
from pipeline.runtime.spark.round_bytes import (
    ReadBytes,
    ReadBytesCounter,
    _SumParam,
    bytes_per_row_after,
    epochs_within_budget,
    measured,
    sampled_bytes_per_row,
)
from pipeline.source.planner import Split

pytestmark = pytest.mark.unit

MIB = 2**20


def test_epochs_are_added_while_the_estimate_per_task_stays_within_the_budget():
    # 1000 rows of 1 KiB per epoch on 2 tasks: 0.5 MiB per task and epoch (the acks: 100 rows of 100 bytes)
    epochs = [{"docs": 1024, "acks": 100}] * 8
    figure = {"docs": 1024.0, "acks": 100.0}
    half = (1024 * 1024 + 100 * 100) / 2
    cut = epochs_within_budget(epochs, figure, 2, 2 * MIB)
    assert cut.epochs == 3 and cut.task_bytes == round(3 * half + 0.5)  # 4 epochs: 2.02 MiB > 2 MiB
    assert "4 epochs would hold ~2.0 MiB per task, over PIPELINE_MAX_TASK_BYTES_PER_ROUND=2.0 MiB" in cut.reason
    assert epochs_within_budget(epochs, figure, 4, 2 * MIB).epochs == 7  # twice the tasks: twice the epochs
    assert epochs_within_budget(epochs, figure, 2, 64 * MIB) == epochs_within_budget(epochs, figure, 2, 0)
    whole = epochs_within_budget(epochs, figure, 2, 64 * MIB)
    assert whole.epochs == 8 and whole.reason is None
    # the first epoch is always taken, even above the budget (a round carries at least one)
    assert epochs_within_budget(epochs, figure, 2, 1000).epochs == 1


def test_without_a_figure_the_first_round_takes_one_epoch_and_a_source_without_rows_needs_none():
    epochs = [{"docs": 10, "acks": 0}] * 5
    first = epochs_within_budget(epochs, {}, 2, 128 * MIB)
    assert first.epochs == 1 and first.task_bytes is None
    assert first.reason == "no bytes-per-row figure of source 'docs' yet (this round records it)"
    assert epochs_within_budget(epochs, {"docs": 50.0}, 2, 128 * MIB).epochs == 5  # acks read nothing
    # a source the round's first epochs do not read and that was never measured stops the round before it
    later = epochs_within_budget([{"docs": 10}, {"docs": 10}, {"docs": 10, "acks": 3}], {"docs": 50.0}, 2, MIB)
    assert later.epochs == 2 and "'acks'" in later.reason
    assert epochs_within_budget(epochs, {}, 2, 0).epochs == 5  # no budget: no figure needed


def test_the_read_task_measures_rows_and_arrow_bytes_and_a_checkpoint_keeps_earlier_figures():
    acc = Accumulator(20_001, {}, _SumParam())
    counter = ReadBytesCounter(acc)
    mark = counter.mark()
    batches = [pa.record_batch({"body": ["x" * 1000] * 10}), pa.record_batch({"body": ["y" * 1000] * 30})]

    def read(_):
        yield from batches

    assert list(measured(read, "docs", counter)(iter([]))) == batches
    got = counter.since(mark)
    assert got.rows == {"docs": 40} and got.bytes == {"docs": sum(b.nbytes for b in batches)}
    assert 1000 < got.per_row()["docs"] < 1010  # the payload and its offsets
    assert measured(read, "docs", None) is read  # Spark Connect: no accumulator, nothing measured
    # a checkpoint whose rounds read no acks keeps the acks' earlier figure; nothing measured: the parent's
    after = bytes_per_row_after({"acks": 64.0, "docs": 10.0}, got + ReadBytes({"acks": 0}, {"acks": 0}))
    assert after == {"acks": 64.0, "docs": got.per_row()["docs"]}
    assert bytes_per_row_after({"acks": 64.0}, None) == {"acks": 64.0}


_NEW_PROCESS = """
import json, sys
from pipeline.checkpoint.store import CompletedCheckpointStore
from pipeline.fileio import LocalFileIO
from pipeline.runtime.driver.cursor import cursor_from_metadata
from pipeline.runtime.spark.round_bytes import epochs_within_budget
latest = CompletedCheckpointStore(LocalFileIO(), sys.argv[1]).latest()
cursor = cursor_from_metadata(latest.metadata)
cut = epochs_within_budget([{"docs": 1000}] * 8, cursor.bytes_per_row, 2, int(sys.argv[2]))
print(json.dumps({"figure": cursor.bytes_per_row, "epochs": cut.epochs, "reason": cut.reason}))
"""


def test_a_new_process_reads_the_figure_from_the_latest_checkpoint(tmp_path: Path):
    fio = LocalFileIO()
    job_root = (tmp_path / "ckpt" / "docs_job").as_uri()
    store = CompletedCheckpointStore(fio, job_root)
    figure = bytes_per_row_after({}, ReadBytes({"docs": 1000}, {"docs": 2_048_000}))
    md = CheckpointMetadata(job="docs_job", checkpoint_id=1, parent_id=None, kind="checkpoint", epoch=0,
                            barrier_time="t", checkpoint_mode="exactly_once", alignment="aligned",
                            max_parallelism=8, parallelism=2, operators={}, extra={BYTES_PER_ROW_KEY: figure})
    fio.write_bytes(join_uri(store.location_of(1), "_metadata"), md.to_bytes(), if_none_match=True)
    assert cursor_from_metadata(CheckpointMetadata.from_json(md.to_json())).bytes_per_row == {"docs": 2048.0}
    assert Cursor().bytes_per_row == {}  # a job with no checkpoint: no figure (its first round takes one epoch)
    # 1000 rows x 2048 bytes / 2 tasks = ~1 MiB per epoch and task: a 3 MiB budget takes 3 epochs
    out = subprocess.run([sys.executable, "-c", _NEW_PROCESS, job_root, str(3 * MIB)], check=True,
                         capture_output=True, text=True, cwd=Path(__file__).resolve().parents[3])
    got = json.loads(out.stdout)
    assert got["figure"] == {"docs": 2048.0} and got["epochs"] == 3 and "4 epochs would hold" in got["reason"]


def test_the_budget_key_is_documented_and_validated():
    assert load_config(env={}).max_task_bytes_per_round == 128 * MIB
    assert load_config(env={}).max_epochs_per_round == 8
    assert load_config(env={"PIPELINE_MAX_TASK_BYTES_PER_ROUND": "0"}).max_task_bytes_per_round == 0
    from pipeline.exceptions import ConfigError
    with pytest.raises(ConfigError, match="PIPELINE_MAX_TASK_BYTES_PER_ROUND=-1"):
        load_config(env={"PIPELINE_MAX_TASK_BYTES_PER_ROUND": "-1"})
    from pipeline.config import CONFIG_KEYS  # the docs' configuration reference is generated from these
    assert "PIPELINE_MAX_TASK_BYTES_PER_ROUND" in CONFIG_KEYS


def test_a_first_figure_is_sampled_from_the_rounds_first_parquet_file_as_the_read_tasks_decode_it(tmp_path: Path):
    """A dictionary-encoded 2 KB payload is a few bytes per row on disk and ~2 KB in Arrow: the sample decodes it,
    only the declared columns count, and a JSON Lines file, a split without rows or an unreadable file give no
    figure (the round then takes one epoch and measures)."""
    import pyarrow.parquet as pq

    ts = pa.timestamp("us", tz="UTC")
    payload = "x" * 2000
    t = pa.table({"k": [f"k{i}" for i in range(10_000)], "payload": [payload] * 10_000,
                  "extra": list(range(10_000)), "_ingest_ts": pa.array(list(range(10_000)), pa.int64()).cast(ts)})
    path = tmp_path / "00000001.parquet"
    pq.write_table(t, path, use_dictionary=True)
    assert path.stat().st_size < 200_000  # 10k rows of 2 KB: the file does not tell the bytes
    schema = pa.schema([("k", pa.string()), ("payload", pa.string()), ("_ingest_ts", ts)])
    uri = path.as_uri()

    def split(fmt="parquet", rows=10_000, u=uri):
        return Split("s", 0, 1, u, fmt, 0, rows)

    got = sampled_bytes_per_row(LocalFileIO(), schema, [split("jsonl"), split(rows=0), split()])
    assert got is not None and 2000 + 8 + 8 < got < 2000 + 8 + 8 + 64   # payload, key, ts (+ the reader's columns)
    assert sampled_bytes_per_row(LocalFileIO(), schema, [split("jsonl")]) is None
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    assert sampled_bytes_per_row(LocalFileIO(), schema, [split(u=(tmp_path / "junk.parquet").as_uri())]) is None
    # with the figure the budget decides at once: 50k such rows per epoch on 2 tasks is ~50 MiB per task and epoch
    cut = epochs_within_budget([{"s": 50_000}] * 8, {"s": got}, 2, 128 * MIB)
    assert cut.epochs == 2 and "3 epochs would hold" in (cut.reason or "")
