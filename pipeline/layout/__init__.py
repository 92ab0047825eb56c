"""Storage layout: every key Epochal writes under its roots is built here, and only here.

::

    <checkpoint root>/<job>/
      job.json                                  # job id, max parallelism, operator uids, created
      ids/<id:012d>                             # checkpoint id claims (fencing; create-only)
      barriers/epoch-<n>.json                   # the write-ahead barrier log
      barriers/rounds/epoch-<n>-chk-<id>-r<k>.json  # write-ahead round log: where round k >= 1 of a checkpoint
                                                #   starts (checkpoints that take several rounds; round 0 of unaligned ones)
      barriers/lagged/epoch-<n>-chk-<id>.json   # where a checkpoint that completed while a partition lagged
                                                #   (epoch n not logged) stopped reading each partition
      checkpoints/chk-<id>/
        _pending.json                           # pending manifest (written at trigger)
        _metadata                               # written last, create-only: the checkpoint exists
        rounds/<k>/_plan.json                   # round plan (write-ahead)
        rounds/<k>/state/<uid>/...              # state files written by the tasks of round k
        rounds/<k>/acks/<uid>/...               # acks of chained operators (scratch)
        channel/<uid>/r<k>/...                  # unaligned channel state (in-flight data)
      shared/<uid>/<state>/kg-<a>-<b>/          # incremental state files (bases + deltas) shared by checkpoints:
        c<id:012d>-r<k>-<base|delta>...          #   written by checkpoint <id> round <k>; deleted only when no
                                                #   retained checkpoint and no savepoint references them
      savepoints/sp-<id>-<ts>/                  # self-contained savepoints (same inside)
      failed/chk-<id>.json                      # why a checkpoint was aborted (the newest few)
      restores/<time>-<seq>.json                # restore and rewind events
      validation/<chk-<id>|sp-<id>>/[epoch/]summary.json  # data-quality results per snapshot
      data_docs/index.html                      # the Data Docs site
      orchestration/control.json                # Airflow-side control records
      orchestration/savepoints/<id:012d>.json   #   savepoints taken through Airflow
    <checkpoint root>/_replay/<token>/          # scratch roots of a determinism replay
    <sink root>/<job>/<table>/
      data/txn-<id>/part-<subtask>...           # staged output of checkpoint <id>
      _commits/<id:012d>.json                   # the commit log (readers see committed data only)
    <dead-letter root>/<job>/...                # bad input and late records (:mod:`pipeline.layout.dead_letters`)

State files are named by their key-group range, ``kg-<a:05d>-<b:05d>`` (:func:`key_group_name`); the logs under
``barriers/`` are parsed with the patterns of :mod:`pipeline.layout.logs`. The source side (``partition=<p>/
<seq>.parquet``, the files users write) is :mod:`pipeline.source.layout`.

Functions take and return URIs (strings); :func:`pipeline.fileio.join_uri` joins the segments. A test
(``tests/unit/test_storage_keys.py``) fails on a key literal anywhere else in the package.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from pipeline.fileio import join_uri

__all__ = ["METADATA_FILE", "PENDING_FILE", "JOB_FILE", "CHECKPOINTS_DIR", "SAVEPOINTS_DIR", "BARRIERS_DIR",
           "IDS_DIR", "VALIDATION_DIR", "ORCHESTRATION_DIR", "ROUNDS_DIR", "LAGGED_DIR", "SINK_DATA_DIR", "SINK_COMMITS_DIR",
           "checkpoint_dir_name", "checkpoint_id_of", "savepoint_dir_name", "snapshot_name", "JobLayout",
           "round_dir", "round_plan_uri", "round_state_prefix", "round_acks_prefix", "channel_prefix",
           "id_claim_name", "sink_table_uri", "sink_staging_uri", "sink_commit_name"]

METADATA_FILE = "_metadata"
PENDING_FILE = "_pending.json"
JOB_FILE = "job.json"
CHECKPOINTS_DIR = "checkpoints"
SAVEPOINTS_DIR = "savepoints"
BARRIERS_DIR = "barriers"
IDS_DIR = "ids"
VALIDATION_DIR = "validation"
ORCHESTRATION_DIR = "orchestration"
ROUNDS_DIR = "rounds"
LAGGED_DIR = "lagged"
SINK_DATA_DIR = "data"
SINK_COMMITS_DIR = "_commits"
SHARED_DIR = "shared"
RESTORES_DIR = "restores"
FAILED_DIR = "failed"
DATA_DOCS_DIR = "data_docs"
DATA_DOCS_INDEX = "index.html"
VALIDATION_SUMMARY_FILE = "summary.json"
VALIDATION_EPOCH_DIR = "epoch"          # results of the cheap per-epoch subset (never overwrites a full run's)
CONTROL_FILE = "control.json"
REPLAY_DIR = "_replay"
EXPORT_DONE_FILE = "_SUCCESS"           # written last by ``export`` / ``state``: the target is complete
STATE_DIR = "state"
_CHK = "chk-"
_TXN = "txn-"
_KG = "kg-"


# ------------------------------------------------------------------------------------------- names
def checkpoint_dir_name(checkpoint_id: int | str) -> str:
    """``chk-<id>`` (``chk-?`` as a placeholder in a plan built before the id is known)."""
    return f"{_CHK}{checkpoint_id}"


def checkpoint_id_of(name: str) -> int | None:
    """The id of a ``chk-<id>`` directory name, None for any other name."""
    if name.startswith(_CHK) and name[len(_CHK):].isdigit():
        return int(name[len(_CHK):])
    return None


def savepoint_dir_name(checkpoint_id: int, ts: str) -> str:
    return f"sp-{checkpoint_id}-{ts}"


def snapshot_name(checkpoint_id: int, *, savepoint: bool) -> str:
    """``chk-<id>`` or ``sp-<id>``: how results and history name a retained checkpoint or a savepoint."""
    return ("sp-" if savepoint else _CHK) + str(checkpoint_id)


def id_claim_name(checkpoint_id: int) -> str:
    return f"{checkpoint_id:012d}"


def restore_event_name(at: str, seq: int) -> str:
    """``<UTC time, sortable>-<seq>.json``: one restore or rewind event in ``<job root>/restores/``."""
    return f"{at.replace(':', '').replace('-', '')}-{int(seq):06d}.json"


def sink_commit_name(checkpoint_id: int) -> str:
    return f"{checkpoint_id:012d}.json"


def failed_record_name(checkpoint_id: int) -> str:
    """``chk-<id>.json``: why checkpoint ``checkpoint_id`` was aborted, in ``<job root>/failed/``."""
    return f"{checkpoint_dir_name(int(checkpoint_id))}.json"


def failed_record_id_of(name: str) -> int | None:
    """The checkpoint id of a ``chk-<id>.json`` failure record name, None for any other name."""
    return checkpoint_id_of(name[:-len(".json")]) if name.endswith(".json") else None


def control_savepoint_name(savepoint_id: int) -> str:
    """``<id:012d>.json``: a savepoint taken through Airflow, in ``orchestration/savepoints/``."""
    return f"{int(savepoint_id):012d}.json"


def key_group_name(kg_start: int, kg_end: int) -> str:
    """``kg-<a:05d>-<b:05d>``: the key-group range ``[a, b]`` in a state, channel or dead-letter file name."""
    return f"{_KG}{kg_start:05d}-{kg_end:05d}"


def key_group_range_of(name: str) -> tuple[int, int] | None:
    """``(a, b)`` of a ``kg-<a>-<b>`` directory name, None for any other name."""
    m = _KG_NAME.match(name)
    return (int(m.group(1)), int(m.group(2))) if m else None


_KG_NAME = re.compile(r"^kg-(\d{5})-(\d{5})$")


def key_group_file(prefix: str, name: str, kg_start: int, kg_end: int) -> str:
    """``<prefix>/<name>/kg-<a>-<b>.parquet``: one state (or parked channel) file of a key-group range."""
    return f"{prefix}/{name}/{key_group_name(kg_start, kg_end)}.parquet"


def snapshot_state_uri(location: str, uid: str, name: str, subtask: int, kg_start: int, kg_end: int) -> str:
    """``<location>/state/<uid>/<name>/<subtask:05d>-kg-<a>-<b>.parquet``: a state file of a savepoint written
    as a copy (bases only)."""
    return join_uri(location, STATE_DIR, uid, name, f"{subtask:05d}-{key_group_name(kg_start, kg_end)}.parquet")


# ------------------------------------------------------------------------------------ job root
@dataclass(frozen=True)
class JobLayout:
    """Keys under ``<checkpoint root>/<job>``."""

    root: str

    @classmethod
    def of(cls, checkpoint_root: str, job: str) -> JobLayout:
        return cls(join_uri(checkpoint_root, job))

    def job_json(self) -> str:
        return join_uri(self.root, JOB_FILE)

    def ids(self) -> str:
        return join_uri(self.root, IDS_DIR)

    def checkpoints(self) -> str:
        return join_uri(self.root, CHECKPOINTS_DIR)

    def checkpoint(self, checkpoint_id: int) -> str:
        return join_uri(self.root, CHECKPOINTS_DIR, checkpoint_dir_name(checkpoint_id))

    def savepoints(self) -> str:
        return join_uri(self.root, SAVEPOINTS_DIR)

    def savepoint(self, checkpoint_id: int, ts: str) -> str:
        return join_uri(self.root, SAVEPOINTS_DIR, savepoint_dir_name(checkpoint_id, ts))

    def shared(self, uid: str | None = None) -> str:
        """``shared/`` (or ``shared/<uid>``): state files referenced across checkpoints (incremental)."""
        return join_uri(self.root, SHARED_DIR, uid) if uid else join_uri(self.root, SHARED_DIR)

    def barrier(self, epoch: int) -> str:
        return join_uri(self.root, BARRIERS_DIR, f"epoch-{epoch}.json")

    def round_log(self) -> str:
        """``barriers/rounds/``: the write-ahead round log (where each later round of a checkpoint starts)."""
        return join_uri(self.root, BARRIERS_DIR, ROUNDS_DIR)

    def round_start(self, epoch: int, checkpoint_id: int, rnd: int) -> str:
        """Where round ``rnd`` (>= 1) of checkpoint ``checkpoint_id`` (epoch ``epoch``) starts reading."""
        return join_uri(self.root, BARRIERS_DIR, ROUNDS_DIR, f"epoch-{epoch}-chk-{checkpoint_id:012d}-r{rnd}.json")

    def lag_log(self) -> str:
        """``barriers/lagged/``: the lag log (see :meth:`lagged_read`)."""
        return join_uri(self.root, BARRIERS_DIR, LAGGED_DIR)

    def lagged_read(self, epoch: int, checkpoint_id: int) -> str:
        """Where checkpoint ``checkpoint_id`` of epoch ``epoch``, which completed while a partition lagged (the
        epoch is not in the barrier log), stopped reading each source partition."""
        return join_uri(self.root, BARRIERS_DIR, LAGGED_DIR, f"epoch-{epoch}-chk-{checkpoint_id:012d}.json")

    def validation(self, snapshot: str | None = None) -> str:
        return join_uri(self.root, VALIDATION_DIR, snapshot) if snapshot else join_uri(self.root, VALIDATION_DIR)

    def orchestration(self) -> str:
        return join_uri(self.root, ORCHESTRATION_DIR)

    def failed(self) -> str:
        """``failed/``: why the newest aborted checkpoints failed."""
        return join_uri(self.root, FAILED_DIR)

    def restores(self) -> str:
        return join_uri(self.root, RESTORES_DIR)

    def data_docs(self) -> str:
        """``data_docs/``: the job's Data Docs site."""
        return join_uri(self.root, DATA_DOCS_DIR)

    def barriers(self) -> str:
        """``barriers/``: the barrier log (with the round and lag logs below it)."""
        return join_uri(self.root, BARRIERS_DIR)


