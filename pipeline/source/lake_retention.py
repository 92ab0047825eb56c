"""The retention contract of a lake source, checked at every listing (docs/how-to/lake-sources.md).

A lake source reads a table commit by commit, so the versions its restore point still needs (from the version of
the last file it read on) must stay in the table's history: Delta log retention (``delta.logRetentionDuration``,
default 30 days; none when ``delta.enableExpiredLogCleanup`` is false) and, once a compaction has rearranged files
it has not read, ``VACUUM``'s deleted-file retention (``delta.deletedFileRetentionDuration``, default 7 days);
Iceberg snapshot expiry (``history.expire.max-snapshot-age-ms``, default 5 days, the age an expiry job keeps).

Neither format lets a reader pin a range of versions (an Iceberg tag keeps one snapshot, not the ancestors after
it that a lake source reads one by one), so Epochal does not protect them: at every listing it compares the age of
the oldest version it still needs with the table's retention and warns, naming table, version, checkpoint and
setting, once half of it is used and again once it is exceeded. A version that is gone fails the listing clearly
(:mod:`pipeline.source.lake_commits`, :mod:`pipeline.source.lake_iceberg`), the same way on every run.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from pipeline.sink.delta import delta_storage_options
from pipeline.source.lake_commits import LakeListing, LakeTable

__all__ = ["RetentionContract", "delta_contract", "iceberg_contract", "parse_delta_interval", "retention_warning",
           "format_age", "table_contract"]

DELTA_LOG_RETENTION = "delta.logRetentionDuration"
DELTA_FILE_RETENTION = "delta.deletedFileRetentionDuration"
DELTA_LOG_CLEANUP = "delta.enableExpiredLogCleanup"
ICEBERG_SNAPSHOT_AGE = "history.expire.max-snapshot-age-ms"
_DAY = 86_400.0
_DEFAULTS = {DELTA_LOG_RETENTION: 30 * _DAY, DELTA_FILE_RETENTION: 7 * _DAY, ICEBERG_SNAPSHOT_AGE: 5 * _DAY}
_UNITS = {"nanosecond": 1e-9, "microsecond": 1e-6, "millisecond": 1e-3, "second": 1.0, "minute": 60.0,
          "hour": 3600.0, "day": _DAY, "week": 7 * _DAY}
_INTERVAL = re.compile(r"^\s*(?:interval\s+)?(\d+)\s*([a-z]+?)s?\s*$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class RetentionContract:
    """How long the table keeps a version a lake source needs: ``seconds`` by ``setting`` (its value as set, or
    ``default``); ``seconds`` None: the table keeps its history (no cleanup), or the value is unreadable (``note``)."""

    setting: str
    value: str
    seconds: float | None
    note: str = ""

    def describe(self) -> str:
        return f"{self.setting} = {self.value}"


def parse_delta_interval(text: str) -> float | None:
    """Seconds of a Delta interval property (``interval 30 days``, ``1 week``, ``12 hours``); None if unreadable."""
    m = _INTERVAL.match(text or "")
    if not m or m.group(2).lower() not in _UNITS:
        return None
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def _delta_setting(configuration: Mapping[str, str], name: str) -> RetentionContract:
    raw = configuration.get(name)
    if raw is None:
        return RetentionContract(name, f"{_DEFAULTS[name] / _DAY:g} days (the default)", _DEFAULTS[name])
    seconds = parse_delta_interval(raw)
    note = "" if seconds is not None else f"{name} = {raw!r} is not an interval Epochal can read"
    return RetentionContract(name, raw, seconds, note)


def delta_contract(configuration: Mapping[str, str], *, files_rearranged: bool) -> RetentionContract:
    """The retention that bounds a Delta lake source: log retention (unless log cleanup is off), and the
    deleted-file retention too once a skipped compaction removed files the source has not read
    (``files_rearranged``): the shorter of the two."""
    log = _delta_setting(configuration, DELTA_LOG_RETENTION)
    if str(configuration.get(DELTA_LOG_CLEANUP, "true")).lower() == "false":
        log = RetentionContract(DELTA_LOG_CLEANUP, "false", None)
    if not files_rearranged:
        return log
    files = _delta_setting(configuration, DELTA_FILE_RETENTION)
    if files.seconds is None:
        return files if files.note else log
    return files if log.seconds is None or files.seconds < log.seconds else log


def iceberg_contract(properties: Mapping[str, str]) -> RetentionContract:
    """The snapshot age an Iceberg expiry job keeps (``history.expire.max-snapshot-age-ms``)."""
    raw = properties.get(ICEBERG_SNAPSHOT_AGE)
    if raw is None:
        return RetentionContract(ICEBERG_SNAPSHOT_AGE, f"{_DEFAULTS[ICEBERG_SNAPSHOT_AGE] / _DAY:g} days (the default)",
                                 _DEFAULTS[ICEBERG_SNAPSHOT_AGE])
    try:
        return RetentionContract(ICEBERG_SNAPSHOT_AGE, raw, int(raw) / 1000.0)
    except ValueError:
        return RetentionContract(ICEBERG_SNAPSHOT_AGE, raw, None,
                                 f"{ICEBERG_SNAPSHOT_AGE} = {raw!r} is not a number of milliseconds")


def format_age(seconds: float) -> str:
    """``3d 4h``, ``5h 12m``, ``42s``."""
    s = int(max(0.0, seconds))
    d, h, m = s // 86_400, s % 86_400 // 3600, s % 3600 // 60
    if d:
        return f"{d}d {h}h"
    if h:
        return f"{h}h {m}m"
    return f"{m}m {s % 60}s" if m else f"{s}s"


def retention_warning(source: str, table: LakeTable, listing: LakeListing, contract: RetentionContract,
                      now_us: int, who: str) -> str | None:
    """A warning when the oldest version the listing needs (its first commit: the restore point's listing start)
    has used half of the table's retention or more; None otherwise (or nothing to read again)."""
    if contract.note:
        return (f"lake source {source}: table {table.spec}: {contract.note}; Epochal cannot tell how long the table "
                "keeps the versions this job still needs")
    if not listing.commits or contract.seconds is None or contract.seconds <= 0:
        return None
    oldest = listing.commits[0]
    age = (now_us - oldest.ts_us) / 1e6
    if age < contract.seconds / 2:
        return None
    left = contract.seconds - age
    when = ("it is older than that, so the table's next cleanup may remove it" if left <= 0
            else f"{age / contract.seconds:.0%} of it is used: it may be removed in {format_age(left)}")
    return (f"lake source {source}: {oldest.label(table)}, committed {format_age(age)} ago, is the oldest version "
            f"{who} still needs; the table keeps versions for {contract.describe()}, and {when}. A removed version "
            "stops this job (a LakeSourceError naming it): let the job catch up, or keep the table's history longer")


# a Delta table's configuration per location, with the version it was read at: a listing from version v on sees a
# later change of it (a metaData action) itself; the first listing of a process loads it once
_DELTA_CONFIGURATION: dict[str, tuple[int, Mapping[str, str]]] = {}


def _delta_configuration(table: LakeTable, listing: LakeListing) -> Mapping[str, str]:
    seen, cached = listing.properties, _DELTA_CONFIGURATION.get(table.location)
    if seen is not None and (cached is None or seen[0] >= cached[0]):
        _DELTA_CONFIGURATION[table.location] = seen
        return seen[1]
    if cached is not None:
        return cached[1]
    # lazy: deltalake loads a native library; only a Delta lake source's first listing in a process needs it
    from deltalake import DeltaTable
    loc = table.location[len("file://"):] if table.location.startswith("file://") else table.location
    dt = DeltaTable(loc, storage_options=delta_storage_options(table.location), without_files=True)
    conf = dict(dt.metadata().configuration or {})
    _DELTA_CONFIGURATION[table.location] = (int(dt.version()), conf)
    return conf


def table_contract(table: LakeTable, listing: LakeListing) -> RetentionContract:
    """The retention contract of ``table`` as of ``listing`` (its own properties, or the defaults)."""
    if table.format == "iceberg":
        return iceberg_contract(listing.properties[1] if listing.properties else {})
    return delta_contract(_delta_configuration(table, listing), files_rearranged=listing.files_rearranged)
