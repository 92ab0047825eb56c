"""DagBag integrity (astro-style): no import errors, tags, retries, thin DAG files without top-level I/O."""
from __future__ import annotations

import ast
import builtins
import socket
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from af_helpers import REPO, load_dag_module

pytestmark = [pytest.mark.airflow]

DAG_FILES = sorted((REPO / "dags").glob("*.py"))
EPOCH_SECONDS = 120


@pytest.fixture(scope="module")
def dagbag(airflow_home, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    root = tmp_path_factory.mktemp("dagbag").as_uri()
    for k, v in {"PIPELINE_EPOCH_SECONDS": str(EPOCH_SECONDS), "PIPELINE_SOURCE_URI": f"{root}/src",
                 "PIPELINE_CHECKPOINT_URI": f"{root}/chk", "PIPELINE_SINK_URI": f"{root}/sink"}.items():
        mp.setenv(k, v)
    from airflow.dag_processing.dagbag import DagBag
    bag = DagBag(dag_folder=str(REPO / "dags"))
    yield bag
    mp.undo()


def test_dag_files_exist():
    names = {p.name for p in DAG_FILES}
    assert {"orders_payments_epochs.py", "orders_payments_savepoint.py", "orders_payments_restore.py"} <= names


def test_no_import_errors(dagbag):
    assert dagbag.import_errors == {}, dagbag.import_errors
    assert {"epochal_orders_payments", "epochal_orders_payments_savepoint",
            "epochal_orders_payments_restore"} <= set(dagbag.dag_ids)


def test_tags_retries_and_docs(dagbag):
    for dag_id, dag in dagbag.dags.items():
        assert dag.tags, f"{dag_id} has no tags"
        assert "epochal" in dag.tags
        assert dag.doc_md and dag.doc_md.strip(), f"{dag_id}: the DAG file docstring must become doc_md"
        for task in dag.tasks:
            if task.task_id == "validate" and dag_id.endswith("_restore"):
                continue  # a failed validation of restored state is not retried on purpose
            assert task.retries >= 1, f"{dag_id}.{task.task_id} has no retries"


def test_doc_md_is_the_module_docstring(dagbag):
    for path in DAG_FILES:
        doc = ast.get_docstring(ast.parse(path.read_text()))
        dags = [d for d in dagbag.dags.values() if Path(d.fileloc).name == path.name]
        assert dags, f"{path.name} defines no DAG"
        for d in dags:
            assert d.doc_md.strip() == (doc or "").strip()


def _check_epoch_dag(dag, tasks: list[str], outlet_task: str) -> None:
    from pipeline.jobs import get_job
    assert [t.task_id for t in dag.topological_sort()] == tasks
    assert dag.max_active_runs == 1
    assert getattr(dag.timetable, "delta", None) == timedelta(seconds=EPOCH_SECONDS), dag.timetable
    assert int(dag.start_date.timestamp()) % EPOCH_SECONDS == 0, "data intervals must be aligned to epochs"
    outlets = {a.name for a in dag.get_task(outlet_task).outlets}
    assert outlets == {f"epochal/orders_payments/{t}" for t in get_job("orders_payments").sink_tables()}
    uris = {a.uri for a in dag.get_task(outlet_task).outlets}
    assert all(u.startswith("file://") and "/sink/orders_payments/" in u for u in uris), uris
    assert dag.get_task("trigger").mode == "reschedule"
    assert all(t.retries == 2 for t in dag.tasks if t.task_id != "trigger")
    assert dag.get_task("trigger").retries >= 5


def test_epoch_dag_shape_by_default_is_fused(dagbag):
    """Issue 31 item 6: the default epoch DAG is ``trigger >> epoch`` (process, commit with the sink Assets, and
    validate in one task), whose trigger pokes at a tenth of the epoch (12 s here; 3 s for 30-s epochs)."""
    dag = dagbag.dags["epochal_orders_payments"]
    _check_epoch_dag(dag, ["trigger", "epoch"], "epoch")
    assert dag.get_task("trigger").poke_interval == EPOCH_SECONDS / 10


def test_four_task_epoch_dag_is_an_opt_in(dagbag, monkeypatch):
    monkeypatch.setenv("EPOCHAL_FUSED_EPOCH", "false")
    dag = load_dag_module(REPO / "dags" / "orders_payments_epochs.py").dag
    _check_epoch_dag(dag, ["trigger", "process", "commit", "validate"], "commit")
    monkeypatch.setenv("EPOCHAL_POKE_SECONDS", "7")
    assert load_dag_module(REPO / "dags" / "orders_payments_epochs.py").dag.get_task("trigger").poke_interval == 7


def test_the_chain_dag_is_scheduled_on_the_upstream_sink_asset(dagbag):
    """``customer_spend`` reads ``orders_payments``' Delta table ``paid_orders`` as a lake source; its epoch DAG
    runs on that table's Asset events (data-aware scheduling), not on the clock, and emits its own sink's Asset."""
    dag = dagbag.dags["epochal_customer_spend"]
    assert type(dag.timetable).__name__ == "AssetTriggeredTimetable", dag.timetable
    condition = dag.timetable.asset_condition
    assert type(condition).__name__ == "AssetAll", condition
    assert {(a.name, a.uri) for a in condition.objects} == {
        (a.name, a.uri) for a in dagbag.dags["epochal_orders_payments"].get_task("epoch").outlets
        if a.name == "epochal/orders_payments/paid_orders"}
    assert dag.max_active_runs == 1
    assert {a.name for a in dag.get_task("epoch").outlets} == {"epochal/customer_spend/customer_spend"}
    from pipeline.jobs import get_job
    (src,) = get_job("customer_spend").sources()
    assert src.table is not None and src.table.location.endswith("/sink/orders_payments/paid_orders")


def test_operations_wait_before_touching_the_job(dagbag):
    """The restore and savepoint tasks themselves (not only what follows them) wait for running epochs."""
    for dag_id, task_id in (("epochal_orders_payments_restore", "restore"),
                            ("epochal_orders_payments_savepoint", "savepoint")):
        assert dagbag.dags[dag_id].get_task(task_id).upstream_task_ids == {"wait_for_epoch_runs"}


def test_manual_dags_have_params(dagbag):
    sp = dagbag.dags["epochal_orders_payments_savepoint"]
    assert type(sp.timetable).__name__ == "NullTimetable"  # manual only
    assert set(sp.params) >= {"target", "stop_after_savepoint"}
    rs = dagbag.dags["epochal_orders_payments_restore"]
    assert set(rs.params) >= {"from", "parallelism", "allow_non_restored_state"}
    assert [t.task_id for t in rs.topological_sort()] == ["wait_for_epoch_runs", "restore", "validate"]


def _is_thin(tree: ast.Module) -> list[str]:
    """DAG files: docstring, imports, one `dag = <factory>(...)` and `if __name__ == "__main__": dag.test()`."""
    problems = []
    has_main = False
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call):
            fn = node.value.func
            name = fn.id if isinstance(fn, ast.Name) else getattr(fn, "attr", "")
            if name.startswith("build_"):
                continue
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            has_main = "dag.test()" in ast.unparse(node)
            continue
        problems.append(f"line {node.lineno}: {ast.unparse(node)[:80]}")
    if not has_main:
        problems.append('missing `if __name__ == "__main__": dag.test()`')
    return problems


