"""The expectation suites, defined in code and exported as versioned GX JSON to ``include/gx/expectations/``.

Every suite validates one small **dataset** (a pandas DataFrame): a per-file, per-key-group, per-group or
per-partition summary that the collectors (:mod:`pipeline.quality.collect`) compute - in Spark where the
raw data is big - so that one GX validation per suite checks the whole checkpoint. The suites are job
generic: the column names below are the datasets' own, not the job's.

Areas (see ``docs/quality.md``):

* **metadata**: referenced files (exist, size, checksum, rows), barrier/position monotonicity along the
  checkpoint lineage, sink commit log consistency, no file committed twice;
* **state**: the restored operator state - schema, key-group ranges, unique non-null keys per operator
  and key group, keys inside the key-group range that owns them, value ranges;
* **sink**: committed output - no duplicate keys, non-null references, the upsert totals agree with the
  append table they summarise and with the aggregate state;
* **recovery**: state and committed output equal an independent recomputation from the source files up
  to the checkpoint's barrier positions; totals and per-group counts are conserved.

``python -m pipeline.quality.suites --export include/gx`` rewrites the JSON files; a test fails when they
drift from this module. Expectation ids are derived from the suite name and position, so the export is
stable and diffs are reviewable.

Over 400 lines: one declaration per suite, each short: split, the one list a reviewer diffs would scatter.
"""
from __future__ import annotations

import argparse
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ExpectationSpec", "SuiteSpec", "SUITES", "SUITE_VERSION", "DATASETS", "suite", "suites_for",
           "build_gx_suite", "suite_json", "export_suites", "main"]

SUITE_VERSION = 1
_NS = uuid.UUID("6f0c3d1e-5b1a-4c1e-9a53-0e90c4a1e7a1")


@dataclass(frozen=True, slots=True)
class ExpectationSpec:
    """One expectation: the GX class name, its kwargs, a description, and the example category
    (``examples`` key of the collected dataset) whose rows illustrate a failure."""

    type: str
    kwargs: Mapping[str, Any]
    description: str
    examples: str | None = None


@dataclass(frozen=True, slots=True)
class SuiteSpec:
    name: str
    area: str                             # metadata | state | sink | recovery
    dataset: str                          # which collected dataset it validates
    id_columns: tuple[str, ...]           # columns that name a row in failure reports
    description: str
    expectations: tuple[ExpectationSpec, ...]
    per_epoch: bool = False               # part of the cheap per-epoch subset
    meta: Mapping[str, Any] = field(default_factory=dict)


def _zero(column: str, description: str, examples: str | None = None) -> ExpectationSpec:
    return ExpectationSpec("ExpectColumnValuesToBeBetween", {"column": column, "min_value": 0, "max_value": 0},
                           description, examples)


def _equal(a: str, b: str, description: str, examples: str | None = None, *,
           ignore: str = "either_value_is_missing") -> ExpectationSpec:
    return ExpectationSpec("ExpectColumnPairValuesToBeEqual",
                           {"column_A": a, "column_B": b, "ignore_row_if": ignore}, description, examples)


def _ge(a: str, b: str, description: str, *, or_equal: bool = True) -> ExpectationSpec:
    return ExpectationSpec("ExpectColumnPairValuesAToBeGreaterThanB",
                           {"column_A": a, "column_B": b, "or_equal": or_equal,
                            "ignore_row_if": "either_value_is_missing"}, description)


def _in(column: str, values: list[Any], description: str, examples: str | None = None) -> ExpectationSpec:
    return ExpectationSpec("ExpectColumnValuesToBeInSet", {"column": column, "value_set": values}, description,
                           examples)