# ------------------------------------------------------------------------ inside a checkpoint dir
def metadata_uri(location: str) -> str:
    return join_uri(location, METADATA_FILE)


def pending_uri(location: str) -> str:
    return join_uri(location, PENDING_FILE)


def round_dir(location: str, rnd: int) -> str:
    return f"{location}/{ROUNDS_DIR}/{rnd}"


def round_plan_uri(location: str, rnd: int) -> str:
    return f"{round_dir(location, rnd)}/_plan.json"


def round_state_prefix(location: str, rnd: int, uid: str | None = None) -> str:
    base = f"{round_dir(location, rnd)}/state"
    return f"{base}/{uid}" if uid is not None else base


def round_acks_prefix(location: str, rnd: int, uid: str) -> str:
    return f"{round_dir(location, rnd)}/acks/{uid}"


def round_unused_prefix(location: str, rnd: int, uid: str) -> str:
    """Output prefix of an operator without a sink (nothing is written there)."""
    return f"{round_dir(location, rnd)}/unused/{uid}"


def channel_prefix(location: str, uid: str, rnd: int) -> str:
    return f"{location}/channel/{uid}/r{rnd}"


# ------------------------------------------------------------------------------- shared state
_SHARED_NAME = re.compile(r"/c(\d{12})-r(\d+)-(base|delta)[^/]*$")


