"""The memory of the keyed state stores of one Python worker (``PIPELINE_STATE_BACKEND=rocksdb``): the RocksDB
options every store is opened with, from the executors' environment.

A worker opens, per task, one store per state of the operator subtask it runs (a join: two). Without bounds each
RocksDB instance would hold its own block cache, its memtables and, outside any cache, the index and filter
blocks of every SST file it has open. Here:

* **one LRU cache per process**, shared by every store the worker opens (``PIPELINE_STATE_STORE_CACHE_BYTES``,
  default 32 MiB): data blocks, and also the index and filter blocks (charged to the cache, the level-0 ones
  pinned), so the table readers' memory is bounded by it too;
* **memtables**: ``PIPELINE_STATE_STORE_WRITE_BUFFER_BYTES`` (default 8 MiB) each, at most
  ``PIPELINE_STATE_STORE_WRITE_BUFFERS`` (default 2) per store; a write buffer manager charges them to the same
  cache and flushes the largest when all stores of the process together hold more than half of it;
* **open files**: ``PIPELINE_STATE_STORE_MAX_OPEN_FILES`` (default 64) SST files per store (RocksDB's table
  cache; -1: all).

So a worker's RocksDB memory stays within about the cache (plus a memtable being flushed), whatever the state
(measured in docs/state.md, "State larger than memory"). A scan for a base (:meth:`KeyedStateStore.scan`) reads
every block once: it does not fill the cache. Values that are not positive integers (-1 for the open files) are
a :class:`~pipeline.exceptions.ConfigError` naming the key.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline import settings
from pipeline.exceptions import ConfigError

__all__ = ["StoreMemory", "store_options"]

_KEYS = {
    "write_buffer_bytes": "PIPELINE_STATE_STORE_WRITE_BUFFER_BYTES",
    "write_buffers": "PIPELINE_STATE_STORE_WRITE_BUFFERS",
    "cache_bytes": "PIPELINE_STATE_STORE_CACHE_BYTES",
    "max_open_files": "PIPELINE_STATE_STORE_MAX_OPEN_FILES",
}


@dataclass(frozen=True, slots=True)
class StoreMemory:
    """The memory bounds of a worker's keyed stores (see the module docstring)."""

    write_buffer_bytes: int = 8 << 20
    write_buffers: int = 2
    cache_bytes: int = 32 << 20
    max_open_files: int = 64

    def __post_init__(self) -> None:
        for name, key in _KEYS.items():
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not (v > 0 or (name == "max_open_files" and v == -1)):
                raise ConfigError(f"{key}={v!r}: expected a positive integer"
                                  + (" or -1" if name == "max_open_files" else ""))
        if self.write_buffer_bytes < (64 << 10):
            raise ConfigError(f"{_KEYS['write_buffer_bytes']}={self.write_buffer_bytes}: at least 65536 bytes")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> StoreMemory:
        env = settings.environ() if env is None else env
        values: dict[str, int] = {}
        for name, key in _KEYS.items():
            raw = env.get(key)
            if raw is None or not raw.strip():
                continue
            try:
                values[name] = int(raw.strip())
            except ValueError:
                raise ConfigError(f"{key}={raw!r}: expected an integer") from None
        return cls(**values)


_SHARED: dict[StoreMemory, tuple[Any, Any]] = {}  # bounds -> (the process's cache, its write buffer manager)


def store_options(memory: StoreMemory | None = None) -> Any:
    """rocksdict ``Options`` of a keyed store under ``memory`` (default: from the environment); every store of the
    process with the same bounds shares one cache and one write buffer manager."""
    from rocksdict import BlockBasedOptions, Cache, Options, WriteBufferManager
    memory = StoreMemory.from_env() if memory is None else memory
    shared = _SHARED.get(memory)
    if shared is None:
        cache = Cache(memory.cache_bytes)
        shared = _SHARED[memory] = (cache, WriteBufferManager.new_write_buffer_manager_with_cache(
            memory.cache_bytes // 2, False, cache))
    cache, manager = shared
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_write_buffer_size(memory.write_buffer_bytes)
    opts.set_max_write_buffer_number(memory.write_buffers)
    opts.set_write_buffer_manager(manager)
    opts.set_max_open_files(memory.max_open_files)
    table = BlockBasedOptions()
    table.set_block_cache(cache)
    table.set_cache_index_and_filter_blocks(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    table.set_bloom_filter(10, False)  # most of a round's keys are new: a miss skips SST files
    opts.set_block_based_table_factory(table)
    return opts