#: Columns of every dataset the suites validate (documentation; the collectors produce exactly these).
DATASETS: dict[str, dict[str, str]] = {
    "checkpoint_files": {
        "owner": "chk-<id> / sp-<id> (a retained checkpoint or savepoint) or table:<name> (committed file)",
        "role": "state | channel | sink_staged | committed",
        "object": "state/<operator uid>/<state name> or sink/<table>",
        "uri": "the file", "exists": "the file is there",
        "expected_bytes": "size recorded in the handle", "actual_bytes": "size on storage (null if missing)",
        "expected_sha256": "checksum recorded", "actual_sha256": "checksum computed (null if not checked)",
        "expected_rows": "rows recorded", "actual_rows": "rows in the Parquet footer (null if not read)",
    },
    "checkpoint_lineage": {
        "checkpoint": "chk-<id> / sp-<id>", "checkpoint_id": "id", "parent_id": "parent checkpoint id",
        "epoch": "epoch n of the checkpoint", "parent_epoch": "epoch of the parent (null if subsumed)",
        "source": "source name", "partition": "source partition",
        "in_checkpoint": "false when the parent has the partition and this checkpoint lost it",
        "barrier": "barrier n position as an ordinal (seq * 2^32 + row)", "parent_barrier": "the parent's",
        "position": "restore position ordinal", "parent_position": "the parent's",
    },
    "sink_commits": {
        "table": "sink table", "commit_id": "checkpoint id of the commit entry", "parent_id": "its parent",
        "files": "files committed", "rows": "rows committed", "commit_exists": "false for a completed "
        "checkpoint whose commit entry is missing", "on_reader_lineage": "readers see this commit",
        "on_parent_chain": "the commit is on the head's parent_id chain",
        "checkpoint_known": "the commit belongs to a completed checkpoint/savepoint (null: older than retention, "
        "or an empty commit of an external savepoint)",
        "matches_checkpoint": "committed files equal the files the checkpoint staged",
        "parent_matches": "commit parent equals the checkpoint's parent",
    },
    "committed_files": {"table": "sink table", "commit_id": "commit", "uri": "file", "sha256": "checksum",
                        "rows": "rows"},
    "committed_rows": {
        "table": "sink table", "commit_id": "commit (checkpoint id) readers see", "epoch": "epoch of its checkpoint",
        "rows": "rows committed", "earlier_commits": "earlier commits of the same epoch on the lineage (a restore "
        "point or savepoint re-completes the epoch it starts from)",
        "duplicate_rows": "rows of this commit that an earlier commit of the same epoch holds (multiset, all "
        "columns; null: not compared)",
    },
    "state_files": {
        "object": "state/<uid>/<name>", "operator": "uid", "state": "state name", "subtask": "subtask",
        "kg_start": "first key group", "kg_end": "last key group (inclusive)", "uri": "state file (null: empty)",
        "readable": "the file was read",
        "schema": "logical Parquet schema (name:kind, ...; kinds string, int, number, timestamp[zone])",
        "expected_schema": "schema the job implies (null if not derivable)",
        "range_overlaps": "another handle of the same state overlaps this key-group range",
        "range_gap_before": "key groups left uncovered before this range (after, for the last range)",
    },
    "state_key_groups": {
        "object": "state/<uid>/<name>", "kg": "key group (recomputed from the key)", "rows": "state rows",
        "keys": "distinct keys", "dup_keys": "keys present more than once", "null_keys": "rows with a null key",
        "kg_mismatch": "rows whose stored _kg differs from the recomputed key group",
        "out_of_range": "rows outside the key-group range of the file (subtask) that holds them",
        "files": "state files holding rows of this key group", "null_values": "null numeric/timestamp values",
        "negative_values": "negative numeric values", "after_barrier": "rows with _ingest_ts >= barrier n time",
        "expired": "rows older than the state TTL at barrier n",
    },
    "sink_key_groups": {
        "object": "sink/<table>", "kg": "key group of the row key", "rows": "committed rows visible to readers",
        "keys": "distinct keys", "dup_keys": "keys committed more than once", "null_keys": "rows with a null key",
        "null_values": "null numeric/timestamp values", "negative_values": "negative numeric values",
    },
    "group_totals": {
        "aggregate": "aggregate operator uid", "group": "group key (e.g. merchant_id)", "measure": "aggregate "
        "output (e.g. paid_orders, revenue; float sums in cents)", "append": "recomputed from the append sink "
        "it summarises", "upsert": "committed upsert sink (newest row per key)", "state": "aggregate state",
        "expected": "independent recomputation from the sources",
    },
    "recovery_key_groups": {
        "object": "state/<uid>/<name> or sink/<table>", "kg": "key group",
        "rows": "actual rows", "expected_rows": "recomputed rows", "keys": "actual distinct keys",
        "expected_keys": "recomputed distinct keys", "fp_num": "sum of numeric values (cents)",
        "expected_fp_num": "same, recomputed", "fp_ts": "timestamp fingerprint", "expected_fp_ts": "recomputed",
        "fp_str": "string-content fingerprint", "expected_fp_str": "recomputed",
        "missing_rows": "recomputed rows absent from the actual data (drill-down of mismatching key groups)",
        "extra_rows": "actual rows not implied by the sources", "orphan_rows": "actual rows whose references "
        "are not in the sources (e.g. a paid order without its order or captured payment)",
    },
    "recovery_conservation": {
        "source": "input (e.g. orders, captured payments)", "input_rows": "valid rows before barrier n",
        "in_state": "rows waiting in operator state", "in_output": "rows that reached the output",
        "accounted": "in_state + in_output",
    },
    "users_read": {
        "object": "table/<t> (a Delta or Iceberg sink) or dead_letters/<operator uid>",
        "kind": "DeltaLakeTable, IcebergTable or dead letters", "version": "the table version read",
        "rows_expected": "rows of Epochal's commit log (tables) or of the batch evaluation (dead letters)",
        "rows_actual": "rows read through the table format, or dead-lettered rows on disk",
        "only_expected": "expected rows the reader does not see", "only_actual": "rows the reader sees that are "
        "not expected",
    },
    "runtime_logs": {
        "file": "the barrier, round or lag log file the runtime wrote (barriers/...)",
        "checkpoint": "chk-<id> the entry belongs to (barrier entries: the checkpoint of that epoch, or the validated "
        "one)", "source": "source (- for an entry's header)", "partition": "partition (-: the entry's header)",
        "logged": "what the runtime logged (positions as seq:row)",
        "expected": "what the independent check finds (the source files read with pyarrow; the checkpoints' "
        "_metadata)", "ok": "the entry agrees with the independent evidence",
    },
    "replay": {
        "object": "state/<operator uid>/<state name> or sink/<table> that depends on a process operator",
        "rows_checkpoint": "rows of the object in checkpoint n",
        "rows_replayed": "rows after restoring checkpoint n-1 in a scratch location and re-running epoch n",
        "only_checkpoint": "rows of checkpoint n the replay did not produce",
        "only_replayed": "rows the replay produced that checkpoint n lacks",
    },
}


