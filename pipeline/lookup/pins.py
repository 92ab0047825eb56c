"""The per-epoch record of pinned side-table versions: ``<job root>/lookups/<uid>/epoch-<n>.json`` (one pin,
:mod:`pipeline.lookup.tables`), written once, write-if-absent, the first time epoch ``n`` is processed (before its
Spark round reads a row). Every later processing of epoch ``n`` - a retry, a replay after a crash, a restore
that re-completes it, at any parallelism - reads the recorded pin, so it joins the same version; ``validate``'s
batch meaning joins each epoch's rows with the same record. The records are tiny and kept for the job's life."""
from __future__ import annotations

import json
from typing import Any

from pipeline.exceptions import ConditionalWriteError, CorruptCheckpointError, ObjectNotFoundError
from pipeline.fileio.base import FileIO
from pipeline.layout.lookups import lookup_pin_epoch, lookup_pin_uri, lookup_pins_prefix
from pipeline.lookup.tables import pin_current
from pipeline.operators.lookup import SideTable

__all__ = ["pin_uri", "pin_epoch", "read_pins"]

def pin_uri(job_root: str, uid: str, epoch: int) -> str:
    """Where the pin of ``epoch`` of lookup join ``uid`` is recorded (:mod:`pipeline.layout.lookups`)."""
    return lookup_pin_uri(job_root, uid, epoch)


def _load(fio: FileIO, uri: str) -> dict[str, Any]:
    try:
        return json.loads(fio.read_bytes(uri))
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptCheckpointError(f"unreadable lookup pin {uri}: {e}") from None


def pin_epoch(fio: FileIO, job_root: str, uid: str, epoch: int, table: SideTable) -> dict[str, Any]:
    """The version of ``table`` pinned for ``epoch`` by lookup join ``uid``: the recorded one, else the current
    version, recorded now (a concurrent writer's record wins: write-if-absent)."""
    uri = pin_uri(job_root, uid, epoch)
    try:
        return _load(fio, uri)
    except ObjectNotFoundError:
        pass
    pin = pin_current(table)
    try:
        fio.write_bytes(uri, (json.dumps(pin, sort_keys=True, indent=1) + "\n").encode(), if_none_match=True)
    except ConditionalWriteError:
        return _load(fio, uri)
    return pin


def read_pins(fio: FileIO, job_root: str, uid: str, upto_epoch: int | None = None) -> dict[int, dict[str, Any]]:
    """Every recorded pin of lookup join ``uid`` (epoch -> pin), up to ``upto_epoch``."""
    out: dict[int, dict[str, Any]] = {}
    for f in fio.list(lookup_pins_prefix(job_root, uid)):
        n = lookup_pin_epoch(f.uri)
        if n is not None and (upto_epoch is None or n <= upto_epoch):
            out[n] = _load(fio, f.uri)
    return out
