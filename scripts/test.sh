#!/usr/bin/env bash
# README command 2: set up .venv (with dev tools) and run the whole test suite.
# Extra arguments go to pytest, e.g. scripts/test.sh -m unit (EPOCHAL_TEST_WORKERS=0: no parallel workers)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
scripts/bootstrap.sh --dev
# headless Chromium for the browser tests (Debian packages); skipped quietly where apt is unavailable
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "[test] installing chromium + chromium-driver (Debian) for the browser tests..." >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) >/dev/null 2>&1 \
    || echo "[test] could not install chromium; browser tests will be skipped" >&2
fi
export PATH="$ROOT/.venv/bin:$PATH"
export PYSPARK_PYTHON="$ROOT/.venv/bin/python"
# static checks first (config in pyproject.toml): ruff (pyflakes, pycodestyle, isort, bugbear) and mypy
echo "[test] ruff check + mypy..." >&2
.venv/bin/python -m ruff check pipeline tests dags plugins include benchmarks docs/hooks
.venv/bin/python -m mypy
# two pytest workers (pytest-xdist), one module per worker at a time (--dist loadfile keeps each module's tests
# in order in one process); --no-loadscope-reorder keeps the collection order, which puts the slowest modules
# first (tests/conftest.py), instead of xdist's "most tests first"; EPOCHAL_TEST_WORKERS=0 runs everything in this
# process (e.g. to debug one test)
workers="${EPOCHAL_TEST_WORKERS:-2}"
if [ "$workers" = 0 ]; then
  exec .venv/bin/python -m pytest "$@"
fi
exec .venv/bin/python -m pytest -n "$workers" --dist loadfile --no-loadscope-reorder "$@"