def shared_state_uri(shared_prefix: str, state: str, kg_start: int, kg_end: int, checkpoint_id: int, rnd: int,
                     kind: str) -> str:
    """``<shared>/<state>/kg-<a>-<b>/c<id>-r<k>-<kind>.parquet``: a base or delta file of one state chain,
    written by round ``rnd`` of checkpoint ``checkpoint_id`` (the task adds its attempt id)."""
    if kind not in ("base", "delta"):
        raise ValueError(f"shared state file kind must be base or delta, got {kind!r}")
    return f"{shared_prefix}/{state}/kg-{kg_start:05d}-{kg_end:05d}/c{checkpoint_id:012d}-r{rnd}-{kind}.parquet"


def shared_writer_id(uri: str) -> int | None:
    """The id of the checkpoint that wrote shared state file ``uri`` (None: not a shared state file name)."""
    m = _SHARED_NAME.search(uri)
    return int(m.group(1)) if m else None


# --------------------------------------------------------------------------------------- sinks
def sink_table_uri(sink_root: str, job: str, table: str) -> str:
    return join_uri(sink_root, job, table)


def sink_data_uri(table_uri: str) -> str:
    return join_uri(table_uri, SINK_DATA_DIR)


def sink_commits_uri(table_uri: str) -> str:
    return join_uri(table_uri, SINK_COMMITS_DIR)