@pytest.mark.parametrize("path", DAG_FILES, ids=lambda p: p.name)
def test_dag_file_is_thin(path):
    tree = ast.parse(path.read_text())
    assert ast.get_docstring(tree), f"{path.name} has no docstring"
    assert _is_thin(tree) == [], f"{path.name} is not a thin DAG file"


@pytest.mark.parametrize("path", DAG_FILES, ids=lambda p: p.name)
def test_no_top_level_io(path, dagbag, monkeypatch):
    """Parsing a DAG file opens no file, socket, subprocess, S3 client or Spark session (imports warmed up)."""
    load_dag_module(path)  # warm up imports (they may read files)
    touched: list[str] = []

    def trip(what):
        def f(*a, **k):
            touched.append(f"{what}{a[:1]}")
            raise AssertionError(f"top-level I/O while parsing {path.name}: {what}{a[:1]}")
        return f

    import pipeline.fileio as fio
    monkeypatch.setattr(builtins, "open", trip("open"))
    monkeypatch.setattr(socket.socket, "connect", trip("socket.connect"))
    monkeypatch.setattr(subprocess, "Popen", trip("subprocess.Popen"))
    for cls in (fio.LocalFileIO, fio.S3FileIO):
        for meth in ("read_bytes", "write_bytes", "exists", "list", "list_dirs", "open_input", "open_output"):
            monkeypatch.setattr(cls, meth, trip(f"{cls.__name__}.{meth}"))
    import pipeline.runtime.spark.session as sess
    monkeypatch.setattr(sess, "get_spark", trip("get_spark"))
    load_dag_module(path)
    assert touched == []


