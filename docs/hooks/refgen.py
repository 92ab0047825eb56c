"""Reference pages generated from the code, so they cannot drift (an MkDocs hook, and a module the tests import).

A page holds a marker line; at build time the hook replaces it with a table generated from the declarations:

* ``<!-- refgen:config -->``: every :class:`pipeline.config.PipelineConfig` field (key, type, default and the
  attribute docstring under the field), then the other ``PIPELINE_*``/``EPOCHAL_*`` variables the package reads
  (found by scanning its sources; their doc lines are kept in :data:`OTHER_SETTINGS` below until they too are
  declared in one settings module, issue 30 item 5);
* ``<!-- refgen:cli -->``: every command, sub-command and flag of :func:`pipeline.cli.build_parser`.

Run ``python docs/hooks/refgen.py config|cli`` to print a table.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CONFIG_PY = REPO / "pipeline" / "config.py"

# Variables read outside PipelineConfig: documented here (a test fails when the package reads one not listed).
# Keys: variable -> doc line. "(internal)" marks test / benchmark / fault-injection switches.
OTHER_SETTINGS: dict[str, str] = {
    "EPOCHAL_EXECUTOR_S3_PROBE_SECONDS": "(Spark Connect on a cluster) how long the probe of the executors' S3 "
                                         "access may take before the run is refused (default 15)",
    "PIPELINE_STATE_CACHE_DIR": "(executors) local directory of the warm state cache; default "
                                "`$TMPDIR/epochal-state-cache`",
    "PIPELINE_STATE_CACHE_MAX_BYTES": "(executors) size bound of the warm state cache",
    "PIPELINE_STATE_STORE_DIR": "(executors, `rocksdb`) where an executor keeps its RocksDB stores; default "
                                "`<PIPELINE_STATE_CACHE_DIR>/keyed`",
    "PIPELINE_STATE_MERGE_MEMORY_BYTES": "(executors, `rocksdb`) a new base is merged from the parent chain in Arrow "
                                         "while its deltas and the round's delta fit this budget (default 32 MiB); "
                                         "above it the store is scanned",
    "PIPELINE_STATE_STORE_CACHE_BYTES": "(executors, `rocksdb`) one LRU block cache per Python worker shared by all "
                                        "its stores, memtables charged to it (default 32 MiB)",
    "PIPELINE_STATE_STORE_WRITE_BUFFER_BYTES": "(executors, `rocksdb`) memtable size per store (default 8 MiB)",
    "PIPELINE_STATE_STORE_WRITE_BUFFERS": "(executors, `rocksdb`) memtables per store (default 2)",
    "PIPELINE_STATE_STORE_MAX_OPEN_FILES": "(executors, `rocksdb`) open SST files per store (default 64)",
    "PIPELINE_STATE_STORE_SWEEP_S": "(executors, `rocksdb`) how often a process sweeps the store root (default 3600)",
    "PIPELINE_STATE_STORE_MAX_IDLE_S": "(executors, `rocksdb`) a store directory without a write for this long is "
                                       "removed (default 604800; `0`: never)",
    "PIPELINE_S3_RETRY_SECONDS": "retry budget of one S3 request (transient faults, outages), default 90",
    "PIPELINE_S3_RETRY_BASE_MS": "first back-off of the S3 retries, default 200 ms",
    "PIPELINE_S3_RETRY_MAX_BACKOFF_SECONDS": "longest back-off of the S3 retries, default 5 s",
    "PIPELINE_S3_BOTO_ATTEMPTS": "boto3's own attempts per call, default 1 (the retries above do the work)",
    "PIPELINE_S3_PART_MB": "multipart upload part size in MiB, default 32",
    "PIPELINE_S3_LIST_PAGE_SIZE": "keys per S3 LIST page, default 1000 (tests set it small)",
    "EPOCHAL_HOME": "directory of the default `file://` roots (default `$PWD/.epochal`)",
    "EPOCHAL_CONFIG": "YAML config file the Airflow tasks load (the `--config` of the CLI)",
    "EPOCHAL_SPARK_LOG_LEVEL": "Spark's log level in Epochal's sessions",
    "EPOCHAL_DRIVER_MEMORY": "`spark.driver.memory` of the sessions Epochal starts",
    "EPOCHAL_BATCH_JVM_OPTS": "JVM options of the short-lived `validate` / `batch` / `bootstrap` processes",
    "EPOCHAL_BATCH_NATIVE_READ": "the batch plan reads Parquet sources with Spark's native reader",
    "EPOCHAL_WORKER_PREIMPORT": "modules the Python workers import ahead of the first task",
    "EPOCHAL_WORKER_RELEASE_MEMORY": "Python workers return freed memory to the OS after a task",
    "EPOCHAL_CONNECT_TIMEOUT": "seconds to wait for a Spark Connect server",
    "EPOCHAL_QUALITY_LOCAL_MAX_BYTES": "quality suites: sink tables up to this size are read on the driver",
    "EPOCHAL_QUALITY_LOCAL_SMALL_BYTES": "quality suites: threshold of the small-table fast path",
    "EPOCHAL_RESTORE_VALIDATE": "what a restore validates: full (default), cheap or none (docs/quality.md)",
    "EPOCHAL_DATA_DOCS_DIR": "where Great Expectations Data Docs are rendered",
    "EPOCHAL_FUSED_EPOCH": "Airflow: `trigger >> epoch` (process, commit and validate in one task)",
    "EPOCHAL_SPARK_CONNECT": "Airflow: the tasks use a long-lived Spark Connect server",
    "EPOCHAL_AWS_CONN_ID": "Airflow connection that supplies the S3 settings (default `epochal_s3`)",
    "EPOCHAL_START_DATE": "Airflow: start date of the epoch DAGs",
    "EPOCHAL_END_DATE": "Airflow: end date of the epoch DAGs",
    "EPOCHAL_CATCHUP": "Airflow: `catchup` of the epoch DAGs",
    "EPOCHAL_DAG_RETRIES": "Airflow: task retries",
    "EPOCHAL_DAG_RETRY_DELAY_SECONDS": "Airflow: delay between task retries",
    "EPOCHAL_POKE_SECONDS": "Airflow: poke interval of the trigger sensor",
    "EPOCHAL_TRIGGER_WAIT_SECONDS": "Airflow: how long the trigger task waits for an epoch to close",
    "EPOCHAL_TRIGGER_TIMEOUT_SECONDS": "Airflow: timeout of the trigger task",
    "EPOCHAL_APPROVE_RESTORE": "Airflow: a human approves a restore before it runs",
    "EPOCHAL_APPROVE_REWIND": "Airflow: a human approves a rewind before it runs",
    "EPOCHAL_APPROVAL_TIMEOUT_SECONDS": "Airflow: how long an approval may wait",
    "EPOCHAL_AIRFLOW_PASSWORD": "password of the local `airflow standalone` admin (scripts)",
    "EPOCHAL_TASK_PROFILE": "(internal) profile the operator tasks (benchmarks)",
    "EPOCHAL_STATE_TRACE": "(internal) trace state reads and writes",
    "EPOCHAL_SPARK_TASK_ERRORS": "(internal) how task errors are reported by Spark in tests",
    "EPOCHAL_ICEBERG_COUNTED_IO": "(internal) count Iceberg's storage requests (benchmarks)",
    "EPOCHAL_PHASE": "(internal) crash tests: the phase a kill targets",
    "EPOCHAL_PHASE_MARKERS": "(internal) crash tests: write phase marker files",
    "EPOCHAL_KILL_AT": "(internal) crash tests: kill the process at this point",
    "EPOCHAL_KILL_SCOPE": "(internal) crash tests: what the kill takes down",
    "EPOCHAL_FAIL_AT": "(internal) fault injection: fail at this fault point",
    "EPOCHAL_FAULT": "(internal) fault injection: the fault to inject",
    "EPOCHAL_ATTEMPT_FAULT": "(internal) fault injection: fail a task attempt",
    "EPOCHAL_AIRFLOW_FAIL_ONCE": "(internal) Airflow tests: fail a task once",
    "EPOCHAL_JVM_LOGS": "(internal) keep the JVM's logs of a run",
}
_NOT_SETTINGS = {"PIPELINE_X"}  # the docstring's "field x is read from PIPELINE_X"
_VAR = re.compile(r"\b(?:PIPELINE|EPOCHAL)_[A-Z0-9_]*[A-Z0-9]\b")
_SCANNED = ("pipeline", "dags", "plugins", "include")


@dataclasses.dataclass(frozen=True)
class ConfigKey:
    key: str
    type: str
    default: str
    doc: str


def config_keys() -> list[ConfigKey]:
    """The fields of ``PipelineConfig`` in declaration order, with their attribute docstrings (read with ast)."""
    from pipeline import config as cfg_mod

    tree = ast.parse(CONFIG_PY.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "PipelineConfig")
    docs: dict[str, str] = {}
    types: dict[str, str] = {}
    body = cls.body
    for i, node in enumerate(body):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
            types[name] = ast.unparse(node.annotation)
            nxt = body[i + 1] if i + 1 < len(body) else None
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
                docs[name] = " ".join(nxt.value.value.split())
    home = cfg_mod._DEFAULT_ROOT.as_uri()
    out = []
    for f in dataclasses.fields(cfg_mod.PipelineConfig):
        default: Any = f.default
        if hasattr(default, "value"):  # an enum
            default = default.value
        if isinstance(default, bool):
            shown = "true" if default else "false"
        elif isinstance(default, str):
            shown = default.replace(home, "file://$EPOCHAL_HOME") if default else "(empty)"
        else:
            shown = str(default)
        out.append(ConfigKey(f"PIPELINE_{f.name.upper()}", types.get(f.name, str(f.type)), shown,
                             docs.get(f.name, "")))
    return out


def other_settings() -> dict[str, list[str]]:
    """Variables the package's sources name that are not PipelineConfig keys -> the files that name them."""
    from pipeline.config import CONFIG_KEYS

    found: dict[str, set[str]] = {}
    for top in _SCANNED:
        for path in sorted((REPO / top).rglob("*.py")):
            for var in set(_VAR.findall(path.read_text())):
                if var not in CONFIG_KEYS and var not in _NOT_SETTINGS:
                    found.setdefault(var, set()).add(str(path.relative_to(REPO)))
    return {k: sorted(v) for k, v in sorted(found.items())}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def config_markdown() -> str:
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for k in config_keys():
        lines.append(f"| `{k.key}` | `{_cell(k.type)}` | `{_cell(k.default)}` | {_cell(k.doc)} |")
    lines += ["", "### Other environment variables", "",
              "Read where they are used (executors, Airflow, tests) rather than through `PipelineConfig`; "
              "`(internal)` marks switches of the tests and benchmarks.", "",
              "| variable | meaning | read in |", "|---|---|---|"]
    for var, files in other_settings().items():
        where = ", ".join(f"`{f}`" for f in files[:3]) + (" ..." if len(files) > 3 else "")
        lines.append(f"| `{var}` | {_cell(OTHER_SETTINGS.get(var, '(not documented yet)'))} | {where} |")
    return "\n".join(lines)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _help_of(parser: argparse.ArgumentParser, name: str) -> str:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                if choice.dest == name:
                    return choice.help or ""
    return ""


