"""``_metadata``: the :class:`CheckpointMetadata` value object and its JSON form (format 1).

A checkpoint is complete iff its ``_metadata`` object exists and parses. ``to_json()`` is canonical
(sorted keys, fixed indentation), so ``from_json(m.to_json()) == m`` and
``from_json(text).to_json() == text`` for any text this module wrote. A document with another
``format`` or that does not parse raises :class:`~pipeline.exceptions.CorruptCheckpointError`
naming the URI it was read from.

Keys of ``positions``/``barriers`` are source names, then partition ids as strings.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pipeline.barriers.events import CheckpointingMode, CheckpointType
from pipeline.checkpoint._frozen import FrozenDict, enum_member
from pipeline.checkpoint.channel import partition_key
from pipeline.checkpoint.handles import ChannelStateHandle, FileHandle, Position, SinkHandle, StateHandle
from pipeline.checkpoint.recovery_fields import RecoveryFields
from pipeline.checkpoint.stats import CheckpointStats
from pipeline.exceptions import CorruptCheckpointError

__all__ = ["CheckpointMetadata", "FORMAT_VERSION", "KINDS", "iso_utc", "freeze_json", "thaw_json"]

FORMAT_VERSION = 1
KINDS = tuple(k.value for k in CheckpointType)


def iso_utc(ts: float | None = None) -> str:
    """``ts`` (seconds since the Unix epoch; default now) as ISO-8601 UTC with milliseconds and ``Z``."""
    dt = datetime.fromtimestamp(ts, tz=UTC) if ts is not None else datetime.now(tz=UTC)
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def freeze_json(value: Any) -> Any:
    """Deep-freeze JSON-like data: dicts -> FrozenDict, lists -> tuples."""
    if isinstance(value, Mapping):
        return FrozenDict({str(k): freeze_json(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze_json(v) for v in value)
    return value


def thaw_json(value: Any) -> Any:
    """Inverse of :func:`freeze_json` (plain dicts and lists)."""
    if isinstance(value, Mapping):
        return {k: thaw_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw_json(v) for v in value]
    return value


def _positions(value: Mapping[str, Mapping[Any, Any]] | None) -> FrozenDict:
    out = {}
    for source, parts in (value or {}).items():
        out[str(source)] = FrozenDict({
            partition_key(p): (pos if isinstance(pos, Position) else Position.from_dict(pos)) for p, pos in parts.items()})
    return FrozenDict(out)


def _positions_dict(value: Mapping[str, Mapping[str, Position]]) -> dict[str, dict[str, dict[str, int]]]:
    return {s: {p: pos.to_dict() for p, pos in parts.items()} for s, parts in value.items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointMetadata:
    """Everything needed to restore checkpoint ``checkpoint_id`` (the state after epoch ``epoch``)."""

    job: str
    checkpoint_id: int
    parent_id: int | None
    epoch: int
    barrier_time: str                     # end of epoch n, ISO UTC
    checkpoint_mode: CheckpointingMode    # exactly_once | at_least_once (a str is coerced)
    alignment: str                        # aligned | unaligned | aligned_timeout | tracker ...
    max_parallelism: int
    parallelism: int
    kind: CheckpointType = CheckpointType.CHECKPOINT  # a str is coerced
    positions: Mapping[str, Mapping[str, Position]] = field(default_factory=FrozenDict)  # restore point
    barriers: Mapping[str, Mapping[str, Position]] = field(default_factory=FrozenDict)   # barrier n
    channel_state: tuple[ChannelStateHandle, ...] = ()
    operators: Mapping[str, tuple[StateHandle, ...]] = field(default_factory=FrozenDict)
    sinks: Mapping[str, SinkHandle] = field(default_factory=FrozenDict)
    stats: CheckpointStats | None = None
    created_at: str = ""
    extra: Mapping[str, Any] = field(default_factory=FrozenDict)  # free-form JSON (runtime details)
    format: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        where = f"checkpoint {self.checkpoint_id} of job {self.job!r}"
        set_(self, "kind", enum_member(CheckpointType, self.kind, f"{where}: kind"))
        set_(self, "checkpoint_mode", enum_member(CheckpointingMode, self.checkpoint_mode, f"{where}: checkpoint_mode"))
        if self.checkpoint_id < 1:
            raise ValueError(f"checkpoint ids start at 1, got {self.checkpoint_id}")
        if self.parent_id is not None and self.parent_id >= self.checkpoint_id:
            raise ValueError(f"checkpoint {self.checkpoint_id} of job {self.job!r}: parent {self.parent_id} "
                             "must be older (smaller id)")
        if not 1 <= self.parallelism <= self.max_parallelism:
            raise ValueError(f"checkpoint {self.checkpoint_id}: need 1 <= parallelism ({self.parallelism}) "
                             f"<= max_parallelism ({self.max_parallelism})")
        set_(self, "positions", _positions(self.positions))
        set_(self, "barriers", _positions(self.barriers))
        set_(self, "channel_state", tuple(c if isinstance(c, ChannelStateHandle) else ChannelStateHandle.from_dict(c)
                                         for c in self.channel_state))
        set_(self, "operators", FrozenDict({
            str(uid): tuple(h if isinstance(h, StateHandle) else StateHandle.from_dict(h) for h in hs)
            for uid, hs in (self.operators or {}).items()}))
        set_(self, "sinks", FrozenDict({str(t): (s if isinstance(s, SinkHandle) else SinkHandle.from_dict(s))
                                        for t, s in (self.sinks or {}).items()}))
        set_(self, "extra", freeze_json(self.extra or {}))
        if not self.created_at:
            set_(self, "created_at", iso_utc())
        if self.stats is None:
            set_(self, "stats", CheckpointStats(trigger_time=self.created_at))

    # -- derived -----------------------------------------------------------------------------------
    @property
    def recovery(self) -> RecoveryFields:
        """The runtime's recovery fields (``extra``'s low epoch, read inventory, records, ...), typed."""
        return RecoveryFields.of(self.extra)

    @property
    def is_savepoint(self) -> bool:
        return self.kind == CheckpointType.SAVEPOINT

    @property
    def name(self) -> str:
        """``chk-<id>`` (or ``sp-<id>`` for savepoints), for messages."""
        return f"{'sp' if self.is_savepoint else 'chk'}-{self.checkpoint_id}"

    def state_handles(self) -> list[StateHandle]:
        return [h for uid in sorted(self.operators) for h in self.operators[uid]]

    def state_files(self) -> list[FileHandle]:
        """State and channel-state files (the files that live under the checkpoint root)."""
        files = [f for h in self.state_handles() for f in h.files()]
        files += [c.file for c in self.channel_state if c.file is not None]
        return files

    def sink_files(self) -> list[FileHandle]:
        return [f for t in sorted(self.sinks) for f in self.sinks[t].files]

    def referenced_files(self) -> list[FileHandle]:
        """Every file this checkpoint needs: state, channel state and staged sink files."""
        return self.state_files() + self.sink_files()

    # -- serde -------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        assert self.stats is not None
        return {
            "format": self.format, "job": self.job, "checkpoint_id": self.checkpoint_id,
            "parent_id": self.parent_id, "kind": self.kind, "epoch": self.epoch,
            "barrier_time": self.barrier_time, "checkpoint_mode": self.checkpoint_mode,
            "alignment": self.alignment, "max_parallelism": self.max_parallelism,
            "parallelism": self.parallelism,
            "positions": _positions_dict(self.positions), "barriers": _positions_dict(self.barriers),
            "channel_state": [c.to_dict() for c in self.channel_state],
            "operators": {uid: [h.to_dict() for h in hs] for uid, hs in self.operators.items()},
            "sinks": {t: s.to_dict() for t, s in self.sinks.items()},
            "stats": self.stats.to_dict(), "created_at": self.created_at, "extra": thaw_json(self.extra),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=1, allow_nan=False) + "\n"

    def to_bytes(self) -> bytes:
        return self.to_json().encode("utf-8")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], uri: str = "<memory>") -> CheckpointMetadata:
        if not isinstance(d, Mapping):
            raise CorruptCheckpointError(f"unreadable checkpoint metadata {uri}: not a JSON object")
        fmt = d.get("format")
        if fmt != FORMAT_VERSION:
            raise CorruptCheckpointError(
                f"unsupported checkpoint metadata format {fmt!r} in {uri} (this version reads format "
                f"{FORMAT_VERSION})")
        try:
            return cls(
                format=int(d["format"]), job=str(d["job"]), checkpoint_id=int(d["checkpoint_id"]),
                parent_id=None if d["parent_id"] is None else int(d["parent_id"]), kind=enum_member(CheckpointType, d["kind"], f"{uri}: kind"),
                epoch=int(d["epoch"]), barrier_time=str(d["barrier_time"]),
                checkpoint_mode=enum_member(CheckpointingMode, d["checkpoint_mode"], f"{uri}: checkpoint_mode"), alignment=str(d["alignment"]),
                max_parallelism=int(d["max_parallelism"]), parallelism=int(d["parallelism"]),
                positions=d["positions"], barriers=d["barriers"],
                channel_state=tuple(ChannelStateHandle.from_dict(c) for c in d["channel_state"]),
                operators={uid: tuple(StateHandle.from_dict(h) for h in hs) for uid, hs in d["operators"].items()},
                sinks={t: SinkHandle.from_dict(s) for t, s in d["sinks"].items()},
                stats=CheckpointStats.from_dict(d["stats"]), created_at=str(d["created_at"]),
                extra=d.get("extra") or {},
            )
        except KeyError as e:
            raise CorruptCheckpointError(f"unreadable checkpoint metadata {uri}: missing field {e}") from e
        except (TypeError, ValueError, AttributeError) as e:
            raise CorruptCheckpointError(f"unreadable checkpoint metadata {uri}: {e}") from e

    @classmethod
    def from_json(cls, text: str | bytes, uri: str = "<memory>") -> CheckpointMetadata:
        try:
            d = json.loads(text)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CorruptCheckpointError(f"unreadable checkpoint metadata {uri}: invalid JSON ({e})") from e
        return cls.from_dict(d, uri)
