"""Helpers shared by the Airflow tests (imported as ``af_helpers``; fixtures live in conftest.py)."""
from __future__ import annotations

import json
import shutil
import sys
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
JOB = "orders_payments"


def airflow_base_env(home: Path) -> dict[str, str]:
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
    }


def load_dag_module(path: Path):
    """Import a DAG file as a fresh module (parse time sees the current environment)."""
    import importlib.util
    name = f"_epochal_dag_{path.stem}_{uuid.uuid4().hex[:6]}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def committed_vs_oracle(source_uri: str, sink_uri: str, checkpoint_uri: str, *, fileio=None, job: str = JOB,
                        positions_of: str = "head"):
    """Compare the committed sink tables with the independent oracle over the source rows before the
    head checkpoint's positions. Returns ``(report, head metadata)``."""
    from pipeline.checkpoint.store import CompletedCheckpointStore
    from pipeline.demo import oracle
    from pipeline.fileio import file_io_for, join_uri
    from pipeline.sink.table import CommittedTable
    fio = fileio or file_io_for(checkpoint_uri)
    head = CompletedCheckpointStore(fio, join_uri(checkpoint_uri, job), job=job).latest()
    assert head is not None, "no completed checkpoint"
    positions = oracle.load_positions(json.loads(head.metadata.to_json()))
    exp = oracle.expected(source_uri, positions)
    sfio = fileio or file_io_for(sink_uri)
    paid = CommittedTable(sfio, sink_uri, job, "paid_orders").read()
    rev = CommittedTable(sfio, sink_uri, job, "merchant_revenue").read()
    return oracle.compare(exp, {"paid_orders": paid, "merchant_revenue": rev}), head.metadata


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def copy_db(template: Path, home: Path) -> None:
    home.mkdir(parents=True, exist_ok=True)
    shutil.copy2(template, home / "airflow.db")
