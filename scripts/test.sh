#!/usr/bin/env bash
# README command 2: set up .venv (with dev tools) and run the whole test suite.
# Extra arguments go to pytest, e.g. scripts/test.sh -m unit
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
exec .venv/bin/python -m pytest "$@"
