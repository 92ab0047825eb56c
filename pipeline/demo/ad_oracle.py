"""Independent oracle of the example job ``ad_clicks``: recomputes its committed output from the source files.

It shares no code with the pipeline (it imports nothing from ``pipeline``; pandas + pyarrow only) and follows
the written semantics: docs/windows.md (watermark, lateness, firing) and the job's docstring
(:mod:`pipeline.jobs.ad_clicks`). Constants are restated here on purpose.

Given the sources and the last completed epoch ``n``:

1. records of epoch ``<= n`` (epoch = ``_ingest_ts // E``);
2. clicks deduplicated: the first copy per ``click_id`` by ``_ingest_ts`` (copies come within the 1 h TTL);
3. every (impression, click) pair with the same user and ad, emitted in the later of the two epochs;
4. two tumbling 5-minute windows per campaign, watermark ``max event time - 30 s`` over the active channels
   (impressions: one per source partition; a pair counts for both its rows' source partitions, the impression's and
   the click's, docs/concepts/watermarks.md "Joins"), lateness 60 s, final emission.

CLI: ``python -m pipeline.demo.ad_oracle --root URI --through-epoch N compare --clicks DIR --impressions DIR``.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipeline import settings

__all__ = ["expected_ad_output", "compare_ad_output", "main"]

US = 1_000_000
WINDOW_US = 300 * US
OOO_US = 30 * US
LATENESS_US = 60 * US
_FILE = re.compile(r"partition=(\d+)/(\d+)\.parquet$")


def _fs(root: str) -> tuple[pafs.FileSystem, str]:
    u = urlsplit(root)
    if u.scheme == "s3":
        region = settings.raw("AWS_DEFAULT_REGION")
        fs = pafs.S3FileSystem(endpoint_override=settings.raw("AWS_ENDPOINT_URL"),
                               region="us-east-1" if region is None else region)
        return fs, (u.netloc + u.path).rstrip("/")
    return pafs.LocalFileSystem(), u.path.rstrip("/")


def read_source(root: str, source: str) -> pd.DataFrame:
    fs, base = _fs(root)
    infos = fs.get_file_info(pafs.FileSelector(f"{base}/{source}", recursive=True, allow_not_found=True))
    parts = []
    for info in infos:
        m = _FILE.search(info.path)
        if info.type != pafs.FileType.File or not m:
            continue
        with fs.open_input_file(info.path) as f:
            t = pq.read_table(f)
        df = t.to_pandas()
        df["partition"] = int(m.group(1))
        parts.append(df)
    df = pd.concat(parts, ignore_index=True)
    for c in ("event_time", "_ingest_ts"):
        df[c + "_us"] = pa.array(df[c]).cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_numpy()
    return df


def _window(df: pd.DataFrame, key: str, t_col: str, through: int, aggs: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Fired windows (key, window_start, window_end, aggs) and late rows, per docs/windows.md (tumbling)."""
    df = df[df["epoch"] <= through]
    # a row counts for each of its channels (a join's pair: both rows' source partitions, docs/concepts/watermarks.md)
    chans = df[["epoch", "channel", t_col]].explode("channel")
    chan_max: dict = {}
    wm: dict[int, int | None] = {}
    cur = None
    for m in sorted(df["epoch"].unique()):
        part = chans[chans["epoch"] == m].groupby("channel")[t_col].max()
        for c, t in part.items():
            chan_max[c] = max(chan_max.get(c, t), t)
        cand = min(chan_max[c] for c in part.index) - OOO_US
        cur = cand if cur is None else max(cur, cand)
        wm[int(m)] = cur
    epochs = sorted(wm)

    def prev_wm(m):
        ps = [e for e in epochs if e < m]
        return wm[ps[-1]] if ps else None
    df = df.copy()
    df["ws"] = (df[t_col] // WINDOW_US) * WINDOW_US
    df["prev_wm"] = [prev_wm(int(m)) for m in df["epoch"]]
    closes = df["ws"] + WINDOW_US + LATENESS_US
    late_mask = df["prev_wm"].notna() & (closes <= df["prev_wm"].fillna(0))
    late, ontime = df[late_mask], df[~late_mask]
    final_wm = wm[epochs[-1]] if epochs else None
    fired = ontime[(ontime["ws"] + WINDOW_US + LATENESS_US) <= (final_wm if final_wm is not None else -2**62)]
    g = fired.groupby([key, "ws"])
    out = pd.DataFrame({name: (g.size() if fn == "count" else g[col].nunique()) for name, (fn, col) in aggs.items()})
    out = out.reset_index()
    out["window_start"] = out["ws"]
    out["window_end"] = out["ws"] + WINDOW_US
    return out[[key, "window_start", "window_end", *aggs]], late


@dataclass
class AdExpected:
    campaign_clicks: pd.DataFrame
    campaign_impressions: pd.DataFrame
    late_pairs: set = field(default_factory=set)        # (impression_id, click_id)
    late_impressions: set = field(default_factory=set)  # impression_id
    stats: dict = field(default_factory=dict)


def expected_ad_output(root: str, through_epoch: int, epoch_seconds: int = 60) -> AdExpected:
    E = epoch_seconds * US
    imp = read_source(root, "impressions")
    clk = read_source(root, "clicks")
    imp["epoch"] = imp["_ingest_ts_us"] // E
    clk["epoch"] = clk["_ingest_ts_us"] // E
    imp = imp[imp["epoch"] <= through_epoch]
    clk = clk[clk["epoch"] <= through_epoch]
    first = clk.sort_values(["click_id", "_ingest_ts_us"], kind="stable").drop_duplicates("click_id", keep="first")
    imp["view_key"] = imp["user_id"] + "|" + imp["ad_id"]
    first = first.assign(view_key=first["user_id"] + "|" + first["ad_id"])
    pairs = imp[["view_key", "impression_id", "campaign_id", "epoch", "partition"]].merge(
        first[["view_key", "click_id", "event_time_us", "epoch", "partition"]].rename(
            columns={"event_time_us": "click_time", "epoch": "click_epoch", "partition": "click_partition"}),
        on="view_key")
    pairs["epoch"] = np.maximum(pairs["epoch"], pairs["click_epoch"])
    # a pair carries the channels of both its rows: the impression's and the click's source partition
    pairs["channel"] = [[f"impressions/{a}", f"clicks/{b}"]
                        for a, b in zip(pairs["partition"], pairs["click_partition"])]
    clicks_out, late_p = _window(pairs, "campaign_id", "click_time", through_epoch,
                                 {"clicks": ("count_distinct", "click_id"),
                                  "clicked_impressions": ("count_distinct", "impression_id"),
                                  "attributions": ("count", None)})
    imp["channel"] = "impressions/" + imp["partition"].astype(str)
    imps_out, late_i = _window(imp, "campaign_id", "event_time_us", through_epoch,
                               {"impressions": ("count", None), "users": ("count_distinct", "user_id")})
    return AdExpected(clicks_out, imps_out, set(zip(late_p["impression_id"], late_p["click_id"])),
                      set(late_i["impression_id"]),
                      {"impressions": len(imp), "clicks": len(clk), "unique_clicks": len(first), "pairs": len(pairs)})


def _rows(df: pd.DataFrame) -> list[tuple]:
    df = df.copy()
    for c in ("window_start", "window_end"):
        if c in df and not pd.api.types.is_integer_dtype(df[c].dtype):
            df[c] = pa.array(df[c]).cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_numpy()
    return sorted(tuple(int(v) if isinstance(v, (np.integer,)) else v for v in r)
                  for r in df.itertuples(index=False, name=None))


def compare_ad_output(exp: AdExpected, clicks_dir: str, impressions_dir: str) -> dict:
    rep: dict[str, Any] = {}
    for name, want, d in (("campaign_clicks", exp.campaign_clicks, clicks_dir),
                          ("campaign_impressions", exp.campaign_impressions, impressions_dir)):
        got = pq.read_table(d).to_pandas()[list(want.columns)]
        w, g = _rows(want), _rows(got)
        missing = sorted(set(w) - set(g))
        extra = sorted(set(g) - set(w))
        rep[name] = {"expected": len(w), "got": len(g), "missing": len(missing), "extra": len(extra),
                     "duplicates": len(g) - len(set(g)), "examples": [str(x) for x in (missing + extra)[:3]]}
    rep["ok"] = all(r["missing"] == r["extra"] == r["duplicates"] == 0 for r in rep.values() if isinstance(r, dict))
    return rep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.demo.ad_oracle", description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--through-epoch", type=int, required=True)
    ap.add_argument("--epoch-seconds", type=int, default=60)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--clicks", required=True)
    c.add_argument("--impressions", required=True)
    sub.add_parser("ctr")
    a = ap.parse_args(argv)
    exp = expected_ad_output(a.root, a.through_epoch, a.epoch_seconds)
    if a.cmd == "ctr":
        m = exp.campaign_impressions.merge(exp.campaign_clicks, on=["campaign_id", "window_start", "window_end"],
                                           how="left").fillna({"clicks": 0})
        m["ctr"] = m["clicks"] / m["impressions"]
        print(m.to_string(index=False))
        return 0
    rep = compare_ad_output(exp, a.clicks, a.impressions)
    print(json.dumps(rep, indent=1))
    return 0 if rep["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
