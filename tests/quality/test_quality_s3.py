"""The whole validation on a real moto S3 server (state, sink, sources and results all on s3://)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.s3, pytest.mark.spark, pytest.mark.slow]


def test_validation_on_s3(moto_server, s3_root):
    script = Path(__file__).with_name("s3_scenario.py")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "GX_ANALYTICS_ENABLED": "False",
           "EPOCHAL_DATA_DOCS_DIR": str(Path(os.environ.get("TMPDIR", "/tmp")) / "epochal-s3-docs")}
    proc = subprocess.run([sys.executable, str(script), s3_root], env=env, capture_output=True, text=True,
                          timeout=1200)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line, f"scenario failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    out = json.loads(line[len("RESULT "):])
    assert out["good"] is True, out["good_summary"]
    assert out["result_uri"].startswith("s3://") and out["stored_success"] is False  # overwritten by the 2nd run
    assert out["bad"] is False
    assert {"epochal_checkpoint_files", "epochal_state_files"} <= set(out["bad_failed"]), out["bad_summary"]
    assert out["victim"] in out["bad_summary"]
