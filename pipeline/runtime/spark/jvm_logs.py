"""Spark's JVM log lines at their own level, not as errors.

The Spark driver JVM (and the Python workers it forks) write their log4j output to the process's stderr.
Airflow's task supervisor logs every stderr line of a task at ERROR, so a harmless ``WARN NativeCodeLoader``
becomes a red ERROR line in every task log. While the JVM starts, :func:`relay_jvm_stderr` gives it a pipe
as its stderr (the JVM inherits fd 2 at launch; Python's own fd 2 is restored at once) and a daemon thread
re-logs each line through Python's ``logging`` under ``spark.jvm`` at the line's log4j level (``WARN`` ->
WARNING, ...; continuation lines such as stack traces keep the level of the line they follow; lines with
no level are INFO - Spark's start-up chatter - unless they look like trouble, e.g. a Python worker's
traceback, which is WARNING).

Used when ``EPOCHAL_JVM_LOGS=python`` (the Airflow tasks set it); a terminal keeps Spark's own output.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
from collections.abc import Iterator

from pipeline import settings

__all__ = ["relay_jvm_stderr", "level_of", "ENV"]

ENV = "EPOCHAL_JVM_LOGS"
_LINE = re.compile(r"^\d{2,4}[/-]\d\d[/-]\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?\s+(TRACE|DEBUG|INFO|WARN|WARNING|ERROR|FATAL)\s")
_LEVELS = {"TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
           "WARNING": logging.WARNING, "ERROR": logging.ERROR, "FATAL": logging.CRITICAL}
_TROUBLE = re.compile(r"Traceback|Exception|Error|FATAL|Killed", re.I)
log = logging.getLogger("spark.jvm")


def level_of(line: str, previous: int | None) -> int:
    """The logging level of one JVM stderr line (a continuation line keeps ``previous``)."""
    m = _LINE.match(line)
    if m:
        return _LEVELS[m.group(1)]
    if previous is not None and (line.startswith(("\t", " ", "Caused by", "...")) or not line.strip()):
        return previous
    if _TROUBLE.search(line):
        return logging.WARNING
    return logging.INFO


def _pump(fd: int) -> None:
    previous: int | None = None
    with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as f:
        for raw in f:
            line = raw.rstrip("\n")
            if not line.strip():
                continue
            previous = level_of(line, previous)
            log.log(previous, "%s", line)


@contextlib.contextmanager
def relay_jvm_stderr() -> Iterator[None]:
    """Within this block, child processes started (the Spark JVM) get a relayed stderr; no-op unless enabled."""
    if (settings.raw(ENV) or "").strip().lower() != "python":
        yield
        return
    read_fd, write_fd = os.pipe()
    saved = os.dup(2)
    threading.Thread(target=_pump, args=(read_fd,), name="spark-jvm-stderr", daemon=True).start()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
