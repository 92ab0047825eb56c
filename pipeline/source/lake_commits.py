"""A Delta or Iceberg table's commits, as a lake source reads them (pipeline/source/lake.py; docs/lake-sources.md).

:func:`delta_commits` reads ``_delta_log/<version>.json`` from a version on (the table's own log, through Epochal's
FileIO: file:// or S3); :func:`pipeline.source.lake_iceberg.iceberg_commits` walks the current snapshot's ancestors
(pyiceberg). Each commit is a
:class:`LakeCommit`: its version (Delta version; Iceberg sequence number), its time and the data files it adds.

Commits, per kind (the rule is checked at every listing, before anything of the epoch runs):

* append (Delta: ``add`` actions with ``dataChange=true`` and no ``remove`` with ``dataChange=true``; Iceberg:
  an ``append`` snapshot): its added files are read;
* compaction (Delta ``OPTIMIZE``: every action ``dataChange=false``; Iceberg ``replace``): skipped, the rows
  are already read from the files it compacts;
* a commit without data files (metadata, ``txn``, an empty commit): skipped;
* every commit's schema (Delta ``metaData``, the Iceberg snapshot's schema) is checked against the declared schema:
  columns the source does not declare are ignored (an added column is fine); a declared column that is missing or
  whose type does not cast to the declared type fails;
* anything that removes or rewrites rows (Delta ``DELETE``/``UPDATE``/``MERGE``/overwrite, Iceberg
  ``delete``/``overwrite``): :class:`~pipeline.exceptions.LakeSourceError` naming the table and version. A job
  reading the table stops there; it never reads a changed table as if it had only grown;
* a rewind of the writing job (Delta ``RESTORE`` to version V at version R; Iceberg: the current snapshot set back
  to an ancestor) is **followed**: the abandoned versions ``V < v <= R`` (Delta) or the snapshots no longer in the
  current snapshot's ancestry (Iceberg) are skipped, as if never written. A job that has already read one of them
  fails instead (pipeline/source/lake.py ``check_lineage``): its output holds rows the table no longer has.

Retention: a Delta version whose JSON is gone (log retention) or an Iceberg history cut by snapshot expiry fails
naming the table, the version and the checkpoint that needs it.
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import unquote

import pyarrow as pa

from pipeline.exceptions import ConfigError, LakeSourceError
from pipeline.fileio import file_io_for
from pipeline.source._formats import INGEST_TS, TypeMismatch, cast_lenient

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.fileio import FileIO

__all__ = ["IngestTime", "LakeTable", "LakeCommit", "LakeListing", "delta_commits", "check_declared_schema"]

IngestTime = Literal["commit", "column"]
_DELTA_LOG = re.compile(r"(?:^|/)(\d{20})\.json$")


@dataclass(frozen=True, slots=True)
class LakeTable:
    """``delta:<uri>``, ``iceberg:<uri>`` (the table's location, holding ``metadata/``) or
    ``iceberg:<catalog>.<namespace>.<table>`` (loaded with pyiceberg's ``load_catalog``)."""

    format: Literal["delta", "iceberg"]
    location: str

    @classmethod
    def parse(cls, spec: str, where: str) -> LakeTable:
        fmt, sep, loc = (spec or "").partition(":")
        if not sep or not loc.strip() or fmt not in ("delta", "iceberg"):
            raise ConfigError(f"{where}: table={spec!r}; use 'delta:<uri>', 'iceberg:<uri>' or "
                              "'iceberg:<catalog>.<namespace>.<table>'")
        if fmt == "iceberg" and cls._is_identifier(loc) and loc.count(".") < 2:
            raise ConfigError(f"{where}: table={spec!r}: an Iceberg catalog table is '<catalog>.<namespace>.<table>'")
        return cls(fmt, loc)  # type: ignore[arg-type]

    @staticmethod
    def _is_identifier(loc: str) -> bool:
        return "/" not in loc and ":" not in loc

    @property
    def spec(self) -> str:
        return f"{self.format}:{self.location}"

    @property
    def in_catalog(self) -> bool:
        return self.format == "iceberg" and self._is_identifier(self.location)

    def resolved(self, source_root: str) -> LakeTable:
        """The table with a relative location made absolute against ``source_root`` (a catalog name as it is)."""
        loc = self.location
        if self.in_catalog or "://" in loc:
            return self
        if loc.startswith("/"):
            return LakeTable(self.format, "file://" + loc)
        return LakeTable(self.format, source_root.rstrip("/") + "/" + loc.lstrip("./"))


@dataclass(frozen=True, slots=True)
class LakeCommit:
    """One version (Delta) or snapshot (Iceberg) of a table, as a lake source reads it."""

    version: int                         # Delta version; Iceberg sequence number
    ts_us: int                           # commit time, µs since the epoch
    operation: str                       # Delta commitInfo.operation; Iceberg summary operation
    files: tuple[tuple[str, int], ...]   # added data files read as the source (uri, size); () when skipped
    snapshot_id: int | None = None       # Iceberg only

    def label(self, table: LakeTable) -> str:
        snap = f" (snapshot {self.snapshot_id})" if self.snapshot_id is not None else ""
        return f"table {table.spec} version {self.version}{snap}"


@dataclass(frozen=True, slots=True)
class LakeListing:
    commits: tuple[LakeCommit, ...]      # from the start version on, oldest first (skipped commits included)
    latest: int | None                   # the newest version seen (None: an empty table)
    #: Delta: the newest ``metaData.configuration`` among the listed versions, with its version (None: none there);
    #: Iceberg: the table's properties as of the current snapshot
    properties: tuple[int, Mapping[str, str]] | None = None
    files_rearranged: bool = False       # a skipped compaction removed files (VACUUM's retention applies to them)


# --- schemas --------------------------------------------------------------------------------------------------
_DELTA_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(), "long": pa.int64(), "integer": pa.int32(), "short": pa.int16(), "byte": pa.int8(),
    "float": pa.float32(), "double": pa.float64(), "boolean": pa.bool_(), "binary": pa.binary(),
    "date": pa.date32(), "timestamp": pa.timestamp("us", tz="UTC"), "timestamp_ntz": pa.timestamp("us"),
}
_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")


def _delta_type(t: Any) -> pa.DataType | None:
    """The Arrow type of a Delta schema type (None: a nested type, not checked here; the reader checks it)."""
    if not isinstance(t, str):
        return None
    m = _DECIMAL.match(t)
    return pa.decimal128(int(m.group(1)), int(m.group(2))) if m else _DELTA_TYPES.get(t)


def _delta_schema(meta: Mapping[str, Any]) -> dict[str, pa.DataType | None]:
    fields = json.loads(meta.get("schemaString") or "{}").get("fields", [])
    return {f["name"]: _delta_type(f.get("type")) for f in fields}


def check_declared_schema(declared: pa.Schema, table_columns: Mapping[str, pa.DataType | None], where: str, *,
                          ingest_time: IngestTime) -> None:
    """Every declared column is a table column whose type casts to the declared type (``_ingest_ts`` too with
    ``ingest_time="column"``); columns the source does not declare are ignored. Raises naming ``where``."""
    for f in declared:
        if f.name == INGEST_TS and ingest_time == "commit":
            continue
        if f.name not in table_columns:
            raise LakeSourceError(f"{where}: declared column {f.name!r} is not in the table (its columns: "
                                  f"{sorted(table_columns)}); a lake source reads only tables whose schema keeps "
                                  "every declared column")
        t = table_columns[f.name]
        if t is None:
            continue
        try:
            cast_lenient(pa.array([], type=t), f.type)
        except TypeMismatch:
            raise LakeSourceError(f"{where}: column {f.name!r} is {t} in the table and cannot be read as the "
                                  f"declared {f.type}") from None


# --- Delta ------------------------------------------------------------------------------------------------------
def _delta_versions(fio: FileIO, log: str, start: int) -> list[tuple[int, str]]:
    after = f"{log}/{start - 1:020d}.json" if start > 0 else None
    out = []
    for info in fio.list(log + "/", recursive=False, start_after=after):
        m = _DELTA_LOG.search(info.uri)
        if m and int(m.group(1)) >= start:
            out.append((int(m.group(1)), info.uri))
    return sorted(out)


def _delta_file_uri(table_uri: str, path: str) -> str:
    if "://" in path:
        return path
    return table_uri.rstrip("/") + "/" + unquote(path)


def _delta_commit(table: LakeTable, version: int, actions: list[dict[str, Any]], declared: pa.Schema,
                  ingest_time: IngestTime, partition_columns: list[str]) -> tuple[LakeCommit, list[str]]:
    op = _operation(actions)
    ts_ms = _commit_ms(actions, table, version, op)
    where = f"table {table.spec} version {version} ({op})"
    for a in actions:
        if "metaData" in a:
            meta = a["metaData"]
            cfg = meta.get("configuration") or {}
            if cfg.get("delta.columnMapping.mode", "none") != "none":
                raise LakeSourceError(f"{where}: column mapping ({cfg['delta.columnMapping.mode']}) is not "
                                      "supported by lake sources")
            partition_columns = list(meta.get("partitionColumns") or [])
            clash = [c for c in partition_columns if c in declared.names]
            if clash:
                raise LakeSourceError(f"{where}: declared column(s) {clash} are partition columns of the table "
                                      "(their values are not in the data files); not supported by lake sources")
            check_declared_schema(declared, _delta_schema(meta), where, ingest_time=ingest_time)
    adds = [a["add"] for a in actions if "add" in a]
    removes = [a["remove"] for a in actions if "remove" in a]
    changing_removes = [r for r in removes if r.get("dataChange", True)]
    if changing_removes:
        raise LakeSourceError(
            f"{where} removes rows ({len(changing_removes)} data file(s) removed, first "
            f"{changing_removes[0].get('path')}): a lake source reads append-only tables; deletes, updates, "
            "merges and overwrites stop it here (a RESTORE to a version is followed: its abandoned versions are "
            "skipped). Read the table from a new job once it is append-only again")
    data = [a for a in adds if a.get("dataChange", True)]
    if data and len(data) != len(adds):
        raise LakeSourceError(f"{where} mixes added rows and rearranged files (dataChange true and false); "
                              "not an append a lake source can read")
    for a in data:
        if a.get("deletionVector"):
            raise LakeSourceError(f"{where}: data file {a.get('path')} has a deletion vector; not supported by "
                                  "lake sources")
    files = tuple((_delta_file_uri(table.location, a["path"]), int(a["size"])) for a in data)
    return LakeCommit(version, int(ts_ms) * 1000, op, files), partition_columns


def delta_commits(table: LakeTable, declared: pa.Schema, start: int, *, ingest_time: IngestTime = "commit",
                  checkpoint: str = "") -> LakeListing:
    """The commits of a Delta table from version ``start`` on (read from ``_delta_log/<v>.json``; a version whose
    JSON is gone, by log retention, is an error naming the table, the version and ``checkpoint``)."""
    fio = file_io_for(table.location)
    log = table.location.rstrip("/") + "/_delta_log"
    versions = _delta_versions(fio, log, start)
    if not versions:
        if start == 0:
            if not _delta_versions(fio, log, 0) and not fio.list(log + "/", recursive=False):
                raise LakeSourceError(f"table {table.spec}: no Delta table there (no _delta_log/<version>.json)")
        return LakeListing((), None) if start == 0 else _delta_tail(table, fio, log, start, checkpoint)
    first = versions[0][0]
    if first != start:
        raise _retention_error(table, start, first, checkpoint)
    logged: list[tuple[int, list[dict[str, Any]]]] = []
    expected = start
    for v, uri in versions:
        if v != expected:
            raise LakeSourceError(f"table {table.spec}: version {expected} is missing from _delta_log (found "
                                  f"{v} next); the log must be complete from the version a lake source reads")
        expected = v + 1
        logged.append((v, [json.loads(line) for line in fio.read_bytes(uri).decode("utf-8").splitlines()
                           if line.strip()]))
    abandoned = _restored_ranges(table, logged)
    commits: list[LakeCommit] = []
    partition_columns: list[str] = []
    for v, actions in logged:
        if any(lo < v <= hi for lo, hi in abandoned):   # abandoned by a RESTORE (or the RESTORE itself): skipped
            op = _operation(actions)
            commits.append(LakeCommit(v, _commit_ms(actions, table, v, op) * 1000, op, ()))
            continue
        commit, partition_columns = _delta_commit(table, v, actions, declared, ingest_time, partition_columns)
        commits.append(commit)
    meta = [(v, dict(a["metaData"].get("configuration") or {})) for v, actions in logged for a in actions
            if "metaData" in a]
    rearranged = any(c.operation != "RESTORE" and not c.files and any("remove" in a for a in actions)
                     for c, (_v, actions) in zip(commits, logged))   # a compaction: VACUUM may delete what it removed
    return LakeListing(tuple(commits), versions[-1][0], meta[-1] if meta else None, rearranged)


def _operation(actions: list[dict[str, Any]]) -> str:
    infos = [a["commitInfo"] or {} for a in actions if "commitInfo" in a]
    return str((infos[0] if infos else {}).get("operation") or "UNKNOWN")


def _commit_ms(actions: list[dict[str, Any]], table: LakeTable, version: int, op: str) -> int:
    infos = [a["commitInfo"] or {} for a in actions if "commitInfo" in a]
    info = infos[0] if infos else {}
    ts_ms = info.get("inCommitTimestamp", info.get("timestamp"))
    if not isinstance(ts_ms, int):
        raise LakeSourceError(f"table {table.spec} version {version} ({op}): the commit has no commitInfo timestamp; "
                              "a lake source needs the commit time of every version")
    return ts_ms


def _restored_ranges(table: LakeTable, logged: list[tuple[int, list[dict[str, Any]]]]) -> list[tuple[int, int]]:
    """``(V, R)`` per ``RESTORE`` commit R to version V among ``logged``: versions ``V < v <= R`` are abandoned (the
    table is again as at V; a rewind of Epochal's Delta sink is such a commit). The lake source follows the restored
    lineage: it skips them. A restore to a version an earlier restore abandoned, or by timestamp, fails."""
    out: list[tuple[int, int]] = []
    for v, actions in logged:
        if _operation(actions) != "RESTORE":
            continue
        info = next(a["commitInfo"] or {} for a in actions if "commitInfo" in a)
        target = (info.get("operationParameters") or {}).get("version")
        if target is None or not str(target).isdigit():
            raise LakeSourceError(f"table {table.spec} version {v} (RESTORE): restores to "
                                  f"{info.get('operationParameters')}, not to a version; a lake source follows a "
                                  "restore to a version only")
        back = int(target)
        if any(lo < back <= hi for lo, hi in out):
            raise LakeSourceError(f"table {table.spec} version {v} (RESTORE) restores version {back}, which an "
                                  "earlier RESTORE abandoned; a lake source cannot follow it")
        out.append((back, v))
    return out


def _delta_tail(table: LakeTable, fio: FileIO, log: str, start: int, checkpoint: str) -> LakeListing:
    """No version at or after ``start``: fine when ``start`` is the next version to be written, an error when
    the log has been cleaned up past it."""
    older = _delta_versions(fio, log, 0)
    if older and older[-1][0] == start - 1:
        return LakeListing((), older[-1][0])
    if not older:
        raise LakeSourceError(f"table {table.spec}: no Delta table there (no _delta_log/<version>.json)")
    raise LakeSourceError(f"table {table.spec}: its newest version is {older[-1][0]} but {checkpoint or 'the job'} "
                          f"has read up to version {start - 1}: the table was recreated or its log rewritten")


def _retention_error(table: LakeTable, start: int, first: int, checkpoint: str) -> LakeSourceError:
    who = checkpoint or "the job"
    return LakeSourceError(
        f"table {table.spec}: version {start}, which {who} needs, is no longer in the table's log (the oldest "
        f"version there is {first}: log retention or VACUUM removed it). A lake source cannot skip versions: "
        "restore a newer checkpoint or savepoint, read the table from a new job, or keep the log longer "
        "(delta.logRetentionDuration) than the job's oldest retained checkpoint")
