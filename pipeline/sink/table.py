"""Committed sink tables: a commit log over staged files, and lineage resolution for readers.

Layout under ``<sink root>/<job>/<table>/``::

    data/txn-<checkpoint id>/part-<subtask:05d>.parquet   staged by tasks (pre-commit)
    _commits/<checkpoint id:012d>.json                    one CommitEntry per completed checkpoint

``commit(entry)`` writes the entry create-only and is idempotent: committing an identical entry again
returns ``AckResult.DUPLICATE``; a *different* entry for the same checkpoint id is a SinkError.

Readers see exactly the **lineage**: the commit entries on the parent chain of the head (the entry with
the highest checkpoint id), walking ``parent_id`` back to the first entry (``parent_id`` None) or, for
upsert tables, to the first ``full`` entry (a full image of every key). Entries of a losing racing
runner or of a rewound branch are not on the chain, so they are invisible. Every completed checkpoint
must commit an entry for every table of the job (possibly with no files): a parent without an entry
is a broken chain and raises SinkError instead of silently dropping output.

Upsert tables: per key, the row from the newest entry on the chain wins.
"""
from __future__ import annotations

import builtins
import json
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline.checkpoint.ack import AckResult
from pipeline.checkpoint.handles import FileHandle
from pipeline.exceptions import ConditionalWriteError, ObjectNotFoundError, SinkError, StorageError
from pipeline.fileio import FileIO, join_uri
from pipeline.layout import (
    sink_commit_name,
    sink_commits_uri,
    sink_data_uri,
    sink_staging_uri,
    sink_table_uri,
    sink_txn_id_of,
)

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

__all__ = ["CommitEntry", "CommittedTable", "SINK_MODES", "COMMIT_FORMAT"]

log = logging.getLogger(__name__)

SINK_MODES = ("append", "upsert")
#: :meth:`CommittedTable.recent_garbage` sweeps the whole table when more ids than this lie in its window
RECENT_GARBAGE_MAX_IDS = 64
COMMIT_FORMAT = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitEntry:
    """One committed transaction of a sink table (``_commits/<id:012d>.json``)."""

    table: str
    checkpoint_id: int
    parent_id: int | None
    files: tuple[FileHandle, ...] = ()
    full: bool = False
    mode: str = "append"
    key: tuple[str, ...] = ()
    #: the commit of a savepoint's sink transaction (not a checkpoint of ``checkpoints/``); not part of equality,
    #: so an entry written before the flag existed and the same entry with it are the same commit
    savepoint: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", tuple(self.files))
        object.__setattr__(self, "key", tuple(self.key))
        object.__setattr__(self, "full", bool(self.full))
        if self.mode not in SINK_MODES:
            raise ValueError(f"table {self.table}: sink mode must be one of {SINK_MODES}, got {self.mode!r}")
        if self.mode == "upsert" and not self.key:
            raise ValueError(f"table {self.table}: an upsert table needs a key")
        if self.parent_id is not None and self.parent_id >= self.checkpoint_id:
            raise ValueError(f"table {self.table}: commit {self.checkpoint_id} has parent {self.parent_id}, "
                             "which is not older")

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        return {"format": COMMIT_FORMAT, "table": self.table, "checkpoint_id": self.checkpoint_id,
                "parent_id": self.parent_id, "files": [f.to_dict() for f in self.files], "full": self.full,
                "mode": self.mode, "key": list(self.key), **({"savepoint": True} if self.savepoint else {})}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=1) + "\n"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CommitEntry:
        return cls(table=str(d["table"]), checkpoint_id=int(d["checkpoint_id"]),
                   parent_id=None if d.get("parent_id") is None else int(d["parent_id"]),
                   files=tuple(FileHandle.from_dict(f) for f in d.get("files", ())), full=bool(d.get("full", False)),
                   mode=str(d.get("mode", "append")), key=tuple(d.get("key", ())),
                   savepoint=bool(d.get("savepoint", False)))

    @classmethod
    def from_json(cls, text: str | builtins.bytes, uri: str = "<memory>") -> CommitEntry:
        try:
            d = json.loads(text)
            if not isinstance(d, dict) or d.get("format", COMMIT_FORMAT) != COMMIT_FORMAT:
                raise SinkError(f"unsupported commit entry format in {uri}")
            return cls.from_dict(d)
        except SinkError:
            raise
        except (ValueError, KeyError, TypeError) as e:
            raise SinkError(f"unreadable sink commit entry {uri}: {e!r}") from e


_ATTEMPT = re.compile(r"^(.*)\.t\d+(\.[^./]+)?$")


def _logical_name(uri: str) -> str | None:
    """``.../part-00003.parquet`` of an attempt file ``.../part-00003.t<attempt id>.parquet`` (None: no attempt id)."""
    m = _ATTEMPT.match(uri)
    return None if m is None else m.group(1) + (m.group(2) or "")


def _txn_id(name: str) -> int | None:
    return sink_txn_id_of(name)