#: engines a DAG file must not import at parse time (the scheduler parses every file every few seconds)
ENGINES = ("pyspark", "pandas", "great_expectations", "deltalake", "pyiceberg", "boto3", "duckdb")


@pytest.mark.parametrize("path", DAG_FILES, ids=lambda p: p.name)
def test_parsing_imports_no_engine(path, dagbag):
    """Parsing is fast because it imports no engine: a DAG file parsed in a fresh interpreter (as Airflow's DAG
    processor does) leaves none of ``ENGINES`` in ``sys.modules``. Replaces a wall-clock bound (< 2 s), which
    measured the machine's load as much as the DAG file (issue 34, item 13)."""
    import os
    import sys
    code = ("import runpy, sys; runpy.run_path(sys.argv[1]); "
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({ENGINES!r})))")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ), cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def test_human_approval_is_off_by_default_and_wired_when_on(dagbag, monkeypatch):
    """EPOCHAL_APPROVE_RESTORE / EPOCHAL_APPROVE_REWIND add Airflow's ApprovalOperator before the restore (and
    before its wait for running epochs) and between trigger and the epoch task; without them there is no approval task."""
    from airflow.providers.standard.operators.hitl import ApprovalOperator
    assert "approve_restore" not in dagbag.dags["epochal_orders_payments_restore"].task_ids
    assert "approve_rewind" not in dagbag.dags["epochal_orders_payments"].task_ids
    monkeypatch.setenv("EPOCHAL_APPROVE_RESTORE", "true")
    monkeypatch.setenv("EPOCHAL_APPROVE_REWIND", "true")
    restore = load_dag_module(REPO / "dags" / "orders_payments_restore.py").dag
    t = restore.get_task("approve_restore")
    assert isinstance(t, ApprovalOperator) and t.defaults == ["Reject"] and t.retries == 0
    assert restore.get_task("wait_for_epoch_runs").upstream_task_ids == {"approve_restore"}
    assert [x.task_id for x in restore.topological_sort()] == ["approve_restore", "wait_for_epoch_runs", "restore",
                                                              "validate"]
    epochs = load_dag_module(REPO / "dags" / "orders_payments_epochs.py").dag
    assert isinstance(epochs.get_task("approve_rewind"), ApprovalOperator)
    assert epochs.get_task("epoch").upstream_task_ids == {"trigger", "approve_rewind"}
    monkeypatch.setenv("EPOCHAL_APPROVAL_TIMEOUT_SECONDS", "soon")
    from pipeline.exceptions import ConfigError
    with pytest.raises(ConfigError, match="EPOCHAL_APPROVAL_TIMEOUT_SECONDS"):
        load_dag_module(REPO / "dags" / "orders_payments_restore.py")
