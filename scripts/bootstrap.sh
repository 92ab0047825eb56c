#!/usr/bin/env bash
# Creates .venv in the repo root (if needed) and installs the pinned requirements.
# Usage: scripts/bootstrap.sh [--dev]     (--dev also installs requirements-dev.txt)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)'; then
  echo "Epochal needs Python 3.11 (found $("$PY" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2
  exit 2
fi
if ! command -v java >/dev/null 2>&1; then
  echo "Epochal needs Java 17 on PATH (Spark runs on the JVM)" >&2
  exit 2
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
files=(requirements.txt)
[ "${1:-}" = "--dev" ] && files+=(requirements-dev.txt)
stamp=".venv/.epochal-installed-$(cat "${files[@]}" pyproject.toml | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "[bootstrap] installing ${files[*]} into .venv (first time takes ~2.5 minutes)..." >&2
  args=()
  for f in "${files[@]}"; do args+=(-r "$f"); done
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "${args[@]}" 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" || true
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e . 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" || true
  .venv/bin/python -c "import pyspark, airflow, pyarrow, boto3, moto, pipeline" || { echo "[bootstrap] install failed" >&2; exit 1; }
  rm -f .venv/.epochal-installed-*
  touch "$stamp"
fi
# the Spark JVM's class-data-sharing archive (pipeline/runtime/spark/class_archive.py), once per machine and JDK:
# a session then starts in ~4 s instead of ~7 s; EPOCHAL_JVM_CLASS_ARCHIVE_DIR= (empty) switches it off
.venv/bin/python - >&2 2>/dev/null <<'PY' || echo "[bootstrap] no Spark JVM class archive prepared (JVMs start without)" >&2
import time
from pipeline.runtime.spark.session import prepare_class_archive
t0 = time.monotonic()
made = prepare_class_archive()
if made:
    print(f"[bootstrap] Spark JVM class archive {made} prepared in {time.monotonic() - t0:.0f} s")
PY
