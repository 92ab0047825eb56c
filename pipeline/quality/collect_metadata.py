"""Metadata datasets: the snapshot's files, checkpoint lineage, sink commit log and committed files (driver,
no Spark)."""
from __future__ import annotations

from typing import Any

from pipeline.exceptions import SinkError, StorageError
from pipeline.layout import snapshot_name
from pipeline.quality.collect_base import CollectorBase, ordinal, records_frame
from pipeline.quality.committed_rows import COLUMNS as COMMITTED_ROWS_COLUMNS
from pipeline.quality.committed_rows import committed_rows
from pipeline.quality.filestats import stat_files
from pipeline.quality.jobspec import sink_obj, state_obj
from pipeline.sink.table import CommittedTable

__all__ = ["MetadataCollector"]


class MetadataCollector(CollectorBase):
    """Metadata steps of the collector."""

    # -- metadata ----------------------------------------------------------------------------------
    def load_known(self) -> None:
        store = self.runner.coordinator.store
        self.retained = store.list()
        self.savepoints = store.savepoints()
        known: dict[int, Any] = {}
        for cp in self.retained + self.savepoints + [self.snap.completed]:
            known[cp.checkpoint_id] = cp
        self.known = known
        self.retained_ids = sorted(cp.checkpoint_id for cp in self.retained)
        self.newest_id = max(known)

    def output_view(self) -> None:
        """Per sink table: all commit entries, the entries readers see, and the parent chain."""
        self.tables: dict[str, dict] = {}
        newest = self.snap.completed.checkpoint_id >= self.newest_id
        for t in self.job.sink_tables():
            table = CommittedTable(self.runner.sink_fio, self.runner.config.sink_uri, self.job.name, t)
            info: dict[str, Any] = {"table": table, "entries": [], "view": [], "error": None, "mode": "append"}
            try:
                entries = table.entries()
            except (SinkError, StorageError) as e:
                info["error"] = f"commit log of table {t} unreadable: {e}"
                self.tables[t] = info
                continue
            info["entries"] = entries
            scope = entries if newest else [e for e in entries if e.checkpoint_id <= self.snap.completed.checkpoint_id]
            try:
                info["view"] = table.lineage(scope) if scope else []
            except SinkError as e:
                info["error"] = str(e)
            by_id = {e.checkpoint_id: e for e in entries}
            chain: list[int] = []
            head = max(scope, key=lambda e: e.checkpoint_id) if scope else None
            cur = head
            while cur is not None:
                chain.append(cur.checkpoint_id)
                if cur.mode == "upsert" and cur.full:
                    break
                cur = by_id.get(cur.parent_id) if cur.parent_id is not None else None
            info["chain"] = set(chain)
            if entries:
                info["mode"] = entries[-1].mode
            self.tables[t] = info
            if info["error"]:
                self.out.messages.append(info["error"])

    def metadata_datasets(self, checksums: dict[str, dict]) -> None:
        """checkpoint_files, checkpoint_lineage, sink_commits, committed_files.

        Over 80 lines: four datasets from one walk over the checkpoint's files (files, lineage, sink commits,
        committed files); split, each would list the files again."""
        snap = self.snap
        files: list[dict] = []
        wanted: dict[str, bool] = {}

        def add(owner: str, role: str, obj: str | None, fh, checksum: bool) -> None:
            files.append({"owner": owner, "role": role, "object": obj, "uri": fh.uri, "expected_bytes": fh.bytes,
                          "expected_sha256": fh.sha256, "expected_rows": fh.rows, "_checksum": checksum})
            wanted[fh.uri] = wanted.get(fh.uri, False) or checksum

        owners = [(snap.name, snap.completed, True)]
        if self.mode != "epoch":
            owners += [(snapshot_name(cp.checkpoint_id, savepoint=cp.is_savepoint), cp, False)
                       for cp in self.retained + self.savepoints
                       if cp.location.rstrip("/") != snap.location.rstrip("/")]
        for owner, cp, deep in owners:
            md = cp.metadata
            for h in md.state_handles():
                for f in h.files():  # an incremental snapshot: its base and its deltas
                    add(owner, "state", state_obj(h.operator_uid, h.name), f, deep)
            for c in md.channel_state:
                if c.file is not None:
                    add(owner, "channel", f"channel/{c.operator_uid}/{c.channel}", c.file, deep)
            for t in sorted(md.sinks):
                for f in md.sinks[t].files:
                    add(owner, "sink_staged", sink_obj(t), f, deep)
        for t, info in self.tables.items():
            view = info["view"]
            if self.mode == "epoch":
                view = [e for e in view if e.checkpoint_id == snap.completed.checkpoint_id]
            for e in view:
                for f in e.files:
                    add(f"table:{t}", "committed", sink_obj(t), f, self.mode != "epoch")
        need = {u for u, c in wanted.items() if c and u not in checksums}
        with self.timer("metadata_files"):
            stats = stat_files(self.fio, [u for u in wanted if u not in checksums], need)
        stats.update(checksums)
        for r in files:
            s = stats.get(r["uri"], {})
            r["exists"] = bool(s.get("exists"))
            r["actual_bytes"] = s.get("bytes")
            r["actual_sha256"] = s.get("sha256") if r.pop("_checksum") else None
            r["actual_rows"] = s.get("rows") if s.get("rows") is not None and s.get("sha256") else None
        cols = ["owner", "role", "object", "uri", "exists", "expected_bytes", "actual_bytes", "expected_sha256",
                "actual_sha256", "expected_rows", "actual_rows"]
        self.out.datasets["checkpoint_files"] = records_frame(files, cols)
        self.out.figures["files_checked"] = len(files)
        self.out.figures["bytes_checksummed"] = sum(
            (stats.get(u, {}).get("bytes") or 0) for u, c in wanted.items() if c)

        # -- lineage: barrier/position monotonicity along parent links
        lineage: list[dict] = []
        if self.mode == "epoch":
            metas = [snap.completed]
        else:
            metas = list({id(c): c for c in self.retained + self.savepoints + [snap.completed]}.values())
        for cp in sorted(metas, key=lambda c: c.checkpoint_id):
            md = cp.metadata
            parent = self.known.get(md.parent_id) if md.parent_id is not None else None
            if parent is None and md.parent_id is not None and self.mode == "epoch":
                try:
                    parent = self.runner.coordinator.store.get(md.parent_id)
                except Exception:  # noqa: BLE001 - subsumed parent: nothing to compare with
                    parent = None
            pmd = parent.metadata if parent is not None else None
            name = snapshot_name(md.checkpoint_id, savepoint=cp.is_savepoint)
            sources = set(md.barriers) | set(md.positions) | (set(pmd.barriers) if pmd else set())
            for s in sorted(sources):
                parts = set(md.barriers.get(s, {})) | set(md.positions.get(s, {}))
                pparts = set(pmd.barriers.get(s, {})) | set(pmd.positions.get(s, {})) if pmd else set()
                for p in sorted(parts | pparts, key=lambda x: (len(x), x)):
                    b = md.barriers.get(s, {}).get(p)
                    pos = md.positions.get(s, {}).get(p)
                    pb = pmd.barriers.get(s, {}).get(p) if pmd else None
                    pp = pmd.positions.get(s, {}).get(p) if pmd else None
                    lineage.append({
                        "checkpoint": name, "checkpoint_id": md.checkpoint_id, "parent_id": md.parent_id,
                        "kind": md.kind, "epoch": md.epoch, "parent_epoch": pmd.epoch if pmd else None,
                        "source": s, "partition": p, "in_checkpoint": p in parts,
                        "barrier_seq": b.seq if b else None, "barrier_row": b.row if b else None,
                        "barrier": ordinal(b) if b else None, "parent_barrier": ordinal(pb) if pb else None,
                        "position": ordinal(pos) if pos else None, "parent_position": ordinal(pp) if pp else None})
        self.out.datasets["checkpoint_lineage"] = records_frame(lineage, [
            "checkpoint", "checkpoint_id", "parent_id", "kind", "epoch", "parent_epoch", "source", "partition",
            "in_checkpoint", "barrier_seq", "barrier_row", "barrier", "parent_barrier", "position",
            "parent_position"])

        # -- sink commit log
        commits: list[dict] = []
        committed: list[dict] = []
        min_retained = min(self.retained_ids) if self.retained_ids else snap.completed.checkpoint_id
        completed_ids = {cp.checkpoint_id for cp in self.retained} | {snap.completed.checkpoint_id}
        if self.mode == "epoch":
            completed_ids = {snap.completed.checkpoint_id}
        for t, info in self.tables.items():
            reader = {e.checkpoint_id for e in info["view"]}
            by_id = {e.checkpoint_id: e for e in info["entries"]}
            entries = info["entries"]
            if self.mode == "epoch":
                entries = [e for e in entries if e.checkpoint_id == snap.completed.checkpoint_id]
            for e in entries:
                cp = self.known.get(e.checkpoint_id)
                if cp is not None:
                    known: bool | None = True
                elif not e.files or e.checkpoint_id < min_retained:
                    known = None
                else:
                    known = False
                matches = parent_ok = None
                if cp is not None and t in cp.metadata.sinks:
                    staged = {(f.uri, f.sha256) for f in cp.metadata.sinks[t].files}
                    matches = staged == {(f.uri, f.sha256) for f in e.files}
                    parent_ok = e.parent_id == cp.metadata.parent_id
                commits.append({"table": t, "commit_id": e.checkpoint_id, "parent_id": e.parent_id,
                                "files": len(e.files), "rows": e.rows, "commit_exists": True,
                                "on_reader_lineage": e.checkpoint_id in reader,
                                "on_parent_chain": e.checkpoint_id in info.get("chain", set()),
                                "checkpoint_known": known, "matches_checkpoint": matches,
                                "parent_matches": parent_ok})
            for cid in sorted(completed_ids):
                cp = self.known.get(cid)
                if cid not in by_id and cp is not None and t in cp.metadata.sinks:
                    commits.append({"table": t, "commit_id": cid, "parent_id": cp.metadata.parent_id, "files": 0,
                                    "rows": 0, "commit_exists": False, "on_reader_lineage": False,
                                    "on_parent_chain": False, "checkpoint_known": True,
                                    "matches_checkpoint": None, "parent_matches": None})
            view = info["view"] if self.mode != "epoch" else [e for e in info["view"]
                                                               if e.checkpoint_id == snap.completed.checkpoint_id]
            for e in view:
                for f in e.files:
                    committed.append({"table": t, "commit_id": e.checkpoint_id, "uri": f.uri, "sha256": f.sha256,
                                      "rows": f.rows})
        self.out.datasets["sink_commits"] = records_frame(commits, [
            "table", "commit_id", "parent_id", "files", "rows", "commit_exists", "on_reader_lineage",
            "on_parent_chain", "checkpoint_known", "matches_checkpoint", "parent_matches"])
        self.out.datasets["committed_files"] = records_frame(committed, ["table", "commit_id", "uri", "sha256", "rows"])

    def committed_rows_dataset(self) -> None:
        """``committed_rows``: no row committed twice for one epoch on the lineage readers see
        (:mod:`pipeline.quality.committed_rows`; reads only commits of an epoch committed more than once)."""
        import pyarrow.parquet as pq

        def read(uri: str):
            with self.fio(uri).open_input(uri) as f:
                return pq.read_table(f)

        views = {t: info["view"] for t, info in self.tables.items() if not info["error"]}
        res = committed_rows(views, {cid: int(cp.metadata.epoch) for cid, cp in self.known.items()}, read)
        self.out.datasets["committed_rows"] = records_frame(res.records, COMMITTED_ROWS_COLUMNS)
        self.out.examples["committed_duplicates"] = res.examples
        self.out.figures["committed_rows_files_read"] = res.files_read
        if res.unknown_epoch:
            self.out.figures["committed_rows_not_compared"] = res.unknown_epoch