def sink_txn_name(checkpoint_id: int) -> str:
    """``txn-<id>``: the staging directory (and transaction name) of checkpoint ``checkpoint_id``."""
    return f"{_TXN}{checkpoint_id}"


def sink_txn_id_of(name: str) -> int | None:
    """The checkpoint id of a ``txn-<id>`` name, None for any other name."""
    if name.startswith(_TXN) and name[len(_TXN):].isdigit():
        return int(name[len(_TXN):])
    return None


def sink_staging_uri(table_uri: str, checkpoint_id: int) -> str:
    """``data/txn-<id>``: where tasks stage the files of checkpoint ``checkpoint_id``."""
    return join_uri(table_uri, SINK_DATA_DIR, sink_txn_name(checkpoint_id))


# --------------------------------------------------------------------------- quality and tools
def replay_root(root: str, token: str) -> str:
    """``<root>/_replay/<token>``: a scratch root of one determinism replay."""
    return join_uri(root, REPLAY_DIR, token)


def validation_results_uri(snapshot_dir: str, *, epoch_mode: bool) -> str:
    """Where one validation writes: ``<validation>/<snapshot>`` (full) or its ``epoch/`` (the per-epoch subset)."""
    return join_uri(snapshot_dir, VALIDATION_EPOCH_DIR) if epoch_mode else snapshot_dir


__all__ += ["SHARED_DIR", "shared_state_uri", "shared_writer_id", "metadata_uri", "pending_uri", "round_unused_prefix", "sink_data_uri", "sink_commits_uri"]
__all__ += ["RESTORES_DIR", "restore_event_name"]
__all__ += ["FAILED_DIR", "DATA_DOCS_DIR", "DATA_DOCS_INDEX", "VALIDATION_SUMMARY_FILE", "VALIDATION_EPOCH_DIR",
            "CONTROL_FILE", "REPLAY_DIR", "EXPORT_DONE_FILE", "STATE_DIR", "failed_record_name",
            "failed_record_id_of", "control_savepoint_name", "key_group_name", "key_group_range_of", "key_group_file",
            "snapshot_state_uri", "sink_txn_name", "sink_txn_id_of", "replay_root", "validation_results_uri"]
