"""The source contract, checked: files are append-only logs whose files never change once written.

Epochal cannot stop a producer from breaking the contract, but it must notice when it does, never skip
data silently. Two breaches are detectable after the fact:

* **late file**: a file appears with a sequence number lower than (or equal to) the position the job has
  already read past in its partition (``seq`` gaps filled in late, a file re-numbered, a backfill written
  into the past). Its rows lie behind the restore position and would never be read.
* **changed file**: a file the job has (fully or partly) read has a different size now (rows appended,
  values rewritten, the file replaced).

How it is detected, cheaply: every completed checkpoint records its **read inventory** in
``_metadata`` (``extra.source_files``): per source partition, ``[seq, size]`` of each file at or before
the checkpoint's position (one pair per file; sizes come from the listing that planning needs anyway, no
extra request). At every listing the files behind the restore position are compared with the inventory.
A rewrite that keeps the byte size identical is not detected (size is the fingerprint; an S3 ETag would be
the next step); a source whose old files are deleted (source retention) is fine: only files that are
present are compared.

**Incremental listing** (S3 requests per epoch that do not grow with history, docs/state.md): a partition is
listed from the ``PIPELINE_SOURCE_LISTING_WINDOW`` (default 16) newest inventory files behind its position on
(:func:`listing_start`), so late or changed files among those are detected at once; every
``PIPELINE_SOURCE_FULL_LISTING_EVERY``-th checkpoint (default 50; 0: never) lists everything and checks every
file against the inventory, so an older breach is reported at most that many checkpoints later. The inventory
of the next checkpoint keeps the entries behind the window (:func:`read_inventory` ``base``).

What happens (``PIPELINE_BAD_RECORDS``): ``fail`` raises :class:`~pipeline.exceptions.SourceContractError`
naming the file and partition before anything is processed; ``dead_letter`` writes one dead-letter record
per offending file (``<dl>/<job>/<source>/_contract/...``), counts it in the dead-letter stats of the next
checkpoint, and warns. The next checkpoint's inventory includes the file as it is now, so a breach is
reported once.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from pipeline.checkpoint.channel import partition_key, partition_of
from pipeline.exceptions import SourceContractError, SourceError
from pipeline.fileio import file_io_for
from pipeline.source.layout import SourceFile

__all__ = ["Breach", "ContractViolation", "read_inventory", "find_violations", "handle_violations",
           "check_source_contract", "unplaceable_files_error", "listing_start", "inventory_behind"]

Inventory = Mapping[str, Mapping[str, Sequence[Sequence[int]]]]  # source -> partition -> [[seq, size]]


class Breach(str, Enum):
    LATE_FILE = "late_file"
    CHANGED_FILE = "changed_file"


@dataclass(frozen=True, slots=True)
class ContractViolation:
    breach: Breach
    file: SourceFile
    detail: str

    def message(self) -> str:
        f = self.file
        return (f"source {f.source}, partition {f.partition}: {self.breach.value.replace('_', ' ')} {f.uri}: "
                f"{self.detail}")


def _read_upto(pos) -> Callable[[int], bool]:
    return lambda seq: seq < pos.seq or (seq == pos.seq and pos.row > 0)


def read_inventory(files: Mapping[str, Mapping[int, Sequence[SourceFile]]],
                   positions: Mapping[str, Mapping[str, object]],
                   base: Inventory | None = None) -> dict[str, dict[str, list[list[int]]]]:
    """``[seq, size]`` of every listed file at or before each partition's position (read, fully or partly),
    plus the ``base`` entries (the inventory behind an incremental listing's start) of seqs not listed."""
    out: dict[str, dict[str, list[list[int]]]] = {}
    for src, parts in files.items():
        for p, fs in parts.items():
            pos = positions.get(src, {}).get(partition_key(p))
            if pos is None:
                continue
            read = _read_upto(pos)
            out.setdefault(src, {})[partition_key(p)] = [[f.seq, f.size] for f in fs if read(f.seq)]
    for src, base_parts in (base or {}).items():
        for bp, known in base_parts.items():
            if positions.get(src, {}).get(partition_key(bp)) is None:
                continue
            listed = out.setdefault(src, {}).setdefault(partition_key(bp), [])
            seen = {entry[0] for entry in listed}
            listed.extend([int(e[0]), int(e[1])] for e in known if int(e[0]) not in seen)
            listed.sort()
    return out


def listing_start(inventory: Inventory, positions: Mapping[str, object], source: str,
                  window: int) -> dict[int, int] | None:
    """Per partition of ``source`` with a position, the first seq an incremental listing must list: the oldest
    of the ``window`` newest inventory files behind the position (or the position's own file). None when a
    partition with a position has no inventory (an older checkpoint): then everything must be listed."""
    known_parts = inventory.get(source, {})
    out: dict[int, int] = {}
    for p, pos in positions.items():
        known = known_parts.get(partition_key(p))
        if known is None:
            return None
        read = _read_upto(pos)
        behind = sorted(int(s) for s, _ in known if read(int(s)))
        seq = int(pos.seq)  # type: ignore[attr-defined]
        out[partition_of(p)] = min(behind[-window:][0], seq) if window > 0 and behind else seq
    return out


def inventory_behind(inventory: Inventory, source: str, start: Mapping[int, int]) -> dict[str, list[list[int]]]:
    """The inventory entries of ``source`` below each partition's listing start (kept, not listed again)."""
    parts = inventory.get(source, {})
    return {partition_key(p): [[int(s), int(n)] for s, n in parts.get(partition_key(p), ()) if int(s) < seq]
            for p, seq in start.items()}


def find_violations(inventory: Inventory, files: Mapping[str, Mapping[int, Sequence[SourceFile]]],
                    positions: Mapping[str, Mapping[str, object]]) -> list[ContractViolation]:
    """Files behind the position that the inventory does not know (late) or knows with another size."""
    out: list[ContractViolation] = []
    for src, parts in files.items():
        for p, fs in parts.items():
            known = inventory.get(src, {}).get(partition_key(p))
            pos: Any = positions.get(src, {}).get(partition_key(p))
            if known is None or pos is None:  # nothing read yet, or a checkpoint without an inventory
                continue
            sizes = {int(s): int(n) for s, n in known}
            read = _read_upto(pos)
            for f in fs:
                if f.seq in sizes:
                    if f.size != sizes[f.seq]:
                        out.append(ContractViolation(Breach.CHANGED_FILE, f, (
                            f"{sizes[f.seq]} bytes when read, {f.size} bytes now; files must never change once "
                            f"written (rows before position ({pos.seq}, {pos.row}) are not read again)")))
                elif read(f.seq):
                    out.append(ContractViolation(Breach.LATE_FILE, f, (
                        f"seq {f.seq} appeared after the partition was read up to position ({pos.seq}, {pos.row}); "
                        "its rows are not read (sequence numbers must increase with arrival)")))
    return out


def contract_dead_letter_uri(dead_letter_root: str, job: str, v: ContractViolation) -> str:
    key = f"{v.breach.value}|{v.file.uri}|{v.file.size}"
    digest = hashlib.sha1(key.encode("utf-8")).hexdigest()[:16]
    return f"{dead_letter_root.rstrip('/')}/{job}/{v.file.source}/_contract/{digest}.jsonl"


def handle_violations(violations: Sequence[ContractViolation], policy: str, dead_letter_root: str, job: str,
                      warn: Callable[[str], None]) -> dict[str, int]:
    """Fail (policy ``fail``) or dead-letter each violation; returns the dead-letter count per source."""
    if not violations:
        return {}
    if policy == "fail":
        more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
        raise SourceContractError(violations[0].message() + more)
    dl_io = file_io_for(dead_letter_root)
    counts: dict[str, int] = {}
    for v in violations:
        f = v.file
        record = {"file": f.uri, "source": f.source, "partition": f.partition, "seq": f.seq, "row": None,
                  "error": f"source contract broken: {v.message()}", "size": f.size, "values": None}
        dl_io.write_bytes(contract_dead_letter_uri(dead_letter_root, job, v), (json.dumps(record) + "\n").encode())
        counts[f.source] = counts.get(f.source, 0) + 1
        warn(f"WARNING: {v.message()} (dead-lettered)")
    return counts


def check_source_contract(runner, cursor, listing: Mapping[str, Mapping[int, Sequence[SourceFile]]]) -> dict[str, int]:
    """The runner's hook: compare a fresh listing with the restore point's inventory; fail or dead-letter."""
    violations = find_violations(cursor.inventory, listing, cursor.positions)
    return handle_violations(violations, runner.config.bad_records, runner.dead_letter_root, runner.job.name,
                             runner.echo)


def unplaceable_files_error(job: str, summaries) -> SourceError:
    """A fresh job has unread files but none with a readable ``_ingest_ts``: no epoch can be placed."""
    bad = [s for parts in summaries.values() for ss in parts.values() for s in ss if s.corrupt or not s.rows]
    first = next((s for s in bad if s.corrupt), bad[0] if bad else None)
    where = (f"; first: source {first.file.source}, partition {first.file.partition}: {first.uri}"
             + (f": {first.error}" if first.error else "")) if first else ""
    return SourceError(f"job {job!r} has never run and none of its {len(bad)} unread source file(s) is readable, "
                       f"so no epoch can be placed{where}. Fix or remove the files, then run again")
