"""Existence, size, checksum and row count of the files a snapshot references (driver, a thread pool)."""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from pipeline.exceptions import ObjectNotFoundError, StorageError

__all__ = ["stat_file", "stat_files", "HEAD_WORKERS"]

HEAD_WORKERS = 16


def stat_file(fio_for: Callable[[str], Any], uri: str, checksum: bool) -> dict:
    """exists / bytes / sha256 / rows of one file (sha256 and rows only when ``checksum``)."""
    fio = fio_for(uri)
    try:
        if not checksum:
            return {"exists": True, "bytes": fio.size(uri), "sha256": None, "rows": None}
        data = fio.read_bytes(uri)
    except ObjectNotFoundError:
        return {"exists": False, "bytes": None, "sha256": None, "rows": None}
    except StorageError as e:
        return {"exists": False, "bytes": None, "sha256": None, "rows": None, "error": str(e)}
    rows = None
    if uri.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
            rows = pq.ParquetFile(pa.BufferReader(data)).metadata.num_rows
        except Exception:  # noqa: BLE001 - reported as a row-count mismatch
            rows = -1
    return {"exists": True, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "rows": rows,
            "data": data}


def stat_files(fio_for, uris: Iterable[str], checksum: set[str]) -> dict[str, dict]:
    uris = sorted(set(uris))
    if not uris:
        return {}
    with ThreadPoolExecutor(max_workers=min(HEAD_WORKERS, len(uris))) as pool:
        res = list(pool.map(lambda u: stat_file(fio_for, u, u in checksum), uris))
    out = {}
    for u, r in zip(uris, res):
        r.pop("data", None)
        out[u] = r
    return out