SUITES: tuple[SuiteSpec, ...] = (
    # ------------------------------------------------------------------------------------ metadata
    SuiteSpec(
        "epochal_checkpoint_files", "metadata", "checkpoint_files", ("owner", "role", "object", "uri"),
        "Every file referenced by the validated snapshot, the retained checkpoints, the savepoints and the "
        "committed sink lineage exists with its recorded size, checksum and row count.",
        (
            _in("exists", [True], "every referenced file exists (retained checkpoints and savepoints reference no "
                "deleted file)"),
            _equal("actual_bytes", "expected_bytes", "every referenced file has its recorded size"),
            _equal("actual_sha256", "expected_sha256", "every checked file has its recorded sha256 checksum"),
            _equal("actual_rows", "expected_rows", "every read file has its recorded number of rows"),
            ExpectationSpec("ExpectCompoundColumnsToBeUnique", {"column_list": ["owner", "uri"]},
                            "no file is referenced twice by the same checkpoint"),
        ), per_epoch=True),
    SuiteSpec(
        "epochal_checkpoint_lineage", "metadata", "checkpoint_lineage", ("checkpoint", "source", "partition"),
        "Barrier positions and restore positions never decrease along the checkpoint lineage; ids increase; "
        "no source partition is dropped.",
        (
            _ge("barrier", "parent_barrier", "barrier positions never decrease across checkpoints"),
            _ge("position", "parent_position", "restore positions never decrease across checkpoints"),
            _ge("barrier", "position", "a snapshot holds nothing past its barrier (position <= barrier n)"),
            _ge("epoch", "parent_epoch", "epochs never go back along the lineage"),
            _ge("checkpoint_id", "parent_id", "checkpoint ids strictly increase along the lineage", or_equal=False),
            _in("in_checkpoint", [True], "no source partition of the parent is missing from the checkpoint"),
        ), per_epoch=True),
    SuiteSpec(
        "epochal_sink_commits", "metadata", "sink_commits", ("table", "commit_id"),
        "The sink commit log matches the checkpoints: every completed checkpoint committed its staged files, "
        "every commit belongs to a completed checkpoint, and readers see exactly the parent chain of the head.",
        (
            _in("commit_exists", [True], "every completed checkpoint has a commit entry in every sink table"),
            _equal("on_reader_lineage", "on_parent_chain", "readers see exactly the commits on the head's parent "
                   "chain (a rewound or losing branch is invisible)", ignore="neither"),
            _in("checkpoint_known", [True], "every commit with output belongs to a completed checkpoint or "
                "savepoint (no epoch committed twice, no commit without a checkpoint)"),
            _in("matches_checkpoint", [True], "each commit holds exactly the files its checkpoint staged"),
            _in("parent_matches", [True], "each commit's parent is its checkpoint's parent"),
        ), per_epoch=True),
    SuiteSpec(
        "epochal_committed_files", "metadata", "committed_files", ("table", "commit_id", "uri"),
        "No output file is committed twice on the lineage readers see.",
        (
            ExpectationSpec("ExpectColumnValuesToBeUnique", {"column": "uri"},
                            "no file is committed by two commits readers see"),
            ExpectationSpec("ExpectCompoundColumnsToBeUnique", {"column_list": ["table", "sha256"]},
                            "no output content is committed twice to a table (same bytes under another name; two "
                            "tables may hold the same rows)"),
        ), per_epoch=True),
    # --------------------------------------------------------------------------------------- state
    SuiteSpec(
        "epochal_state_files", "state", "state_files", ("object", "subtask", "uri"),
        "Each operator state's snapshot covers every key group exactly once, with the schema the job implies.",
        (
            _in("readable", [True], "every state file can be read"),
            _equal("schema", "expected_schema", "state files have the schema the job implies (key, values, _kg)"),
            _in("range_overlaps", [False], "key-group ranges of one state do not overlap"),
            _zero("range_gap_before", "key-group ranges of one state cover 0..max_parallelism-1 without gaps"),
        )),
    SuiteSpec(
        "epochal_state_key_groups", "state", "state_key_groups", ("object", "kg"),
        "Restored operator state, per operator, state and key group: unique keys (a null aggregate key is one), "
        "every key in the key group and key-group range that owns it, value ranges, nothing past the barrier.",
        (
            _zero("dup_keys", "keys are unique per operator, state and key group", "state_duplicates"),
            _zero("null_keys", "no state row lacks a key it needs (an aggregate's NULL group and a join row with a "
                  "null key, which matches nothing, are legitimate: docs/operators.md \"Null keys\")"),
            _zero("kg_mismatch", "every row is filed under the key group of its key"),
            _zero("out_of_range", "every key lies in the key-group range of the subtask whose file holds it"),
            ExpectationSpec("ExpectColumnValuesToBeBetween", {"column": "files", "min_value": 1, "max_value": 1},
                            "each key group of a state lives in exactly one state file"),
            _zero("after_barrier", "snapshot n holds no record ingested at or after barrier n (exactly-once)"),
            _zero("expired", "no state row is older than the state TTL at barrier n"),
        )),
    # ---------------------------------------------------------------------------------------- sink
    SuiteSpec(
        "epochal_sink_key_groups", "sink", "sink_key_groups", ("object", "kg"),
        "Committed output as readers see it: each result row exactly once, with a key. (Nulls and negative "
        "values are legitimate in a user's job - an outer join's other side, a refund - so they are counted in "
        "the figures but not expected to be zero; correctness is the recovery suites' comparison.)",
        (
            _zero("dup_keys", "no duplicate key in committed output (e.g. order_id in paid_orders)",
                  "sink_duplicates"),
            _zero("null_keys", "committed rows have a key (an aggregate's NULL group is one key, held exactly once)"),
        )),
    SuiteSpec(
        "epochal_committed_rows", "sink", "committed_rows", ("table", "commit_id", "epoch"),
        "Row by row, no epoch's output is committed twice on the lineage readers see: a later commit of an epoch "
        "(a restore point or savepoint re-completing it) holds no row an earlier commit of that epoch holds - "
        "whatever parallelism split the rows into files, whatever the sink mode.",
        (
            _zero("duplicate_rows", "no row is committed twice for one epoch (the same rows in other files: a "
                  "re-emission at another parallelism)", "committed_duplicates"),
        )),
    SuiteSpec(
        "epochal_sink_totals", "sink", "group_totals", ("aggregate", "group", "measure"),
        "The upsert totals agree with the append output they summarise and with the aggregate state "
        "(e.g. merchant_revenue agrees with paid_orders).",
        (
            _equal("upsert", "append", "per-group totals of the upsert sink equal the totals recomputed from "
                   "the append sink (merchant_revenue agrees with paid_orders)", "totals"),
            _equal("upsert", "state", "the committed upsert totals equal the aggregate state", "totals"),
        )),
    # ------------------------------------------------------------------------------------ recovery
    SuiteSpec(
        "epochal_recovery_key_groups", "recovery", "recovery_key_groups", ("object", "kg"),
        "State and committed output equal an independent recomputation from the source files up to the "
        "checkpoint's barrier positions, key group by key group.",
        (
            _equal("rows", "expected_rows", "row counts equal the recomputation", "recovery_diff"),
            _equal("keys", "expected_keys", "distinct keys equal the recomputation", "recovery_diff"),
            _equal("fp_num", "expected_fp_num", "amounts and counts equal the recomputation", "recovery_diff"),
            _equal("fp_ts", "expected_fp_ts", "timestamps equal the recomputation", "recovery_diff"),
            _equal("fp_str", "expected_fp_str", "string values equal the recomputation", "recovery_diff"),
            _zero("missing_rows", "nothing lost: every recomputed row is present", "recovery_missing"),
            _zero("extra_rows", "nothing counted twice or invented: every row is implied by the sources",
                  "recovery_extra"),
            _zero("orphan_rows", "every output row references source records before the barrier (a paid order "
                  "has its order and a captured payment)", "recovery_extra"),
        )),
    SuiteSpec(
        "epochal_recovery_totals", "recovery", "group_totals", ("aggregate", "group", "measure"),
        "Per-group totals (e.g. per-merchant paid orders and revenue) of state and output equal the "
        "recomputation from the sources.",
        (
            _equal("state", "expected", "aggregate state equals the recomputed per-group totals", "totals"),
            _equal("upsert", "expected", "committed upsert totals equal the recomputed per-group totals", "totals"),
            _equal("append", "expected", "the append output summed per group equals the recomputed totals",
                   "totals"),
        )),
    SuiteSpec(
        "epochal_recovery_conservation", "recovery", "recovery_conservation", ("source",),
        "Every valid input record before the barrier is accounted for exactly once: waiting in state or in "
        "the output.",
        (
            _equal("accounted", "input_rows", "input records are conserved (in state + in output == read)",
                   "conservation"),
        )),
    SuiteSpec(
        "epochal_users_read", "sink", "users_read", ("object",),
        "What users read equals what the job committed: each Delta/Iceberg sink's current version, read through its "
        "format as any engine reads it, holds exactly the committed rows (row by row, every column); each "
        "operator's dead letters on disk are as many as the batch evaluation dead-letters.",
        (
            _zero("only_expected", "no committed row (or dead letter) is missing from what readers see", "users_read"),
            _zero("only_actual", "readers see no row that was not committed (changed or added rows)", "users_read"),
            _equal("rows_expected", "rows_actual", "readers see as many rows as were committed", "users_read"),
        )),
    SuiteSpec(
        "epochal_runtime_logs", "recovery", "runtime_logs", ("file", "checkpoint", "source", "partition"),
        "The logs the batch evaluation trusts are checked independently: every barrier position is the first row "
        "whose _ingest_ts reaches the epoch's end, as pyarrow reads the source files (not Epochal's reader); every "
        "round and lag log entry agrees with the checkpoints' _metadata.",
        (
            _in("ok", [True], "every barrier, round and lag log entry agrees with the independent evidence",
                "runtime_logs"),
        )),
    SuiteSpec(
        "epochal_replay_determinism", "recovery", "replay", ("object",),
        "Objects that depend on a user-defined process operator (which the batch evaluation cannot model) are "
        "reproduced exactly by restoring checkpoint n-1 in a scratch location and re-running epoch n "
        "(invariant 5: determinism under replay). Runs only for jobs with process operators.",
        (
            _zero("only_checkpoint", "every row of the checkpoint is reproduced by the replay", "replay_diff"),
            _zero("only_replayed", "the replay produces no row the checkpoint lacks", "replay_diff"),
            _equal("rows_checkpoint", "rows_replayed", "the replay produces as many rows as the checkpoint holds",
                   "replay_diff"),
        )),
)