class CommittedTable:
    """A sink table of one job: staged data, commit log, lineage."""

    def __init__(self, fileio: FileIO, sink_root: str, job: str, table: str) -> None:
        self.fileio = fileio
        self.job = job
        self.table = table
        self.table_uri = sink_table_uri(sink_root, job, table)
        self.data_uri = sink_data_uri(self.table_uri)
        self.commits_uri = sink_commits_uri(self.table_uri)

    def __repr__(self) -> str:
        return f"CommittedTable({self.table_uri})"

    def staging_uri(self, checkpoint_id: int) -> str:
        """``data/txn-<id>``: where tasks stage the files of checkpoint ``checkpoint_id``."""
        return sink_staging_uri(self.table_uri, checkpoint_id)

    def part_uri(self, checkpoint_id: int, subtask: int, suffix: str = ".parquet") -> str:
        return join_uri(self.staging_uri(checkpoint_id), f"part-{subtask:05d}{suffix}")

    def commit_uri(self, checkpoint_id: int) -> str:
        return join_uri(self.commits_uri, sink_commit_name(checkpoint_id))

    # -- commit log --------------------------------------------------------------------------------
    def commit(self, entry: CommitEntry) -> AckResult:
        """Write the commit entry create-only. SUCCESS, or DUPLICATE if the identical entry exists."""
        if entry.table != self.table:
            raise SinkError(f"commit entry of table {entry.table!r} given to table {self.table!r} ({self.table_uri})")
        uri = self.commit_uri(entry.checkpoint_id)
        try:
            self.fileio.write_bytes(uri, entry.to_json().encode(), if_none_match=True)
        except ConditionalWriteError as e:
            existing = self._read_entry(uri)
            if existing == entry:
                return AckResult.DUPLICATE
            raise SinkError(
                f"table {self.table} (job {self.job}): checkpoint {entry.checkpoint_id} is already committed with "
                f"different content at {uri} (parent {existing.parent_id}, {len(existing.files)} files) than "
                f"the commit attempted now (parent {entry.parent_id}, {len(entry.files)} files)") from e
        except StorageError as e:
            # the PUT may have gone through although the answer was lost
            try:
                if self._read_entry(uri) == entry:
                    return AckResult.SUCCESS
            except (SinkError, StorageError):
                pass
            raise SinkError(f"table {self.table}: could not write commit entry {uri}: {e}") from e
        log.info("table %s: committed checkpoint %d (%d files, parent %s)", self.table, entry.checkpoint_id,
                 len(entry.files), entry.parent_id)
        return AckResult.SUCCESS

    def remove_other_attempts(self, entry: CommitEntry) -> int:
        """Delete the files that *other* task attempts wrote beside the files ``entry`` references (a failed attempt
        before its retry, the losing copy of a speculative task: ``part-00003.t<attempt id>.parquet`` for a
        referenced ``part-00003.t<other id>.parquet``) in the directories of ``entry``'s files. Only such files:
        nothing another entry could reference. One listing per directory; returns the number deleted."""
        kept = {f.uri for f in entry.files}
        logical = {n for n in (_logical_name(u) for u in kept) if n is not None}
        if not logical:
            return 0
        deleted = 0
        for d in sorted({u.rsplit("/", 1)[0] for u in kept}):
            for fi in self.fileio.list(d):
                if fi.uri not in kept and _logical_name(fi.uri) in logical:
                    try:
                        self.fileio.delete(fi.uri)
                    except ObjectNotFoundError:
                        continue
                    deleted += 1
                    log.info("table %s: deleted %s, written by a task attempt checkpoint %d did not keep", self.table,
                             fi.uri, entry.checkpoint_id)
        return deleted

    def _read_entry(self, uri: str) -> CommitEntry:
        return CommitEntry.from_json(self.fileio.read_bytes(uri), uri)

    def entry(self, checkpoint_id: int) -> CommitEntry | None:
        try:
            return self._read_entry(self.commit_uri(checkpoint_id))
        except ObjectNotFoundError:
            return None

    def committed_ids(self, *, after: int | None = None) -> list[int]:
        """Checkpoint ids with a commit entry, ascending; only ids > ``after`` if given. Names only (no entry is
        read); with ``after`` the listing starts after that entry's key (S3 ``StartAfter``: O(newer entries))."""
        start = None if after is None or after < 0 else self.commit_uri(after)
        out = []
        for fi in self.fileio.list(self.commits_uri, recursive=False, start_after=start):
            name = fi.uri.rsplit("/", 1)[-1]
            if name.endswith(".json") and name[:-5].isdigit():
                out.append(int(name[:-5]))
        return sorted(i for i in out if after is None or i > after)

    def entries(self) -> list[CommitEntry]:
        """All commit entries (on and off the lineage), oldest first."""
        out = []
        for fi in self.fileio.list(self.commits_uri, recursive=False):
            name = fi.uri.rsplit("/", 1)[-1]
            if name.endswith(".json") and name[:-5].isdigit():
                out.append(self._read_entry(fi.uri))
        return sorted(out, key=lambda e: e.checkpoint_id)

    def head(self, *, after: int | None = None) -> CommitEntry | None:
        """The entry with the highest checkpoint id (one listing of names, one read); with ``after``: None if no
        entry is newer than ``after``, and the listing costs O(newer entries)."""
        ids = self.committed_ids(after=after)
        return self._read_entry(self.commit_uri(ids[-1])) if ids else None

    def lineage(self, entries: Iterable[CommitEntry] | None = None) -> list[CommitEntry]:
        """Commit entries on the head's parent chain, oldest first (what readers see)."""
        all_entries = list(self.entries() if entries is None else entries)
        if not all_entries:
            return []
        by_id = {e.checkpoint_id: e for e in all_entries}
        cur = max(all_entries, key=lambda e: e.checkpoint_id)
        chain = [cur]
        while True:
            if cur.mode == "upsert" and cur.full:
                break
            if cur.parent_id is None:
                break
            parent = by_id.get(cur.parent_id)
            if parent is None:
                raise SinkError(
                    f"table {self.table} (job {self.job}): broken lineage - commit {cur.checkpoint_id} has parent "
                    f"checkpoint {cur.parent_id}, which has no commit entry in {self.commits_uri} "
                    "(was the sink re-committed on restore?)")
            chain.append(parent)
            cur = parent
        chain.reverse()
        return chain

    def committed_files(self) -> list[FileHandle]:
        """Files visible to readers, in commit order."""
        return [f for e in self.lineage() for f in e.files]

    # -- reading -----------------------------------------------------------------------------------
    def read(self) -> pa.Table:
        """The committed rows as one Arrow table (upsert: newest row per key)."""
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        from pipeline.sink.deletes import live_rows  # lazy: pyarrow, like the imports above (only when rows are read)
        chain = self.lineage()
        parts = []
        for e in chain:
            for f in e.files:
                with self.fileio.open_input(f.uri) as fh:
                    parts.append(pq.read_table(fh))
        if not parts:
            return pa.table({})
        table = pa.concat_tables(parts, promote_options="default")
        head = chain[-1]
        if head.mode != "upsert":
            return table
        order = "__epochal_order"
        table = table.append_column(order, pa.array(range(table.num_rows), type=pa.int64()))
        newest = table.group_by(list(head.key)).aggregate([(order, "max")])[f"{order}_max"]
        table = table.filter(pc.is_in(table[order], value_set=newest))
        return live_rows(table.sort_by(order).drop_columns([order]))  # a key whose newest row is a tombstone: gone

    # -- garbage -----------------------------------------------------------------------------------
    def garbage(self, *, protect: Iterable[int] = (), protect_from_id: int | None = None) -> list[str]:
        """``data/txn-*`` dirs that no commit entry references (uncommitted / aborted output).

        Spares ids in ``protect`` (e.g. completed checkpoints whose commit is still to be recovered, the
        running transaction) and ids >= ``protect_from_id`` (e.g. the newest claimed checkpoint id).
        """
        entries = self.entries()
        committed = {e.checkpoint_id for e in entries}
        prefixes = {f.uri.rsplit("/", 1)[0] for e in entries for f in e.files}
        keep = set(protect)
        out = []
        for name in self.fileio.list_dirs(self.data_uri):
            tid = _txn_id(name)
            if tid is None or tid in committed or tid in keep:
                continue
            if protect_from_id is not None and tid >= protect_from_id:
                continue
            uri = join_uri(self.data_uri, name)
            if any(p == uri or p.startswith(uri + "/") for p in prefixes):
                continue
            out.append(uri)
        return out

    def recent_garbage(self, after: int | None, *, protect: Iterable[int] = (),
                       protect_from_id: int | None = None) -> list[str]:
        """Like :meth:`garbage`, but only for the checkpoint ids in ``(after, protect_from_id)``: the staging dirs
        of checkpoints claimed after ``after`` (the restored checkpoint) that have no commit entry. Costs one
        listing of the newer commit names plus one listing per such id, whatever the table's history; in the
        steady state (no crash since ``after``) there is no such id and nothing is listed but the names."""
        if protect_from_id is None:
            return []
        lo = -1 if after is None else after
        if protect_from_id - lo > RECENT_GARBAGE_MAX_IDS:  # a long way back (rewind, many aborts): sweep it all
            return self.garbage(protect=protect, protect_from_id=protect_from_id)
        keep = set(protect)
        candidates = [i for i in range(lo + 1, protect_from_id) if i not in keep]
        if not candidates:
            return []
        committed = set(self.committed_ids(after=lo))
        out = []
        for tid in candidates:
            if tid in committed:
                continue
            uri = self.staging_uri(tid)
            if self.fileio.list(uri):
                out.append(uri)
        return out

    def cleanup(self, *, protect: Iterable[int] = (), protect_from_id: int | None = None,
                after: int | None = None, full: bool = True) -> int:
        """Delete :meth:`garbage` (``full``) or :meth:`recent_garbage` after ``after``; returns the number of
        staging dirs deleted."""
        dirs = (self.garbage(protect=protect, protect_from_id=protect_from_id) if full
                else self.recent_garbage(after, protect=protect, protect_from_id=protect_from_id))
        for uri in dirs:
            self.fileio.delete_prefix(uri)
            log.info("table %s: deleted uncommitted staging dir %s", self.table, uri)
        return len(dirs)
