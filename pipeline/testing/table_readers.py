"""Read committed Iceberg/Delta sink tables with DuckDB (its iceberg/delta extensions, from PyPI wheels):
an engine that shares no code with Epochal, for tests. Run in a child process (``python -m
pipeline.testing.table_readers FORMAT LOCATION OUT.parquet``) so nothing of Epochal's process state leaks in.

``LOCATION``: an Iceberg metadata JSON file, or a Delta table root. S3 settings come from ``AWS_*``.
"""
from __future__ import annotations

import glob
import os
import sys

__all__ = ["duckdb_read", "read_in_child", "main"]


def _load(con, package: str) -> None:
    mod = __import__(package)
    assert mod.__file__ is not None, package
    path = glob.glob(os.path.join(os.path.dirname(mod.__file__), "extensions", "*", "*.duckdb_extension"))[0]
    con.execute(f"LOAD '{path}'")


def duckdb_read(fmt: str, location: str):
    import duckdb
    con = duckdb.connect()
    con.execute("SET autoinstall_known_extensions=false; SET autoload_known_extensions=false")
    for ext in ("duckdb_extension_httpfs", "duckdb_extension_avro"):
        _load(con, ext)
    if location.startswith("s3://"):
        ep = os.environ.get("AWS_ENDPOINT_URL", "")
        host = ep.split("://", 1)[-1]
        con.execute(f"""CREATE SECRET s3 (TYPE s3, KEY_ID '{os.environ.get("AWS_ACCESS_KEY_ID", "")}',
            SECRET '{os.environ.get("AWS_SECRET_ACCESS_KEY", "")}', REGION '{os.environ.get("AWS_DEFAULT_REGION", "us-east-1")}',
            ENDPOINT '{host}', URL_STYLE 'path', USE_SSL {str(ep.startswith("https")).lower()})""")
    if fmt == "iceberg":
        _load(con, "duckdb_extension_iceberg")
        return con.execute(f"SELECT * FROM iceberg_scan('{location}')").arrow()
    _load(con, "duckdb_extension_delta")
    loc = location[len("file://"):] if location.startswith("file://") else location
    return con.execute(f"SELECT * FROM delta_scan('{loc}')").arrow()


def main(argv: list[str] | None = None) -> int:
    import pyarrow.parquet as pq
    fmt, location, out = (argv or sys.argv[1:])[:3]
    t = duckdb_read(fmt, location)
    t = t.read_all() if hasattr(t, "read_all") else t
    pq.write_table(t, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def read_in_child(fmt: str, location: str, out_dir) -> pd.DataFrame:  # type: ignore[name-defined]  # noqa: F821
    """Run :func:`duckdb_read` in a child Python process and return its rows as pandas."""
    import itertools
    import subprocess
    from pathlib import Path

    import pandas as pd
    out_dir = Path(out_dir)
    for i in itertools.count():
        out = out_dir / f"duckdb-read-{i}.parquet"
        if not out.exists():
            break
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-m", "pipeline.testing.table_readers", fmt, location, str(out)], check=True,
                   env=env, timeout=300)
    return pd.read_parquet(out)
