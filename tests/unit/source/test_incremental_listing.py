"""Incremental source listing (docs/state.md, "S3 requests per epoch"): a partition is listed from a window of
already-read files behind its position on, so late and changed files inside the window are still caught at once;
older ones are caught by the periodic full listing, and the read inventory stays complete. On every FileIO."""
from __future__ import annotations

import pytest

from pipeline.checkpoint.handles import Position
from pipeline.fileio import join_uri
from pipeline.source.contract import Breach, find_violations, inventory_behind, listing_start, read_inventory
from pipeline.source.layout import list_source_files, scan_source

pytestmark = pytest.mark.unit


def _put(fio, root, p, seq, size=10, name=None):
    fio.write_bytes(join_uri(root, "ev", f"partition={p}", name or f"{seq:08d}.parquet"), b"x" * size)


def test_incremental_listing_catches_breaches_in_the_window_and_the_full_listing_the_rest(any_root):
    fio, root = any_root
    for seq in [1, 2, 4, 5, 6, 7, 8, 10]:  # 3 and 9 missing for now
        _put(fio, root, 0, seq)
    _put(fio, root, 1, 1)
    full = list_source_files(fio, root, "ev")
    positions = {"ev": {"0": Position(seq=11, row=0), "1": Position(seq=1, row=4)}}  # p1: file 1 partly read
    inventory = read_inventory({"ev": full}, positions)
    assert [s for s, _ in inventory["ev"]["0"]] == [1, 2, 4, 5, 6, 7, 8, 10]

    start = listing_start(inventory, positions["ev"], "ev", window=3)
    assert start == {0: 7, 1: 1}  # the 3 newest read files of p0 are 7, 8 and 10: from 7 on
    _put(fio, root, 0, 11)  # new data
    _put(fio, root, 0, 9)  # a late file inside the window
    _put(fio, root, 0, 7, size=12)  # a changed file inside the window
    _put(fio, root, 0, 3)  # a late file behind the window
    _put(fio, root, 0, 2, size=11)  # a changed file behind the window
    part = list_source_files(fio, root, "ev", start_at=start)
    assert [f.seq for f in part[0]] == [7, 8, 9, 10, 11] and [f.seq for f in part[1]] == [1]
    found = {(v.breach, v.file.seq) for v in find_violations(inventory, {"ev": part}, positions)}
    assert found == {(Breach.LATE_FILE, 9), (Breach.CHANGED_FILE, 7)}

    # the next inventory: listed files + the entries behind the window, so nothing is forgotten
    new_pos = {"ev": {"0": Position(seq=12, row=0), "1": Position(seq=2, row=0)}}
    nxt = read_inventory({"ev": part}, new_pos, {"ev": inventory_behind(inventory, "ev", start)})
    assert nxt["ev"]["0"] == [[1, 10], [2, 10], [4, 10], [5, 10], [6, 10], [7, 12], [8, 10], [9, 10], [10, 10],
                              [11, 10]]

    # the full listing (every PIPELINE_SOURCE_FULL_LISTING_EVERY-th checkpoint) finds the breaches behind the window
    everything = list_source_files(fio, root, "ev")
    found = {(v.breach, v.file.seq) for v in find_violations(nxt, {"ev": everything}, new_pos)}
    assert found == {(Breach.LATE_FILE, 3), (Breach.CHANGED_FILE, 2)}


def test_incremental_listing_still_reports_bad_partition_folders_and_new_partitions(any_root):
    fio, root = any_root
    for seq in range(1, 6):
        _put(fio, root, 0, seq)
    _put(fio, root, 7, 1)  # a partition the job has never read
    fio.write_bytes(join_uri(root, "ev", "partition=x", "00000001.parquet"), b"bad")
    listing = scan_source(fio, root, "ev", start_at={0: 4})
    assert [f.seq for f in listing.files[0]] == [4, 5]
    assert [f.seq for f in listing.files[7]] == [1]
    assert [u.uri.rsplit("/", 2)[-2] for u in listing.unexpected] == ["partition=x"]


def test_no_inventory_means_a_full_listing(any_root):
    assert listing_start({}, {"0": Position(seq=3, row=0)}, "ev", window=4) is None
    assert listing_start({"ev": {"0": []}}, {"0": Position(seq=3, row=0)}, "ev", window=4) == {0: 3}
    inv = {"ev": {"0": [[1, 5], [2, 5]]}}
    assert listing_start(inv, {"0": Position(seq=3, row=0)}, "ev", window=0) == {0: 3}
    assert listing_start(inv, {"0": Position(seq=2, row=7)}, "ev", window=1) == {0: 2}  # the partly read file
