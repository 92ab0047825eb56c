"""Handles: small frozen value objects that point at stored data.

* :class:`Position` ``(seq, row)``: a place in a source partition log, "the next row to read"
  (file ``<seq:08d>`` of the partition, row index inside it). Ordered.
* :class:`FileHandle` ``(uri, rows, bytes, sha256)``: a file written for a checkpoint or a sink.
* :class:`StateHandle`: one operator subtask's snapshot of one named state (``left``/``right``/``agg``)
  over its key-group range ``[kg_start, kg_end]`` (inclusive, like Flink's ``KeyGroupRange``);
  ``file`` is None when the state was empty. An incremental snapshot is a chain: ``file`` is its
  materialised base and ``deltas`` the changelog files applied on top, oldest first (files that earlier
  checkpoints may have written, in the job's ``shared/`` area; see docs/state.md).
* :class:`ChannelStateHandle`: unaligned checkpoints' in-flight data of one channel, either a file
  (data between operators) or a source position range ``[start, end)`` (data durable in a source log).
* :class:`SinkHandle`: what checkpoint n staged for one sink table: files + whether it is a full image.

Every class has ``to_dict()`` / ``from_dict()`` producing plain JSON-able data.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.checkpoint.channel import Channel, partition_key, partition_of

__all__ = ["Position", "FileHandle", "StateHandle", "ChannelStateHandle", "SinkHandle"]


@dataclass(frozen=True, slots=True, order=True)
class Position:
    """Position in a source partition: file sequence number and row index (next row to read)."""

    seq: int
    row: int

    def __post_init__(self) -> None:
        if self.seq < 0 or self.row < 0:
            raise ValueError(f"invalid source position ({self.seq}, {self.row})")

    def to_dict(self) -> dict[str, int]:
        return {"seq": self.seq, "row": self.row}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | Iterable[int]) -> Position:
        if isinstance(d, Mapping):
            return cls(int(d["seq"]), int(d["row"]))
        seq, row = d
        return cls(int(seq), int(row))


@dataclass(frozen=True, slots=True)
class FileHandle:
    """A stored file with its row count, size and SHA-256 (hex)."""

    uri: str
    rows: int
    bytes: int
    sha256: str

    def __post_init__(self) -> None:
        if not self.uri:
            raise ValueError("file handle without uri")
        if self.rows < 0 or self.bytes < 0:
            raise ValueError(f"file handle {self.uri}: negative rows/bytes ({self.rows}, {self.bytes})")

    def to_dict(self) -> dict[str, Any]:
        return {"uri": self.uri, "rows": self.rows, "bytes": self.bytes, "sha256": self.sha256}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FileHandle:
        return cls(uri=str(d["uri"]), rows=int(d["rows"]), bytes=int(d["bytes"]), sha256=str(d["sha256"]))


@dataclass(frozen=True, slots=True)
class StateHandle:
    """One subtask's snapshot of one named keyed state over key groups ``[kg_start, kg_end]``."""

    operator_uid: str
    subtask: int
    kg_start: int
    kg_end: int
    name: str
    file: FileHandle | None = None
    deltas: tuple[FileHandle, ...] = ()    # changelog files on top of ``file`` (incremental snapshots)
    state_rows: int | None = None          # rows of the state the chain represents (None: ``file.rows``)
    persisted_bytes: int | None = None     # bytes of the chain this checkpoint wrote (None: all of it)

    def __post_init__(self) -> None:
        object.__setattr__(self, "deltas", tuple(self.deltas))
        if self.deltas and self.file is None:
            raise ValueError(f"state handle of {self.operator_uid}[{self.subtask}] {self.name}: deltas without a base")
        if self.subtask < 0:
            raise ValueError(f"state handle of {self.operator_uid}: negative subtask {self.subtask}")
        if self.kg_start < 0 or self.kg_end < self.kg_start - 1:
            raise ValueError(f"state handle of {self.operator_uid}[{self.subtask}]: "
                             f"invalid key-group range [{self.kg_start}, {self.kg_end}]")

    @property
    def rows(self) -> int:
        """Rows of the state this snapshot represents."""
        if self.state_rows is not None:
            return self.state_rows
        return self.file.rows if self.file else 0

    @property
    def bytes(self) -> int:
        """Stored bytes of the whole snapshot (base + deltas): the full state size."""
        return (self.file.bytes if self.file else 0) + sum(f.bytes for f in self.deltas)

    @property
    def checkpointed_bytes(self) -> int:
        """Bytes this checkpoint wrote for this snapshot (the rest was written by earlier checkpoints)."""
        return self.bytes if self.persisted_bytes is None else self.persisted_bytes

    def files(self) -> tuple[FileHandle, ...]:
        """Every file the snapshot needs: the base, then the deltas."""
        return ((self.file,) if self.file else ()) + self.deltas

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"operator_uid": self.operator_uid, "subtask": self.subtask,
                               "kg_start": self.kg_start, "kg_end": self.kg_end, "name": self.name,
                               "file": self.file.to_dict() if self.file else None}
        if self.deltas:
            out["deltas"] = [f.to_dict() for f in self.deltas]
        if self.state_rows is not None:
            out["state_rows"] = self.state_rows
        if self.persisted_bytes is not None:
            out["persisted_bytes"] = self.persisted_bytes
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StateHandle:
        f = d.get("file")
        return cls(operator_uid=str(d["operator_uid"]), subtask=int(d["subtask"]), kg_start=int(d["kg_start"]),
                   kg_end=int(d["kg_end"]), name=str(d["name"]), file=FileHandle.from_dict(f) if f else None,
                   deltas=tuple(FileHandle.from_dict(x) for x in d.get("deltas") or ()),
                   state_rows=None if d.get("state_rows") is None else int(d["state_rows"]),
                   persisted_bytes=None if d.get("persisted_bytes") is None else int(d["persisted_bytes"]))