def _flag(action: argparse.Action) -> str:
    opt = " / ".join(action.option_strings)
    if action.nargs == 0:
        return opt
    metavar = action.metavar or action.dest.upper()
    return f"{opt} {metavar}"


def cli_markdown() -> str:
    from pipeline.cli import build_parser

    root = build_parser()
    out: list[str] = []

    def emit(prefix: str, parent: argparse.ArgumentParser) -> None:
        for name, p in _subparsers(parent).items():
            full = f"{prefix} {name}".strip()
            children = _subparsers(p)
            if children:
                emit(full, p)
                continue
            out.append(f"### `{full}`\n\n{_help_of(parent, name)}\n")
            out.append(f"```text\n{p.format_usage().strip()}\n```\n")
            out.append("| flag | required | default | meaning |\n|---|---|---|---|")
            for a in p._actions:
                if isinstance(a, argparse._HelpAction) or not a.option_strings:
                    continue
                default = "" if a.default in (None, False, argparse.SUPPRESS) else f"`{a.default}`"
                out.append(f"| `{_cell(_flag(a))}` | {'yes' if a.required else ''} | {default} | "
                           f"{_cell(a.help or '')} |")
            out.append("")

    emit("", root)
    return "\n".join(out)


GENERATORS = {"config": config_markdown, "cli": cli_markdown}
_MARKER = re.compile(r"^<!-- refgen:(\w+) -->$", re.M)


def expand(markdown: str) -> str:
    return _MARKER.sub(lambda m: GENERATORS[m.group(1)](), markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs hook: replace the markers of a page with the generated tables."""
    return expand(markdown) if "<!-- refgen:" in markdown else markdown


if __name__ == "__main__":
    print(GENERATORS[sys.argv[1]]())
