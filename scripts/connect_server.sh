#!/usr/bin/env bash
# A long-lived Spark Connect server on 127.0.0.1 (default port 15002) from the pyspark package: CLI runs and
# Airflow tasks connect to it with PIPELINE_SPARK_MASTER=sc://127.0.0.1:15002 instead of starting a JVM each.
# Usage: scripts/connect_server.sh [--port 15002] [--master 'local[*]']     (Ctrl-C stops it)
# S3: the server's executors use their own S3 settings, never a client's. With a local master (the default) they
# are this shell's AWS_* variables. With --master spark://..., the executors run on the cluster's workers and use
# the workers' settings: export AWS_* (endpoint, keys or profile) before each start-worker.sh, or give the nodes an
# instance profile / IRSA; this shell's AWS_* do not reach them. A client checks that the executors reach S3 when it
# connects and refuses to run otherwise (exit 2, before writing anything).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
scripts/bootstrap.sh
export PATH="$ROOT/.venv/bin:$PATH"
exec .venv/bin/python -m pipeline.testing.connect_server "$@"