@dataclass(frozen=True, slots=True)
class ChannelStateHandle:
    """In-flight data of one input channel persisted by an unaligned checkpoint.

    Either ``file`` (records that were between operators) or a source range ``[start, end)`` of
    ``source``/``partition`` (records still durable in the source log; replayed, not copied). ``end`` is
    None for an open range: up to the partition's barrier n, not known yet when the checkpoint completed
    (a lagging partition); reading resumes at ``start`` either way. The partition is an ``int`` here and its
    string key in ``_metadata`` (:mod:`pipeline.checkpoint.channel`).
    """

    operator_uid: str
    subtask: int
    channel: str
    file: FileHandle | None = None
    source: str | None = None
    partition: int | None = None
    start: Position | None = None
    end: Position | None = None

    def __post_init__(self) -> None:
        if self.partition is not None and type(self.partition) is not int:  # a stored key ("3") or a numpy int
            object.__setattr__(self, "partition", partition_of(self.partition))
        if self.start is None and self.end is not None:
            raise ValueError(f"channel state {self.operator_uid}[{self.subtask}]/{self.channel}: "
                             "a position range needs a start")
        if self.start is not None and self.end is not None and self.end < self.start:
            raise ValueError(f"channel state {self.operator_uid}[{self.subtask}]/{self.channel}: "
                             f"range end {self.end} before start {self.start}")

    def to_dict(self) -> dict[str, Any]:
        return {"operator_uid": self.operator_uid, "subtask": self.subtask, "channel": self.channel,
                "file": self.file.to_dict() if self.file else None, "source": self.source,
                "partition": None if self.partition is None else partition_key(self.partition),
                "start": self.start.to_dict() if self.start else None,
                "end": self.end.to_dict() if self.end else None}

    @classmethod
    def source_range(cls, operator_uid: str, subtask: int, channel: Channel, start: Position,
                     end: Position | None) -> ChannelStateHandle:
        """In-flight data of ``channel`` still in its source log: ``[start, end)`` (``end`` None: open)."""
        return cls(operator_uid=operator_uid, subtask=subtask, channel=channel.name, source=channel.source,
                   partition=channel.partition, start=start, end=end)

    @property
    def source_channel(self) -> Channel | None:
        """The source partition of a position range (None for a file of data between operators)."""
        if self.source is None or self.partition is None:
            return None
        return Channel(self.source, self.partition)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ChannelStateHandle:
        f, s, e, p = d.get("file"), d.get("start"), d.get("end"), d.get("partition")
        return cls(operator_uid=str(d["operator_uid"]), subtask=int(d["subtask"]), channel=str(d["channel"]),
                   file=FileHandle.from_dict(f) if f else None, source=d.get("source"),
                   partition=None if p is None else partition_of(p), start=Position.from_dict(s) if s else None,
                   end=Position.from_dict(e) if e else None)


@dataclass(frozen=True, slots=True)
class SinkHandle:
    """The files checkpoint n staged for one sink table; ``full``: they hold every key (upsert image)."""

    files: tuple[FileHandle, ...] = ()
    full: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", tuple(self.files))
        object.__setattr__(self, "full", bool(self.full))

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        return {"files": [f.to_dict() for f in self.files], "full": self.full}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SinkHandle:
        return cls(files=tuple(FileHandle.from_dict(f) for f in d.get("files", ())), full=bool(d.get("full", False)))
