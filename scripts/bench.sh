#!/usr/bin/env bash
# Throughput benchmark (prints figures; not a timed test): Epochal vs a one-shot Spark batch vs Spark
# Structured Streaming on the same generated data (~2M orders + payments, 8 partitions, 24 epochs).
# Usage: scripts/bench.sh [--orders 200000] [--parallelism 1,2,4] [--s3] [--profile] ...   (--help: all options)
# Results: a table on stdout, JSON in bench-results/, the table in docs/performance.md.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
scripts/bootstrap.sh --dev
export PATH="$ROOT/.venv/bin:$PATH"
export PYSPARK_PYTHON="$ROOT/.venv/bin/python"
exec .venv/bin/python benchmarks/throughput.py "$@"
