"""The Data Docs site of the latest validations, rendered by headless Chromium (screenshot + DOM)."""
from __future__ import annotations

import glob
import os
import shutil
import struct
import subprocess
from pathlib import Path

import corrupt
import pytest
from conftest import make_runner

pytestmark = [pytest.mark.browser, pytest.mark.spark]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or (
    "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _chromium(args: list[str], profile: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                          timeout=timeout)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_data_docs_render_in_headless_chromium(deployment, tmp_path):
    from pipeline.quality import validate_job
    runner = make_runner(deployment)
    docs = tmp_path / "docs"
    good = validate_job(runner, "2", docs_dir=str(docs))           # an older, good checkpoint
    assert good.success, good.summary()
    corrupt.checksum_mismatch(deployment, 3)
    bad = validate_job(runner, None, docs_dir=str(docs))           # the newest, broken
    assert not bad.success
    index = docs / "index.html"
    # published per job on the checkpoint store (served in the Airflow UI), styled without internet
    assert bad.docs_uri == f"{runner.config.checkpoint_uri}/{runner.job.name}/data_docs/index.html", bad.docs_uri
    import re
    for page in docs.rglob("*.html"):
        text = page.read_text()
        assert not re.search(r"<(link|script)\b[^>]*(href|src)=[\"']https?://", text), f"{page} loads from the internet"
        assert "epochal-offline.css" in text
    assert runner.ckpt_fio.exists(bad.docs_uri)
    profile = tmp_path / "chromium-profile"

    dom = _chromium(["--dump-dom", index.as_uri()], profile)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert "Epochal data quality: latest validations" in html
    assert "chk-3" in html and "chk-2" in html, "the site shows the latest validations of both checkpoints"
    assert "FAILED" in html and "every checked file has its recorded sha256 checksum" in html
    assert html.count("epochal_recovery_key_groups") >= 2

    shot = tmp_path / "data_docs_index.png"
    r = _chromium(["--window-size=1400,1000", f"--screenshot={shot}", index.as_uri()], profile)
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    assert _png_size(shot) == (1400, 1000)
    assert shot.stat().st_size > 20_000, "the screenshot looks blank"

    page = sorted(glob.glob(str(docs / "validations" / "epochal_checkpoint_files" / "chk-3" / "*" / "*.html")))
    assert page, "no GX validation page for the failed suite"
    shot2 = tmp_path / "data_docs_validation.png"
    r = _chromium(["--window-size=1200,1600", f"--screenshot={shot2}", Path(page[-1]).as_uri()], profile)
    assert r.returncode == 0 and shot2.exists(), r.stderr[-2000:]
    assert shot2.stat().st_size > 20_000
    out = os.environ.get("EPOCHAL_SCREENSHOT_DIR")
    if out:  # keep the screenshots for a human to look at
        os.makedirs(out, exist_ok=True)
        shutil.copy(shot, out)
        shutil.copy(shot2, out)
