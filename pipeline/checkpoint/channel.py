"""An input channel: one partition of one source, ``Channel(source, partition)`` with the partition as an ``int``.

The driver's barrier alignment (:mod:`pipeline.runtime.driver.alignment`), the own epochs of records
(:mod:`pipeline.runtime.driver.input_epochs`), the round plans and the restore point key their values by
:class:`Channel`. On disk (``_metadata.positions``, the write-ahead barrier log, its round and lagged-read entries,
the round plans and ``channel_state``) a partition is a **string** key, ``{source: {"<partition>": ...}}``, the
formats existing checkpoints were written in. This module is the one place that converts between the two:

* :func:`partition_of` parses a stored partition key (or an ``int``) into the partition; :meth:`Channel.of` builds
  a channel from a stored pair;
* :func:`partition_key` and :attr:`Channel.key` spell a partition as it is stored;
* :meth:`Channel.lookup` reads one channel's value from a stored ``{source: {partition: value}}`` map, and
  :func:`nest` writes channel-keyed values in that shape (sources, then partition keys, in sorted string order).

A ``tuple`` (``NamedTuple``): ``source, partition = ch`` and ``ch[0]`` still work, but a ``("s", "0")`` pair with a
string partition is a different key from ``Channel("s", 0)``; building channels only here keeps the two from mixing.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple, TypeVar, overload

__all__ = ["Channel", "partition_of", "partition_key", "nest"]

T = TypeVar("T")


def partition_of(key: str | int) -> int:
    """The partition a stored partition key names (``"3"`` -> ``3``); an ``int`` is returned as it is."""
    if isinstance(key, bool):
        raise ValueError(f"partition key {key!r} is not a partition number")
    if isinstance(key, int):
        return key
    try:
        return int(key)
    except (TypeError, ValueError):
        raise ValueError(f"partition key {key!r} is not a partition number") from None


def partition_key(partition: int | str) -> str:
    """A partition as it is stored: the key of ``{source: {partition: ...}}`` maps on disk (``3`` -> ``"3"``; a
    stored key is checked and returned as it is)."""
    return str(partition_of(partition))


class Channel(NamedTuple):
    """One source partition as an input channel of the job (see the module docstring)."""

    source: str
    partition: int

    @classmethod
    def of(cls, source: str, partition: str | int) -> Channel:
        """The channel of a stored ``(source, partition key)`` pair."""
        return cls(str(source), partition_of(partition))

    @property
    def key(self) -> str:
        """The partition as stored (:func:`partition_key`)."""
        return partition_key(self.partition)

    @property
    def name(self) -> str:
        """``<source>/partition=<p>``: the channel in messages, barrier-handler names and ``_metadata``."""
        return f"{self.source}/partition={self.partition}"

    @overload
    def lookup(self, stored: Mapping[str, Mapping[str, T]]) -> T | None: ...

    @overload
    def lookup(self, stored: Mapping[str, Mapping[str, T]], default: T) -> T: ...

    def lookup(self, stored: Mapping[str, Mapping[str, T]], default: T | None = None) -> T | None:
        """This channel's value in a stored ``{source: {partition key: value}}`` map (``default`` if absent)."""
        parts = stored.get(self.source)
        return default if parts is None else parts.get(self.key, default)


def nest(by_channel: Mapping[Channel, T]) -> dict[str, dict[str, T]]:
    """Channel-keyed values in the stored shape ``{source: {partition key: value}}``, sources and partition keys in
    sorted (string) order, as the barrier log's round and lagged-read entries have always been written."""
    out: dict[str, dict[str, T]] = {}
    for ch, v in sorted(by_channel.items(), key=lambda kv: (kv[0].source, kv[0].key)):
        out.setdefault(ch.source, {})[ch.key] = v
    return out
