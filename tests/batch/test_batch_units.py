"""Units of the batch evaluation that need no Spark."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.batch.evaluation.prefix import Prefix, ordinal

pytestmark = [pytest.mark.unit]


def test_the_library_does_not_import_the_demo():
    code = ("import sys, pipeline.batch, pipeline.quality.collect, pipeline.quality.recovery, "
            "pipeline.quality.validate; bad = [m for m in sys.modules if m.startswith('pipeline.demo')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_processing_epoch_lookup_follows_the_barrier_log():
    """Barrier k of a partition that was idle stays where it was; rows after it belong to the next barrier."""
    pre = Prefix(7, 60, {"s": {0: (5, 0)}}, {4: {"s": {0: (2, 10)}}, 5: {"s": {0: (2, 10)}}, 6: {"s": {0: (4, 3)}}})
    ords, eps = pre.lookup("s")[0]
    assert eps.tolist() == [4, 5, 6, 7]
    rows = np.array([ordinal(2, 9), ordinal(2, 10), ordinal(4, 2), ordinal(4, 3)])
    idx = np.searchsorted(ords, rows, side="right")
    assert eps[idx].tolist() == [4, 6, 6, 7]   # (2,10) was behind barriers 4 and 5: consumed for epoch 6


def test_prefix_epoch_arithmetic():
    pre = Prefix(3, 60, {}, {})
    assert pre.end_us(3) == 4 * 60_000_000 and pre.epoch_us == 60_000_000


def test_bootstrap_skips_only_parquet_files_whose_footer_proves_them_clean(tmp_path):
    """Bootstrap's dead-letter pass reads again only the files that may hold a bad record: a Parquet footer with every
    declared column of exactly its type and statistics without a null key, an empty-string key or a null
    ``_ingest_ts`` proves a file clean; anything else (a null, an empty key, another type, no statistics) is read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline import Job
    from pipeline.batch.bootstrap.suspects import clean_file as _clean_file
    ts = pa.timestamp("us", tz="UTC")
    schema = pa.schema([("k", pa.string()), ("v", pa.float64()), ("_ingest_ts", ts)])
    job = Job("units_dl")
    job.source("s", schema, key="k")
    src = job.sources()[0]

    def write(name, k, v=(1.0, 2.0), t=(1, 2), typ=None, stats=True):
        p = tmp_path / name
        pq.write_table(pa.table({"k": pa.array(k, pa.string()), "v": pa.array(v, typ or pa.float64()),
                                 "_ingest_ts": pa.array(t, pa.int64()).cast(ts)}), p, write_statistics=stats)
        return str(p)

    assert _clean_file(write("ok.parquet", ["a", "b"]), src)
    assert not _clean_file(write("null_key.parquet", ["a", None]), src)
    assert not _clean_file(write("empty_key.parquet", ["", "b"]), src)
    assert not _clean_file(write("null_ts.parquet", ["a", "b"], t=(1, None)), src)
    assert not _clean_file(write("int_v.parquet", ["a", "b"], v=(1, 2), typ=pa.int64()), src)
    assert not _clean_file(write("no_stats.parquet", ["a", "b"], stats=False), src)
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    assert not _clean_file(str(tmp_path / "junk.parquet"), src)


def test_batch_jvm_options_are_set_once_for_a_fresh_jvm(monkeypatch):
    """``epochal bootstrap`` / ``batch`` start their JVM with the batch options, unless the user chose
    (``SPARK_SUBMIT_OPTS`` set, ``EPOCHAL_BATCH_JVM_OPTS=`` empty) or a JVM already runs in the process."""
    from pyspark import SparkContext

    from pipeline.batch.jvm import BATCH_JVM_OPTS, use_batch_jvm_options
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    env: dict[str, str] = {"EPOCHAL_JVM_CLASS_ARCHIVE_DIR": ""}  # no class archive (its own test below)
    assert use_batch_jvm_options(env) == BATCH_JVM_OPTS and env["SPARK_SUBMIT_OPTS"] == BATCH_JVM_OPTS
    assert use_batch_jvm_options({"SPARK_SUBMIT_OPTS": "-Xss4m"}) is None        # an explicit choice wins
    assert use_batch_jvm_options({"PYSPARK_GATEWAY_PORT": "4242"}) is None      # spark-submit started the JVM
    env = {"EPOCHAL_BATCH_JVM_OPTS": ""}
    assert use_batch_jvm_options(env) is None and "SPARK_SUBMIT_OPTS" not in env  # the JVM defaults
    env = {"EPOCHAL_BATCH_JVM_OPTS": "-XX:+UseSerialGC", "EPOCHAL_JVM_CLASS_ARCHIVE_DIR": ""}
    assert use_batch_jvm_options(env) == "-XX:+UseSerialGC" == env["SPARK_SUBMIT_OPTS"]
    monkeypatch.setattr(SparkContext, "_active_spark_context", object())        # too late: the JVM runs
    env = {}
    assert use_batch_jvm_options(env) is None and env == {}


