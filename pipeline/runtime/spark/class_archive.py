"""The class-data-sharing archive of the Spark JVM an Epochal process starts (HotSpot's dynamic AppCDS, JDK 13+).

A fresh Spark JVM spends most of its start loading and verifying the same ~20,000 classes from ~280 jars. A dynamic
class-data-sharing archive holds them parsed and verified, mapped from one file: on the 2-core development machine a
local SparkSession started in 3.7-4.0 s with the archive against 6.6-6.8 s without, and the first Arrow job took
1.7 s instead of 1.9-2.1 s (docs/performance.md). What the JVM computes is unchanged.

How the archive comes to be, with no step for the user:

* its name is a digest of the JDK (home and runtime version), PySpark's version and jar list, and the JVM options
  (an archive is only valid for the classpath and JVM it was dumped with);
* the first process without an archive starts its JVM with ``-XX:ArchiveClassesAtExit=<name>.<pid>.<random>.part``:
  the JVM dumps the classes it loaded when it exits (a few seconds, after the Python process has ended);
* a later process promotes a ``.part`` file that has not changed for :data:`SETTLED_S` (its dump ended) to
  ``<name>.jsa`` (an atomic rename) and starts with ``-XX:SharedArchiveFile``; while a dump may still be running, a
  process starts without either.

The JVM checks an archive's header against its own classpath and version and runs without it when they differ; its
CDS log lines are switched off (they would go to the process's standard output). Processes that do not start a JVM
of their own (Spark Connect clients, ``spark-submit``) are untouched. ``EPOCHAL_JVM_CLASS_ARCHIVE_DIR`` is the
directory (default ``$XDG_CACHE_HOME/epochal/jvm-classes``, else ``~/.cache/epochal/jvm-classes``; an archive is
about 160 MB); set it to empty to start every JVM without one. Delete the directory to rebuild the archives.
``scripts/bootstrap.sh`` dumps the runtime JVM's archive ahead of the first run
(:func:`pipeline.runtime.spark.session.prepare_class_archive`).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from pipeline import settings

__all__ = ["ARCHIVE_DIR_ENV", "SETTLED_S", "archive_options", "java_release", "promote"]

ARCHIVE_DIR_ENV = "EPOCHAL_JVM_CLASS_ARCHIVE_DIR"
#: a ``.part`` file unchanged this long is a finished dump (a dump takes seconds)
SETTLED_S = 120.0
#: HotSpot logs CDS warnings (signed jars skipped, classes that failed verification) to standard output
_QUIET = "-Xlog:cds*=off"


def java_release(env: Mapping[str, str]) -> tuple[int, str, str] | None:
    """(major version, runtime version, java home) of the JDK ``spark-submit`` will run (``JAVA_HOME``, else the
    ``java`` on ``PATH``), from its ``release`` file; None when it cannot be told."""
    home = env.get("JAVA_HOME")
    if not home:
        java = shutil.which("java", path=env.get("PATH"))
        if java is None:
            return None
        home = str(Path(os.path.realpath(java)).parent.parent)
    try:
        fields = dict(line.split("=", 1) for line in Path(home, "release").read_text().splitlines() if "=" in line)
    except OSError:
        return None
    version = fields.get("JAVA_VERSION", "").strip('"')
    runtime = fields.get("JAVA_RUNTIME_VERSION", version).strip('"')
    try:
        major = int(version.split(".")[0])
    except ValueError:
        return None
    return major, runtime, home


def _archive_dir(env: Mapping[str, str]) -> Path | None:
    configured = settings.raw(ARCHIVE_DIR_ENV, env)
    if configured is not None:
        return Path(configured).expanduser() if configured.strip() else None
    cache = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "epochal" / "jvm-classes"


def _key(opts: str, release: tuple[int, str, str]) -> str:
    import pyspark
    jars = Path(pyspark.__file__).parent / "jars"
    try:
        names = sorted(os.listdir(jars))
    except OSError:
        names = []
    ident = [release[1], release[2], pyspark.__version__, str(jars), names, opts]
    return "spark-" + hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:20]


def archive_options(opts: str, env: Mapping[str, str] | None = None, *, now: float | None = None) -> str:
    """The archive options to add to ``opts`` for the JVM about to start ("" when off or not possible)."""
    env = settings.environ() if env is None else env
    folder = _archive_dir(env)
    release = java_release(env) if folder is not None else None
    if folder is None or release is None or release[0] < 13:  # dynamic archives: JDK 13+
        return ""
    key = _key(opts, release)
    final = folder / f"{key}.jsa"
    now = time.time() if now is None else now
    try:
        if final.is_file() and final.stat().st_size > 0:
            return f"-XX:SharedArchiveFile={final} {_QUIET}"
        folder.mkdir(parents=True, exist_ok=True)
        parts = sorted(folder.glob(f"{key}.*.part"), key=lambda p: p.stat().st_mtime, reverse=True)
        settled = [p for p in parts if now - p.stat().st_mtime >= SETTLED_S and p.stat().st_size > 0]
        if settled and promote(settled[0]) is not None:  # a racing process promotes another finished dump, as good
            for p in settled[1:]:
                p.unlink(missing_ok=True)
            return f"-XX:SharedArchiveFile={final} {_QUIET}"
        if parts:  # a dump may still be running: no archive this time
            return ""
        part = folder / f"{key}.{os.getpid()}.{uuid.uuid4().hex[:8]}.part"
        return f"-XX:ArchiveClassesAtExit={part} {_QUIET}"
    except OSError:  # an unwritable cache directory: the JVM starts as it would without
        return ""


def promote(part: Path) -> Path | None:
    """Make the finished dump ``part`` the archive of its key (an atomic rename); None when nothing was dumped."""
    if not part.is_file() or part.stat().st_size == 0:
        return None
    final = part.parent / f"{part.name.split('.', 1)[0]}.jsa"
    os.replace(part, final)
    return final