def suite(name: str) -> SuiteSpec:
    for s in SUITES:
        if s.name == name:
            return s
    raise KeyError(f"no expectation suite {name!r} (have {[s.name for s in SUITES]})")


def suites_for(areas: tuple[str, ...] | None = None, *, per_epoch: bool = False) -> list[SuiteSpec]:
    out = [s for s in SUITES if areas is None or s.area in areas]
    return [s for s in out if s.per_epoch] if per_epoch else out


def _eid(suite_name: str, i: int) -> str:
    return str(uuid.uuid5(_NS, f"{suite_name}/{i}"))


def build_gx_suite(spec: SuiteSpec):
    """The GX ``ExpectationSuite`` of ``spec`` (ids are assigned by the context that stores it)."""
    import great_expectations as gx
    import great_expectations.expectations as gxe
    exps = []
    for e in spec.expectations:
        cls = getattr(gxe, e.type)
        meta = {"area": spec.area}
        if e.examples:
            meta["examples"] = e.examples
        exps.append(cls(**dict(e.kwargs), description=e.description, meta=meta))
    return gx.ExpectationSuite(name=spec.name, expectations=exps,
                               meta={"epochal_suite_version": SUITE_VERSION, "area": spec.area,
                                     "dataset": spec.dataset, "id_columns": list(spec.id_columns),
                                     "per_epoch": spec.per_epoch, "description": spec.description,
                                     "dataset_columns": DATASETS[spec.dataset], **dict(spec.meta)})


def suite_json(spec: SuiteSpec) -> dict[str, Any]:
    """The suite as GX writes it (``ExpectationSuite.to_json_dict()``) with deterministic ids and without
    the GX version stamp, so that the exported file only changes when the suite does."""
    d = build_gx_suite(spec).to_json_dict()
    d.get("meta", {}).pop("great_expectations_version", None)
    d["id"] = str(uuid.uuid5(_NS, spec.name))
    for i, e in enumerate(d.get("expectations", [])):
        e["id"] = _eid(spec.name, i)
    return d


def export_suites(root: str | Path) -> list[Path]:
    """Write every suite to ``<root>/expectations/<name>.json``; returns the paths."""
    out_dir = Path(root) / "expectations"
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for spec in SUITES:
        p = out_dir / f"{spec.name}.json"
        p.write_text(json.dumps(suite_json(spec), indent=2, sort_keys=True) + "\n")
        paths.append(p)
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.quality.suites",
                                 description="Export the Epochal expectation suites as GX JSON.")
    ap.add_argument("--export", default="include/gx", metavar="DIR", help="GX directory (default include/gx)")
    a = ap.parse_args(argv)
    for p in export_suites(a.export):
        print(p)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
