"""Spark JVM log lines relayed at their level (pipeline.runtime.spark.jvm_logs)."""
import logging
import os
import subprocess
import sys

import pytest

from pipeline.runtime.spark.jvm_logs import level_of


@pytest.mark.unit
def test_level_of_log4j_lines():
    assert level_of("25/11/23 21:00:00 WARN NativeCodeLoader: Unable to load native-hadoop", None) == logging.WARNING
    assert level_of("25/11/23 21:00:00 INFO SparkContext: Running Spark", None) == logging.INFO
    assert level_of("2025-11-23 21:00:00,123 ERROR Executor: boom", None) == logging.ERROR
    assert level_of("\tat org.apache.spark.Foo(Foo.java:1)", logging.ERROR) == logging.ERROR
    assert level_of("Traceback (most recent call last):", None) == logging.WARNING
    assert level_of("Using Spark's default log4j profile: org/apache/spark/log4j2-defaults.properties", None) == logging.INFO


@pytest.mark.spark
@pytest.mark.slow
def test_jvm_warning_is_a_warning_not_stderr():
    """With EPOCHAL_JVM_LOGS=python a JVM WARN line reaches Python logging as WARNING and not fd 2."""
    code = (
        "import logging, sys, threading\n"
        "logging.basicConfig(stream=sys.stdout, level=logging.INFO, format='%(levelname)s %(name)s: %(message)s')\n"
        "seen = threading.Event()\n"
        "class H(logging.Handler):\n"
        "    def emit(self, r):\n"
        "        if 'relay-check-42' in r.getMessage(): seen.set()\n"
        "logging.getLogger('spark.jvm').addHandler(H())\n"
        "from pipeline.runtime.spark.session import get_spark, stop_spark\n"
        "s = get_spark(parallelism=1)\n"
        "s.sparkContext.setLogLevel('WARN')\n"
        "s.sparkContext._jvm.org.apache.logging.log4j.LogManager.getLogger('epochal.test').warn('relay-check-42')\n"
        "assert seen.wait(60), 'the JVM line was not relayed'\n"
        "stop_spark()\n")
    env = {**os.environ, "EPOCHAL_JVM_LOGS": "python"}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "relay-check-42" not in p.stderr, p.stderr[-3000:]
    lines = [ln for ln in p.stdout.splitlines() if "relay-check-42" in ln]
    assert lines and lines[0].startswith("WARNING spark.jvm:"), p.stdout[-3000:]
