#!/usr/bin/env bash
# A long-lived Spark Connect server on 127.0.0.1 (default port 15002) from the pyspark package: CLI runs and
# Airflow tasks connect to it with PIPELINE_SPARK_MASTER=sc://127.0.0.1:15002 instead of starting a JVM each.
# Usage: scripts/connect_server.sh [--port 15002] [--master 'local[*]']     (Ctrl-C stops it)
# S3 settings (AWS_* variables) of this shell are the server's: its executors read and write S3 with them.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
scripts/bootstrap.sh
export PATH="$ROOT/.venv/bin:$PATH"
exec .venv/bin/python -m pipeline.testing.connect_server "$@"
