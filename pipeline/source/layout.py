"""Source layout: a source is a partitioned, append-only log of immutable files.

Contract (DESIGN.md, "Source layout")::

    <source root>/<source>/partition=<p>/<seq:08d>.parquet      (or .jsonl)

* ``p`` is a non-negative integer without leading zeros (``partition=0``, ``partition=12``).
* ``seq`` is written with at least 8 digits (``{seq:08d}``); it increases within a partition and is the
  order in which files are read. Gaps are allowed.
* Ignored (never data, never reported): any path component starting with ``_`` or ``.``
  (``_SUCCESS``, ``_tmp_x.parquet``, ``.x.crc``, FileIO temporaries) and in-progress files whose name
  ends with one of :data:`IN_PROGRESS_SUFFIXES`.
* Anything else that does not match the layout (``partition=x/``, ``1.parquet``, ``00000001.csv``,
  files directly under ``<source>/``, nested directories, two files with the same seq) is an
  :class:`UnexpectedFile`. It is never silently skipped: :func:`list_source_files` raises
  :class:`~pipeline.exceptions.MalformedInputError` under the ``fail`` policy, and under ``dead_letter``
  it writes one dead-letter record per file (see :func:`dead_letter_unexpected`) and logs a warning.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from pipeline.exceptions import ConfigError, MalformedInputError
from pipeline.fileio import file_io_for

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.fileio import FileIO

__all__ = [
    "SourceFormat", "BadRecordsPolicy", "SourceFile", "UnexpectedFile", "SourceListing",
    "IN_PROGRESS_SUFFIXES", "FORMATS", "scan_source", "list_source_files", "source_file_uri",
    "dead_letter_unexpected", "unexpected_dead_letter_uri",
]

log = logging.getLogger(__name__)

SourceFormat = Literal["parquet", "jsonl"]
BadRecordsPolicy = Literal["dead_letter", "fail"]
FORMATS: tuple[str, ...] = ("parquet", "jsonl")
IN_PROGRESS_SUFFIXES: tuple[str, ...] = (
    ".inprogress", ".in-progress", ".in_progress", ".tmp", ".temp", ".partial", ".part", "._copying_",
    ".crc", ".swp", ".uploading",
)

_PARTITION_DIR = re.compile(r"^partition=(0|[1-9][0-9]*)$")
_FILE_NAME = re.compile(r"^([0-9]{8,})\.(parquet|jsonl)$")


@dataclass(frozen=True, slots=True, order=True)
class SourceFile:
    """One immutable file of a source partition. Ordered by (source, partition, seq)."""

    source: str
    partition: int
    seq: int
    uri: str
    format: SourceFormat
    size: int
    #: a lake source's file (pipeline/source/lake.py): the ``_ingest_ts`` of every row (µs; None: the file's own
    #: column) and what it is (table and version), for messages
    ingest_ts: int | None = field(default=None, compare=False)
    origin: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"source file {self.uri}: format must be one of {FORMATS}, not {self.format!r}")
        if self.partition < 0 or self.seq < 0:
            raise ValueError(f"source file {self.uri}: partition and seq must be >= 0")


@dataclass(frozen=True, slots=True)
class UnexpectedFile:
    """A file under a source directory whose name does not match the layout."""

    source: str
    uri: str
    size: int
    reason: str
    partition: int | None = None  # when the partition directory itself was valid


@dataclass(frozen=True, slots=True)
class SourceListing:
    """Result of :func:`scan_source`: the files per partition (sorted by seq) and what did not match."""

    source: str
    files: Mapping[int, tuple[SourceFile, ...]]
    unexpected: tuple[UnexpectedFile, ...]

    @property
    def partitions(self) -> tuple[int, ...]:
        return tuple(sorted(self.files))


def _join(root: str, *parts: str) -> str:
    out = root.rstrip("/")
    for p in parts:
        out = f"{out}/{str(p).strip('/')}"
    return out


def source_file_uri(source_root_uri: str, source: str, partition: int, seq: int,
                    format: SourceFormat = "parquet") -> str:
    """The URI of a source file per the layout contract."""
    ext = "parquet" if format == "parquet" else "jsonl"
    return _join(source_root_uri, source, f"partition={partition}", f"{seq:08d}.{ext}")


def _ignored(rel_parts: list[str]) -> bool:
    if any(part.startswith(("_", ".")) for part in rel_parts):
        return True
    return rel_parts[-1].lower().endswith(IN_PROGRESS_SUFFIXES)


#: seqs up to here sort like numbers as file names (``{seq:08d}``); a listing from a higher seq lists it all
_MAX_SORTED_SEQ = 10 ** 8 - 1


def _listing(fileio: FileIO, prefix: str, start_at: Mapping[int, int] | None) -> list:
    """The files under ``prefix`` (``<root>/<source>``): all of them (one recursive listing), or with
    ``start_at`` (partition -> first seq to list) one listing of the partition directories and one per
    partition, each starting at that partition's seq (S3 ``StartAfter``): O(partitions + new files), not
    O(all files ever). Files directly under ``prefix`` are then not listed (a full listing reports them)."""
    if start_at is None:
        return fileio.list(prefix, recursive=True)
    infos = []
    for name in fileio.list_dirs(prefix):
        d = _join(prefix, name)
        m = _PARTITION_DIR.match(name)
        seq = start_at.get(int(m.group(1))) if m else None
        after = f"{d}/{seq:08d}" if seq is not None and 0 < seq <= _MAX_SORTED_SEQ else None
        infos.extend(fileio.list(d, recursive=True, start_after=after))
    return infos


def scan_source(fileio: FileIO, source_root_uri: str, source: str, *,
                start_at: Mapping[int, int] | None = None) -> SourceListing:
    """List ``<root>/<source>/`` and classify every file (pure listing, no reads); with ``start_at``
    (partition -> seq) only the files of each partition from that seq on (see :func:`_listing`)."""
    if not source or "/" in source or source.startswith(("_", ".")):
        raise ConfigError(f"invalid source name {source!r}")
    prefix = _join(source_root_uri, source)
    infos = _listing(fileio, prefix, start_at)
    by_part: dict[int, dict[int, list[SourceFile]]] = {}
    unexpected: list[UnexpectedFile] = []
    for info in infos:
        if not info.uri.startswith(prefix + "/"):
            unexpected.append(UnexpectedFile(source, info.uri, info.size, f"listed outside {prefix}/"))
            continue
        rel = info.uri[len(prefix) + 1:]
        parts = rel.split("/")
        if _ignored(parts):
            continue
        if len(parts) != 2:
            reason = ("file directly under the source directory" if len(parts) == 1
                      else "nested directory inside a partition")
            unexpected.append(UnexpectedFile(source, info.uri, info.size,
                                             f"{reason} (expected partition=<p>/<seq:08d>.parquet|.jsonl)"))
            continue
        m_dir = _PARTITION_DIR.match(parts[0])
        if not m_dir:
            unexpected.append(UnexpectedFile(source, info.uri, info.size,
                                             f"directory {parts[0]!r} is not partition=<non-negative int>"))
            continue
        partition = int(m_dir.group(1))
        m_file = _FILE_NAME.match(parts[1])
        if not m_file or (len(m_file.group(1)) > 8 and m_file.group(1).startswith("0")):
            unexpected.append(UnexpectedFile(source, info.uri, info.size,
                                             f"file name {parts[1]!r} is not <seq:08d>.parquet or <seq:08d>.jsonl",
                                             partition))
            continue
        seq = int(m_file.group(1))
        fmt: SourceFormat = "parquet" if m_file.group(2) == "parquet" else "jsonl"
        by_part.setdefault(partition, {}).setdefault(seq, []).append(
            SourceFile(source, partition, seq, info.uri, fmt, info.size))
    files: dict[int, tuple[SourceFile, ...]] = {}
    for partition in sorted(by_part):
        good: list[SourceFile] = []
        for seq in sorted(by_part[partition]):
            same = by_part[partition][seq]
            if len(same) == 1:
                good.append(same[0])
            else:  # ambiguous order: neither file is read, both are reported
                names = ", ".join(f.uri.rsplit("/", 1)[-1] for f in same)
                for f in same:
                    unexpected.append(UnexpectedFile(source, f.uri, f.size,
                                                     f"duplicate seq {seq} in partition {partition} ({names})",
                                                     partition))
        if good:
            files[partition] = tuple(good)
    unexpected.sort(key=lambda u: u.uri)
    return SourceListing(source, files, tuple(unexpected))


def list_source_files(fileio: FileIO, source_root_uri: str, source: str, *,
                      policy: BadRecordsPolicy = "fail", dead_letter_root: str | None = None,
                      job: str | None = None, new_dead_letters: dict[str, int] | None = None,
                      start_at: Mapping[int, int] | None = None) -> dict[int, tuple[SourceFile, ...]]:
    """The files of ``source`` per partition, each tuple sorted by seq (with ``start_at``, partition -> seq:
    only from that seq on, see :func:`scan_source`).

    Files that do not match the layout are reported per ``policy``: ``fail`` raises
    :class:`MalformedInputError` naming them; ``dead_letter`` writes a dead-letter record per file when
    ``dead_letter_root`` and ``job`` are given (idempotent) and logs a warning either way.
    """
    if policy not in ("fail", "dead_letter"):
        raise ConfigError(f"bad-records policy must be 'dead_letter' or 'fail', not {policy!r}")
    listing = scan_source(fileio, source_root_uri, source, start_at=start_at)
    if listing.unexpected:
        first = listing.unexpected[0]
        summary = f"{len(listing.unexpected)} file(s) under {_join(source_root_uri, source)} do not match the " \
                  f"source layout; first: {first.uri}: {first.reason}"
        if policy == "fail":
            raise MalformedInputError(summary)
        if dead_letter_root is not None and job is not None:
            for src, n in dead_letter_unexpected(dead_letter_root, job, listing.unexpected, only_new=True).items():
                if new_dead_letters is not None:  # counted in the next checkpoint's dead-letter stats
                    new_dead_letters[src] = new_dead_letters.get(src, 0) + n
        log.warning("%s (dead-lettered, not read)", summary)
    return dict(listing.files)


def unexpected_dead_letter_uri(dead_letter_root: str, job: str, unexpected: UnexpectedFile) -> str:
    """``<dl>/<job>/<source>/_unexpected/<sha1(uri)[:16]>.jsonl`` (deterministic per file)."""
    digest = hashlib.sha1(unexpected.uri.encode("utf-8")).hexdigest()[:16]
    return _join(dead_letter_root, job, unexpected.source, "_unexpected", f"{digest}.jsonl")


def dead_letter_unexpected(dead_letter_root: str, job: str,
                           unexpected: Iterable[UnexpectedFile], *, only_new: bool = False) -> dict[str, int]:
    """Write one dead-letter record per unexpected file; returns the count per source.

    Records are deterministic, so calling this again for the same files rewrites identical content.
    """

    dl_io = file_io_for(dead_letter_root)
    counts: dict[str, int] = {}
    for u in unexpected:
        record = {"file": u.uri, "source": u.source, "partition": u.partition, "seq": None, "row": None,
                  "error": f"unexpected file in source layout: {u.reason}", "size": u.size, "values": None}
        uri = unexpected_dead_letter_uri(dead_letter_root, job, u)
        if only_new and dl_io.exists(uri):  # dead-lettered (and counted) by an earlier listing
            continue
        dl_io.write_bytes(uri, (json.dumps(record) + "\n").encode("utf-8"))
        counts[u.source] = counts.get(u.source, 0) + 1
    return counts