def test_batch_jvm_options_are_accepted_by_this_jvm():
    """An option the JVM does not know would stop every bootstrap before it starts: the JVM Spark runs on takes
    them (``java <options> -version``)."""
    import os
    import shutil

    from pipeline.batch.jvm import BATCH_JVM_OPTS
    java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else shutil.which("java")
    if java is None:
        pytest.skip("no java on PATH (Spark tests need one)")
    p = subprocess.run([java, *BATCH_JVM_OPTS.split(), "-XX:+PrintFlagsFinal", "-version"], capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stderr
    flags = {ln.split()[1]: ln.split()[3] for ln in p.stdout.splitlines() if len(ln.split()) >= 4 and ln.split()[2] == "="}
    assert flags["UseSerialGC"] == "true" and flags["Tier4InvocationThreshold"] == "100000"


def test_bootstrap_source_cuts_equal_a_barrier_search_from_the_first_file(tmp_path):
    """The bootstrap's per-epoch file cuts (:func:`_cuts`) start each barrier search at the previous barrier's file;
    they equal the runtime's rule searched from the partition's first file for every epoch, over files whose
    ``_ingest_ts`` ranges overlap, go back in time, hold null timestamps, or are empty - and with logged barriers."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.batch.bootstrap.dead_letters import _cuts
    from pipeline.checkpoint.handles import Position
    from pipeline.epochs import EpochClock
    from pipeline.fileio import LocalFileIO
    from pipeline.source.layout import list_source_files
    from pipeline.source.positions import barrier_position, end_position
    from pipeline.source.summary import summarize_files

    E = 60_000_000
    ts = pa.timestamp("us", tz="UTC")
    files = [[10, 50, 70], [65, 130, 200], [5, 20], [None, 190, 250], [], [310, 330, 400], [245, 260], [430, 500],
             [None, None], [600, 610]]   # seconds; each file's rows in order
    d = tmp_path / "src" / "s" / "partition=0"
    d.mkdir(parents=True)
    for seq, secs in enumerate(files):
        t = pa.array([None if x is None else x * 1_000_000 for x in secs], pa.int64()).cast(ts)
        pq.write_table(pa.table({"k": pa.array([f"k{i}" for i in range(len(secs))], pa.string()), "_ingest_ts": t}),
                       d / f"{seq:08d}.parquet", row_group_size=2)
    listed = list_source_files(LocalFileIO(), (tmp_path / "src").as_uri(), "s", policy="dead_letter")
    ss = summarize_files(listed[0])
    epochs = EpochClock(60)
    for first, n, logged in ((0, 11, {}), (0, 11, {3: Position(seq=2, row=0), 6: Position(seq=6, row=1)}),
                             (2, 9, {}), (4, 5, {})):
        got = _cuts(ss, first, n, epochs, logged)
        ks = set(logged)
        for s in ss:
            if not s.corrupt and s.rows:
                ks.update(range(first, n) if s.min_ts is None or s.max_ts is None else
                          range(max(first, epochs.epoch_of(s.min_ts)), min(n, epochs.epoch_of(s.max_ts) + 1)))
        want = [logged.get(k) or barrier_position(ss, (k + 1) * E) or end_position(ss) for k in sorted(ks)]
        assert got == want, (first, n, logged)
    assert len(_cuts(ss, 0, 11, epochs, {})) >= 9


def test_runtime_jvm_options_take_the_jit_thresholds_without_the_serial_collector(monkeypatch):
    """A Spark JVM the runtime starts (``epochal run``, an Airflow task) gets C2's raised thresholds and keeps G1
    (long-lived); ``EPOCHAL_JVM_OPTS`` chooses others, empty keeps the JVM's defaults; a batch process's own
    options, set first, win."""
    from pyspark import SparkContext

    from pipeline.batch.jvm import BATCH_JVM_OPTS, use_batch_jvm_options
    from pipeline.runtime.spark.jvm_options import JIT_OPTS, use_jvm_options
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    off = {"EPOCHAL_JVM_CLASS_ARCHIVE_DIR": ""}  # no class archive (its own test below)
    env: dict[str, str] = dict(off)
    assert use_jvm_options(env) == JIT_OPTS == env["SPARK_SUBMIT_OPTS"]
    assert "-XX:Tier4InvocationThreshold=" in JIT_OPTS and "UseSerialGC" not in JIT_OPTS
    assert BATCH_JVM_OPTS.startswith("-XX:+UseSerialGC") and JIT_OPTS in BATCH_JVM_OPTS
    env = {"EPOCHAL_JVM_OPTS": ""}
    assert use_jvm_options(env) is None and "SPARK_SUBMIT_OPTS" not in env
    env = {"EPOCHAL_JVM_OPTS": "-Xss4m", **off}
    assert use_jvm_options(env) == "-Xss4m" == env["SPARK_SUBMIT_OPTS"]
    env = dict(off)
    use_batch_jvm_options(env)            # `epochal bootstrap` sets its options before the runner's session starts
    assert use_jvm_options(env) is None and env["SPARK_SUBMIT_OPTS"] == BATCH_JVM_OPTS


def test_class_archive_is_dumped_once_then_promoted_and_mapped(monkeypatch, tmp_path):
    """The JVM's class-data-sharing archive: the first JVM dumps it at exit into a ``.part`` of its own, a later
    process promotes a settled dump and maps it, a dump that may still be running is left alone (no archive that
    time), and it is off without a JDK 13+ or with the directory set to empty. Keyed by the JVM options."""
    from pipeline.runtime.spark.class_archive import SETTLED_S, archive_options, java_release
    jdk = tmp_path / "jdk"
    (jdk / "bin").mkdir(parents=True)
    (jdk / "release").write_text('JAVA_VERSION="17.0.15"\nJAVA_RUNTIME_VERSION="17.0.15+6"\n')
    folder = tmp_path / "archives"
    env = {"JAVA_HOME": str(jdk), "EPOCHAL_JVM_CLASS_ARCHIVE_DIR": str(folder)}
    assert java_release(env) == (17, "17.0.15+6", str(jdk))
    first = archive_options("-Xss4m", env, now=1000.0)
    assert first.startswith("-XX:ArchiveClassesAtExit=") and "-Xlog:cds*=off" in first
    part = first.split("=", 1)[1].split()[0]
    assert part.startswith(str(folder)) and part.endswith(".part")
    other = archive_options("-Xss4m", env, now=1000.0)     # no dump yet: a second first process dumps its own
    assert other.startswith("-XX:ArchiveClassesAtExit=") and other.split()[0] != first.split()[0]
    Path(part).write_bytes(b"dumped classes")                         # its JVM exited and dumped
    import os
    os.utime(part, (1000.0, 1000.0))
    assert archive_options("-Xss4m", env, now=1000.0 + SETTLED_S / 2) == ""   # the dump may still be running
    mapped = archive_options("-Xss4m", env, now=1000.0 + SETTLED_S + 1)
    final = next(folder.glob("*.jsa"))
    assert mapped == f"-XX:SharedArchiveFile={final} -Xlog:cds*=off" and not list(folder.glob("*.part"))
    assert archive_options("-Xss4m", env) == mapped                                    # from now on
    assert archive_options("-Xss8m", env).startswith("-XX:ArchiveClassesAtExit=")     # other options: another
    assert archive_options("-Xss4m", {**env, "EPOCHAL_JVM_CLASS_ARCHIVE_DIR": ""}) == ""
    (jdk / "release").write_text('JAVA_VERSION="11.0.2"\n')
    assert archive_options("-Xss4m", env) == ""                                        # JDK 11: no dynamic archive
