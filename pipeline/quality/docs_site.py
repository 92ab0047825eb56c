"""Great Expectations Data Docs that work inside the Airflow UI: per job, offline, on the checkpoint store.

GX builds its site into a local directory with stylesheets and scripts from CDNs (Bootstrap, Font Awesome,
jQuery, Vega). :func:`make_offline` rewrites every page of a built site so that it needs no internet:
external ``<link>``/``<script>`` tags are removed, a bundled stylesheet (``static/epochal-offline.css``, a
Bootstrap 4 subset) is linked instead, and external logos point at the site's own ``static/images``.
:func:`publish_site` then copies the site to ``<checkpoint root>/<job>/data_docs/``, where the Airflow
plugin serves it behind Airflow's login (``/epochal/jobs/<job>/data-docs/``); the api-server reads storage,
not a worker's disk, so the docs are there whichever machine validated.
"""
from __future__ import annotations

import os
import re
from importlib import resources
from pathlib import Path

from pipeline.fileio import FileIO, join_uri
from pipeline.layout import JobLayout

__all__ = ["make_offline", "publish_site", "site_uri", "OFFLINE_CSS", "CONTENT_TYPES"]

OFFLINE_CSS = "epochal-offline.css"
_EXT_LINK = re.compile(r"<link\b[^>]*href=[\"']https?://[^\"']*[\"'][^>]*>", re.I)
_EXT_SCRIPT = re.compile(r"<script\b[^>]*src=[\"']https?://[^\"']*[\"'][^>]*>\s*</script>", re.I)
_EXT_IMG = re.compile(r"(<img\b[^>]*src=)[\"']https?://[^\"']*logo[^\"']*[\"']", re.I)
CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css", ".js": "application/javascript",
                 ".png": "image/png", ".svg": "image/svg+xml", ".ico": "image/x-icon", ".gif": "image/gif",
                 ".json": "application/json", ".woff": "font/woff", ".woff2": "font/woff2", ".ttf": "font/ttf",
                 ".otf": "font/otf"}


def site_uri(checkpoint_root: str, job: str) -> str:
    """Where a job's Data Docs site lives on the checkpoint store."""
    return JobLayout.of(checkpoint_root, job).data_docs()


def make_offline(site_dir: str | os.PathLike) -> int:
    """Rewrite the HTML pages of a built site to need no internet; returns the number of pages."""
    root = Path(site_dir)
    static = root / "static"
    static.mkdir(parents=True, exist_ok=True)
    css = resources.files("pipeline.quality").joinpath("static", OFFLINE_CSS).read_text(encoding="utf-8")
    (static / OFFLINE_CSS).write_text(css, encoding="utf-8")
    pages = 0
    for page in root.rglob("*.html"):
        rel = os.path.relpath(static, page.parent).replace(os.sep, "/")
        text = page.read_text(encoding="utf-8")
        text = _EXT_LINK.sub("", text)
        text = _EXT_SCRIPT.sub("", text)
        logo = f'"{rel}/images/logo-long.png"'
        text = _EXT_IMG.sub(lambda m: f"{m.group(1)}{logo}", text)  # noqa: B023 - used at once, in this iteration
        tag = f'<link rel="stylesheet" href="{rel}/{OFFLINE_CSS}">'
        if tag not in text:
            text = re.sub(r"</head>", tag + "</head>", text, count=1, flags=re.I) if "</head>" in text.lower() \
                else tag + text
        page.write_text(text, encoding="utf-8")
        pages += 1
    return pages


def publish_site(site_dir: str | os.PathLike, fileio: FileIO, target_uri: str) -> int:
    """Copy every file of a local site to ``target_uri`` (overwriting); returns the number of files."""
    root = Path(site_dir)
    n = 0
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        fileio.write_bytes(join_uri(target_uri, f.relative_to(root).as_posix()), f.read_bytes())
        n += 1
    return n
