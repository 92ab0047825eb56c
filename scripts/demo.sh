#!/usr/bin/env bash
# README command 1: set up .venv, start moto S3 on loopback, generate the demo data, run the demo job
# orders_payments through all its epochs (with one real SIGKILL mid-epoch and a resume), then check the
# exported output against an independent oracle and print a summary.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
scripts/bootstrap.sh
export PATH="$ROOT/.venv/bin:$PATH"
export PYSPARK_PYTHON="$ROOT/.venv/bin/python"
exec .venv/bin/python -m pipeline.demo "$@"
