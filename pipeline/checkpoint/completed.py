"""CompletedCheckpoint: a checkpoint whose ``_metadata`` exists, plus where it lives.

``verify()`` proves a checkpoint can be restored: every file it references (state, channel state,
staged sink files) exists with the recorded size and SHA-256. ``discard()`` deletes it: ``_metadata``
first (so a half-deleted checkpoint is never mistaken for a complete one), then its files, except
those listed in ``keep`` (files a retained checkpoint or a savepoint still references).
Savepoints are user-owned: ``discard()`` refuses them.
"""
from __future__ import annotations

import logging
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from pipeline.checkpoint.handles import FileHandle
from pipeline.checkpoint.metadata import CheckpointMetadata
from pipeline.exceptions import CheckpointError, CorruptCheckpointError, ObjectNotFoundError, StorageError
from pipeline.fileio import FileIO, join_uri, sha256_of_file
from pipeline.layout import METADATA_FILE

__all__ = ["CompletedCheckpoint", "METADATA_FILE", "delete_location"]

log = logging.getLogger(__name__)

_MAX_LISTED_PROBLEMS = 5


def delete_location(fileio: FileIO, location: str, keep: Collection[str] = ()) -> int:
    """Delete a checkpoint directory: ``_metadata`` first, then every file not in ``keep``."""
    prefix = location.rstrip("/") + "/"
    fileio.delete(join_uri(location, METADATA_FILE))
    kept = [u for u in keep if u.startswith(prefix)]
    if not kept:
        return fileio.delete_prefix(location)
    keep_set = set(kept)
    n = 0
    for fi in fileio.list(location):
        if fi.uri not in keep_set:
            fileio.delete(fi.uri)
            n += 1
    return n


@dataclass(frozen=True, slots=True)
class CompletedCheckpoint:
    """A completed checkpoint (or savepoint): its metadata and its location (directory URI)."""

    metadata: CheckpointMetadata
    location: str

    # -- accessors ---------------------------------------------------------------------------------
    @property
    def checkpoint_id(self) -> int:
        return self.metadata.checkpoint_id

    @property
    def parent_id(self) -> int | None:
        return self.metadata.parent_id

    @property
    def job(self) -> str:
        return self.metadata.job

    @property
    def epoch(self) -> int:
        return self.metadata.epoch

    @property
    def kind(self) -> str:
        return self.metadata.kind

    @property
    def is_savepoint(self) -> bool:
        return self.metadata.is_savepoint

    @property
    def metadata_uri(self) -> str:
        return join_uri(self.location, METADATA_FILE)

    def describe(self) -> str:
        return f"{self.kind} {self.checkpoint_id} of job '{self.job}' at {self.location}"

    @classmethod
    def load(cls, fileio: FileIO, location: str) -> CompletedCheckpoint:
        """Read ``<location>/_metadata``. ObjectNotFoundError if absent, CorruptCheckpointError if unreadable."""
        uri = join_uri(location, METADATA_FILE)
        data = fileio.read_bytes(uri)
        return cls(CheckpointMetadata.from_json(data, uri), location.rstrip("/"))

    # -- verification ------------------------------------------------------------------------------
    def _check_file(self, fileio: FileIO, fh: FileHandle, what: str, checksums: bool) -> str | None:
        try:
            if checksums:
                size, digest = sha256_of_file(fileio, fh.uri)
            else:
                size, digest = fileio.size(fh.uri), fh.sha256
        except ObjectNotFoundError:
            return f"{what} {fh.uri} is missing"
        except StorageError as e:
            return f"{what} {fh.uri} is unreadable: {e}"
        if size != fh.bytes:
            return f"{what} {fh.uri} has {size} bytes, expected {fh.bytes}"
        if digest != fh.sha256:
            return f"{what} {fh.uri} has sha256 {digest[:16]}..., expected {fh.sha256[:16]}..."
        return None

    def problems(self, fileio: FileIO, *, checksums: bool = True, include_sinks: bool = True,
                 workers: int = 8) -> list[str]:
        """Everything wrong with this checkpoint's files (empty list: restorable)."""
        md = self.metadata
        checks: list[tuple[FileHandle, str]] = []
        for h in md.state_handles():
            for i, f in enumerate(h.files()):
                checks.append((f, f"state file ({h.operator_uid}[{h.subtask}] {h.name}"
                                  + (f", delta {i}" if i else "") + ")"))
        for c in md.channel_state:
            if c.file is not None:
                checks.append((c.file, f"channel state file ({c.operator_uid}[{c.subtask}] {c.channel})"))
        if include_sinks:
            for table in sorted(md.sinks):
                checks += [(f, f"staged sink file (table {table})") for f in md.sinks[table].files]
        if not checks:
            return []
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(checks)))) as pool:
            results = list(pool.map(lambda c: self._check_file(fileio, c[0], c[1], checksums), checks))
        return [r for r in results if r]

    def verify(self, fileio: FileIO, *, checksums: bool = True, include_sinks: bool = True) -> None:
        """Raise CorruptCheckpointError (naming the file and the checkpoint) unless restorable."""
        problems = self.problems(fileio, checksums=checksums, include_sinks=include_sinks)
        if problems:
            shown = "; ".join(problems[:_MAX_LISTED_PROBLEMS])
            more = f" (and {len(problems) - _MAX_LISTED_PROBLEMS} more)" if len(problems) > _MAX_LISTED_PROBLEMS else ""
            raise CorruptCheckpointError(f"{self.describe()} is corrupt: {shown}{more}")

    # -- disposal ----------------------------------------------------------------------------------
    def discard(self, fileio: FileIO, *, keep: Collection[str] = ()) -> int:
        """Delete this checkpoint (``_metadata`` first) except files in ``keep``; returns files deleted."""
        if self.is_savepoint:
            raise CheckpointError(f"refusing to discard {self.describe()}: savepoints are owned by the user")
        n = delete_location(fileio, self.location, keep)
        log.info("discarded %s (%d files)", self.describe(), n)
        return n
