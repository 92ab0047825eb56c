"""Pinning and reading a version of a bounded side table (docs/operators.md "Lookup join").

A **pin** is a small JSON-able dict naming exactly one version of a side table:

* Delta: ``{"format": "delta", "uri", "version": <table version>}``; read with ``deltalake`` at that version;
* Iceberg: ``{"format": "iceberg", "uri", "metadata": <metadata file>, "version": <snapshot id or -1>}``; the
  table's newest ``metadata/*.metadata.json``, read with ``pyiceberg`` (``StaticTable``) at that snapshot;
* Parquet (a file, or a directory read recursively, hidden ``_``/``.`` files skipped): ``{"format": "parquet",
  "uri", "files": [[uri, size, sha256], ...], "version": <sha256 of the list>}``. A Parquet path has no versions:
  the pin records each file's identity (size and content hash). Reading a pin checks every file again; a file that
  is gone or changed under a pinned epoch is an error naming the table and the file (never a silent other version).
  Use a Delta or Iceberg table for a side table that changes.

:func:`read_pinned` caches the last versions read per process (a worker reuses them across rounds).
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import OrderedDict
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.exceptions import ConfigError, EpochalError, SourceError
from pipeline.fileio import file_io_for
from pipeline.fileio.base import sha256_of
from pipeline.operators.lookup import SideTable, SideTableFormat, normalized_schema
from pipeline.sink.delta import delta_storage_options
from pipeline.sink.iceberg import s3_properties

__all__ = ["pin_current", "read_pinned", "pinned_schema", "describe_pin"]

_CACHE: OrderedDict[str, pa.Table] = OrderedDict()
_CACHE_SIZE = 4
_LOCK = threading.Lock()
_META = re.compile(r"(?:^|/)(?:v)?(\d+)(?:-[^/]*)?\.metadata\.json$")


def _local(uri: str) -> str:
    return uri[len("file://"):] if uri.startswith("file://") else uri


def _parquet_files(table: SideTable) -> list[tuple[str, int]]:
    fio = file_io_for(table.uri)
    if table.uri.endswith(".parquet") and fio.exists(table.uri):
        return [(table.uri, fio.size(table.uri))]
    base = table.uri.rstrip("/") + "/"
    files = []
    for f in fio.list(base):
        rel = f.uri[len(base):] if f.uri.startswith(base) else f.uri.rsplit("/", 1)[-1]
        if rel.endswith(".parquet") and not any(p.startswith(("_", ".")) for p in rel.split("/")):
            files.append((f.uri, f.size))
    return sorted(files)


def _iceberg_properties(uri: str) -> dict[str, str]:
    if not uri.startswith("s3://"):
        return {}
    return s3_properties()


def pin_current(table: SideTable) -> dict[str, Any]:
    """A pin of the table's current version (see the module docstring). A missing or unreadable table is a
    :class:`~pipeline.exceptions.ConfigError` naming it."""
    named = table.spec
    if table.uri.startswith("/"):   # an absolute local path
        table = SideTable(table.format, "file://" + table.uri)
    try:
        if table.format is SideTableFormat.DELTA:
            # lazy: deltalake loads its native library; only jobs with a Delta side table pay for it
            from deltalake import DeltaTable
            dt = DeltaTable(_local(table.uri) if table.uri.startswith("file://") else table.uri,
                            storage_options=delta_storage_options(table.uri))
            return {"format": "delta", "uri": table.uri, "version": int(dt.version())}
        if table.format is SideTableFormat.ICEBERG:
            fio = file_io_for(table.uri)
            metas = []
            for f in fio.list(table.uri.rstrip("/") + "/metadata/"):
                m = _META.search(f.uri)
                if m:
                    metas.append((int(m.group(1)), f.uri))
            if not metas:
                raise ConfigError("no metadata/*.metadata.json")
            meta = max(metas)[1]
            from pyiceberg.table import StaticTable  # lazy: pyiceberg is heavy; only Iceberg side tables need it
            snap = StaticTable.from_metadata(meta, properties=_iceberg_properties(meta)).current_snapshot()
            return {"format": "iceberg", "uri": table.uri, "metadata": meta,
                    "version": snap.snapshot_id if snap is not None else -1}
        files = _parquet_files(table)
        if not files:
            raise ConfigError("no Parquet file")
        fio = file_io_for(table.uri)
        listed = [[u, n, sha256_of(fio.read_bytes(u))] for u, n in files]
        digest = hashlib.sha256(json.dumps(listed, separators=(",", ":")).encode()).hexdigest()
        return {"format": "parquet", "uri": table.uri, "files": listed, "version": digest}
    except Exception as e:  # noqa: BLE001 - any failure to open the table is the user's table, named
        raise ConfigError(f"lookup join side table {named!r} is missing or unreadable: "
                          f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def describe_pin(pin: dict[str, Any]) -> str:
    v = pin.get("version")
    return f"{pin.get('format')}:{pin.get('uri')} version {v if pin.get('format') != 'parquet' else str(v)[:12]}"


def _read(pin: dict[str, Any]) -> pa.Table:
    fmt, uri = pin["format"], pin["uri"]
    if fmt == "delta":
        from deltalake import DeltaTable  # lazy: see pin_current
        dt = DeltaTable(_local(uri) if uri.startswith("file://") else uri, version=int(pin["version"]),
                        storage_options=delta_storage_options(uri))
        t = dt.to_pyarrow_table()
    elif fmt == "iceberg":
        from pyiceberg.table import StaticTable  # lazy: see pin_current
        tbl = StaticTable.from_metadata(pin["metadata"], properties=_iceberg_properties(pin["metadata"]))
        snap = int(pin["version"])
        t = tbl.scan(snapshot_id=snap).to_arrow() if snap != -1 else tbl.schema().as_arrow().empty_table()
    else:
        fio = file_io_for(uri)
        parts = []
        for f_uri, size, digest in pin["files"]:
            try:
                data = fio.read_bytes(f_uri)
            except Exception as e:  # noqa: BLE001
                raise SourceError(f"lookup join side table parquet:{uri}: file {f_uri} of the version pinned for "
                                  f"this epoch is gone ({type(e).__name__}); a Parquet side table must not change "
                                  "under a pinned epoch (use a Delta or Iceberg table)") from None
            if len(data) != size or sha256_of(data) != digest:
                raise SourceError(f"lookup join side table parquet:{uri}: file {f_uri} changed after it was pinned "
                                  "for this epoch; a Parquet side table must not change under a pinned epoch (use a "
                                  "Delta or Iceberg table)")
            parts.append(pq.read_table(pa.BufferReader(data)))
        t = pa.concat_tables(parts, promote_options="permissive") if len(parts) > 1 else parts[0]
    return t.cast(normalized_schema(t.schema))


def read_pinned(pin: dict[str, Any]) -> pa.Table:
    """The rows of the pinned version (types normalised as Spark hands them back: :func:`normalized_schema`)."""
    key = json.dumps(pin, sort_keys=True)
    with _LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    try:
        t = _read(pin)
    except EpochalError:
        raise
    except Exception as e:  # noqa: BLE001 - named, never a bare library traceback
        raise SourceError(f"lookup join side table {describe_pin(pin)} cannot be read: "
                          f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    with _LOCK:
        _CACHE[key] = t
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return t


def pinned_schema(pin: dict[str, Any]) -> pa.Schema:
    return read_pinned(pin).schema
